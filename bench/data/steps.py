"""One pipeline step as its own process, exactly as dvc.yaml calls it: its wall time, its
largest process's max RSS (the kernel's high-water mark) and the peak of its process tree's
summed RSS (sampled every 50 ms); the chain of steps of one run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.data.common import ALL_STEPS, REPO, env, log


@dataclass
class StepRun:
    step: str
    seconds: float
    max_rss_mb: float  # the largest process's high-water mark (wait4 rusage)
    tree_rss_mb: float  # the peak of the process tree's summed RSS (sampled)


def sample_tree_rss(pid: int, done: threading.Event, peak: list[int]) -> None:
    """Until ``done`` is set, every 50 ms: the summed RSS of process ``pid`` and all its
    children; the largest sum in ``peak[0]`` (bytes)."""
    import psutil

    try:
        root = psutil.Process(pid)
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


def measure(argv: list[str], log_file: Path, name: str, timeout: float = 6 * 3600) -> StepRun:
    """Run ``argv`` as a process; its wall time, max RSS (kernel) and peak tree RSS."""
    import psutil  # noqa: F401  (the sampler's: a missing psutil fails before the step runs)

    log_file.parent.mkdir(parents=True, exist_ok=True)
    peak = [0]
    done = threading.Event()
    started = time.perf_counter()
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env(), stdout=out, stderr=subprocess.STDOUT)
        sampler = threading.Thread(target=sample_tree_rss, args=(proc.pid, done, peak), daemon=True)
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
