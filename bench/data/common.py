"""What every part of the data benchmark shares: the repo, the logger, the classes of the
generated images, the steps and goals, and the environment of every child process."""

from __future__ import annotations

import logging
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

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
    "rerun_no_change": ("<=", 0.05),
    "rss_100k_224_mb": ("<", 3072.0),
    "train_vs_memory": (">=", 0.9),
}


def env() -> dict[str, str]:
    """The environment of every child process: this repo importable, quiet logs."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "GLOG_minloglevel": "2",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "GX_ANALYTICS_ENABLED": "false",
    }
