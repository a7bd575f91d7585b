"""Images: the data format of the image-classification tasks (digits, image folders).

Ingest sources (``params.yaml: ingest.source`` + ``ingest.kind``):

- ``builtin`` with source ``builtin:digits``: scikit-learn's 1,797 real 8x8 handwritten digits
  (scaled from 0-16 to 0-255).
- ``mnist_idx``: IDX files (raw or ``.gz``) in a local directory or under an ``http(s)://`` or
  ``s3://`` prefix (read through fsspec). ``ingest.idx_files`` lists ``[images, labels]`` pairs.
- ``image_folder``: a directory with one sub-directory per class holding PNG/JPEG files.

Stored as ``<split>.npz`` (``images`` uint8 ``[N, H, W, C]``, ``labels`` int64). Validation:
one row per image (label, shape, dtype, pixel range, NaNs, sha256 of its bytes) with rules on
the shape (``validate.image_shape`` or the train split's), pixel range, dtypes and label set.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import math
import struct
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from components import dataset
from components.artifacts import StepError, atomic_path, sha256_bytes
from components.sources import join_uri, read_bytes
from components.tasks.data import (
    BASE_COLUMNS,
    HASH_COLUMN,
    CommonValidateParams,
    DataFormat,
    ShardParams,
    SplitParams,
    Unit,
    UnitBatch,
    check_sha256,
    sum_facts,
)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IDX_IMAGES_NDIM, IDX_LABELS_NDIM = 3, 1  # [N, H, W] images, [N] labels
LABEL_DTYPE = "int64"  # the documented on-disk label dtype (components.dataset)
SAMPLE_COLUMNS = [
    *BASE_COLUMNS, "label_dtype", "ndim", "height", "width", "channels", "dtype",
    "pixel_min", "pixel_max", "has_nan", HASH_COLUMN,
]  # fmt: skip


@dataclass(frozen=True)
class IngestParams:
    source: str
    kind: Literal["builtin", "mnist_idx", "image_folder"]
    idx_files: list[list[str]] = field(default_factory=list)
    sha256: dict[str, str] = field(default_factory=dict)
    label_names: list[str] | None = None
    image_size: list[int] | None = None
    image_mode: Literal["L", "RGB"] = "L"
    split: SplitParams = field(default_factory=SplitParams)
    shards: ShardParams = field(default_factory=ShardParams)
    unit_files: int = 256  # image folders: about this many files per unit (shards reuse)
    workers: int = 1  # processes reading units at once (1: in this process)

    def check(self) -> None:
        if self.kind == "mnist_idx":
            if not self.idx_files:
                raise ValueError("kind mnist_idx needs idx_files: [[images, labels], ...]")
            for pair in self.idx_files:
                if len(pair) != 2:
                    raise ValueError(f"idx_files entries must be [images, labels], got {pair}")
        if self.image_size is not None and (len(self.image_size) != 2 or min(self.image_size) < 1):
            raise ValueError(f"image_size must be [H, W] with H, W >= 1, got {self.image_size}")
        check_sha256(self.sha256)
        self.split.check()
        self.shards.check()
        if self.unit_files < 1 or self.workers < 1:
            raise ValueError("unit_files and workers must be >= 1")
        if self.label_names is not None and not self.label_names:
            raise ValueError("label_names must list at least one name (or be left out)")


@dataclass(frozen=True)
class ValidateParams(CommonValidateParams):
    image_shape: list[int] | None = None  # [H, W, C]; None = every split must match train
    pixel_min: float = 0
    pixel_max: float = 255
    expected_dtype: str = "uint8"

    def check(self) -> None:
        super().check()
        if self.image_shape is not None and (
            len(self.image_shape) != 3 or any(d <= 0 for d in self.image_shape)
        ):
            raise ValueError(f"image_shape must be [H, W, C] > 0, got {self.image_shape}")
        if self.pixel_min > self.pixel_max:
            raise ValueError(f"pixel_min {self.pixel_min} > pixel_max {self.pixel_max}")
        try:
            np.dtype(self.expected_dtype)
        except TypeError as exc:
            raise ValueError(f"expected_dtype {self.expected_dtype!r} is not a dtype") from exc


# --------------------------------------------------------------------------- readers


def parse_idx(data: bytes, name: str, ndim: int | None = None) -> np.ndarray:
    """Parse an IDX file (optionally gzip-compressed) with strict length checks.

    ``ndim`` is the number of dimensions the file must have (3 for images, 1 for labels);
    the 4-byte magic number encodes it, so a wrong magic is reported as such.
    """
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except EOFError as exc:  # the stream ends early: a cut-off download or copy
            raise StepError(f"{name}: {_describe_truncated_gzip(data)}") from exc
        except (OSError, zlib.error) as exc:
            raise StepError(f"{name}: corrupt gzip stream ({exc})") from exc
    expect = f"0x0000{0x08:02x}{ndim:02x}" if ndim is not None else "0x0000TTDD"
    what = {IDX_IMAGES_NDIM: "uint8 images [N, H, W]", IDX_LABELS_NDIM: "labels [N]"}.get(
        ndim or -1, "type TT, DD dimensions"
    )
    if len(data) < 4:
        raise StepError(
            f"{name}: not an IDX file ({len(data)} bytes, shorter than the magic number)"
        )
    magic = f"0x{data[:4].hex()}"
    if data[0] != 0 or data[1] != 0:
        raise StepError(
            f"{name}: not an IDX file: magic number {magic}, expected {expect} ({what}); "
            "the magic must start with two zero bytes"
        )
    code, dims_count = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise StepError(
            f"{name}: wrong IDX magic number {magic}: unknown element type 0x{code:02x} "
            f"(known: {', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)}); expected {expect} ({what})"
        )
    if ndim is not None and dims_count != ndim:
        raise StepError(
            f"{name}: wrong IDX magic number {magic}: it declares {dims_count} dimension(s), "
            f"expected {expect} ({what}, {ndim} dimension(s))"
        )
    header = 4 + 4 * dims_count
    if len(data) < header:
        raise StepError(f"{name}: truncated IDX header ({len(data)} bytes, need {header})")
    dims = struct.unpack(f">{dims_count}I", data[4:header])
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = math.prod(dims) * dtype.itemsize
    body = len(data) - header
    if body != expected:
        kind = "truncated" if body < expected else "has trailing bytes"
        raise StepError(
            f"{name}: IDX file {kind}: header declares shape {list(dims)} "
            f"= {expected} bytes of data, file has {body}"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)


def _as_pixels(images: np.ndarray, name: str) -> np.ndarray:
    """IDX images as uint8; other element types only when every value is an integer 0-255."""
    if images.dtype == np.uint8:
        return images
    if images.size:
        lo, hi = images.min(), images.max()
        integral = np.issubdtype(images.dtype, np.integer) or bool(np.all(np.mod(images, 1) == 0))
        if not integral or lo < 0 or hi > 255:
            raise StepError(
                f"{name}: pixels must be integers 0-255; {images.dtype} values range {lo}..{hi}"
            )
    return images.astype(np.uint8)


def _as_labels(labels: np.ndarray, name: str) -> np.ndarray:
    """IDX labels as int64; non-integer values are an error, never silently truncated."""
    if not np.issubdtype(labels.dtype, np.integer):
        bad = np.flatnonzero(np.mod(labels, 1) != 0)
        if bad.size:
            raise StepError(
                f"{name}: labels must be integers; found {labels[bad[0]]} at index {bad[0]} "
                f"({bad.size} non-integer label(s))"
            )
    return labels.astype(np.int64)


def _describe_truncated_gzip(data: bytes) -> str:
    """What a truncated gzip stream holds: its decompressed size and the IDX size it declares."""
    try:
        partial = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS).decompress(data)
    except zlib.error:
        partial = b""
    text = f"truncated gzip stream: {len(data)} compressed bytes decompress to {len(partial)} bytes"
    if len(partial) >= 4 and partial[:2] == b"\0\0" and partial[2] in _IDX_DTYPES:
        header = 4 + 4 * partial[3]
        if len(partial) >= header:
            dims = struct.unpack(f">{partial[3]}I", partial[4:header])
            size = header + int(np.prod(dims)) * np.dtype(_IDX_DTYPES[partial[2]]).itemsize
            text += f", its IDX header declares {size} bytes (shape {list(dims)})"
    return text


IDX_BATCH = 4096  # images per batch read from an IDX pair


def _image_batch(
    images: np.ndarray, labels: np.ndarray, keys: list[bytes], source: str, first: int
) -> UnitBatch:
    """Rows of uint8 ``[n, H, W, C]`` images (one shape) read from ``source``."""
    n = int(images.shape[0])
    h, w, c = (int(d) for d in images.shape[1:4])
    return UnitBatch(
        keys=keys,
        labels=np.asarray(labels, dtype=np.int64),
        sources=[source] * n,
        rows=np.arange(first, first + n, dtype=np.int64),
        columns={
            "image": [bytes(im) for im in np.ascontiguousarray(images).reshape(n, -1)],
            "height": np.full(n, h, np.int32),
            "width": np.full(n, w, np.int32),
            "channels": np.full(n, c, np.int32),
        },
    )


def _pixel_keys(images: np.ndarray) -> list[bytes]:
    """A decoded image's identity: the sha256 of its pixels as stored."""
    return [hashlib.sha256(np.ascontiguousarray(im).tobytes()).digest() for im in images]


