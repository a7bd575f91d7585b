"""The on-disk format written by ``ingest`` and read by every later step.

An ingested data set is a directory with:

- ``train.npz``, ``val.npz``, ``test.npz``: NumPy archives with ``images`` (``uint8``,
  shape ``[N, H, W, C]``, values 0-255) and ``labels`` (``int64``, shape ``[N]``, values
  ``0..num_classes-1``).
- ``labels.json``: ``{"names": [...]}``, class names indexed by label id.
- ``manifest.json``: source, sha256 of inputs and outputs, counts per split and class.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from components.artifacts import StepError, atomic_path, read_json, write_json

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Split:
    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def split_path(data_dir: str | Path, split: str) -> Path:
    return Path(data_dir) / f"{split}.npz"


def _check_data_dir(data_dir: str | Path) -> Path:
    path = Path(data_dir)
    if path.exists() and not path.is_dir():
        raise StepError(f"{path}: is a file, not an ingested data set directory (run ingest)")
    return path


def write_split(data_dir: str | Path, split: str, data: Split) -> Path:
    dest = split_path(data_dir, split)
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, images=data.images, labels=data.labels)
    return dest


def read_split(data_dir: str | Path, split: str) -> Split:
    """Read one split without changing dtypes (validation needs to see what is stored)."""
    path = split_path(_check_data_dir(data_dir), split)
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = {"images", "labels"} - set(npz.files)
            if missing:
                raise StepError(f"{path}: missing array(s) {sorted(missing)}")
            return Split(images=npz["images"], labels=npz["labels"])
    except FileNotFoundError as exc:
        raise StepError(f"{path}: split file not found (run ingest first)") from exc
    except (ValueError, OSError) as exc:
        raise StepError(f"{path}: not a readable .npz archive ({exc})") from exc


def write_label_names(data_dir: str | Path, names: list[str]) -> Path:
    return write_json(Path(data_dir) / "labels.json", {"names": list(names)})


def read_label_names(data_dir: str | Path) -> list[str]:
    data = read_json(_check_data_dir(data_dir) / "labels.json")
    names = data.get("names") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names:
        raise StepError(f"{Path(data_dir) / 'labels.json'}: field 'names' must be a non-empty list")
    return [str(n) for n in names]
