"""harvest: labelled logged traffic back into the training source, through ingest's own path.

What a user relies on: the real server's log of real requests, with labels fed back, becomes
one more unit of the source in the source's own format; ingest then reads it into train (never
into val/test or the pinned holdout), every existing sample keeps its split, a request is
harvested once, a logged input that no stored sample reproduces is left out, and params.yaml
keeps its comments.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from components.core.artifacts import read_json
from components.ml.data import snapshot
from components.ml.data.harvest import AffineImageInverse
from components.ml.serving.server import RunningServer
from components.tasks import get_task
from components.tasks.data import SplitParams
from components.tasks.image_data import builtin_digits, materialize_builtin_digits
from tests.conftest import REPO, run_module, with_model_config

NAME = "digits"


def test_every_digit_comes_back_within_one_grey_level_and_noise_does_not(digits_task):
    """The measured inverse of the task's own preprocessing, checked by preprocessing again:
    plain and inverted digits (what the closed-loop test serves) all come back; inputs that
    are no resized 8x8 image (noise at 28x28) are refused, not guessed."""
    images, _ = builtin_digits()
    raw = images[..., None]
    (x,) = digits_task.preprocess(raw)
    for inputs, truth in ((x, raw), (-x, 255 - raw)):
        samples, ok = digits_task.raw_samples([inputs], raw[0])
        back = np.stack(samples)
        assert ok.all()
        assert np.abs(back.astype(int) - truth).max() <= 1
        # measured 0.83 on every CPU (the resize's uint8 rounding, not the CPU, decides)
        assert (back == truth).all(axis=(1, 2, 3)).mean() >= 0.5
    noise = np.random.default_rng(0).normal(size=x[:64].shape).astype(np.float32)
    assert not digits_task.raw_samples([noise], raw[0])[1].any()


def test_colour_images_stored_larger_than_the_model_input_come_back():
    """A downsizing, 3-channel preprocessing (an image-folder task) is inverted too."""
    task = get_task("image_folder", {"image_size": [40, 32], "mean": [0.4, 0.5, 0.6],
                                     "std": [0.2, 0.25, 0.3]})  # fmt: skip
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:48, 0:40] / 40.0  # 48x40 stored, 40x32 model input
    phase = rng.uniform(0, 2 * np.pi, size=(32, 1, 1, 3))
    scene = np.sin(3 * yy[None, :, :, None] + 2 * xx[None, :, :, None] + phase)
    raw = np.clip(128 + 100 * scene + rng.normal(0, 8, scene.shape), 0, 255).astype(np.uint8)
    (x,) = task.preprocess(raw)
    samples, ok = task.raw_samples([x], raw[0])
    assert ok.mean() >= 0.9, ok.mean()
    again = task.preprocess(np.stack(samples)[ok])[0]
    gain = AffineImageInverse(lambda r: task.preprocess(r)[0], raw.shape[1:]).gain
    assert (np.abs(again - x[ok]) / gain).max() <= 1.001


def _ids(data_dir: Path, split: str) -> set[bytes]:
    return {bytes(k) for k in snapshot.split_keys(data_dir, [split])}


def _sources(data_dir: Path, split: str) -> list[str]:
    batches = snapshot.iter_batches(data_dir, split, batch_rows=4096, columns=["source"])
    return [s for b in batches for s in b.column("source").to_pylist()]


@pytest.fixture
def project(tmp_path: Path) -> dict:
    """A local IDX source (as `make data` writes it) and the shipped params.yaml pointing at
    it, comments and all, ingested once."""
    raw = tmp_path / "raw"
    materialize_builtin_digits(raw)
    text = (REPO / "params.yaml").read_text()
    text = text.replace("source: data/raw/digits ", f"source: {raw} ", 1)
    assert str(raw) in text
    params = tmp_path / "params.yaml"
    params.write_text(text)
    before = tmp_path / "before"
    proc = run_module("components", "ingest", "--params", str(params), "--data", str(before))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {"raw": raw, "params": params, "before": before, "tmp": tmp_path}


def test_logged_labelled_traffic_enters_train_once_and_no_sample_moves(
    server_binary, exported_int8, digits_task, project
):
    tmp, params = project["tmp"], project["params"]
    raw_test, y = digits_task.read_split(project["before"], "test")
    (x,) = digits_task.preprocess(raw_test)
    bundle = with_model_config(exported_int8, tmp / "bundle", log_input_rate=1.0)
    log_dir, labels = tmp / "log", tmp / "labels.jsonl"
    server = RunningServer(
        server_binary, bundle, "fp32", NAME, tmp / "server.log",
        extra_args=[f"--prediction-log-dir={log_dir}"],
    )  # fmt: skip
    server.wait_ready(60)
    sent = {"inverted": 0, "plain": 0}
    try:
        with labels.open("w") as out:
            for n in range(30):  # the world shifts: inverted digits, labelled
                rows = np.arange(4 * n, 4 * n + 4) % len(x)
                rid = f"inverted-{n}"
                server.client.infer(NAME, {"image": -x[rows]}, binary=True, request_id=rid)
                out.write(json.dumps({"id": rid, "labels": y[rows].tolist()}) + "\n")
                sent["inverted"] += 4
            for n in range(10):  # test images as they are: the snapshot holds them already
                rows = np.arange(4 * n, 4 * n + 4) % len(x)
                rid = f"plain-{n}"
                server.client.infer(NAME, {"image": x[rows]}, binary=True, request_id=rid)
                out.write(json.dumps({"id": rid, "labels": y[rows].tolist()}) + "\n")
            for n in range(5):  # no label came back (yet): not harvested
                server.client.infer(NAME, {"image": -x[:4]}, binary=True, request_id=f"nolabel-{n}")
    finally:
        assert server.stop() == 0
    time.sleep(0.1)

    def harvest(name: str, *extra: str):
        return run_module(
            "components", "harvest", "--params", str(params), "--data", str(project["before"]),
            "--log", str(log_dir), "--labels", str(labels), "--name", name,
            "--report", str(tmp / name), *extra,
        )  # fmt: skip

    proc = harvest("w49")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = read_json(tmp / "w49" / "harvest.json")
    assert doc["requests"] == 40 and doc["labelled_requests"] == 40
    # the plain test images are in the snapshot already (their preprocessing is what was
    # sent): left out; the inverted ones are new, but for repeats of one image
    assert doc["in_snapshot"] == 40 and doc["not_recovered"] == 0
    assert doc["samples"] + doc["repeated"] == 120 and doc["samples"] >= 100
    assert "harvest: " in proc.stderr and "(split: train)" in proc.stderr

    # params.yaml: the new IDX pair read, pinned and sent to train; comments kept
    text = params.read_text()
    assert "# hash: a sample's split is a function of its identity alone" in text
    ingest = yaml.safe_load(text)["ingest"]
    pair = ["w49-images-idx3-ubyte", "w49-labels-idx1-ubyte"]
    assert ingest["idx_files"][-1] == pair
    assert ingest["split"]["files"] == {"w49-*": "train"}
    assert set(pair) <= set(ingest["sha256"])

    # ingest again: train grows by exactly the harvest, val and test are the same samples
    after = tmp / "after"
    proc = run_module("components", "ingest", "--params", str(params), "--data", str(after))
    assert proc.returncode == 0, proc.stderr[-2000:]
    before = project["before"]
    for split in ("val", "test"):
        assert _ids(after, split) == _ids(before, split)
        assert not any("w49" in s for s in _sources(after, split))
    grown = _ids(after, "train") - _ids(before, "train")
    assert len(grown) == doc["samples"]
    assert sum("w49" in s for s in _sources(after, "train")) == doc["samples"]
    # what trains is what the model saw: the harvested images preprocess to the logged inputs
    harvested, labels_back = digits_task.read_split(after, "train")
    mask = np.asarray(["w49" in s for s in _sources(after, "train")])
    # every harvested image is an inverted digit that was sent (to one grey level: the
    # resize's rounding), under the label fed back
    sent_raw, sent_y = (255 - raw_test[:120]).astype(int), y[:120]
    for image, label in zip(harvested[mask].astype(int), labels_back[mask], strict=True):
        closest = np.abs(sent_raw - image).reshape(len(sent_raw), -1).max(axis=1)
        assert closest.min() <= 1 and label in sent_y[closest <= 1]

    # a second harvest of the same log finds nothing new and changes nothing
    again = harvest("w50")
    assert again.returncode == 0, again.stderr[-2000:]
    assert read_json(tmp / "w50" / "harvest.json")["samples"] == 0
    assert read_json(tmp / "w50" / "harvest.json")["already_harvested_requests"] == 40
    assert params.read_text() == text and not (project["raw"] / "w50-images-idx3-ubyte").exists()


def test_refusals_are_one_line_and_leave_nothing(project):
    tmp, params = project["tmp"], project["params"]
    (tmp / "log").mkdir()
    (tmp / "labels.jsonl").write_text("")
    base = ["components", "harvest", "--data", str(project["before"]), "--log",
            str(tmp / "log"), "--report", str(tmp / "out")]  # fmt: skip
    builtin = tmp / "builtin.yaml"
    builtin.write_text(
        params.read_text().replace(f"source: {project['raw']} ", "source: builtin:digits ")
    )
    cases = {
        "built-in corpus cannot take harvested data": [
            "--params", str(builtin), "--labels", str(tmp / "labels.jsonl")],
        "--labels is required": ["--params", str(params)],
        "no labels file": ["--params", str(params), "--labels", str(tmp / "missing.jsonl")],
        "--name": ["--params", str(params), "--labels", str(tmp / "labels.jsonl"),
                   "--name", "../x"],
    }  # fmt: skip
    for expected, args in cases.items():
        proc = run_module(*base, *args)
        assert proc.returncode != 0 and expected in proc.stderr, proc.stderr[-1500:]
        assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in project["raw"].iterdir()) == [
        "digits-images-idx3-ubyte",
        "digits-labels-idx1-ubyte",
    ]
    assert not (tmp / "out").exists()


def _text_event(rid: str, texts: list[str]) -> str:
    import base64

    from components.ml.data.prediction_log import EVENT_TYPE

    blob = b"".join(len(t.encode()).to_bytes(4, "little") + t.encode() for t in texts)
    return json.dumps({
        "specversion": "1.0", "id": rid, "type": EVENT_TYPE, "source": "test",
        "time": "2026-12-04T10:00:00Z",
        "data": {"model_name": "m", "model_version": "1", "role": "default", "answered": True,
                 "latency_us": 10, "code": 200, "batch": len(texts),
                 "top1": [0] * len(texts), "confidence": [0.9] * len(texts),
                 "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                             "data_base64": base64.b64encode(blob).decode()}]},
    })  # fmt: skip


def test_texts_a_client_sent_become_a_table_of_the_source(tmp_path):
    """A text client's logged texts (not token ids) go into one more table of the source,
    into train; a text the snapshot holds is left out."""
    src = tmp_path / "reviews"
    src.mkdir()
    rows = [{"text": f"review {i} is {'good' if i % 2 else 'bad'}", "label": i % 2}
            for i in range(200)]  # fmt: skip
    (src / "week1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = tmp_path / "params.yaml"
    params.write_text(
        "task:\n  name: sentiment   # the text task\n"
        f"ingest:\n  source: {src}\n  kind: table\n  files: [week1.jsonl]\n"
    )
    before, after = tmp_path / "before", tmp_path / "after"
    ingest = ["components", "ingest", "--params", str(params), "--data"]
    assert run_module(*ingest, str(before)).returncode == 0
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    new = [f"a new review {i}, much longer than the old ones" for i in range(6)]
    (log_dir / "predictions-20261204T100000Z-h-1-0.jsonl").write_text(
        _text_event("t1", new[:3]) + "\n" + _text_event("t2", [*new[3:], rows[0]["text"]]) + "\n"
    )
    (tmp_path / "labels.jsonl").write_text(
        json.dumps({"id": "t1", "labels": [1, 0, 1]}) + "\n"
        + json.dumps({"id": "t2", "labels": [0, 1, 1, 0]}) + "\n"
    )  # fmt: skip
    proc = run_module(
        "components", "harvest", "--params", str(params), "--data", str(before),
        "--log", str(log_dir), "--labels", str(tmp_path / "labels.jsonl"), "--name", "w2",
        "--report", str(tmp_path / "out"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = read_json(tmp_path / "out" / "harvest.json")
    assert (doc["samples"], doc["in_snapshot"], doc["requests"]) == (6, 1, 2)
    written = [json.loads(line) for line in (src / "w2.jsonl").read_text().splitlines()]
    assert [(r["text"], r["label"]) for r in written] == list(
        zip(new, [1, 0, 1, 0, 1, 1], strict=True)
    )
    conf = yaml.safe_load(params.read_text())["ingest"]
    assert conf["files"] == ["week1.jsonl", "w2.jsonl"]
    assert conf["split"]["files"] == {"w2.jsonl": "train"}
    assert "# the text task" in params.read_text()
    assert run_module(*ingest, str(after)).returncode == 0
    for split in ("val", "test"):
        assert _ids(after, split) == _ids(before, split)
    assert len(_ids(after, "train") - _ids(before, "train")) == 6


def test_images_of_a_folder_source_come_back_as_pngs_of_their_class(tmp_path):
    """An image-folder source gets the harvested images as PNGs in each class folder, in a
    sub-folder of the unit's name that ingest sends to train."""
    from PIL import Image

    from components.ml.data.harvest import update_params
    from components.steps.ingest import run as ingest
    from components.tasks.image_data import IngestParams

    root = tmp_path / "folder"
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        for i in range(30):
            (root / cls).mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(
                root / cls / f"{i:03d}.png"
            )
    task = get_task("image_folder", {"image_size": [32, 32]})
    params = IngestParams(source=str(root), kind="image_folder", image_mode="RGB")
    ingest(params, task, tmp_path / "before")
    new = rng.integers(0, 256, (5, 12, 12, 3), dtype=np.uint8)
    unit = task.data.write_harvest(
        params, "w2", [(f"r/{i}", new[i], i % 2) for i in range(5)], "params.yaml"
    )
    assert unit.samples == 5 and unit.ingest_update == {"split": {"files": {"*/w2/*": "train"}}}
    assert sorted(p.relative_to(root).as_posix() for p in root.glob("*/w2/*.png")) == [
        "cat/w2/r_0-0.png", "cat/w2/r_2-2.png", "cat/w2/r_4-4.png",
        "dog/w2/r_1-1.png", "dog/w2/r_3-3.png",
    ]  # fmt: skip
    np.testing.assert_array_equal(np.asarray(Image.open(root / "dog/w2/r_3-3.png")), new[3])
    conf = tmp_path / "params.yaml"
    conf.write_text(f"ingest:\n  source: {root}\n  kind: image_folder\n  split:\n    files: {{}}\n")
    update_params(conf, unit.ingest_update)
    files = yaml.safe_load(conf.read_text())["ingest"]["split"]["files"]
    ingest(
        IngestParams(source=str(root), kind="image_folder", image_mode="RGB",
                     split=SplitParams(files=files)),
        task, tmp_path / "after",
    )  # fmt: skip
    for split in ("val", "test"):
        assert _ids(tmp_path / "after", split) == _ids(tmp_path / "before", split)
    assert len(_ids(tmp_path / "after", "train") - _ids(tmp_path / "before", "train")) == 5


def test_the_params_harvest_writes_are_loggable_by_mlflow():
    """``split.files`` keys are globs, which MLflow cannot name a parameter: track logs such a
    mapping as one JSON value (the closed-loop test runs track on a real server after a
    harvest)."""
    from mlflow.utils.validation import _validate_param_name

    from components.tracking.step_outputs import flatten

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["ingest"]["split"]["files"] = {"w49-*": "train", "holdout/*": "test"}
    flat = dict(flatten(params))
    for key in flat:
        _validate_param_name(key)
    assert json.loads(flat["ingest.split.files"]) == {"holdout/*": "test", "w49-*": "train"}
    assert flat["ingest.split.method"] == "hash"
