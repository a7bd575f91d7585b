"""Labelled logged traffic back into the training source (the ``harvest`` step's library).

Three pieces, each format- and task-neutral:

- :class:`AffineImageInverse`: the stored image a logged model input came from. An image task's
  preprocessing (resize, scale, normalise) is affine in the stored pixels and separable in
  rows and columns; it is measured by probing the task's own ``preprocess`` (no formula of a
  resize kernel is assumed) and inverted by least squares. Every recovered image is checked
  by running ``preprocess`` on it again: one that does not reproduce the logged tensor within
  one grey level is refused, never guessed.
- :class:`Harvested`: what a data format wrote into its source, and the ``ingest`` params that
  make ingest read it, always into the ``train`` split (``ingest.split.files``) — never into
  the pinned holdout or the test split a champion was blessed on.
- :func:`update_params`: applies that change to ``params.yaml`` in place, comments kept, written
  atomically.

Library layer: imported by tasks, formats and steps; imports no step.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import StepError, atomic_path

HARVEST_DIR = ".harvested"  # under a local source: one file of request ids per harvested unit
TOLERANCE_LEVELS = 1.0  # a recovered image must reproduce the logged input within this (0-255)
PROJECTIONS = 100  # at most, when the least-norm solution leaves [0, 255] (a downsizing resize)


@dataclass
class Harvested:
    """A unit a format wrote into its source: files (sha256 by name, relative to the source),
    and the change to ``params.yaml: ingest`` that makes ingest read it into train."""

    files: dict[str, str]
    ingest_update: dict[str, Any]
    samples: int
    notes: list[str] = field(default_factory=list)


class AffineImageInverse:
    """Least-squares inverse of an image preprocessing ``uint8 [N, h, w, C] → float [N, C, H,
    W]`` that is affine per channel and separable (``V = R_h · X · R_wᵀ``, then scale and shift).

    The row and column maps are measured with ``h + w + 2`` probe images through
    ``preprocess`` itself; :meth:`invert` returns the recovered images and which of them
    reproduce their input within :data:`TOLERANCE_LEVELS` grey levels."""

    def __init__(self, preprocess: Callable[[np.ndarray], np.ndarray], raw_shape: tuple[int, ...]):
        if len(raw_shape) != 3:
            raise ValueError(f"stored images must be [h, w, C], got {list(raw_shape)}")
        self.preprocess = preprocess
        self.raw_shape = tuple(int(d) for d in raw_shape)
        h, w, c = self.raw_shape
        probes = np.zeros((2 + h + w, h, w, c), dtype=np.float32)
        probes[1] = 255
        for i in range(h):
            probes[2 + i, i, :, :] = 255
        for j in range(w):
            probes[2 + h + j, :, j, :] = 255
        # black and white as stored (uint8) give the offset and the gain; the row and column
        # maps come from float probes where preprocess takes them (no rounding of the
        # resized probe), else from uint8 ones (weights rounded to 1/255)
        ends = self._run(probes[:2].astype(np.uint8), c)
        self.offset = ends[0]  # the preprocessing of a black image
        gain = ends[1] - ends[0]  # of a white one, minus black: 255 grey levels
        if np.any(np.abs(gain) < 1e-9):
            raise ValueError("preprocess is not invertible: a white image equals a black one")
        self.gain = gain / 255.0  # output units per grey level
        try:
            out = self._run(probes, c)
        except (ValueError, TypeError):
            out = self._run(probes.astype(np.uint8), c)
        unit = out[1] - out[0]
        if np.any(np.abs(unit) < 1e-9):
            out, unit = self._run(probes.astype(np.uint8), c), gain
        share = (out[2:] - out[0]) / unit  # each probe's share of white, [P, C, H, W]
        self.rows = share[:h].mean(axis=(1, 3)).T  # R_h [H, h]
        self.cols = share[h:].mean(axis=(1, 2)).T  # R_w [W, w]
        self.rows_pinv = np.linalg.pinv(self.rows)  # [h, H]
        self.cols_pinv = np.linalg.pinv(self.cols)  # [w, W]
        self.model_shape = tuple(out.shape[1:])

    def _solve(self, levels: np.ndarray) -> np.ndarray:
        """The least-norm stored image ``[N, h, w, C]`` of model inputs in grey levels."""
        return np.moveaxis(self.rows_pinv @ levels @ self.cols_pinv.T, 1, -1)

    def _forward(self, images: np.ndarray) -> np.ndarray:
        """The model inputs, in grey levels, of stored images ``[N, h, w, C]`` (no rounding)."""
        return self.rows @ np.moveaxis(images, -1, 1) @ self.cols.T

    def _run(self, images: np.ndarray, channels: int) -> np.ndarray:
        out = np.asarray(self.preprocess(images), dtype=np.float64)  # [P, C, H, W]
        if out.ndim != 4 or out.shape[1] != channels:
            raise ValueError(f"preprocess gave {list(out.shape)}, not [N, {channels}, H, W]")
        return out

    def invert(self, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(images uint8 [N, h, w, C], ok bool [N])`` for model inputs ``[N, C, H, W]``."""
        x = np.asarray(inputs, dtype=np.float64)
        if x.ndim != 4 or tuple(x.shape[1:]) != self.model_shape:
            n = x.shape[0] if x.ndim else 0
            return np.zeros((n, *self.raw_shape), np.uint8), np.zeros(n, dtype=bool)
        levels = (x - self.offset) / self.gain  # [N, C, H, W] grey levels
        raw = self._solve(levels)
        # a downsizing preprocessing has many solutions; the least-norm one can leave
        # [0, 255]: alternate projections onto the box and onto the solutions (bounded)
        for _ in range(PROJECTIONS):
            boxed = np.clip(raw, 0, 255)
            if np.abs(boxed - raw).max(initial=0.0) < 0.5:
                break
            residual = levels - self._forward(boxed)
            raw = boxed + self._solve(residual)
        images = np.clip(np.rint(raw), 0, 255).astype(np.uint8)
        again = np.asarray(self.preprocess(images), dtype=np.float64)
        error = np.abs((again - x) / self.gain).reshape(len(x), -1).max(axis=1)
        return images, error <= TOLERANCE_LEVELS * (1 + 1e-3)


