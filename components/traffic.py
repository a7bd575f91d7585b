"""``paddle-mlops traffic`` (``make traffic``): held-out samples to the served model.

Sends ``--samples`` samples of the pipeline's snapshot (``--split``, default ``test``: never
trained on) to the server ``deploy`` started on this machine (``outputs/deploy/deployment.json``
of the pipeline of ``--params``), ``--batch`` samples a KServe v2 request, each request with an
id, so the server's prediction log holds answers ``paddle-mlops monitor`` can judge. The true
labels are appended to ``local_state_dir/labels.jsonl`` (``{"id": ..., "labels": [...]}``, the
label feedback ``monitor --labels`` joins on the ids).

Also the example request of ``make run``'s summary (:func:`write_request`): one held-out
sample as a JSON KServe v2 request, for ``curl -d @FILE``.
"""

from __future__ import annotations

import argparse
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import StepError, read_json, write_text
from components.core.config import load_params, section
from components.kernel.cli import run_cli
from components.kernel.dvc import pipeline_path
from components.kernel.step import load
from components.ml.serving.kserve_client import KServeClient, encode_request
from components.tasks import task_from_params

log = logging.getLogger(__name__)

LABELS_FILE = "labels.jsonl"
REQUEST_FILE = "request.json"


@dataclass(frozen=True)
class Served:
    """What the pipeline of ``params_file`` serves on this machine, from its records."""

    params_file: str
    model: str
    version: int
    url: str
    state_dir: Path  # deploy.local_state_dir
    data_dir: Path  # the pipeline's snapshot (outputs/ingest)


def deployment_path(params_file: str) -> Path:
    return Path(pipeline_path("outputs/deploy", params_file)) / "deployment.json"


def served(params_file: str) -> Served:
    """The served model, or one error line saying why there is none."""
    path = deployment_path(params_file)
    if not path.is_file():
        raise StepError(f"{path}: no deployment record: run the pipeline first (make run)")
    record = read_json(path)
    local = record.get("local") or {}
    if not record.get("deployed") or not local.get("url"):
        why = str(record.get("refused") or "").splitlines()[0:1]
        raise StepError(
            f"{path}: nothing is served on this machine (deploy.target {record.get('target')}"
            f"{': ' + why[0] if why else ''}); deploy.target local serves the champion"
        )
    params = load_params(params_file)
    state = Path(section(params, "deploy", load("deploy").params).local_state_dir)
    return Served(
        params_file,
        str(record["model"]),
        int(record["version"]),
        str(local["url"]),
        state,
        Path(pipeline_path("outputs/ingest", params_file)),
    )


def text_input(target: Served) -> str | None:
    """The raw-text input the served model declares (its metadata's ``text_inputs``: the
    server tokenizes), or None (a model fed its tensors, or a server that does not answer)."""
    try:
        meta = KServeClient(target.url, timeout=10).metadata(target.model)
    except Exception:  # noqa: BLE001 - not answering: send() says so; a request file still helps
        return None
    names = [str(t.get("name")) for t in meta.get("text_inputs") or [] if t.get("name")]
    return names[0] if names else None


def held_out(
    params_file: str, data_dir: Path, split: str, count: int, text: str | None = None
) -> tuple[dict, Any]:
    """The first ``count`` samples of ``split`` (repeated when it holds fewer) as the
    model's named inputs, or as the raw samples under ``text`` (a text model's server
    tokenizes them itself), and their labels."""
    task = task_from_params(load_params(params_file))
    if not (data_dir / "snapshot.json").is_file():
        raise StepError(f"{data_dir}: no snapshot (the pipeline's ingest output)")
    if text is not None:
        raw, labels = task.read_head(data_dir, split, count)
        inputs, names = [np.asarray(raw, dtype=object)], [text]
    else:
        inputs, labels = task.eval_head(data_dir, split, count)
        names = [spec.name for spec in task.input_specs()]
    if len(labels) == 0:
        raise StepError(f"{data_dir}: the {split} split holds no samples")
    take = np.arange(count) % len(labels)
    return {n: np.asarray(x)[take] for n, x in zip(names, inputs, strict=True)}, labels[take]


def write_request(target: Served, split: str = "test") -> Path:
    """One held-out sample as a JSON KServe v2 request (for ``curl -d @file``)."""
    inputs, _ = held_out(target.params_file, target.data_dir, split, 1, text_input(target))
    body, _ = encode_request(inputs, request_id=f"example-{split}-0")
    path = target.state_dir / REQUEST_FILE
    write_text(path, body.decode("utf-8") + "\n")
    return path


def send(target: Served, split: str, samples: int, batch: int) -> dict[str, Any]:
    """``samples`` held-out samples in requests of ``batch``; their labels fed back."""
    inputs, labels = held_out(
        target.params_file, target.data_dir, split, samples, text_input(target)
    )
    client = KServeClient(target.url, timeout=60)
    if not client.ready():
        raise StepError(
            f"{target.url} does not answer: the server deploy started is not running "
            "(make run starts it again; make stop stopped it)"
        )
    run = uuid.uuid4().hex[:8]
    lines, requests = [], 0
    for start in range(0, samples, batch):
        rows = slice(start, start + batch)
        rid = f"traffic-{run}-{requests}"
        client.infer(target.model, {n: x[rows] for n, x in inputs.items()}, request_id=rid)
        lines.append(json.dumps({"id": rid, "labels": labels[rows].tolist()}))
        requests += 1
    target.state_dir.mkdir(parents=True, exist_ok=True)
    labels_path = target.state_dir / LABELS_FILE
    with labels_path.open("a", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    return {"samples": samples, "requests": requests, "labels": str(labels_path)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="paddle-mlops traffic",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--params", default="params.yaml", help="params file (%(default)s)")
    parser.add_argument("--samples", type=int, default=300, help="samples sent (%(default)s)")
    parser.add_argument("--batch", type=int, default=4, help="samples a request (%(default)s)")
    parser.add_argument("--split", default="test", help="held-out split (%(default)s)")
    args = parser.parse_args(argv)

    def _go() -> None:
        if args.samples < 1 or args.batch < 1:
            raise StepError("traffic: --samples and --batch must be >= 1")
        target = served(args.params)
        sent = send(target, args.split, args.samples, args.batch)
        log.info(
            "sent %d %s samples in %d requests to %s v%d at %s; labels appended to %s",
            sent["samples"], args.split, sent["requests"], target.model, target.version,
            target.url, sent["labels"],
        )  # fmt: skip

    return run_cli(_go)
