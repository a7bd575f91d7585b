"""harvest: labelled logged traffic into the next training snapshot (opt-in).

Reads the server's prediction log (``--log``) and the labels fed back (``--labels``: JSON
Lines ``{"id": ..., "label": ...}``, or ``"labels": [...]`` for a batch request), and writes
every answered request whose inputs were logged and whose labels came back as a new unit of
the ingest source, in the source's own format (``DataFormat.write_harvest``): an IDX pair, a
folder of PNGs per class, a table. The task turns each logged model input back into the
sample ingest stores (``Task.raw_samples``: an image task inverts its preprocessing and checks
the result reproduces the logged input; a text task takes the text a client sent); an input it
cannot recover is counted and left out, never guessed. So is a sample the snapshot holds
already (as stored, or as the model input it preprocesses to), and a repeat within the unit.

Then ``params.yaml`` (``--params``) is updated in place (comments kept) so ``ingest`` reads the
unit; with ``--split train`` (the default) ``ingest.split.files`` sends all of it to train,
with ``--split hash`` ingest's own rule splits it like any new data. Either way the pinned
holdout (the test split a champion was blessed on, pinned in MLflow) does not change, and no
existing sample changes split. A request is harvested once: the ids of each unit are kept
under ``<source>/.harvested/``. The next ``dvc repro`` (after ``dvc commit data.dvc``, where the
source is tracked) ingests, validates and trains as for any new data. ``harvest.json``
(``--report``) counts what was read, written and left out, and why.

Not a stage of the training DAG: its input is live traffic. The source must be a local
directory (the copy ``data.dvc`` tracks); a built-in corpus or a remote URI is refused.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, write_json
from components.core.config import params_source, section
from components.kernel.step import In, Out, Step, Value
from components.ml.data.dataset import SPLITS
from components.ml.data.harvest import (
    HARVEST_DIR,
    harvested_ids,
    local_source,
    sample_digest,
    update_params,
    write_ids,
)
from components.ml.data.harvest_rows import (
    Selection,
    candidates,
    inputs_digest,
    recovered,
    wanted_digests,
)
from components.ml.data.prediction_log import read_labels
from components.tasks.base import Task
from components.tasks.data import iter_split

log = logging.getLogger(__name__)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _source_root(name: str, split: str, labels_file: str, log_dir: Path, ingest: Any) -> Path:
    """The local source directory the unit goes to, once the arguments are checked."""
    if not NAME.fullmatch(name):
        raise StepError(f"harvest --name {name!r}: letters, digits, '_', '.', '-' (at most 64)")
    if split not in ("train", "hash"):
        raise StepError(f"harvest --split: train or hash, got {split!r}")
    if not labels_file:
        raise StepError("harvest: --labels is required (only labelled traffic is harvested)")
    if not Path(labels_file).is_file():
        raise StepError(f"{labels_file}: no labels file (--labels)")
    if not log_dir.is_dir():
        raise StepError(f"{log_dir}: no prediction log directory (--log)")
    root = local_source(ingest.source, ingest.kind)
    if (root / HARVEST_DIR / f"{name}.ids").exists():
        raise StepError(f"{root}: a unit named {name!r} was harvested already (--name)")
    return root


def run(
    task: Task,
    all_params: Any,
    params_file: str,
    data_dir: str | Path,
    log_dir: str | Path,
    out_dir: str | Path,
    labels_file: str = "",
    name: str = "",
    split: str = "train",
) -> dict[str, Any]:
    data_dir, log_dir, out_dir = Path(data_dir), Path(log_dir), Path(out_dir)
    source = params_source(all_params)
    ingest = section(dict(all_params), "ingest", task.data.ingest_params, source=source)
    name = name or time.strftime("harvest-%Y%m%dT%H%M%SZ", time.gmtime())
    root = _source_root(name, split, labels_file, log_dir, ingest)
    like, _ = task.read_head(data_dir, "train", 1)
    if len(like) == 0:
        raise StepError(f"{data_dir}: the train split is empty; run ingest first (--data)")
    done = harvested_ids(root)
    labels = read_labels(Path(labels_file), log_dir, candidates(log_dir, done))
    names = [s.name for s in task.input_specs()]
    # pass 1: digests of what would be written; pass 2: those the snapshot already holds,
    # as stored samples or as the model inputs they preprocess to (a client preprocessing
    # as the task does sends exactly those); pass 3: the rest is written
    wanted_raw, wanted_inputs = wanted_digests(recovered(log_dir, labels, names, task, like[0]))
    known_raw, known_inputs = _in_snapshot(task, data_dir, wanted_raw, wanted_inputs)
    selection = Selection()
    items = recovered(log_dir, labels, names, task, like[0])
    rows = selection.rows(items, known_raw, known_inputs)
    unit = task.data.write_harvest(ingest, name, rows, params_file)
    counts = selection.counts
    update = unit.ingest_update
    if split == "hash":  # ingest's own rule splits the unit like any new data
        update = {k: v for k, v in update.items() if k != "split"}
    doc: dict[str, Any] = {
        "name": name,
        "source": ingest.source,
        "split": split,
        "already_harvested_requests": len(done),
        "labelled_requests": len(labels),
        **counts,
        "files": unit.files,
        "ingest_update": update if unit.samples else {},
    }
    if unit.samples:
        update_params(params_file, update)
        log.info(
            "harvest: %d labelled logged samples of %d requests -> %s under %s (split: %s); "
            "left out: %d not recovered, %d already in the snapshot, %d repeated; %s updated",
            unit.samples, counts["requests"], ", ".join(unit.files), ingest.source, split,
            counts["not_recovered"], counts["in_snapshot"], counts["repeated"], params_file,
        )  # fmt: skip
    else:
        log.warning("harvest: nothing new to harvest from %s", log_dir)
    write_ids(root, name, selection.taken)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "harvest.json", doc)
    return doc


def _in_snapshot(
    task: Task, data_dir: Path, raw: set[bytes], inputs: set[bytes]
) -> tuple[set[bytes], set[bytes]]:
    """Which of the ``raw`` sample digests and of the model ``inputs`` digests the snapshot
    already holds, in any split (streamed; the samples preprocessed batch by batch)."""
    found_raw: set[bytes] = set()
    found_inputs: set[bytes] = set()
    if not raw:
        return found_raw, found_inputs
    for split in SPLITS:
        for samples, _ in iter_split(task.data, data_dir, split, 1024):
            found_raw.update(d for d in map(sample_digest, samples) if d in raw)
            if inputs:
                arrays = task.preprocess(samples)
                digests = (inputs_digest(arrays, i) for i in range(len(samples)))
                found_inputs.update(d for d in digests if d in inputs)
    return found_raw, found_inputs


STEP = Step(
    name="harvest",
    doc=__doc__,
    params=None,
    sections=("task", "ingest"),
    run=run,
    inputs=(
        In("data", "outputs/ingest", "data_dir", help="the current snapshot (a stored sample)"),
        In("log", ".deploy/predictions", "log_dir", help="the server's prediction log dir"),
    ),
    outputs=(Out("report", "outputs/harvest", "out_dir", help="harvest.json"),),
    values=(
        Value("labels", "labels_file", "", help="fed-back labels, JSON Lines {id, label}"),
        Value("name", "name", "", help="the unit's name (default: harvest-<UTC time>)"),
        Value(
            "split",
            "split",
            "train",
            help="train: every harvested sample trains (ingest.split.files); hash: ingest's "
            "rule splits them like any new data. Either way the pinned holdout is untouched",
        ),
    ),
)
