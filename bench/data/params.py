"""The params.yaml of each run: the repo's params turned into an image-folder run, with the
``--set`` overrides."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.data.common import REPO


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
