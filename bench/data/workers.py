"""The measurements that each run in a fresh process of the benchmark
(``bench/data_bench.py --worker decode|ingest|reader ARGS``, :func:`call_worker`), timed inside
it after the imports: the bare decode loop, the ingest step, the streaming reader and the
train step."""

from __future__ import annotations

import io
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.data.common import CLASSES, REPO, env
from bench.data.corpus import image_files

ENTRY = REPO / "bench" / "data_bench.py"  # the script whose --worker mode call_worker runs


def _decode_chunk(paths: list[str]) -> int:
    from PIL import Image

    for p in paths:
        with open(p, "rb") as fh:
            blob = fh.read()
        np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"), dtype=np.uint8)
    return len(paths)


def worker_decode(source: Path, workers: int, chunk: int) -> dict[str, Any]:
    """The limit: decode every image of ``source`` on a pool of ``workers`` (timed here)."""
    started = time.perf_counter()
    files = [str(f) for f in image_files(source)]
    chunks = [files[i : i + chunk] for i in range(0, len(files), chunk)]
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            n = sum(pool.imap(_decode_chunk, chunks))
    else:
        n = sum(_decode_chunk(c) for c in chunks)
    return {"seconds": time.perf_counter() - started, "images": n}


def worker_ingest(params_file: Path, out: Path) -> dict[str, Any]:
    """``components.steps.ingest`` on ``params_file`` into ``out``, timed after the imports."""
    from components.core.config import load_params
    from components.kernel.step import load
    from components.tasks import task_from_params

    step = load("ingest")
    params = load_params(params_file)
    task_from_params(params)  # imports the task (paddle) before the clock starts
    started = time.perf_counter()
    step.call(params, {"data": out})
    seconds = time.perf_counter() - started
    doc = json.loads((out / "snapshot.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    return {
        "seconds": seconds,
        "rows": sum(s["rows"] for s in doc["shards"]),
        "units": len(doc["units"]),
        "units_reused": int(manifest["units_reused"]),
        "shards": len(doc["shards"]),
    }


def reader_pass(
    task: Any, data: Path, batch: int
) -> tuple[int, float, tuple[np.ndarray, np.ndarray]]:
    """One pass of ``iter_split`` (+ ``task.preprocess``) over the train split of ``data``:
    the samples read, the seconds, and the first full training batch."""
    from components.tasks.data import iter_split

    # a shard holds one unit's rows of one split, so iter_split's batches end at shard ends
    # (often below batch_rows): the first full training batch is gathered across them
    first: tuple[np.ndarray, np.ndarray] | None = None
    gather: list[tuple[np.ndarray, np.ndarray]] = []
    n = 0
    started = time.perf_counter()
    for samples, labels in iter_split(task.data, data, "train", batch_rows=batch):
        (x,) = task.preprocess(samples)
        n += len(labels)
        if first is None:
            gather.append((x, labels))
            if sum(len(g[1]) for g in gather) >= batch:
                first = (
                    np.concatenate([g[0] for g in gather])[:batch],
                    np.concatenate([g[1] for g in gather])[:batch],
                )
    reader_s = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"{data}: the train split has fewer than {batch} samples")
    return n, reader_s, first


def train_seconds(task: Any, first: tuple[np.ndarray, np.ndarray], steps: int) -> float:
    """Seconds of ``steps`` resnet18 training steps (Adam, cross-entropy) on the batch
    ``first``, after 3 warm-up steps."""
    import paddle
    import paddle.nn.functional as F

    paddle.seed(0)
    model = task.build_model(len(CLASSES))
    model.train()
    opt = paddle.optimizer.Adam(parameters=model.parameters(), learning_rate=1e-3)
    x, y = paddle.to_tensor(first[0]), paddle.to_tensor(first[1])

    def one_step() -> None:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
        float(loss)  # wait for the step

    for _ in range(3):
        one_step()
    started = time.perf_counter()
    for _ in range(steps):
        one_step()
    return time.perf_counter() - started


