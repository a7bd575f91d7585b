"""Shared fixtures: a real ingested digits data set and a tiny trained model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GLOG_minloglevel", "2")


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sklearn's real digits, ingested and split exactly as the pipeline does."""
    from components.ingest import IngestParams, run

    out = tmp_path_factory.mktemp("digits") / "ingest"
    run(IngestParams(source="builtin:digits", kind="builtin"), out)
    return out


@pytest.fixture(scope="session")
def digits_task():
    from components.tasks import get_task

    return get_task("digits", {"conv_channels": [6, 16], "augment_shift": 1})


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, digits_data: Path, digits_task) -> Path:
    """A small model trained for a few epochs (enough for parity and evaluation tests)."""
    from components.train import TrainParams, run

    root = tmp_path_factory.mktemp("trained")
    run(
        TrainParams(epochs=4, batch_size=64),
        digits_task,
        digits_data,
        root / "train",
        checkpoint_dir=root / "ckpt",
    )
    return root / "train"


@pytest.fixture(scope="session")
def exported(
    tmp_path_factory: pytest.TempPathFactory, trained: Path, digits_data: Path, digits_task
) -> Path:
    from components.export import ExportParams, run

    out = tmp_path_factory.mktemp("export") / "export"
    run(ExportParams(), digits_task, trained, digits_data, out)
    return out


def run_module(
    module: str, *args: str, cwd: Path = REPO, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` like dvc.yaml does."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def copy_repo(dest: Path) -> Path:
    """Copy the tracked project files (what a fresh clone has) into ``dest``."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for rel in files:
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest
