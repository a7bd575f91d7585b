"""Data-parallel scaling of the train step on this machine: 1 vs 2 ranks, side by side.

Two measurements, both in one run:

1. **The train step end to end** (``python -m components train``, the code ``dvc repro`` and
   a PaddleJob run) on the digits data, ``--epochs`` epochs each, in three layouts on the
   same cores: 1 rank x 1 thread, 1 rank x ``--threads`` threads, and ``--nproc`` ranks x 1
   thread. Training samples/second come from the step's own ``metrics`` (validation and
   start-up excluded); scaling efficiency = ranks' throughput / (nproc x one rank's).
2. **The gradient-sync share** inside ``--nproc`` ranks (``paddle.distributed.launch``,
   gloo on CPU): the same optimizer steps timed with ``paddle.DataParallel``'s all-reduce and
   inside ``no_sync()`` (no all-reduce), interleaved, for each model in ``--models``:
   share = (t_sync - t_local) / t_sync.

    .venv/bin/python bench/distributed.py                       # digits CNN + ResNet-18
    .venv/bin/python bench/distributed.py --nproc 8 --models resnet50   # a bigger node

On GPU nodes see docs/distributed.md (the same script with ``--device gpu``: NCCL).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

log = logging.getLogger("bench")

# per-model step settings for the sync-share measurement: task, options, batch per rank
MODELS = {
    "digits": ("digits", {}, 32),
    "resnet18": ("image_folder", {"arch": "resnet18", "image_size": [64, 64]}, 16),
    "resnet50": ("image_folder", {"arch": "resnet50", "image_size": [224, 224]}, 8),
}


# --------------------------------------------------------------------------- 1. the step


def _train(data: Path, root: Path, *, nproc: int, threads: int, epochs: int, batch: str) -> dict:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"].update(epochs=epochs, early_stopping={"patience": 1000, "min_delta": 0.0})
    params["train"]["distributed"].update(nproc=nproc, batch=batch)
    params_file = root / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "components", "train", "--params", str(params_file),
         "--data", str(data), "--model", str(root / "model"), "--checkpoints",
         str(root / "ckpt"), "--metrics", str(root / "train.json"), "--plots",
         str(root / "train.csv")],
        cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    metrics = json.loads((root / "train.json").read_text())
    metrics["wall_seconds"] = time.perf_counter() - started
    return metrics


def step_scaling(nproc: int, threads: int, epochs: int) -> dict:
    from components.steps.ingest import IngestParams
    from components.steps.ingest import run as ingest
    from components.tasks import get_task

    with tempfile.TemporaryDirectory(prefix="bench-dp-") as tmp:
        root = Path(tmp)
        source = IngestParams(source="builtin:digits", kind="builtin")
        ingest(source, get_task("digits"), root / "data")
        layouts = {
            "1 rank x 1 thread": (1, 1, "global"),
            f"1 rank x {threads} threads": (1, threads, "global"),
            f"{nproc} ranks x 1 thread": (nproc, 1, "global"),
            f"{nproc} ranks, batch per rank": (nproc, 1, "per_rank"),
        }
        runs = {}
        for name, (n, t, batch) in layouts.items():
            (root / name).mkdir()
            runs[name] = _train(
                root / "data", root / name, nproc=n, threads=t, epochs=epochs, batch=batch
            )
            log.info("%s: %.0f samples/s", name, runs[name]["samples_per_second"])
    one = runs["1 rank x 1 thread"]["samples_per_second"]
    ranks = runs[f"{nproc} ranks x 1 thread"]["samples_per_second"]
    threaded = runs[f"1 rank x {threads} threads"]["samples_per_second"]
    return {
        "runs": {
            k: {
                "samples_per_second": v["samples_per_second"],
                "wall_seconds": round(v["wall_seconds"], 1),
                "best_val_accuracy": v["best_val_accuracy"],
                "world_size": v["world_size"],
                "global_batch": v["global_batch"],
            }
            for k, v in runs.items()
        },
        "speedup_ranks_vs_1": ranks / one,
        "efficiency_ranks": ranks / (nproc * one),
        "ranks_vs_threads": ranks / threaded,
        "per_rank_batch_speedup_vs_1": runs[f"{nproc} ranks, batch per rank"]["samples_per_second"]
        / one,
    }


# --------------------------------------------------------------------------- 2. sync share


def _timed_step(net, opt, x, y, sync: bool) -> float:  # noqa: ANN001 - paddle objects
    """One optimizer step, with DataParallel's all-reduce or inside ``no_sync()``."""
    import paddle.distributed as dist
    import paddle.nn.functional as F

    dist.barrier()
    t0 = time.perf_counter()
    if sync:
        F.cross_entropy(net(x), y).backward()
    else:
        with net.no_sync():
            F.cross_entropy(net(x), y).backward()
    opt.step()
    opt.clear_grad()
    return time.perf_counter() - t0


