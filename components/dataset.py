"""The on-disk layout written by ``ingest`` and read by every later step.

An ingested data set is a directory with:

- one file per split (train, val, test) in the task's data format
  (``components.tasks.data.DataFormat``):

  - images: ``train.npz``, ``val.npz``, ``test.npz``, NumPy archives with ``images``
    (``uint8``, shape ``[N, H, W, C]``, values 0-255) and ``labels`` (``int64``, shape
    ``[N]``, values ``0..num_classes-1``);
  - texts: ``train.jsonl``, ``val.jsonl``, ``test.jsonl``, UTF-8 JSON Lines with one
    ``{"text": str, "label": int}`` object per sample.
- ``labels.json``: ``{"names": [...], "format": "image", "splits": {"train": "train.npz",
  ...}}``: class names indexed by label id, the data format and the split files (a data set
  without ``format`` is an image data set).
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
    samples: np.ndarray  # one row per sample: images [N, H, W, C], texts [N] (objects)
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def images(self) -> np.ndarray:
        """The samples of an image data set."""
        return self.samples


def split_path(data_dir: str | Path, split: str) -> Path:
    """The file of ``split``, as ``labels.json`` names it (``<split>.npz`` when it does not)."""
    files = _labels_doc(data_dir).get("splits")
    name = str(files.get(split) or "") if isinstance(files, dict) else ""
    if name and (Path(name).name != name or name in (".", "..")):
        raise StepError(
            f"{Path(data_dir) / 'labels.json'}: field 'splits.{split}' must be a file name in "
            f"the data set directory, got {name!r}"
        )
    return Path(data_dir) / (name or f"{split}.npz")


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


def write_npz(path: Path, data: Split) -> None:
    """Write an image split (``images`` and ``labels`` arrays) to ``path`` as is."""
    with open(path, "wb") as fh:
        np.savez(fh, images=data.samples, labels=data.labels)


def read_npz(path: Path) -> Split:
    """Read an image split without changing dtypes (validation needs to see what is stored)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = {"images", "labels"} - set(npz.files)
            if missing:
                raise StepError(f"{path}: missing array(s) {sorted(missing)}")
            return Split(npz["images"], npz["labels"])
    except FileNotFoundError as exc:
        raise StepError(f"{path}: split file not found (run ingest first)") from exc
    except (ValueError, OSError) as exc:
        raise StepError(f"{path}: not a readable .npz archive ({exc})") from exc


def write_split(data_dir: str | Path, split: str, data: Split) -> Path:
    """Replace one split of an image data set (atomically)."""
    dest = split_path(data_dir, split)
    with atomic_path(dest) as tmp:
        write_npz(tmp, data)
    return dest


def read_split(data_dir: str | Path, split: str) -> Split:
    """Read one split of an image data set without changing dtypes."""
    return read_npz(split_path(_check_data_dir(data_dir), split))


def write_label_names(
    data_dir: str | Path,
    names: list[str],
    data_format: str = "image",
    splits: dict[str, str] | None = None,
) -> Path:
    """Write ``labels.json``: the class names, the data format and the split files."""
    files = splits or {s: f"{s}.npz" for s in SPLITS}
    doc = {"names": list(names), "format": data_format, "splits": dict(files)}
    return write_json(Path(data_dir) / "labels.json", doc)


def read_label_names(data_dir: str | Path) -> list[str]:
    data = read_json(_check_data_dir(data_dir) / "labels.json")
    names = data.get("names") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names:
        raise StepError(f"{Path(data_dir) / 'labels.json'}: field 'names' must be a non-empty list")
    return [str(n) for n in names]
