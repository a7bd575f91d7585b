"""The on-disk layout written by ``ingest`` and read by every later step.

An ingested data set is a snapshot directory (``components.ml.data.snapshot``, documented in
``docs/data-format.md``):

- ``snapshot.json``: the shards with their sha256, counts per split and class, the input units
  they came from and the split rule;
- ``shards/*.parquet``: the samples, one row each (``key``, ``label``, ``source``, ``row`` and
  the data format's columns: images ``image`` raw uint8 bytes with ``height``, ``width``,
  ``channels``; texts ``text``);
- ``labels.json``: ``{"names": [...], "format": "image"}``: class names indexed by label id
  and the data format;
- ``manifest.json``: ingest's step manifest (source, sha256 of every input, params, versions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from components.core.artifacts import StepError, read_json, write_json

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Split:
    """A split read whole (``components.tasks.data.read_split``)."""

    samples: np.ndarray  # one row per sample: images [N, H, W, C], texts [N] (objects)
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def images(self) -> np.ndarray:
        """The samples of an image data set."""
        return self.samples


def split_inputs(data_dir: str | Path, split: str) -> dict[str, Path]:
    """What a step that reads ``split`` records as its input in its manifest: the snapshot
    manifest, which pins every shard's sha256."""
    return {f"{split}:snapshot.json": Path(data_dir) / "snapshot.json"}


def _labels_doc(data_dir: str | Path) -> dict:
    path = Path(data_dir) / "labels.json"
    if not path.is_file():
        return {}
    data = read_json(path)
    return data if isinstance(data, dict) else {}


def read_format(data_dir: str | Path) -> str:
    """The data format ingest stored (``image`` for a data set that does not say)."""
    return str(_labels_doc(_check_data_dir(data_dir)).get("format") or "image")


def _check_data_dir(data_dir: str | Path) -> Path:
    path = Path(data_dir)
    if path.exists() and not path.is_dir():
        raise StepError(f"{path}: is a file, not an ingested data set directory (run ingest)")
    return path


def write_label_names(data_dir: str | Path, names: list[str], data_format: str = "image") -> Path:
    """Write ``labels.json``: the class names and the data format."""
    doc = {"names": list(names), "format": data_format}
    return write_json(Path(data_dir) / "labels.json", doc)


def read_label_names(data_dir: str | Path) -> list[str]:
    data = read_json(_check_data_dir(data_dir) / "labels.json")
    names = data.get("names") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names:
        raise StepError(f"{Path(data_dir) / 'labels.json'}: field 'names' must be a non-empty list")
    return [str(n) for n in names]