def idx_units(params: IngestParams) -> list[Unit]:
    return [Unit(f"{img}+{lbl}", (img, lbl)) for img, lbl in params.idx_files]


def read_idx_unit(params: IngestParams, unit: Unit) -> Iterator[UnitBatch]:
    img_name, lbl_name = unit.files
    img_uri, lbl_uri = join_uri(params.source, img_name), join_uri(params.source, lbl_name)
    imgs = parse_idx(read_bytes(img_uri), img_uri, IDX_IMAGES_NDIM)
    lbls = parse_idx(read_bytes(lbl_uri), lbl_uri, IDX_LABELS_NDIM)
    if imgs.shape[0] != lbls.shape[0]:
        raise StepError(
            f"{img_uri}: {imgs.shape[0]} images but {lbl_name} has {lbls.shape[0]} labels"
        )
    images, labels = _as_pixels(imgs, img_uri)[..., None], _as_labels(lbls, lbl_uri)
    for start in range(0, images.shape[0], IDX_BATCH):
        part = images[start : start + IDX_BATCH]
        yield _image_batch(
            part, labels[start : start + IDX_BATCH], _pixel_keys(part), img_name, start
        )


def builtin_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's real 8x8 digits as uint8 0-255 images [N, 8, 8] and labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    return images, bunch.target.astype(np.int64)


