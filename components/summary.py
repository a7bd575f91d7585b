"""``paddle-mlops summary`` (the end of ``make run``): what the pipeline that ran made, where it
is served, and what to open next, in at most 25 lines of at most 120 characters.

Read from the committed outputs of the pipeline of ``--params`` (its ``metrics/*.json``, the
``outputs/*/`` records and the deployment record), never recomputed; a missing piece is said
("missing: ..."), not skipped. With a served model it writes one held-out sample as a KServe v2
request (``local_state_dir/request.json``) and prints the ``curl`` that sends it.

``--metrics-files`` prints the metrics files of that pipeline's ``dvc.yaml`` instead (``make
metrics``: ``dvc metrics show`` of exactly those); ``--monitor-command`` prints the
``paddle-mlops monitor`` command for the served model and the traffic ``make traffic`` sent
(``make monitor`` runs it).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from components.core import overrides
from components.core.artifacts import StepError, read_json
from components.core.config import load_params, section
from components.kernel.cli import run_cli
from components.kernel.dvc import dvc_yaml_path, pipeline_name, pipeline_path
from components.kernel.step import REPO, load
from components.traffic import LABELS_FILE, served, write_request

MAX_LINES = 25
MAX_WIDTH = 120
MLFLOW_UI = "http://127.0.0.1:5000"


def metrics_files(params_file: str) -> list[str]:
    """The metrics files the stages of the pipeline's ``dvc.yaml`` write (repo-relative)."""
    dvc_yaml = dvc_yaml_path(params_file)
    if not dvc_yaml.is_file():
        raise StepError(f"{dvc_yaml}: no such pipeline (the dvc.yaml of {params_file})")
    doc = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")) or {}
    files = []
    for stage in (doc.get("stages") or {}).values():
        wdir = dvc_yaml.parent / str(stage.get("wdir", "."))
        for entry in stage.get("metrics") or []:
            name = next(iter(entry)) if isinstance(entry, dict) else str(entry)
            path = (wdir / name).resolve().relative_to(Path.cwd().resolve())
            files.append(path.as_posix())
    return files


def _json(path: str, missing: list[str]) -> dict[str, Any]:
    if not Path(path).is_file():
        missing.append(path)
        return {}
    return read_json(path)


def _num(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:.4f}" if isinstance(value, float) and abs(value) < 10 else f"{value:g}"


def _cli() -> str:
    """How this checkout's CLI is run without an activated venv."""
    exe = Path(sys.executable).parent / "paddle-mlops"
    try:
        return exe.relative_to(Path.cwd()).as_posix() if exe.exists() else "paddle-mlops"
    except ValueError:
        return "paddle-mlops"


def monitor_command(params_file: str) -> str:
    """``paddle-mlops monitor`` on the served model's log and the labels ``traffic`` fed back."""
    # the deploy section typed by the step's params model (imported here: only this needs it)
    deploy = section(load_params(params_file), "deploy", load("deploy").params)
    state = Path(deploy.local_state_dir)
    args = [_cli(), "monitor"]
    if pipeline_name(params_file) is not None:
        args += ["--params", params_file]
        for flag, port in (("--bundle", "package"), ("--data", "ingest"), ("--report", "monitor")):
            args += [flag, pipeline_path(f"outputs/{port}", params_file)]
    args += ["--log", (state / "predictions").as_posix()]
    args += ["--labels", (state / LABELS_FILE).as_posix()]
    return shlex.join(args)


def _task_line(params_file: str, task: str, evaluation: dict[str, Any]) -> str:
    shown = [
        f"{k} {_num(v)}"
        for k, v in evaluation.items()
        if isinstance(v, int | float) and not k.startswith(("latency", "baseline", "samples"))
    ][:3]
    samples = evaluation.get("samples")
    where = f"test ({samples} samples)" if samples else "test"
    return f"{where}: " + (", ".join(shown) or "no metrics")


