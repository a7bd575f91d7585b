"""No orphans: a step SIGKILLed while its pool workers run leaves no process of its tree.

A SIGKILLed step runs no handler, so its workers must end by themselves: each asks the kernel
for SIGKILL at its parent's death (``components.core.children.die_with_parent``), and
multiprocessing's resource tracker ends when the last holder of its pipe (the step and its
workers) is gone. For ingest and validate (a spawned process pool:
``components.ml.data.snapshot.ordered_map``) and the train loader (``paddle.io.DataLoader``
workers: ``components.tasks.stream``), each test starts the step's CLI with two workers, makes
both hang in their work (a failpoint: nothing else would end them), SIGKILLs the step and
asserts that its whole tree is gone within 5 s. The ingest and validate workers are also
checked not to have loaded Paddle: they do not need it, and its signal handlers are what
printed ``FatalError: Termination signal`` dumps from orphaned workers.

Measured before the fix (AMD EPYC, 2 vCPU): the two spawn workers and the resource tracker of
a killed ingest were alive 30 s later, each worker about 410 MB (Paddle loaded).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from tests.conftest import REPO, cmdline, descendants, kill_and_expect_no_survivors, reap

CLASSES = ("circle", "square", "triangle")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 classes x 8 RGB PNGs of 12x12: units of 4 files give 7 units, and 8 shards."""
    root = tmp_path_factory.mktemp("orphans") / "folder"
    for c, cls in enumerate(CLASSES):
        (root / cls).mkdir(parents=True)
        for i in range(8):
            rng = np.random.default_rng(100 * c + i)
            pixels = rng.integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{i:02d}.png")
    return root


def write_params(root: Path, folder: Path) -> Path:
    """params.yaml ingesting ``folder`` with 2 ingest workers and 2 validate workers."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    ingest = {k: v for k, v in params["ingest"].items() if k not in ("idx_files", "sha256")}
    ingest.update(source=str(folder), kind="image_folder", image_mode="RGB", unit_files=4)
    params["ingest"] = {**ingest, "workers": 2}
    params["validate"]["workers"] = 2
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def maps_paddle(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return "libpaddle" in Path(f"/proc/{pid}/maps").read_text()
    return False


def kill_with_hung_workers(
    root: Path, step_args: list[str], point: str, *, paddle_free: bool
) -> None:
    """Run ``python -m components <step_args>`` with ``point`` armed to hang; once two
    workers hang there, SIGKILL the step and assert that its tree is gone within 5 s."""
    err = root / "stderr.txt"
    with err.open("w") as stderr:
        step = subprocess.Popen(
            [sys.executable, "-m", "components", *step_args],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(REPO), "PADDLE_MLOPS_FAILPOINTS": point},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    name = point.split("@")[0]
    tree: list[int] = []
    try:
        for _ in range(3000):  # a bound on polls, not on time: until both workers hang
            if err.read_text().count(f"failpoint {name}: hang") >= 2 or step.poll() is not None:
                break
            time.sleep(0.1)
        assert err.read_text().count(f"failpoint {name}: hang") >= 2, (
            f"exit {step.poll()}: {err.read_text()[-3000:]}"
        )
        tree = descendants(step.pid)
        assert len(tree) >= 2, [cmdline(p) for p in tree]
        if paddle_free:
            assert not [p for p in tree if maps_paddle(p)], "a worker loaded Paddle"
        kill_and_expect_no_survivors(step, tree)
    finally:
        reap(step, tree)


def test_a_killed_ingest_leaves_no_worker(tmp_path: Path, folder: Path) -> None:
    params = write_params(tmp_path, folder)
    args = ["ingest", "--params", str(params), "--data", str(tmp_path / "ingest")]
    kill_with_hung_workers(tmp_path, args, "ingest.unit@ingest=hang", paddle_free=True)


def test_a_killed_validate_leaves_no_worker(tmp_path: Path, folder: Path) -> None:
    from components.steps.ingest import IngestParams, run
    from components.tasks import get_task

    params = write_params(tmp_path, folder)
    source = IngestParams(source=str(folder), kind="image_folder", image_mode="RGB", unit_files=4)
    run(source, get_task("digits"), tmp_path / "ingest")  # here: 7 units, 8 shards
    args = ["validate", "--params", str(params), "--data", str(tmp_path / "ingest")]
    args += ["--report", str(tmp_path / "validate")]
    kill_with_hung_workers(tmp_path, args, "validate.shard@validate=hang", paddle_free=True)


def test_a_killed_train_leaves_no_loader_worker(tmp_path: Path, digits_data: Path) -> None:
    out = tmp_path / "train"
    args = [
        "train", "--params", str(REPO / "params.yaml"), "--data", str(digits_data),
        "--hpo", str(tmp_path / "hpo"), "--model", str(out / "model"),
        "--checkpoints", str(out / "checkpoints"), "--metrics", str(out / "train.json"),
        "--plots", str(out / "train.csv"), "--set=train.loader_workers=2", "--set=train.epochs=1",
    ]  # fmt: skip
    kill_with_hung_workers(tmp_path, args, "stream.piece@train=hang", paddle_free=False)