def _check_builtin(params: IngestParams, params_file: str) -> None:
    if params.source != "builtin:digits":
        raise StepError(
            f"{params_file}: ingest.source '{params.source}': only builtin:digits exists"
        )


def read_builtin_unit(params: IngestParams) -> Iterator[UnitBatch]:
    images, labels = builtin_digits()
    images = images[..., None]
    yield _image_batch(images, labels, _pixel_keys(images), params.source, 0)


def _builtin_sha() -> str:
    images, labels = builtin_digits()
    return sha256_bytes(images.tobytes() + labels.tobytes())


def _class_folders(params: IngestParams) -> list[str]:
    root = Path(params.source)
    if not root.is_dir():
        raise StepError(f"{root}: image folder not found")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise StepError(f"{root}: need at least two class sub-folders, found {classes}")
    return classes


def folder_units(params: IngestParams) -> list[Unit]:
    """Runs of image files per class folder, in path order. A run ends where the directory
    changes (a new dated sub-folder is new units) or at a file whose path hashes to a
    boundary (about ``unit_files`` files a run, at most 4x that): adding files touches only
    the runs they fall into, so every other run keeps its shards."""
    root = Path(params.source)
    classes = _class_folders(params)
    units: list[Unit] = []
    every = max(1, int(params.unit_files))
    for idx, cls in enumerate(classes):
        files = sorted(f for f in (root / cls).rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES)
        for path in files:  # before reading any: fail fast on entries that are not files
            _check_image_file(path)
        run: list[str] = []
        for path in files:
            rel = path.relative_to(root).as_posix()
            boundary = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % every == 0
            if run and (
                boundary or len(run) >= 4 * every or Path(run[-1]).parent != Path(rel).parent
            ):
                units.append(_folder_unit(run, idx))
                run = []
            run.append(rel)
        if run:
            units.append(_folder_unit(run, idx))
    if not units:
        raise StepError(f"{root}: no {sorted(IMAGE_SUFFIXES)} files in the class folders")
    return units