def lines(params_file: str) -> list[str]:
    """The summary (module docstring)."""
    params = load_params(params_file)
    task = str((params.get("task") or {}).get("name", "?"))
    missing: list[str] = []
    out = lambda port: pipeline_path(f"outputs/{port}", params_file)  # noqa: E731
    metric = lambda name: pipeline_path(f"metrics/{name}.json", params_file)  # noqa: E731
    evaluation = _json(metric("evaluate"), missing)
    qat = _json(metric("qat"), missing)
    validate = _json(f"{out('validate')}/summary.json", missing)
    blessing = _json(f"{out('register')}/blessing.json", missing)
    infra = _json(f"{out('serving_image')}/infra.json", missing)
    promotion = _json(f"{out('promote')}/promotion.json", missing)
    deployment = _json(f"{out('deploy')}/deployment.json", missing)
    tracked = _json(f"{out('track')}/run.json", missing)

    version = promotion.get("version", "?")
    champion = deployment.get("version")
    text = [
        f"== {task} (dvc repro {dvc_yaml_path(params_file).relative_to(REPO).as_posix()}) ==",
        f"model {promotion.get('model', '?')}: this run registered v{version}"
        + (", promoted to champion" if promotion.get("promoted") else ", not promoted")
        + (f"; champion v{champion}" if champion is not None else ""),
    ]
    if evaluation:
        text.append(_task_line(params_file, task, evaluation))
    text += _hpo_lines(Path(out("hpo")))
    if qat.get("fp32_only") or qat.get("int8_available") is False:
        text.append("int8: none shipped (fp32 only: its gate did not pass); the bundle serves fp32")
    elif qat:
        text.append(
            f"int8: accuracy {_num(qat.get('accuracy'))} (fp32 {_num(qat.get('fp32_accuracy'))}),"
            f" size x{_num(qat.get('size_ratio'))}, latency b1 x{_num(qat.get('latency_ratio_b1'))}"
            f" b64 x{_num(qat.get('latency_ratio_b64'))} of fp32"
        )
    gates = []
    if validate:
        gates.append(f"data {'pass' if not validate.get('failed') else 'FAIL'}")
    if qat:
        gates.append(f"int8 {'pass' if qat.get('gate_passed') else 'fail'}")
    if infra:
        gates.append(f"server {'pass' if infra.get('infra_validated') else 'FAIL'}")
    if blessing:
        gates.append(f"blessed {'yes' if blessing.get('blessed') else 'no'}")
    if gates:
        text.append("gates: " + ", ".join(gates))
    reasons = [str(r) for r in blessing.get("reasons") or []] if not blessing.get("blessed") else []
    text += [f"  not blessed: {r}" for r in reasons[:2]]
    text += _served_lines(params_file, deployment)
    text.append("next:")
    # MLflow 3's UI lands on its GenAI view unless the URL asks for the training runs
    ui_path = str(tracked.get("experiment_ui_path") or "")
    text.append(f"  make mlflow-ui               {MLFLOW_UI}/{ui_path}")
    docs = Path(out("validate")) / str(validate.get("data_docs") or "data_docs/index.html")
    text.append(f"  data docs                    {docs.as_posix()}")
    task_arg = "" if pipeline_name(params_file) is None else f" TASK={pipeline_name(params_file)}"
    if deployment.get("deployed") and (deployment.get("local") or {}).get("url"):
        text.append(f"  make traffic{task_arg:<17}held-out samples to the served model")
        text.append(f"  make monitor{task_arg:<17}drift and live accuracy of what it answered:")
        text += _wrap(monitor_command(params_file), "    ")
        text.append(f"  make stop{task_arg:<20}stop the server")
    if missing:
        text.append("missing: " + ", ".join(missing))
    return [_fit(line) for line in text][:MAX_LINES]


def _hpo_lines(hpo_dir: Path) -> list[str]:
    """The search's decision when it ran (``hpo.enabled``; ``decision.yaml``): what train used
    and why."""
    try:
        decision = yaml.safe_load((hpo_dir / overrides.DECISION).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(decision, dict) or not decision.get("study"):
        return []  # the search was off
    if decision.get("adopted"):
        sets = " ".join(f"{k}={v}" for k, v in (decision.get("winner_params") or {}).items())
        return [f"hpo: train used trial {decision.get('trial')} of {decision['study']}: {sets}"]
    return [str(decision.get("reason") or "hpo: kept current params")]


def _served_lines(params_file: str, deployment: dict[str, Any]) -> list[str]:
    if not deployment:
        return ["served: nothing (no deployment record)"]
    local = deployment.get("local") or {}
    if not deployment.get("deployed") or not local.get("url"):
        why = " ".join(s.strip(" -") for s in str(deployment.get("refused") or "").splitlines())
        target = deployment.get("target")
        return [f"served: nothing (deploy.target {target}" + (f"; {why})" if why else ")")]
    target = served(params_file)
    request = write_request(target)
    url = f"{target.url}/v2/models/{target.model}/infer"
    return [
        f"served: {target.model} v{target.version} at {target.url}",
        f"  pid file {_rel(Path(local.get('pid_file', '-')))}, "
        f"log {_rel(Path(local.get('log_file', '-')))}",
        "  a held-out test sample (KServe v2 infer):",
        f"  curl -d @{_rel(request)} {url}",
    ]


def _wrap(command: str, indent: str) -> list[str]:
    """``command`` over lines of at most MAX_WIDTH (shell continuations)."""
    out, line = [], indent
    for word in command.split(" "):
        if len(line) + len(word) + 2 > MAX_WIDTH and line.strip():
            out.append(line.rstrip() + " \\")
            line = indent + "  "
        line += word + " "
    return [*out, line.rstrip()]


def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _fit(line: str) -> str:
    return line if len(line) <= MAX_WIDTH else line[: MAX_WIDTH - 3] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="paddle-mlops summary",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--params", default="params.yaml", help="params file (%(default)s)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--metrics-files", action="store_true", help="print the metrics files")
    what.add_argument("--monitor-command", action="store_true", help="print the monitor command")
    args = parser.parse_args(argv)

    def _go() -> None:
        if args.metrics_files:
            text = metrics_files(args.params)
        elif args.monitor_command:
            text = [monitor_command(args.params)]
        else:
            text = lines(args.params)
        sys.stdout.write("\n".join(text) + "\n")

    return run_cli(_go)
