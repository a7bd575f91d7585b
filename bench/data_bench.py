"""Data layer benchmark: memory as the data set grows, ingest vs bare decoding, the streaming
reader vs the train step, incremental ingest. Every ratio is measured side by side in one run.

Data: generated image folders of RGB 64x64 JPEGs, 10 classes (noise plus a class-dependent
shape: 5 shapes x 2 colours at random places and sizes, so a model learns something),
deterministic from ``--seed`` (image i of class c depends only on (seed, c, i)). They are
cached under ``--cache-dir`` (build/bench-data) and reused between runs: one generated
folder per resolution, and one folder per size made of hard links to its first images.

1. **Peak RSS per step and size** (``--sizes``: 2,000, 8,000 and 32,000 images). For each
   size the real CLI runs each step as its own process, exactly as dvc.yaml calls it
   (``python -m components ingest|validate|train|export|evaluate --params <generated>``;
   task ``image_folder``, resnet18 at 64x64, ``ingest.kind: image_folder``, ``image_mode:
   RGB``; train 1 epoch at ``--batch-size``). Evaluate scores the export directly
   (``--bundle`` = the export's output: it holds the fp32 program evaluate runs); qat and
   package are not run (evaluate reads only the fp32 model from the bundle). Each step's
   memory is read two ways: **max RSS**, the kernel's high-water mark of the largest single
   process of the step (``wait4`` rusage: what ``/usr/bin/time -v`` prints as "Maximum
   resident set size"; ingest's pool workers are included, they are waited for), and **tree
   RSS**, the peak of the summed RSS of the step's process tree, sampled every 50 ms
   (psutil). ``rss_growth_16x`` = the worst step's max RSS at the largest size over the
   smallest (32k/2k: 16x the data); export is shown but is not one of the four steps of the
   goal (ingest, validate, train, evaluate).
2. **Ingest vs bare decode** at ``--throughput-size`` (default: the largest size), both with
   ``--workers`` processes: (a) ``components.steps.ingest.run`` (``ingest.workers`` = N) into a
   fresh directory; (b) a ``multiprocessing`` spawn pool of N doing only the decode of the
   same files (read bytes, ``PIL.Image.open(...).convert("RGB")``, ``np.asarray``) in
   chunks of ``ingest.unit_files`` files. Each runs in its own fresh process and is timed
   *inside* it, from after the imports (``components.steps.ingest``, the task: paddle) to the
   end: Python start-up and imports are not ingest work. Pool start-up (spawn) is inside
   both timings, as it is part of the work. ``--repeats`` rounds, decode and ingest
   alternating; ``ingest_vs_decode`` = the median of the rounds' decode_time / ingest_time.
3. **Reader vs train step**, in one fresh process on the snapshot of ``--reader-size``
   (default 8,000), one pass over the train split each: (a) ``components.tasks.data.
   iter_split`` (``batch_rows`` = the batch size) with each batch through
   ``task.preprocess``, in this process; (b) the train step's own input pipeline where it
   has one (``components.tasks.stream.SnapshotData(...).batches``: ``train.loader_workers``
   DataLoader processes, the shuffle buffer, with the params' ``train`` settings); (c) the
   train step's samples/s (resnet18 at 64x64, Adam, cross-entropy: forward, backward and
   optimizer step on real preprocessed batches of ``--batch-size``, after 3 warm-up steps,
   ``--train-steps`` timed, paddle's default threads). ``reader_vs_train`` = (b) / (c), or
   (a) / (c) where there is no (b). The train step's own ``metrics/train.json`` figures
   (``reader_samples_per_second``, ``samples_per_second``) are printed beside it.
4. **Incremental ingest** at ``--incremental-size`` (default: the largest size): a folder
   linking the first N images is ingested in full (timed as in 2.), then +10% new images
   arrive as a new dated sub-folder per class (``<class>/2026-12-03/*.jpg``) and ingest runs
   again into the SAME output directory (unchanged units reuse their shards).
   ``incremental_ingest`` = time(incremental) / time(full). The bench asserts (and prints)
   that every shard of the old snapshot is in the new one under the same path with the same
   sha256, its bytes hashed again, and that every old sample (key) is in the same split.
5. ``--big``: 100,000 RGB 224x224 images (not in CI, not by default): ingest and validate
   (``--big-steps``) with their peak RSS; ``rss_100k_224_mb`` = the largest. Train and
   evaluate need a params knob that bounds them (a full ResNet epoch at 224^2 takes hours on
   2 cores): add them to ``--big-steps`` with ``--big-set train.<knob>=<n>`` once it exists.

    .venv/bin/python bench/data_bench.py                # 2k/8k/32k (make bench-data)
    .venv/bin/python bench/data_bench.py --quick        # 500/2000 images: a CI smoke run
    .venv/bin/python bench/data_bench.py --big          # + 100k RGB 224x224
    .venv/bin/python bench/data_bench.py --set validate.workers=2 --json out.json

The last line printed is machine-readable::

    rss_growth_16x=R ingest_vs_decode=D reader_vs_train=T incremental_ingest=I rss_100k_224_mb=M

(``na`` for what was not measured, e.g. ``rss_100k_224_mb`` without ``--big``).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

log = logging.getLogger("data_bench")

GENERATOR_VERSION = 1  # bump when the images change: cached folders are made again
SHAPES = ("square", "disc", "hbar", "vbar", "ring")
COLOURS = {"red": (210, 50, 40), "blue": (40, 90, 220)}
CLASSES = [f"{i}_{SHAPES[i % 5]}_{list(COLOURS)[i // 5]}" for i in range(10)]
NEW_FOLDER = "2026-12-03"  # the dated sub-folder the incremental +10% arrives in
GOAL_STEPS = ("ingest", "validate", "train", "evaluate")  # the steps rss_growth_16x covers
ALL_STEPS = ("ingest", "validate", "train", "export", "evaluate")
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}  # as components.tasks.image_data
GOALS = {  # name: (comparison, limit)
    "rss_growth_16x": ("<=", 1.2),
    "ingest_vs_decode": (">=", 0.8),
    "reader_vs_train": (">=", 3.0),
    "incremental_ingest": ("<=", 0.2),
    "rss_100k_224_mb": ("<", 3072.0),
}


# --------------------------------------------------------------------------- images


def draw(cls: int, index: int, size: int, seed: int) -> np.ndarray:
    """Image ``index`` of class ``cls``: uint8 noise with the class's shape in its colour."""
    rng = np.random.default_rng([seed, cls, index])
    img = rng.integers(0, 90, size=(size, size, 3), dtype=np.int16)
    r = int(rng.integers(size // 8, size // 4 + 1))
    cy, cx = (int(v) for v in rng.integers(r, size - r, size=2))
    yy, xx = np.ogrid[:size, :size]
    dy, dx = np.abs(yy - cy), np.abs(xx - cx)
    d2 = dy**2 + dx**2
    shape = SHAPES[cls % len(SHAPES)]
    if shape == "square":
        mask = (dy <= r) & (dx <= r)
    elif shape == "disc":
        mask = d2 <= r * r
    elif shape == "hbar":
        mask = (dy <= max(1, r // 3)) & (dx <= r + r // 2)
    elif shape == "vbar":
        mask = (dx <= max(1, r // 3)) & (dy <= r + r // 2)
    else:  # ring
        mask = (d2 <= r * r) & (d2 >= (r * 6 // 10) ** 2)
    colour = np.asarray(COLOURS[list(COLOURS)[cls // len(SHAPES)]]) + rng.integers(-30, 31, 3)
    img[mask] = np.clip(colour, 0, 255)
    return img.astype(np.uint8)


def _write_images(job: tuple[str, int, int, int, int, int]) -> int:
    """Write images [start, stop) of one class (a pool task)."""
    from PIL import Image

    root, size, seed, cls, start, stop = job
    folder = Path(root) / CLASSES[cls]
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, stop):
        buf = io.BytesIO()
        Image.fromarray(draw(cls, i, size, seed)).save(buf, format="JPEG", quality=90)
        tmp = folder / f".{i:06d}.tmp"
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, folder / f"{i:06d}.jpg")
    return stop - start


def generated(cache: Path, size: int, per_class: int, seed: int, workers: int) -> Path:
    """The cached folder of generated ``size``px images, holding at least ``per_class``
    images per class (only the missing ones are made)."""
    root = cache / f"gen-{size}px-seed{seed}-v{GENERATOR_VERSION}"
    marker = root / ".complete.json"
    have = json.loads(marker.read_text())["per_class"] if marker.exists() else 0
    if have >= per_class:
        return root
    jobs = [
        (str(root), size, seed, c, s, min(per_class, s + 500))
        for c in range(len(CLASSES))
        for s in range(have, per_class, 500)
    ]
    log.info("generating %d %dpx images in %s", len(CLASSES) * (per_class - have), size, root)
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for _ in pool.imap_unordered(_write_images, jobs):
            pass
    marker.write_text(json.dumps({"per_class": per_class}))
    log.info("  in %.0f s", time.perf_counter() - started)
    return root


def link_folder(dest: Path, source: Path, per_class: int, extra: int = 0) -> Path:
    """``dest``: the first ``per_class`` images of each class of ``source`` as hard links,
    plus the next ``extra`` under ``<class>/<NEW_FOLDER>/`` (made again when it differs)."""
    marker = dest / ".complete.json"
    want = {"source": source.name, "per_class": per_class, "extra": extra}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    for cls in CLASSES:
        (dest / cls).mkdir(parents=True)
        for i in range(per_class):
            os.link(source / cls / f"{i:06d}.jpg", dest / cls / f"{i:06d}.jpg")
        if extra:
            (dest / cls / NEW_FOLDER).mkdir()
            for i in range(per_class, per_class + extra):
                os.link(source / cls / f"{i:06d}.jpg", dest / cls / NEW_FOLDER / f"{i:06d}.jpg")
    marker.write_text(json.dumps(want))
    return dest


def add_new_folder(folder: Path, source: Path, per_class: int, extra: int) -> None:
    """The week's new data: ``extra`` more images per class in ``<class>/<NEW_FOLDER>/``."""
    for cls in CLASSES:
        (folder / cls / NEW_FOLDER).mkdir()
        for i in range(per_class, per_class + extra):
            os.link(source / cls / f"{i:06d}.jpg", folder / cls / NEW_FOLDER / f"{i:06d}.jpg")


def image_files(root: Path) -> list[Path]:
    """The image files of a class folder tree, in the order ingest lists them."""
    return sorted(
        f
        for cls in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        for f in cls.rglob("*")
        if f.suffix.lower() in IMAGE_SUFFIXES
    )


# --------------------------------------------------------------------------- params


def set_key(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        doc = doc.setdefault(key, {})
    doc[last] = value


def parse_sets(items: Sequence[str]) -> list[tuple[str, Any]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set/--big-set: expected section.key=value, got {item!r}")
        out.append((key, yaml.safe_load(value)))
    return out


def write_params(
    dest: Path,
    source: Path,
    *,
    image_size: int,
    workers: int,
    batch_size: int,
    sets: Sequence[tuple[str, Any]] = (),
) -> Path:
    """The repo's params.yaml turned into an image-folder run on ``source``."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["task"] = {
        "name": "image_folder",
        "options": {"arch": "resnet18", "image_size": [image_size, image_size]},
    }
    params["ingest"].update(
        source=str(source), kind="image_folder", image_mode="RGB", sha256={}, idx_files=[]
    )
    params["ingest"]["workers"] = workers
    if "workers" in params.get("validate", {}):  # validate's process pool, where it has one
        params["validate"]["workers"] = workers
    params["train"].update(epochs=1, batch_size=batch_size)
    params["train"]["distributed"]["nproc"] = 1
    params["evaluate"]["latency"].update(warmup=1, repeats=3)
    for key, value in sets:
        set_key(params, key, value)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(params, sort_keys=False))
    return dest


# --------------------------------------------------------------------------- one step


@dataclass
class StepRun:
    step: str
    seconds: float
    max_rss_mb: float  # the largest process's high-water mark (wait4 rusage)
    tree_rss_mb: float  # the peak of the process tree's summed RSS (sampled)


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "GLOG_minloglevel": "2",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "GX_ANALYTICS_ENABLED": "false",
    }


def measure(argv: list[str], log_file: Path, name: str, timeout: float = 6 * 3600) -> StepRun:
    """Run ``argv`` as a process; its wall time, max RSS (kernel) and peak tree RSS."""
    import psutil

    log_file.parent.mkdir(parents=True, exist_ok=True)
    peak = [0]
    done = threading.Event()
    started = time.perf_counter()
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env(), stdout=out, stderr=subprocess.STDOUT)

        def sample() -> None:
            try:
                root = psutil.Process(proc.pid)
            except psutil.Error:
                return
            while not done.is_set():
                total = 0
                try:
                    procs = [root, *root.children(recursive=True)]
                except psutil.Error:
                    break
                for p in procs:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                peak[0] = max(peak[0], total)
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            done.set()
            sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        tail = log_file.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(
            f"{name} failed (exit {proc.returncode}; log {log_file}):\n" + "\n".join(tail)
        )
    return StepRun(name, seconds, usage.ru_maxrss / 1024, peak[0] / 2**20)


def step_argv(step: str, params: Path, run: Path) -> list[str]:
    """The dvc.yaml command line of ``step`` with its paths under ``run``."""
    py = [sys.executable, "-m", "components", step, "--params", str(params)]
    data, model, exported = run / "ingest", run / "train", run / "export"
    m = run / "metrics"
    return py + {
        "ingest": ["--data", str(data)],
        "validate": ["--data", str(data), "--report", str(run / "validate")],
        "train": ["--data", str(data), "--model", str(model), "--checkpoints",
                  str(run / "checkpoints"), "--metrics", str(m / "train.json"), "--plots",
                  str(m / "train.csv")],
        "export": ["--model", str(model), "--data", str(data), "--exported", str(exported)],
        # the export's output holds the fp32 program evaluate scores (no qat/package needed)
        "evaluate": ["--bundle", str(exported), "--data", str(data), "--evaluation",
                     str(run / "evaluate"), "--metrics", str(m / "evaluate.json"),
                     "--confusion", str(m / "confusion.csv"), "--figures", str(m / "figures")],
    }[step]  # fmt: skip


def chain(steps: Sequence[str]) -> list[str]:
    """The steps to run for ``steps``: what each needs first (evaluate needs train, export)."""
    need = set(steps) | {"ingest"}
    if "evaluate" in need:
        need |= {"train", "export"}
    return [s for s in ALL_STEPS if s in need]


NEEDS = {"export": "train", "evaluate": "export"}  # a step that cannot run without another


def run_steps(
    params: Path, run: Path, steps: Sequence[str]
) -> tuple[dict[str, StepRun], dict[str, str]]:
    """Run the chain of ``steps`` in a fresh ``run`` directory: the measured steps and the
    failed (or skipped) ones with the reason. A failing ingest stops the benchmark."""
    if run.exists():
        shutil.rmtree(run)  # fresh: ingest must not reuse a previous snapshot here
    run.mkdir(parents=True)
    out: dict[str, StepRun] = {}
    failed: dict[str, str] = {}
    for step in chain(steps):
        if NEEDS.get(step) in failed:
            failed[step] = f"skipped: {NEEDS[step]} failed"
            continue
        try:
            out[step] = measure(step_argv(step, params, run), run / "logs" / f"{step}.log", step)
        except RuntimeError as exc:
            if step == "ingest":
                raise
            failed[step] = str(exc)
            log.error("  %-8s FAILED: %s", step, exc)
            continue
        r = out[step]
        log.info(
            "  %-8s %7.1f s  max RSS %6.0f MB  tree %6.0f MB",
            step, r.seconds, r.max_rss_mb, r.tree_rss_mb,
        )  # fmt: skip
    return out, failed


# --------------------------------------------------------------------------- workers


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
    return {
        "seconds": seconds,
        "rows": sum(s["rows"] for s in doc["shards"]),
        "units": len(doc["units"]),
        "units_reused": sum(1 for u in doc["units"] if u.get("reused")),
        "shards": len(doc["shards"]),
    }


def worker_reader(params_file: Path, data: Path, batch: int, steps: int) -> dict[str, Any]:
    """The streaming reader's samples/s against resnet18's training samples/s."""
    import paddle
    import paddle.nn.functional as F

    from components.tasks import get_task
    from components.tasks.data import iter_split

    params = yaml.safe_load(params_file.read_text())
    task = get_task("image_folder", params["task"]["options"])
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
    loader = loader_rate(task, data, params["train"], batch)

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
    train_s = time.perf_counter() - started
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


def call_worker(kind: str, *args: str) -> dict[str, Any]:
    """Run one of the worker modes of this script in a fresh process; its JSON answer."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", kind, *args],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=6 * 3600,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).splitlines()[-15:]
        raise RuntimeError(f"worker {kind} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- measurements


def ingest_vs_decode(
    source: Path, params: Path, scratch: Path, workers: int, repeats: int, chunk: int
) -> dict[str, Any]:
    rounds = []
    for r in range(repeats):
        decode = call_worker("decode", str(source), str(workers), str(chunk))
        out = scratch / "ingest"
        if out.exists():
            shutil.rmtree(out)
        ingest = call_worker("ingest", str(params), str(out))
        if ingest["rows"] != decode["images"]:
            raise RuntimeError(
                f"ingest stored {ingest['rows']} images, the decode loop read {decode['images']}"
            )
        ratio = decode["seconds"] / ingest["seconds"]
        rounds.append(
            {"decode_s": decode["seconds"], "ingest_s": ingest["seconds"], "ratio": ratio}
        )
        log.info(
            "  round %d: decode %.2f s, ingest %.2f s (%d units, %d shards) -> %.2f",
            r + 1, decode["seconds"], ingest["seconds"], ingest["units"], ingest["shards"], ratio,
        )  # fmt: skip
    images = decode["images"]
    return {
        "images": images,
        "workers": workers,
        "rounds": rounds,
        "decode_images_per_s": images / statistics.median(x["decode_s"] for x in rounds),
        "ingest_images_per_s": images / statistics.median(x["ingest_s"] for x in rounds),
        "ingest_vs_decode": statistics.median(x["ratio"] for x in rounds),
    }


def _split_keys(data: Path) -> dict[str, set[bytes]]:
    from components.ml.data import snapshot

    return {s: set(snapshot.split_keys(data, [s]).tolist()) for s in snapshot.SPLITS}


def incremental(
    gen: Path, scratch: Path, n: int, workers: int, batch: int, sets: Sequence[tuple[str, Any]]
) -> dict[str, Any]:
    """Full ingest of ``n`` images, then +10% in a new dated folder into the same output."""
    from components.core.artifacts import sha256_file

    per_class, extra = n // len(CLASSES), max(1, n // len(CLASSES) // 10)
    folder = scratch / "source"
    if folder.exists():
        shutil.rmtree(folder)
    link_folder(folder, gen, per_class)
    params = write_params(
        scratch / "params.yaml", folder, image_size=64, workers=workers, batch_size=batch,
        sets=sets,
    )  # fmt: skip
    out = scratch / "ingest"
    if out.exists():
        shutil.rmtree(out)
    full = call_worker("ingest", str(params), str(out))
    old = json.loads((out / "snapshot.json").read_text())
    for shard in old["shards"]:  # the old snapshot's bytes are what its manifest pins
        assert sha256_file(out / shard["path"]) == shard["sha256"], shard["path"]
    old_keys = _split_keys(out)
    add_new_folder(folder, gen, per_class, extra)
    inc = call_worker("ingest", str(params), str(out))
    new = json.loads((out / "snapshot.json").read_text())
    new_by_path = {s["path"]: s for s in new["shards"]}
    changed = [
        s["path"]
        for s in old["shards"]
        if s["path"] not in new_by_path
        or new_by_path[s["path"]]["sha256"] != s["sha256"]
        or sha256_file(out / s["path"]) != s["sha256"]
    ]
    new_keys = _split_keys(out)
    moved = {
        split: len(keys - new_keys[split]) for split, keys in old_keys.items()
    }  # old samples no longer in their split
    added = inc["rows"] - full["rows"]
    result = {
        "images_full": full["rows"],
        "images_added": added,
        "full_s": full["seconds"],
        "incremental_s": inc["seconds"],
        "incremental_ingest": inc["seconds"] / full["seconds"],
        "units": inc["units"],
        "units_reused": inc["units_reused"],
        "old_shards": len(old["shards"]),
        "old_shards_changed": changed,
        "old_samples_moved": moved,
        "shards_identical": not changed,
        "splits_stable": not any(moved.values()),
    }
    log.info(
        "  full %.2f s (%d images), +%d images: %.2f s -> %.3f; %d/%d units reused; "
        "%d old shards, %d changed; old samples that left their split: %s",
        full["seconds"], full["rows"], added, inc["seconds"], result["incremental_ingest"],
        inc["units_reused"], inc["units"], len(old["shards"]), len(changed), moved,
    )  # fmt: skip
    if added != extra * len(CLASSES):
        raise RuntimeError(f"incremental ingest added {added} images, expected {extra * 10}")
    return result


# --------------------------------------------------------------------------- report


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "na" if value is None else format(value, spec)


def verdict(name: str, value: float | None) -> str:
    if value is None:
        return "not measured"
    op, limit = GOALS[name]
    ok = value <= limit if op == "<=" else value >= limit if op == ">=" else value < limit
    return f"{'met' if ok else 'NOT met'} (goal {op} {limit:g})"


def print_tables(
    sizes: Sequence[int], runs: dict[int, dict[str, StepRun]], failed: dict[int, dict[str, str]]
) -> None:
    small, big = min(sizes), max(sizes)
    steps = [s for s in ALL_STEPS if any(s in runs[n] or s in failed[n] for n in sizes)]
    head = "".join(f"{n:>16,}" for n in sizes)
    for title, attr, unit in (
        ("max RSS (largest process, kernel high-water mark)", "max_rss_mb", "MB"),
        ("tree RSS (peak of the summed RSS of the step's processes, sampled)", "tree_rss_mb", "MB"),
        ("wall time (process start to exit)", "seconds", "s"),
    ):
        print(f"\n{title}, {unit}, images:")
        growth = f"{big // small}x growth" if attr != "seconds" else f"{big // small}x ratio"
        print(f"  {'step':<9}{head}{growth:>14}")
        for step in steps:
            cells = [getattr(runs[n][step], attr) if step in runs[n] else None for n in sizes]
            ratio = cells[-1] / cells[0] if cells[0] and cells[-1] is not None else None
            shown = [
                fmt(c, ".0f" if attr != "seconds" else ".1f") if c is not None else "failed"
                for c in cells
            ]
            print(
                f"  {step:<9}"
                + "".join(f"{c:>16}" for c in shown)
                + f"{fmt(ratio):>14}"
                + ("" if step in GOAL_STEPS else "   (not in the goal)")
            )


def rss_growth(sizes: Sequence[int], runs: dict[int, dict[str, StepRun]]) -> dict[str, float]:
    small, big = min(sizes), max(sizes)
    return {
        step: runs[big][step].max_rss_mb / runs[small][step].max_rss_mb
        for step in GOAL_STEPS
        if step in runs[big] and step in runs[small]
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help="images per data set (default 2000 8000 32000; --quick 500 2000)",
    )
    parser.add_argument("--quick", action="store_true", help="500 and 2000 images, 2 rounds")
    parser.add_argument("--big", action="store_true", help="also 100k RGB 224x224 (not in CI)")
    parser.add_argument("--big-images", type=int, default=100_000, help=argparse.SUPPRESS)
    parser.add_argument(
        "--big-steps",
        nargs="+",
        default=["ingest", "validate"],
        choices=GOAL_STEPS,
        help="steps of the --big run (default: %(default)s)",
    )
    parser.add_argument(
        "--big-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="params of the --big run, e.g. train.<bounding knob>=50",
    )
    parser.add_argument(
        "--steps",
        nargs="+",
        default=list(GOAL_STEPS),
        choices=GOAL_STEPS,
        help="steps measured per size (evaluate also runs train and export)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 2,
        help="ingest.workers and the decode pool's processes",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="train.batch_size")
    parser.add_argument("--repeats", type=int, default=3, help="ingest/decode rounds")
    parser.add_argument("--train-steps", type=int, default=20, help="timed resnet18 steps")
    parser.add_argument("--throughput-size", type=int, help="default: the largest size")
    parser.add_argument("--reader-size", type=int, help="default: 8000 (or the largest below)")
    parser.add_argument("--incremental-size", type=int, help="default: the largest size")
    parser.add_argument("--seed", type=int, default=0, help="of the generated images")
    parser.add_argument("--cache-dir", type=Path, default=REPO / "build" / "bench-data")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a params key of every run, e.g. validate.workers=2",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker", choices=["decode", "ingest", "reader"], help=argparse.SUPPRESS)
    parser.add_argument("worker_args", nargs="*", help=argparse.SUPPRESS)
    return parser


def run_worker(kind: str, a: Sequence[str]) -> dict[str, Any]:
    """``--worker KIND ARGS``: one measurement in this process (see :func:`call_worker`)."""
    if kind == "decode":
        return worker_decode(Path(a[0]), int(a[1]), int(a[2]))
    if kind == "ingest":
        return worker_ingest(Path(a[0]), Path(a[1]))
    return worker_reader(Path(a[0]), Path(a[1]), int(a[2]), int(a[3]))


@dataclass
class Bench:
    """One run of the benchmark: its options, the sizes and sets each scenario measures, the
    generated images, and each scenario's result (:data:`SCENARIOS`) by name."""

    args: argparse.Namespace
    sizes: list[int]
    repeats: int
    throughput_n: int
    reader_n: int
    incremental_n: int
    sets: list[tuple[str, Any]]
    cache: Path
    cpu: dict[str, Any]
    started: datetime
    gen: Path
    results: dict[str, Any] = field(default_factory=dict)


def setup(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Bench:
    """The sizes (checked), the cache and the generated 64x64 images every scenario reads."""
    sizes = sorted(args.sizes or ([500, 2000] if args.quick else [2000, 8000, 32000]))
    if len(sizes) < 2 or any(n < 20 or n % len(CLASSES) for n in sizes):
        parser.error("--sizes: at least two sizes, multiples of 10, >= 20")
    repeats = min(args.repeats, 2) if args.quick else args.repeats
    throughput_n = args.throughput_size or sizes[-1]
    reader_n = args.reader_size or max([n for n in sizes if n <= 8000] or sizes[:1])
    incremental_n = args.incremental_size or sizes[-1]
    for name, n in (("throughput", throughput_n), ("reader", reader_n)):
        if n not in sizes:
            parser.error(f"--{name}-size {n} must be one of --sizes {sizes}")
    sets = parse_sets(args.set)
    cache = args.cache_dir.resolve()
    cache.mkdir(parents=True, exist_ok=True)

    from components.core.artifacts import machine

    cpu = machine()
    started = datetime.now(UTC)
    log.info("CPU %s, %d cores; cache %s", cpu.get("cpu_model"), os.cpu_count(), cache)
    most = max(*sizes, incremental_n)
    gen = generated(cache, 64, most // 10 + max(1, most // 100), args.seed, args.workers)
    return Bench(
        args, sizes, repeats, throughput_n, reader_n, incremental_n, sets, cache, cpu, started, gen
    )


# --------------------------------------------------------------------------- scenarios


def scenario_rss(b: Bench) -> tuple[dict[int, dict[str, StepRun]], dict[int, dict[str, str]]]:
    """Peak RSS per step and size: (runs, failed steps) by size."""
    runs: dict[int, dict[str, StepRun]] = {}
    failed: dict[int, dict[str, str]] = {}
    for n in b.sizes:
        folder = link_folder(b.cache / f"folder-64px-{n}", b.gen, n // len(CLASSES))
        params = write_params(
            b.cache / "runs" / str(n) / "params.yaml", folder, image_size=64,
            workers=b.args.workers, batch_size=b.args.batch_size, sets=b.sets,
        )  # fmt: skip
        log.info("%d images (%s):", n, folder)
        runs[n], failed[n] = run_steps(params, b.cache / "runs" / str(n) / "out", b.args.steps)
    return runs, failed


def scenario_ingest_vs_decode(b: Bench) -> dict[str, Any]:
    """Ingest vs the bare decode loop, on the throughput size's folder."""
    log.info("ingest vs decode, %d images, %d processes:", b.throughput_n, b.args.workers)
    tp_params = b.cache / "runs" / str(b.throughput_n) / "params.yaml"
    unit_files = int(yaml.safe_load(tp_params.read_text())["ingest"].get("unit_files", 256))
    return ingest_vs_decode(
        b.cache / f"folder-64px-{b.throughput_n}", tp_params, b.cache / "scratch" / "throughput",
        b.args.workers, b.repeats, unit_files,
    )  # fmt: skip


def scenario_reader(b: Bench) -> dict[str, Any]:
    """The streaming reader (the train step's loader when it reports one) vs the train step."""
    log.info("reader vs train step, the train split of %d images:", b.reader_n)
    reader = call_worker(
        "reader", str(b.cache / "runs" / str(b.reader_n) / "params.yaml"),
        str(b.cache / "runs" / str(b.reader_n) / "out" / "ingest"), str(b.args.batch_size),
        str(b.args.train_steps),
    )  # fmt: skip
    loader = reader.get("loader") or {}
    if "samples_per_s" in loader:  # the train step's own pipeline is the reader it trains on
        reader["reader"] = "components.tasks.stream (the train step's loader)"
        reader_rate = loader["samples_per_s"]
    else:
        reader["reader"] = "iter_split + task.preprocess"
        reader_rate = reader["reader_samples_per_s"]
    reader["reader_vs_train"] = reader_rate / reader["train_samples_per_s"]
    log.info(
        "  iter_split + preprocess %.0f samples/s (%d samples); the train step's loader: %s",
        reader["reader_samples_per_s"], reader["reader_samples"],
        f"{loader['samples_per_s']:.0f} samples/s" if "samples_per_s" in loader
        else loader.get("error", "none"),
    )  # fmt: skip
    log.info(
        "  train step %.0f samples/s (batch %d) -> reader_vs_train %.2f (%s)",
        reader["train_samples_per_s"], b.args.batch_size, reader["reader_vs_train"],
        reader["reader"],
    )  # fmt: skip
    return reader


def scenario_incremental(b: Bench) -> dict[str, Any]:
    """Incremental ingest: +10% new files, into the same output directory."""
    log.info("incremental ingest, %d images + 10%%:", b.incremental_n)
    return incremental(
        b.gen, b.cache / "scratch" / "incremental", b.incremental_n, b.args.workers,
        b.args.batch_size, b.sets,
    )  # fmt: skip


def scenario_big(b: Bench) -> tuple[dict[str, StepRun], dict[str, str]]:
    """``--big``: 100k RGB images at 224x224 (runs, failed steps)."""
    args = b.args
    per_class = args.big_images // len(CLASSES)
    gen224 = generated(b.cache, 224, per_class, args.seed, args.workers)
    folder = link_folder(b.cache / f"folder-224px-{args.big_images}", gen224, per_class)
    params = write_params(
        b.cache / "runs" / "big" / "params.yaml", folder, image_size=224,
        workers=args.workers, batch_size=args.batch_size,
        sets=[*b.sets, *parse_sets(args.big_set)],
    )  # fmt: skip
    log.info("%d images at 224x224 (%s):", args.big_images, folder)
    return run_steps(params, b.cache / "runs" / "big" / "out", args.big_steps)


@dataclass(frozen=True)
class Scenario:
    """One measurement of the benchmark: ``run`` when ``when`` holds for the options, else
    ``default`` is its result."""

    name: str
    run: Callable[[Bench], Any]
    when: Callable[[argparse.Namespace], bool] = lambda args: True
    default: Any = None


# run in this order; each result is Bench.results[name]
SCENARIOS = (
    Scenario("rss", scenario_rss),  # 1. peak RSS per step and size
    Scenario("throughput", scenario_ingest_vs_decode),  # 2. ingest vs the bare decode loop
    Scenario("reader", scenario_reader),  # 3. the streaming reader vs the train step
    Scenario("incremental", scenario_incremental),  # 4. incremental ingest
    Scenario("big", scenario_big, when=lambda args: args.big, default=({}, {})),  # 5. 100k
)


# --------------------------------------------------------------------------- the report


def goal_values(b: Bench) -> tuple[dict[str, float], str | None, dict[str, float | None]]:
    """The rss growth per step, the worst step, and the value of each of :data:`GOALS`."""
    runs, _ = b.results["rss"]
    big, _ = b.results["big"]
    growth = rss_growth(b.sizes, runs)
    worst = max(growth, key=growth.get) if growth else None
    values = {
        "rss_growth_16x": growth[worst] if worst else None,
        "ingest_vs_decode": b.results["throughput"]["ingest_vs_decode"],
        "reader_vs_train": b.results["reader"]["reader_vs_train"],
        "incremental_ingest": b.results["incremental"]["incremental_ingest"],
        "rss_100k_224_mb": max((r.max_rss_mb for r in big.values()), default=None),
    }
    return growth, worst, values


def print_measurements(b: Bench, growth: dict[str, float], worst: str | None) -> None:
    """The tables and one paragraph per scenario."""
    args, sizes, (runs, failed) = b.args, b.sizes, b.results["rss"]
    throughput, reader, inc = (b.results[k] for k in ("throughput", "reader", "incremental"))
    loader = reader.get("loader") or {}
    print(
        f"\nCPU: {b.cpu.get('cpu_model', '?')}, {os.cpu_count()} cores; "
        f"{b.started:%Y-%m-%d %H:%M} UTC"
    )
    print(f"ingest.workers = decode processes = {args.workers}; train batch {args.batch_size}")
    print_tables(sizes, runs, failed)
    print(f"\nrss_growth ({sizes[-1]:,} vs {sizes[0]:,} images, max RSS): "
          + ", ".join(f"{s} {v:.2f}" for s, v in growth.items())
          + (f"; worst {worst}" if worst else ""))  # fmt: skip
    print(
        f"ingest vs decode ({b.throughput_n:,} images, median of {b.repeats}): decode "
        f"{throughput['decode_images_per_s']:.0f} images/s, ingest "
        f"{throughput['ingest_images_per_s']:.0f} images/s"
    )
    print(
        f"reader vs train ({reader['reader_samples']:,} train samples of the {b.reader_n:,} "
        f"set): iter_split + preprocess {reader['reader_samples_per_s']:.0f} samples/s, the "
        f"train step's loader "
        + (
            f"{loader['samples_per_s']:.0f} samples/s ({loader['settings']})"
            if "samples_per_s" in loader
            else loader.get("error", "not there")
        )
        + f"; resnet18 64x64 train step {reader['train_samples_per_s']:.0f} samples/s "
        f"(batch {args.batch_size}); reader_vs_train uses {reader['reader']}"
    )
    print_train_metrics(b)
    print(
        f"incremental ({inc['images_full']:,} + {inc['images_added']:,} images): full "
        f"{inc['full_s']:.2f} s, incremental {inc['incremental_s']:.2f} s; units reused "
        f"{inc['units_reused']}/{inc['units']}; old shards byte-identical: "
        f"{inc['shards_identical']} ({inc['old_shards']} shards); no old sample changed split: "
        f"{inc['splits_stable']}"
    )
    big, _ = b.results["big"]
    if big:
        cells = [f"{s} {r.max_rss_mb:.0f} MB ({r.seconds:.0f} s)" for s, r in big.items()]
        print(f"{args.big_images:,} images at 224x224: " + ", ".join(cells))


def print_train_metrics(b: Bench) -> None:
    """The train step's own reader and throughput metrics, at each size it ran."""
    for n in b.sizes:
        metrics = b.cache / "runs" / str(n) / "out" / "metrics" / "train.json"
        if metrics.exists():
            doc = json.loads(metrics.read_text())
            print(
                f"  the train step's own metrics at {n:,} images: samples/s "
                f"{fmt(doc.get('samples_per_second'), '.0f')}, reader samples/s "
                f"{fmt(doc.get('reader_samples_per_second'), '.0f')}, reader_vs_train "
                f"{fmt(doc.get('reader_vs_train'))}"
            )


def failures_of(b: Bench) -> list[tuple[str, tuple[str, str]]]:
    """(where, (step, why)) of every step that failed, at each size and in the --big run."""
    _, failed = b.results["rss"]
    _, big_failed = b.results["big"]
    failures = [(f"{n:,} images", f) for n in b.sizes for f in failed[n].items()]
    failures += [("224x224", f) for f in big_failed.items()]
    return failures


def write_json(b: Bench, growth: dict[str, float], values: dict[str, float | None]) -> None:
    runs, failed = b.results["rss"]
    big, big_failed = b.results["big"]
    report = {
        "machine": b.cpu,
        "date": b.started.isoformat(timespec="seconds"),
        "sizes": b.sizes,
        "workers": b.args.workers,
        "runs": {n: {s: asdict(r) for s, r in rs.items()} for n, rs in runs.items()},
        "failed": {**failed, "big": big_failed},
        "rss_growth": growth,
        "throughput": b.results["throughput"],
        "reader": b.results["reader"],
        "incremental": b.results["incremental"],
        "big": {s: asdict(r) for s, r in big.items()},
        "values": values,
    }
    b.args.json.write_text(json.dumps(report, indent=2))


def report(b: Bench) -> int:
    """Print the measurements, the failures, the goals and the last (machine-readable) line;
    0 when the incremental ingest kept the old shards and splits and no step failed."""
    growth, worst, values = goal_values(b)
    print_measurements(b, growth, worst)
    failures = failures_of(b)
    if failures:
        print("\nFAILED steps (not measured; rss_growth_16x covers the measured ones):")
        for where, (step, why) in failures:
            print(f"  {where}: {step}: {why.splitlines()[0]}")
    print("\ngoals:")
    for name, value in values.items():
        print(f"  {name:<20} {fmt(value, '.3f'):>8}  {verdict(name, value)}")
    if b.args.json:
        write_json(b, growth, values)
    inc = b.results["incremental"]
    ok = inc["shards_identical"] and inc["splits_stable"] and not failures
    print(
        f"rss_growth_16x={fmt(values['rss_growth_16x'])} "
        f"ingest_vs_decode={fmt(values['ingest_vs_decode'])} "
        f"reader_vs_train={fmt(values['reader_vs_train'])} "
        f"incremental_ingest={fmt(values['incremental_ingest'], '.3f')} "
        f"rss_100k_224_mb={fmt(values['rss_100k_224_mb'], '.0f')}"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args.worker, args.worker_args)))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bench = setup(parser, args)
    for scenario in SCENARIOS:
        bench.results[scenario.name] = (
            scenario.run(bench) if scenario.when(args) else scenario.default
        )
    return report(bench)


if __name__ == "__main__":
    sys.exit(main())