def _measure(name: str, steps: int, rank: int) -> dict:
    import numpy as np
    import paddle

    from components.tasks import get_task

    task_name, options, batch = MODELS[name]
    task = get_task(task_name, options)
    paddle.seed(0)
    model = task.build_model(10)
    opt = paddle.optimizer.Adam(parameters=model.parameters(), learning_rate=1e-4)
    net = paddle.DataParallel(model)
    shape = [batch, *task.input_specs()[0].shape[1:]]
    rng = np.random.default_rng(rank)
    x = paddle.to_tensor(rng.standard_normal(shape).astype("float32"))
    y = paddle.to_tensor(rng.integers(0, 10, batch).astype("int64"))
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)
    for _ in range(3):  # warm-up
        _timed_step(net, opt, x, y, True)
        _timed_step(net, opt, x, y, False)
    synced, local = [], []
    for _ in range(steps):  # interleaved: both see the same machine state
        synced.append(_timed_step(net, opt, x, y, True))
        local.append(_timed_step(net, opt, x, y, False))
    t_sync, t_local = statistics.median(synced), statistics.median(local)
    return {
        "trainable_parameters": n_params,
        "gradient_mbytes": round(n_params * 4 / 2**20, 2),
        "batch_per_rank": batch,
        "step_ms_synced": round(t_sync * 1e3, 2),
        "step_ms_local": round(t_local * 1e3, 2),
        "sync_share": max(0.0, (t_sync - t_local) / t_sync),
    }


def _rank_worker(models: list[str], steps: int, out: Path, device: str) -> None:
    """Inside a launched rank: time optimizer steps with and without the all-reduce."""
    import paddle
    import paddle.distributed as dist

    paddle.set_device(device)
    dist.init_parallel_env()
    results = {name: _measure(name, steps, dist.get_rank()) for name in models}
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))


def sync_share(models: list[str], nproc: int, steps: int, device: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        out = Path(tmp) / "sync.json"
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
            "PADDLE_DISTRI_BACKEND": "gloo" if device == "cpu" else "nccl",
        }
        subprocess.run(
            [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
             "--host", "127.0.0.1", "--log_dir", str(Path(tmp) / "logs"),
             str(Path(__file__).resolve()), "--worker", "--models", *models, "--steps",
             str(steps), "--out", str(out), "--device", device],
            cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    parser.add_argument("--models", nargs="+", default=["digits", "resnet18"], choices=MODELS)
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.worker:
        _rank_worker(args.models, args.steps, args.out, args.device)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from components.core.artifacts import machine

    cpu = machine()
    report = {
        "machine": cpu,
        "step": step_scaling(args.nproc, args.threads, args.epochs),
        "sync": sync_share(args.models, args.nproc, args.steps, args.device),
    }
    step = report["step"]
    print(f"\nCPU: {cpu.get('cpu_model', '?')}, {os.cpu_count()} cores")
    print(f"\nthe train step on digits, {args.epochs} epochs (training samples/s):")
    for name, r in step["runs"].items():
        print(
            f"  {name:<26} global batch {r['global_batch']:>3}: "
            f"{r['samples_per_second']:>7.0f}   (wall {r['wall_seconds']} s)"
        )
    print(
        f"  {args.nproc} ranks vs 1 rank x 1 thread: x{step['speedup_ranks_vs_1']:.2f} "
        f"(efficiency {step['efficiency_ranks']:.0%}); vs 1 rank x {args.threads} threads: "
        f"x{step['ranks_vs_threads']:.2f}; batch per rank: "
        f"x{step['per_rank_batch_speedup_vs_1']:.2f}"
    )
    print(f"\ngradient sync inside {args.nproc} ranks (median step, all-reduce vs no_sync):")
    for name, r in report["sync"].items():
        print(
            f"  {name:<9} {r['trainable_parameters']:>10,} params ({r['gradient_mbytes']} MB), "
            f"batch {r['batch_per_rank']}/rank: {r['step_ms_synced']} ms vs "
            f"{r['step_ms_local']} ms -> sync share {r['sync_share']:.0%}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