def sample_digest(sample: Any) -> bytes:
    """A stored sample's content digest (an image's shape and pixels, a text's UTF-8)."""
    import hashlib

    if isinstance(sample, str):
        return hashlib.sha256(b"text:" + sample.encode("utf-8", "surrogatepass")).digest()
    array = np.ascontiguousarray(sample)
    head = f"{array.dtype.str}{list(array.shape)}:".encode()
    return hashlib.sha256(head + array.tobytes()).digest()


def png_bytes(image: np.ndarray) -> bytes:
    """A ``uint8 [h, w, C]`` image (C = 1 or 3) as PNG bytes (deterministic)."""
    from PIL import Image

    mode = {1: "L", 3: "RGB"}.get(image.shape[-1])
    if mode is None:
        raise ValueError(f"a PNG holds 1 or 3 channels, not {image.shape[-1]}")
    pixels = image[..., 0] if mode == "L" else image
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels), mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


def local_source(source: str, kind: str) -> Path:
    """The local directory a harvested unit can be written into, or a one-line refusal."""
    if kind == "builtin" or source.startswith("builtin:"):
        raise StepError(
            f"ingest.source {source!r}: a built-in corpus cannot take harvested data; copy it "
            "into a directory (e.g. `python -m components.steps.ingest materialize`) first"
        )
    if "://" in source:
        raise StepError(
            f"ingest.source {source!r}: harvest writes into a local source directory; harvest "
            "into a local copy and upload it with the rest of the source"
        )
    root = Path(source)
    if not root.is_dir():
        raise StepError(f"ingest.source {source!r}: not a directory (harvest adds files to it)")
    return root


def harvested_ids(root: Path) -> set[str]:
    """Request ids already harvested into the source ``root`` (so a request enters once)."""
    ids: set[str] = set()
    for path in sorted((root / HARVEST_DIR).glob("*.ids")):
        with path.open(encoding="utf-8") as handle:
            ids.update(line.rstrip("\n") for line in handle if line.strip())
    return ids


def write_ids(root: Path, name: str, ids: list[str]) -> None:
    dest = root / HARVEST_DIR / f"{name}.ids"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest) as tmp:
        tmp.write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")


def _merge(node: Any, update: dict[str, Any]) -> None:
    """Merge ``update`` into the ruamel mapping ``node``: mappings merge, lists extend."""
    for key, value in update.items():
        if isinstance(value, dict):
            if node.get(key) is None:
                node[key] = {}
            _merge(node[key], value)
        elif isinstance(value, list):
            if node.get(key) is None:
                node[key] = []
            node[key].extend(v for v in value if v not in node[key])
        else:
            node[key] = value


def update_params(params_file: str | Path, ingest_update: dict[str, Any]) -> None:
    """Apply ``ingest_update`` to ``params_file``'s ``ingest`` section (comments and order
    kept; the file replaced atomically)."""
    from ruamel.yaml import YAML

    yaml = YAML()  # round trip
    yaml.preserve_quotes = True
    path = Path(params_file)
    doc = yaml.load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("ingest"), dict):
        raise StepError(f"{path}: no ingest section to add the harvested unit to")
    ingest = doc["ingest"]
    _merge(ingest, ingest_update)
    for sub in _flow_nodes(ingest):  # a flow-style `files: {}` that grew: written as a block
        sub.fa.set_block_style()
    buffer = io.StringIO()
    yaml.dump(doc, buffer)
    with atomic_path(path) as tmp:
        tmp.write_text(buffer.getvalue(), encoding="utf-8")


def _flow_nodes(node: Any) -> list[Any]:
    """Mappings written in flow style (``{}``) that hold something now."""
    found = []
    if isinstance(node, dict):
        if hasattr(node, "fa") and node.fa.flow_style() and node:
            found.append(node)
        for value in node.values():
            found.extend(_flow_nodes(value))
    return found