def _folder_unit(files: list[str], label: int) -> Unit:
    name = files[0] if len(files) == 1 else f"{files[0]} .. {files[-1]} ({len(files)} files)"
    return Unit(name, tuple(files), (("label", label),), rows_are_files=True)


def read_folder_unit(params: IngestParams, unit: Unit) -> Iterator[UnitBatch]:
    from PIL import Image, UnidentifiedImageError

    root = Path(params.source)
    label = dict(unit.context)["label"]
    size = tuple(params.image_size) if params.image_size else None
    keys, images, shapes = [], [], set()
    for rel in unit.files:
        path = root / rel
        blob = _read_image_file(path)
        keys.append(hashlib.sha256(blob).digest())
        try:
            img = Image.open(io.BytesIO(blob)).convert(params.image_mode)
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
            raise StepError(f"{path}: not a readable image ({exc})") from exc
        if size is not None and img.size != (size[1], size[0]):
            img = img.resize((size[1], size[0]), Image.BILINEAR)
        arr = np.asarray(img, dtype=np.uint8)
        images.append(arr[..., None] if arr.ndim == 2 else arr)
        shapes.add(images[-1].shape)
    n = len(images)
    yield UnitBatch(
        keys=keys,
        labels=np.full(n, label, dtype=np.int64),
        sources=list(unit.files),
        rows=np.arange(n, dtype=np.int64),  # the file's place in the unit
        columns={
            "image": [im.tobytes() for im in images],
            "height": np.asarray([im.shape[0] for im in images], np.int32),
            "width": np.asarray([im.shape[1] for im in images], np.int32),
            "channels": np.asarray([im.shape[2] for im in images], np.int32),
        },
    )


def _check_image_file(path: Path) -> None:
    """An entry of a class folder named like an image must be a readable regular file (or a
    link to one); a directory, a broken link or a device is an error naming the path."""
    if path.is_symlink() and not path.exists():
        raise StepError(f"{path}: broken symbolic link (its target {path.readlink()} is missing)")
    if path.is_dir():
        raise StepError(
            f"{path}: is a directory, but its name ends in {path.suffix}; image files must be "
            "regular files (rename or move the directory)"
        )
    if not path.is_file():
        raise StepError(f"{path}: not a regular file (a device, socket or pipe)")


def _read_image_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StepError(f"{path}: cannot read ({exc.strerror or exc})") from exc


# --------------------------------------------------------------------------- materialise


def write_idx(dest: Path, array: np.ndarray) -> None:
    """Write an uncompressed uint8 IDX file (deterministic bytes)."""
    arr = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with atomic_path(dest) as tmp:
        tmp.write_bytes(header + arr.tobytes())


def materialize_builtin_digits(out_dir: str | Path) -> dict[str, str]:
    """Write scikit-learn's digits as IDX files; returns their sha256 by file name."""
    out_dir = Path(out_dir)
    images, labels = builtin_digits()
    write_idx(out_dir / "digits-images-idx3-ubyte", images)
    write_idx(out_dir / "digits-labels-idx1-ubyte", labels.astype(np.uint8))
    from components.artifacts import sha256_file

    return {p.name: sha256_file(p) for p in sorted(out_dir.glob("digits-*-ubyte"))}


