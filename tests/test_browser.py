"""The screens a user opens, in a real browser with no network.

Playwright drives Debian's chromium (``/usr/bin/chromium``; .ci/run installs both, nothing is
downloaded). Every page is served from 127.0.0.1 (a real ``mlflow server``, or a static file
server for the Data Docs and the monitor's report); every request to another host is aborted
by a route, and each test asserts none was needed. Screenshots are kept as test artifacts in
``build/screenshots/`` (docs/testing.md).

Without chromium or playwright the tests fail in CI (``CI`` set) and skip elsewhere, naming
what is missing.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import yaml

from components.tracking.registry import CURVE_PREFIX, LINEAGE_TAGS, UI_WORKFLOW
from tests.conftest import REPO, run_module, track_register_promote, with_model_config
from tests.test_registry import TASK_OPTIONS

CHROMIUM = Path(os.environ.get("PADDLE_MLOPS_CHROMIUM", "/usr/bin/chromium"))
SHOTS = REPO / "build" / "screenshots"
MODEL = "browser-digits"
EXPERIMENT = "browser-tests"
TIMEOUT_MS = 60_000  # the longest a page may take to show what is waited for (2 busy CPUs)


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (make install: the dev dependencies)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    why = _missing()
    if why and os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run in CI: {why}", pytrace=False)
    if why:
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield launched
        finally:
            launched.close()


class Screen:
    """One browser page whose requests may go to 127.0.0.1 (and file:, data:, blob:) only."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.context.set_default_timeout(TIMEOUT_MS)
        self.blocked: list[str] = []
        self.failed: list[str] = []  # local requests answered >= 400 or not answered
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("response", self._response)
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url}: {r.failure}"))

    def _route(self, route: Any) -> None:
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob", "file") or parts.hostname == "127.0.0.1":
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    def _response(self, response: Any) -> None:
        if response.status >= 400:
            self.failed.append(f"{response.url}: HTTP {response.status}")

    def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 10_000, path  # a drawn page, not an empty one
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def screen(browser: Any) -> Iterator[Screen]:
    opened = Screen(browser)
    try:
        yield opened
    finally:
        opened.close()
    # nothing outside 127.0.0.1 was needed (a blocked request would have left something blank)
    assert opened.blocked == []


@contextlib.contextmanager
def static_server(root: Path) -> Iterator[str]:
    """``root`` served on 127.0.0.1 (a free port) for the duration: its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


# --------------------------------------------------------------------------- Data Docs


def test_data_docs_index_lists_the_validations_offline(screen: Screen, step_outputs) -> None:
    """The validate step's Data Docs (the session's real validation of the digits): the index
    lists each validation, with its status, and its link opens the validation's page."""
    docs = step_outputs.report / "data_docs"
    summary = json.loads((step_outputs.report / "summary.json").read_text())
    with static_server(docs) as base:
        page = screen.page
        page.goto(f"{base}/index.html")
        table = page.locator("table.ge-index-page-validation-results-table")
        rows = table.locator("tbody tr")
        assert rows.count() == 7  # train/val/test shards, splits, class counts, overlap, dups
        texts = rows.all_inner_texts()
        for asset in ("train_shards", "val_shards", "test_shards", "splits", "duplicates"):
            assert any(asset in t for t in texts), (asset, texts)
        assert all("Success" in t for t in texts) == summary["success"]
        screen.shot("data-docs-index")
        rows.filter(has_text="ingested-train_shards").locator("a").first.click()
        page.wait_for_url(re.compile(r".*/validations/shards/.*train_shards\.html"))
        body = page.inner_text("body")
        assert "Evaluated Expectations" in body and "Succeeded" in body
        screen.shot("data-docs-validation")
    assert screen.failed == []


# --------------------------------------------------------------------------- monitor report