def worker_reader(params_file: Path, data: Path, batch: int, steps: int) -> dict[str, Any]:
    """The streaming reader's samples/s against resnet18's training samples/s."""
    import paddle  # noqa: F401  (imported first, as the train step does)

    from components.tasks import get_task

    params = yaml.safe_load(params_file.read_text())
    task = get_task("image_folder", params["task"]["options"])
    n, reader_s, first = reader_pass(task, data, batch)
    loader = loader_rate(task, data, params["train"], batch)
    train_s = train_seconds(task, first, steps)
    return {
        "reader_samples": n,
        "reader_seconds": reader_s,
        "reader_samples_per_s": n / reader_s,
        "train_steps": steps,
        "batch_size": batch,
        "train_seconds": train_s,
        "train_samples_per_s": steps * batch / train_s,
        "loader": loader,
    }


def loader_rate(task: Any, data: Path, train: dict[str, Any], batch: int) -> dict[str, Any] | None:
    """Samples/s of the train step's own input pipeline, where it has one
    (``components.tasks.stream``: pieces read and preprocessed by ``train.loader_workers``
    DataLoader processes, a shuffle buffer, batches): one pass over the train split. None
    where the module is not there; its error where its API differs."""
    try:
        from components.ml.data import snapshot
        from components.tasks.stream import SnapshotData, StreamSettings
    except ImportError:
        return None
    given = {
        "shuffle_buffer": train.get("shuffle_buffer"),
        "piece_rows": train.get("piece_rows"),
        "workers": train.get("loader_workers"),
    }
    try:
        settings = StreamSettings(**{k: v for k, v in given.items() if v is not None})
        stream = SnapshotData(snapshot.load(data), task, settings)
        n = 0
        started = time.perf_counter()
        for item in stream.batches(batch, (int(train.get("seed", 0)),)):
            n += len(item.labels)
        seconds = time.perf_counter() - started
    except Exception as exc:  # an API of another shape: reported, never fatal
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "samples": n,
        "seconds": seconds,
        "samples_per_s": n / seconds,
        "settings": asdict(settings),
    }


def memory_batches(
    arrays: tuple[list[np.ndarray], np.ndarray, np.ndarray],
    share: Any,
    rng: np.random.Generator,
) -> Any:
    """The in-memory path: one epoch of batches of the preprocessed split held whole (a
    permutation cut into the plan's batch sizes, each batch a fancy index of the arrays)."""
    from components.tasks.stream import InputBatch

    inputs, labels, keys = arrays
    order = rng.permutation(len(labels))[: share.used]
    start = 0
    for step in range(share.steps):
        idx = order[start : start + share.batch(0, step)]
        start += len(idx)
        yield InputBatch([x[idx] for x in inputs], labels[idx], keys[idx])