# --------------------------------------------------------------------------- validation


def image_dims(images: np.ndarray) -> list[int]:
    """[H, W, C] of an [N, H, W, C] array; missing axes are 0 (the ``ndim`` rule reports them)."""
    return [int(d) for d in (*images.shape[1:4], *([0] * max(0, 4 - images.ndim)))]


def sample_table(split: str, file: str, data: dataset.Split) -> pd.DataFrame:
    """One row per sample, computed on the raw arrays (no casting of the stored data)."""
    images, labels = data.images, data.labels
    if images.ndim < 1 or labels.ndim != 1:
        raise StepError(
            f"{file}: 'images' must be [N, H, W, C] and 'labels' [N]; got shapes "
            f"{list(images.shape)} and {list(labels.shape)}"
        )
    n_img, n_lbl = int(images.shape[0]), int(labels.shape[0])
    n = max(n_img, n_lbl)
    flat = images.reshape(n_img, int(np.prod(images.shape[1:], dtype=np.int64)))
    if np.issubdtype(images.dtype, np.integer) or images.dtype == np.bool_:
        wide: type = np.int64
        has_nan = np.zeros(n_img, dtype=bool)
    else:
        wide = np.float64
        has_nan = np.isnan(flat).any(axis=1) if flat.shape[1] else np.zeros(n_img, dtype=bool)
    if flat.shape[1]:
        pmin = flat.min(axis=1).astype(wide)
        pmax = flat.max(axis=1).astype(wide)
    else:
        pmin = pmax = np.full(n_img, np.nan)
    dims = image_dims(images)
    cols: dict[str, Any] = {
        "ndim": np.full(n_img, images.ndim - 1, dtype=np.int64),
        "height": np.full(n_img, dims[0], dtype=np.int64),
        "width": np.full(n_img, dims[1], dtype=np.int64),
        "channels": np.full(n_img, dims[2], dtype=np.int64),
        "dtype": [str(images.dtype)] * n_img,
        "pixel_min": pmin,
        "pixel_max": pmax,
        "has_nan": has_nan,
        "sample_sha": [hashlib.sha256(img.tobytes()).hexdigest() for img in images],
    }
    frame = pd.DataFrame(cols, index=pd.RangeIndex(n_img)).reindex(pd.RangeIndex(n))
    frame.insert(0, "file", file)
    frame.insert(1, "index", np.arange(n, dtype=np.int64))
    frame.insert(2, "split", split)
    label_col = pd.Series(labels, index=pd.RangeIndex(n_lbl)).reindex(pd.RangeIndex(n))
    frame.insert(3, "label", label_col)
    frame.insert(4, "label_dtype", str(labels.dtype))
    return frame[SAMPLE_COLUMNS]


def sample_expectations(
    params: ValidateParams, num_classes: int, shape: Sequence[int]
) -> list[Any]:
    import great_expectations.expectations as gxe

    classes = list(range(num_classes))
    lo, hi = params.pixel_min, params.pixel_max
    out: list[Any] = [
        gxe.ExpectTableColumnsToMatchSet(
            column_set=SAMPLE_COLUMNS, exact_match=True, description="schema"
        ),
        gxe.ExpectTableRowCountToBeBetween(
            min_value=params.min_rows, max_value=params.max_rows, description="row count per split"
        ),
    ]
    out += [
        gxe.ExpectColumnValuesToNotBeNull(column=c, description="no nulls") for c in SAMPLE_COLUMNS
    ]
    out += [
        gxe.ExpectColumnValuesToBeInSet(
            column="dtype", value_set=[params.expected_dtype], description="image dtype"
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="label_dtype", value_set=[LABEL_DTYPE], description="label dtype"
        ),
        gxe.ExpectColumnValuesToBeInSet(column="ndim", value_set=[3], description="image rank"),
    ]
    out += [
        gxe.ExpectColumnValuesToBeInSet(column=c, value_set=[int(d)], description="image shape")
        for c, d in zip(("height", "width", "channels"), shape, strict=True)
    ]
    out += [
        gxe.ExpectColumnValuesToBeBetween(
            column=c, min_value=lo, max_value=hi, description="pixel range"
        )
        for c in ("pixel_min", "pixel_max")
    ]
    out += [
        gxe.ExpectColumnValuesToBeInSet(column="has_nan", value_set=[False], description="no NaN"),
        gxe.ExpectColumnValuesToBeInSet(column="label", value_set=classes, description="label set"),
        gxe.ExpectColumnDistinctValuesToContainSet(
            column="label", value_set=classes, description="every class present"
        ),
    ]
    return out