def test_monitor_report_shows_its_checks(
    screen: Screen, server_binary, exported_int8, digits_task, digits_data, tmp_path
) -> None:
    """The real C++ server logs 100 real test digits; the monitor CLI judges them and writes
    report.html; the page shows the verdict and one row per check."""
    from components.ml.serving.server import RunningServer

    bundle = with_model_config(exported_int8, tmp_path / "bundle", log_input_rate=1.0)
    log_dir, labels = tmp_path / "log", tmp_path / "labels.jsonl"
    running = RunningServer(
        server_binary, bundle, "fp32", "digits", tmp_path / "server.log",
        extra_args=[f"--prediction-log-dir={log_dir}"],
    )  # fmt: skip
    running.wait_ready(60)
    raw, y = digits_task.read_split(digits_data, "test")
    (x,) = digits_task.preprocess(raw)
    try:
        with labels.open("w") as out:
            for start in range(0, 100, 4):
                rows = np.arange(start, start + 4)
                rid = f"browser-{start}"
                running.client.infer("digits", {"image": x[rows]}, binary=True, request_id=rid)
                out.write(json.dumps({"id": rid, "labels": y[rows].tolist()}) + "\n")
    finally:
        assert running.stop() == 0
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["monitor"] |= {"window": 100, "min_samples": 50}
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    report = tmp_path / "report"
    proc = run_module(
        "components", "monitor", "--params", str(params_file), "--bundle", str(bundle),
        "--data", str(digits_data), "--log", str(log_dir), "--labels", str(labels),
        "--report", str(report),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((report / "monitor.json").read_text())
    checks = [c["name"] for c in doc["verdict"]["checks"]]
    assert {"input:mean", "prediction:class_prior", "accuracy"} <= set(checks)
    with static_server(report) as base:
        screen.page.goto(f"{base}/report.html")
        rows = screen.page.locator("table tr")
        assert rows.count() == 1 + len(checks)
        shown = [rows.nth(i + 1).locator("td").first.inner_text() for i in range(len(checks))]
        assert shown == checks
        verdict = "ALARM" if doc["alarm"] else "no alarm"
        assert verdict in screen.page.inner_text("body")
        screen.shot("monitor-report")
    assert screen.failed == []


# --------------------------------------------------------------------------- MLflow UI

# the nested runs of a pipeline run: the track step's, one per step output, then register's
# and promote's (docs/tracking.md "The runs")
STEP_RUNS = (
    "ingest", "validate", "train", "export", "qat", "package", "evaluate", "serving_image",
    "register", "promote",
)  # fmt: skip
CURVES = ("train_loss", "val_loss", "train_accuracy", "val_accuracy", "lr")
CARD = "[data-testid=experiment-view-compare-runs-card]"  # one chart of a run's metrics
# the UI asks who is signed in; a server without the auth app answers 404 (nothing is missing)
WHO_AM_I = "/ajax-api/2.0/mlflow/users/current"


def _mlflow_failures(screen: Screen) -> list[str]:
    return [f for f in screen.failed if urlsplit(f.split(": ")[0]).path != WHO_AM_I]


@pytest.fixture(scope="module")
def pipeline(server, step_outputs, digits_task, digits_data, tmp_path_factory):
    """The track, register and promote steps over the session's real step outputs, against
    the module's real ``mlflow server``: the pipeline run, its nested step runs, the
    registered version with its ``champion`` alias and lineage tags, and ``run.json`` (the
    UI paths the summary prints)."""
    from mlflow import MlflowClient

    from components.core.artifacts import read_json, write_json
    from components.steps.promote import PromoteParams
    from components.steps.register import RegisterParams

    root = tmp_path_factory.mktemp("browser-pipeline")
    infra = read_json(step_outputs.infra / "infra.json")
    write_json(root / "infra" / "infra.json", infra)
    done = track_register_promote(
        server.uri,
        step_outputs,
        root,
        digits_task,
        digits_data,
        all_params={"task": {"name": "digits", "options": TASK_OPTIONS}},
        experiment=EXPERIMENT,
        model_name=MODEL,
        register=RegisterParams(min_accuracy=0.5),
        promote=PromoteParams(auto_promote=True),
        infra=root / "infra",
    )
    registered, promoted = done.registered, done.promoted
    assert registered.blessing.blessed and promoted.promoted
    run_info = read_json(root / "track" / "run.json")
    client = MlflowClient(tracking_uri=server.uri)
    parent = client.get_run(run_info["run_id"])
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    curves = {
        name: client.get_metric_history(parent.info.run_id, f"{CURVE_PREFIX}{name}")
        for name in CURVES
    }
    return SimpleNamespace(
        uri=server.uri,
        experiment_id=parent.info.experiment_id,
        run_json=run_info,
        parent=parent,
        steps={r.info.run_name: r for r in children},
        epochs=len(curves["val_accuracy"]),
        curves=curves,
        version=registered.version,
        tags=client.get_model_version(MODEL, str(registered.version)).tags,
    )


def _open(screen: Screen, base: str, ui_path: str) -> None:
    """``ui_path`` (run.json's, from ``#/``) under the server's base URL."""
    assert ui_path.startswith("#/"), ui_path
    screen.page.goto(f"{base}/{ui_path}")


def test_mlflow_ui_opens_the_experiment_on_its_training_runs(screen: Screen, pipeline) -> None:
    """run.json's ``experiment_ui_path`` opens the model-training view of the experiment (its
    runs table, not the GenAI overview MLflow 3 opens by default): the pipeline run, and
    under it, once expanded, one nested run per step, register and promote included."""
    assert set(pipeline.steps) == set(STEP_RUNS)
    experiment = pipeline.experiment_id
    path = pipeline.run_json["experiment_ui_path"]
    assert path == f"#/experiments/{experiment}?workflowType={UI_WORKFLOW}"
    page = screen.page
    _open(screen, pipeline.uri, path)
    name = pipeline.parent.info.run_name
    row = page.get_by_role("row").filter(has_text=name)
    row.wait_for()
    # the runs table of the model-training view, not the GenAI overview (usage, traces)
    page.wait_for_url(re.compile(rf"#/experiments/{experiment}/runs\?.*workflowType={UI_WORKFLOW}"))
    sections = page.get_by_role("navigation").first.inner_text().splitlines()
    assert "Runs" in sections and "Models" in sections, sections
    assert not {"Overview", "Observability", "Evaluation", "Judges"} & set(sections), sections
    # the pipeline run alone at the top level; its step runs nested under it
    page.get_by_text(f"{1 + len(STEP_RUNS)} matching runs", exact=True).wait_for()
    assert row.count() == 1

    def step_row(step: str) -> Any:
        return page.get_by_role("row").filter(has=page.get_by_text(step, exact=True))

    assert [step_row(s).count() for s in STEP_RUNS] == [0] * len(STEP_RUNS)  # collapsed
    row.get_by_role("button").first.click()  # the expander of the nested runs
    for step in STEP_RUNS:
        step_row(step).first.wait_for()
        assert step_row(step).count() == 1, step
    names = [t.split("\n") for t in page.get_by_role("row").all_inner_texts()]
    order = [next((s for s in (name, *STEP_RUNS) if s in cells), None) for cells in names]
    shown = [s for s in order if s]
    assert shown[0] == name and set(shown[1:]) == set(STEP_RUNS), shown  # parent first
    screen.shot("mlflow-pipeline-run")
    assert _mlflow_failures(screen) == []


def _training_section(screen: Screen, epochs: int) -> None:
    """The open run's metrics page: its first section is ``training``, one line chart per
    curve, each over the ``epochs`` steps."""
    page = screen.page
    page.locator(CARD).first.wait_for()
    section = CURVE_PREFIX.rstrip("/")
    headers = [
        h.split("\n") for h in page.locator("[role=button][aria-expanded]").all_inner_texts()
    ]
    assert headers[0][:2] == [section, f"({len(CURVES)})"], headers  # the curves come first
    assert len(headers) >= 2, headers  # the unprefixed metrics after them
    for curve in CURVES:
        metric = f"{CURVE_PREFIX}{curve}"
        card = page.locator(CARD).filter(has=page.locator(f'h4[title="{metric}"]'))
        assert card.count() == 1, metric
        assert card.locator("h4").inner_text() == curve  # shown without its section's prefix
        points = card.locator("g.scatterlayer g.points path.point")
        points.nth(epochs - 1).wait_for()
        assert points.count() == epochs, metric  # one point per epoch
        assert card.locator("g.scatterlayer path.js-line").count() >= 1, metric  # a line
        assert card.locator("g.barlayer g.trace").count() == 0, metric  # not a bar
        assert card.locator("text.xtitle").text_content() == "Step", metric
        ticks = card.locator("g.xtick text").all_text_contents()
        assert str(epochs) in ticks, (metric, ticks)  # the last epoch on the step axis


def test_mlflow_ui_draws_the_training_curves_first(screen: Screen, pipeline) -> None:
    """The pipeline run (run.json's ``ui_path``) and the train step's run: the Model metrics
    tab opens on the ``training`` section, the per-epoch curves drawn as lines over steps."""
    assert pipeline.epochs >= 2
    for curve, history in pipeline.curves.items():
        assert [m.step for m in history] == list(range(1, pipeline.epochs + 1)), curve
    page = screen.page
    run_id = pipeline.parent.info.run_id
    path = pipeline.run_json["ui_path"]
    assert (
        path == f"#/experiments/{pipeline.experiment_id}/runs/{run_id}?workflowType={UI_WORKFLOW}"
    )
    _open(screen, pipeline.uri, path)
    page.get_by_role("tab", name="Model metrics").click()
    page.wait_for_url(re.compile(rf"/runs/{run_id}/model-metrics"))
    _training_section(screen, pipeline.epochs)
    screen.shot("mlflow-training-curve")
    train = pipeline.steps["train"].info.run_id
    _open(
        screen,
        pipeline.uri,
        f"#/experiments/{pipeline.experiment_id}/runs/{train}/model-metrics"
        f"?workflowType={UI_WORKFLOW}",
    )
    _training_section(screen, pipeline.epochs)
    screen.shot("mlflow-training-curve-train-step")
    assert _mlflow_failures(screen) == []


def test_mlflow_ui_shows_the_champion_its_lineage_and_why_it_was_blessed(
    screen: Screen, pipeline
) -> None:
    page = screen.page
    page.goto(f"{pipeline.uri}/#/models/{MODEL}/versions/{pipeline.version}")
    page.get_by_text("@ champion").first.wait_for()
    aliases = page.get_by_text("Aliases", exact=True).first.locator("xpath=../..").inner_text()
    assert "@ champion" in aliases.replace("\xa0", " "), aliases

    def tag_row(key: str) -> list[str]:
        row = page.get_by_role("row").filter(has=page.get_by_text(key, exact=True))
        assert row.count() == 1, key
        return row.get_by_role("cell").all_inner_texts()

    for key in (*LINEAGE_TAGS, "snapshot_sha256", "blessed", "blessing_reasons"):
        cells = tag_row(key)
        assert cells[:2] == [key, pipeline.tags[key]], (key, cells)
    assert tag_row("blessed")[1] == "true"
    reasons = tag_row("blessing_reasons")[1]
    assert reasons.strip() and "register.min_accuracy" in reasons, reasons  # the rules it met
    assert pipeline.parent.info.run_name in page.inner_text("body")  # the source run
    screen.shot("mlflow-champion")
    assert _mlflow_failures(screen) == []


# --------------------------------------------------------------------------- dvc plots


@pytest.mark.parametrize(
    ("params_file", "out", "charts", "image"),
    [
        ("params.yaml", "dvc_plots", 3, "plots/figures/confusion_matrix.png"),
        ("tasks/digits_gan/params.yaml", "dvc_plots/digits_gan", 4, "plots/digits_gan/figures"),
    ],
)
def test_plots_of_one_pipeline_drawn_offline_each_once(
    screen: Screen, tmp_path, params_file, out, charts, image
) -> None:
    """`paddle-mlops plots` in a fresh clone over the committed plot files: the pipeline's own
    charts (Vega inline) and figures, each once, none of another pipeline's."""
    from tests.conftest import clone_repo

    repo = clone_repo(tmp_path / "repo")
    proc = run_module("components", "plots", "--params", params_file, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    page_file = repo / out / "index.html"
    pipeline = yaml.safe_load((repo / params_file).parent.joinpath("dvc.yaml").read_text())
    titles = [next(iter(p)) for p in pipeline["plots"] if isinstance(p, dict)]
    assert len(titles) == charts
    text = page_file.read_text()
    assert "cdn.jsdelivr" not in text
    with static_server(page_file.parent) as base:
        page = screen.page
        page.goto(f"{base}/index.html")
        drawn = page.locator(".vega-embed .marks")  # the drawn chart (svg or canvas)
        drawn.nth(charts - 1).wait_for()
        assert drawn.count() == charts
        images = page.locator("img")
        sources = [images.nth(i).get_attribute("src") for i in range(images.count())]
        assert len(sources) == len(set(sources)) >= 1  # each figure once
        flat = image.replace("/", "_").replace(".png", "")
        assert all(flat in src for src in sources), sources
        body = page.inner_text("body")
        for title in titles:
            assert title in body
        # another pipeline's plots (their titles) are not on the page
        others = "Adversarial losses" if params_file == "params.yaml" else "Loss per epoch"
        assert others not in body
        screen.shot(f"dvc-plots-{Path(out).name}")
    assert screen.failed == []