def worker_train_vs_memory(params_file: Path, data: Path, epochs: int) -> dict[str, Any]:
    """The train step's epochs reading shards (its own input pipeline: ``Inputs``, the loader,
    the shuffle buffer, ``Trainer.epoch``) against the same model trained on the same split
    preprocessed once and held in memory, epoch by epoch alternately in this process; each
    side its own freshly built model (same seed). Validation is not run on either side."""
    import paddle

    from components.core.config import load_params
    from components.ml.data import dataset, snapshot
    from components.ml.training import training
    from components.ml.training.distributed import EpochShare, World
    from components.steps.train import TrainParams
    from components.tasks import epochs as run_epochs
    from components.tasks import stream, task_from_params
    from components.tasks.trainer import Inputs, Trainer

    doc = load_params(params_file)
    task = task_from_params(doc)
    params = TrainParams(**{**doc["train"], "epochs": epochs})
    world = World()
    paddle.set_device("cpu")
    amp = training.resolve_amp("off", params.amp_dtype, "cpu")
    snap = snapshot.load(data)
    num_classes = len(dataset.read_label_names(data))
    task.fit_preprocessing(stream.SnapshotData(snap, task, params.stream()))
    batching = training.resolve_batching(
        params.distributed, params.batch_size, params.learning_rate, world
    )
    share = run_epochs.epoch_share(snap, batching, world, data, params.max_steps_per_epoch)

    def trainer() -> Trainer:
        return Trainer.build(params, task, num_classes, amp, share.steps, batching, "cpu")

    # the in-memory side: the split preprocessed once, whole (a bench may; a step may not)
    held: list[list[np.ndarray]] = []
    labels, keys = [], []
    for batch in stream.SnapshotData(snap, task, params.stream()).samples():
        held.append(task.preprocess(batch.samples))
        labels.append(batch.labels)
        keys.append(np.frombuffer(batch.keys.tobytes(), np.uint8).reshape(-1, stream.KEY_BYTES))
    arrays = (
        [np.concatenate(parts) for parts in zip(*held, strict=True)],
        np.concatenate(labels),
        np.concatenate(keys),
    )
    # warm-up, untimed: paddle's first steps (kernels, allocator) on a throwaway model
    warm = trainer()
    warm_share = EpochShare(min(share.used, 5 * params.batch_size), params.batch_size, 1)
    rng = np.random.default_rng(0)
    warm.epoch(task, memory_batches(arrays, warm_share, rng), warm_share, rng, world)
    mem, shards = trainer(), trainer()
    # the train step keeps its piece cache under its checkpoint dir: a fresh one here, so the
    # first epoch reads and preprocesses every piece as a fresh run does
    scratch = tempfile.TemporaryDirectory(prefix="train-vs-memory-")
    cache_dir = Path(scratch.name) / "pieces"
    inputs = Inputs.build(snap, task, params, share, world, shards.objective, cache_dir)
    times: dict[str, list[float]] = {"memory": [], "shards": []}
    reader = inputs.reader(range(1, epochs + 1), val=False)
    try:
        for epoch in range(1, epochs + 1):
            # alternately first: neither side always runs after the other
            for side in ("memory", "shards")[:: 1 if epoch % 2 else -1]:
                paddle.seed(params.seed * 1000 + epoch)
                rng = np.random.default_rng([params.seed, epoch, 0])
                started = time.perf_counter()
                if side == "memory":
                    batches = memory_batches(arrays, share, rng)
                    mem.epoch(task, batches, share, rng, world, epoch)
                else:
                    shards.epoch(task, inputs.batches(reader, epoch, rng), share, rng, world, epoch)
                times[side].append(time.perf_counter() - started)
    finally:
        reader.close()
        scratch.cleanup()
    rates = {side: share.used * epochs / sum(t) for side, t in times.items()}
    return {
        "task": task.name,
        "samples_per_epoch": share.used,
        "epochs": epochs,
        "batch_size": params.batch_size,
        "stream": asdict(params.stream()),
        "epoch_seconds": times,
        "memory_samples_per_s": rates["memory"],
        "shards_samples_per_s": rates["shards"],
        "train_vs_memory": rates["shards"] / rates["memory"],
    }


def call_worker(kind: str, *args: str) -> dict[str, Any]:
    """Run one of the worker modes of the benchmark (``bench/data_bench.py --worker KIND``) in
    a fresh process; its JSON answer."""
    proc = subprocess.run(
        [sys.executable, str(ENTRY), "--worker", kind, *args],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=6 * 3600,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).splitlines()[-15:]
        raise RuntimeError(f"worker {kind} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_worker(kind: str, a: Sequence[str]) -> dict[str, Any]:
    """``--worker KIND ARGS``: one measurement in this process (see :func:`call_worker`)."""
    if kind == "decode":
        return worker_decode(Path(a[0]), int(a[1]), int(a[2]))
    if kind == "ingest":
        return worker_ingest(Path(a[0]), Path(a[1]))
    if kind == "train_vs_memory":
        return worker_train_vs_memory(Path(a[0]), Path(a[1]), int(a[2]))
    return worker_reader(Path(a[0]), Path(a[1]), int(a[2]), int(a[3]))