# --------------------------------------------------------------------------- serving


def to_images(model_input: Any, shape: Sequence[int]) -> np.ndarray:
    """A request (see ``components.mlflow_model``) as ``uint8 [N, H, W, C]`` with ``(H, W, C)
    == shape``; ``ValueError`` for anything else."""
    import pandas as pd

    h, w, c = shape
    if isinstance(model_input, pd.DataFrame):
        if model_input.empty:
            raise ValueError("input DataFrame is empty")
        if model_input.shape[1] == 1:
            cells = model_input.iloc[:, 0].tolist()
            try:
                arr = np.stack([np.asarray(v).reshape(h * w * c) for v in cells])
            except ValueError as exc:
                raise ValueError(
                    f"input DataFrame: each cell of its one column must hold {h * w * c} pixel "
                    f"values (an image {h}x{w}x{c}, row-major H, W, C) ({exc})"
                ) from exc
        elif model_input.shape[1] == h * w * c:
            arr = model_input.to_numpy()
        else:
            raise ValueError(
                f"input DataFrame has {model_input.shape[1]} columns: expected one column of "
                f"flat images or {h * w * c} pixel columns (H, W, C = {h}, {w}, {c})"
            )
        model_input = arr.reshape(-1, h, w, c)
    arr = np.asarray(model_input)
    if arr.ndim == 3 and c == 1:
        arr = arr[..., None]
    if arr.ndim != 4 or tuple(arr.shape[1:]) != (h, w, c):
        raise ValueError(f"expected images shaped [N, {h}, {w}, {c}], got {list(arr.shape)}")
    if arr.dtype != np.uint8:
        if arr.size and (
            not np.issubdtype(arr.dtype, np.number)
            or arr.min() < 0
            or arr.max() > 255
            or not np.array_equal(arr, np.round(arr))
        ):
            raise ValueError(f"pixel values must be integers within 0-255 (dtype {arr.dtype})")
        arr = arr.astype(np.uint8)
    return arr


# --------------------------------------------------------------------------- the format


class ImageData(DataFormat):
    """uint8 ``[N, H, W, C]`` images with int64 labels in ``.npz`` archives."""

    name = "image"
    suffix = ".npz"
    ingest_params = IngestParams
    validate_params = ValidateParams
    sample_noun = "image"
    duplicate_rule = "same image bytes and label"

    def units(self, params: IngestParams, params_file: str) -> list[Unit]:
        if params.kind == "builtin":
            _check_builtin(params, params_file)
            return [Unit(params.source, (params.source,))]
        if params.kind == "mnist_idx":
            return idx_units(params)
        return folder_units(params)

    def unit_inputs(self, params: IngestParams, unit: Unit) -> dict[str, str]:
        if params.kind == "builtin":
            return {params.source: _builtin_sha()}
        if params.kind == "mnist_idx":
            return {f: sha256_bytes(read_bytes(join_uri(params.source, f))) for f in unit.files}
        root = Path(params.source)
        return {f: sha256_bytes(_read_image_file(root / f)) for f in unit.files}

    def read_unit(self, params: IngestParams, unit: Unit, params_file: str) -> Iterator[UnitBatch]:
        if params.kind == "builtin":
            return read_builtin_unit(params)
        if params.kind == "mnist_idx":
            return read_idx_unit(params, unit)
        return read_folder_unit(params, unit)

    def label_source(self, params: IngestParams, unit: Unit) -> str:
        if params.kind == "mnist_idx":
            return join_uri(params.source, unit.files[1])
        return params.source if params.kind == "builtin" else f"{params.source}/{unit.id}"

    def decode_params(self, params: IngestParams) -> dict[str, Any]:
        return {"image_size": params.image_size, "image_mode": params.image_mode}

    def fixed_label_names(self, params: IngestParams, params_file: str) -> list[str] | None:
        if params.kind != "image_folder":
            return params.label_names
        classes = _class_folders(params)
        names = list(params.label_names) if params.label_names else classes
        if len(names) != len(classes):
            raise StepError(
                f"{params_file}: ingest.label_names has {len(names)} names, {params.source} "
                f"has {len(classes)} class folders"
            )
        return names

    def payload_fields(self) -> list[Any]:
        import pyarrow as pa

        return [
            pa.field("image", pa.binary(), nullable=False),  # raw uint8 pixels, H x W x C
            pa.field("height", pa.int32(), nullable=False),
            pa.field("width", pa.int32(), nullable=False),
            pa.field("channels", pa.int32(), nullable=False),
        ]

    def to_samples(self, batch: Any) -> np.ndarray:
        if batch is None or batch.num_rows == 0:
            return np.zeros((0, 0, 0, 0), dtype=np.uint8)
        dims = [batch.column(c).to_numpy() for c in ("height", "width", "channels")]
        shapes = set(zip(*(d.tolist() for d in dims), strict=True))
        if len(shapes) != 1:
            raise StepError(
                f"a shard holds images of several shapes {sorted(shapes)[:4]}; ingest with "
                "ingest.image_size: [H, W]"
            )
        h, w, c = shapes.pop()
        col = batch.column("image")
        flat = np.frombuffer(b"".join(col.to_pylist()), dtype=np.uint8)
        return flat.reshape(batch.num_rows, h, w, c)

    def batch_facts(self, batch: UnitBatch) -> dict[str, Any]:
        dims = zip(
            batch.columns["height"].tolist(),
            batch.columns["width"].tolist(),
            batch.columns["channels"].tolist(),
            strict=True,
        )
        return {"shapes": dict(Counter(f"{h}x{w}x{c}" for h, w, c in dims))}

    def merge_facts(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        shapes = sum_facts(parts).get("shapes", {})
        if len(shapes) > 1:
            shown = dict(sorted(shapes.items(), key=lambda kv: -kv[1]))
            raise StepError(f"images have different sizes {shown}; set ingest.image_size: [H, W]")
        return {"image_shape": [int(d) for d in next(iter(shapes)).split("x")] if shapes else []}

    def sample_table(self, split: str, file: str, data: dataset.Split) -> pd.DataFrame:
        return sample_table(split, file, data)

    def input_examples(
        self, samples: np.ndarray, count: int, max_bytes: int
    ) -> tuple[np.ndarray, list[int]]:
        if samples.ndim != 4 or samples.dtype != np.uint8 or samples.shape[0] == 0:
            raise ValueError(
                "field 'images' must be uint8 [N, H, W, C] with N >= 1, got "
                f"{samples.dtype} {list(samples.shape)}"
            )
        per_image = int(np.prod(samples.shape[1:]))
        n = max(1, min(count, max_bytes // max(per_image, 1), samples.shape[0]))
        return np.ascontiguousarray(samples[:n]), [int(x) for x in samples.shape[1:]]

    def model_input(self, value: Any, shape: list[int]) -> np.ndarray:
        return to_images(value, shape)

    def sample_expectations(
        self, params: ValidateParams, num_classes: int, splits: dict[str, dataset.Split]
    ) -> tuple[list[Any], dict[str, Any]]:
        if params.image_shape is not None:
            shape = [int(d) for d in params.image_shape]
        else:
            shape = image_dims(splits["train"].samples)
        return sample_expectations(params, num_classes, shape), {"image_shape": shape}
