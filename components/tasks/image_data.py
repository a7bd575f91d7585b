"""Images: the data format of the image-classification tasks (digits, image folders).

Ingest sources (``params.yaml: ingest.source`` + ``ingest.kind``):

- ``builtin`` with source ``builtin:digits``: scikit-learn's 1,797 real 8x8 handwritten digits
  (scaled from 0-16 to 0-255).
- ``mnist_idx``: IDX files (raw or ``.gz``) in a local directory or under an ``http(s)://`` or
  ``s3://`` prefix (read through fsspec). ``ingest.idx_files`` lists ``[images, labels]`` pairs.
- ``image_folder``: a directory with one sub-directory per class holding PNG/JPEG files.

Stored in Parquet shards (``components.ml.data.snapshot``: ``image`` raw uint8 bytes with
``height``, ``width``, ``channels``; ``label`` int64). Validation (:class:`ImageShardStats`,
streamed per shard): the pixels' dtype and the shapes as stored, that every image holds H x W x C
values, the pixel range and NaNs, with rules on the shape (``validate.image_shape`` or the train
split's), the dtype and the pixel range.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import math
import os
import re
import shutil
import struct
import tempfile
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from components.core.artifacts import StepError, atomic_path, sha256_bytes, sha256_file
from components.core.config import params_model
from components.ml.data.harvest import Harvested, local_source, png_bytes
from components.ml.data.sources import join_uri, read_bytes
from components.tasks.data import (
    CommonValidateParams,
    DataFormat,
    Examples,
    Sha256,
    ShardParams,
    ShardStats,
    Skipped,
    SplitParams,
    Unit,
    UnitBatch,
    Units,
    show,
    sum_facts,
)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}  # ingest.extensions' default
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IDX_IMAGES_NDIM, IDX_LABELS_NDIM = 3, 1  # [N, H, W] images, [N] labels
LABEL_DTYPE = "int64"  # the documented on-disk label dtype (components.ml.data.dataset)


Dim = Annotated[int, Field(ge=1)]


@params_model
class IngestParams:
    source: str
    kind: Literal["builtin", "mnist_idx", "image_folder"]
    # mnist_idx: [[images, labels], ...]
    idx_files: list[Annotated[list[str], Field(min_length=2, max_length=2)]] = field(
        default_factory=list
    )
    sha256: dict[str, Sha256] = field(default_factory=dict)
    label_names: Annotated[list[str], Field(min_length=1)] | None = None  # or left out
    image_size: Annotated[list[Dim], Field(min_length=2, max_length=2)] | None = None  # [H, W]
    image_mode: Literal["L", "RGB"] = "L"
    split: SplitParams = field(default_factory=SplitParams)
    shards: ShardParams = field(default_factory=ShardParams)
    # image folders: about this many files per unit (shards reuse)
    unit_files: Annotated[int, Field(ge=1)] = 256
    workers: Annotated[int, Field(ge=1)] = 1  # processes reading units at once (1: here)
    # image folders: the file extensions read as images (any case); other files are skipped,
    # counted by extension in the ingest manifest (``skipped``) and logged once
    extensions: Annotated[list[str], Field(min_length=1)] = field(
        default_factory=lambda: sorted(IMAGE_SUFFIXES)
    )

    @field_validator("extensions")
    @classmethod
    def _dotted_extensions(cls, names: list[str]) -> list[str]:
        out = []
        for name in names:
            ext = "." + name.strip().lower().lstrip(".")
            if ext == "." or "/" in ext or any(c.isspace() for c in ext):
                raise ValueError(f"{name!r} is not a file extension (e.g. .png)")
            out.append(ext)
        return sorted(set(out))

    @model_validator(mode="after")
    def _idx_files_of_mnist_idx(self) -> IngestParams:
        if self.kind == "mnist_idx" and not self.idx_files:
            raise ValueError("kind mnist_idx needs idx_files: [[images, labels], ...]")
        return self


@params_model
class ValidateParams(CommonValidateParams):
    # [H, W, C]; None = every split must match train
    image_shape: Annotated[list[Dim], Field(min_length=3, max_length=3)] | None = None
    pixel_min: float = 0
    pixel_max: float = 255
    expected_dtype: str = "uint8"

    @field_validator("expected_dtype")
    @classmethod
    def _a_dtype(cls, name: str) -> str:
        try:
            np.dtype(name)
        except TypeError as exc:
            raise ValueError(f"{name!r} is not a dtype") from exc
        return name

    @model_validator(mode="after")
    def _image_rules(self) -> ValidateParams:
        if self.pixel_min > self.pixel_max:
            raise ValueError(f"pixel_min {self.pixel_min} > pixel_max {self.pixel_max}")
        return self


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
FOLDER_BATCH = 64  # image files decoded per batch of a folder unit


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


def _image_array(col: Any, n: int, shape: tuple[int, int, int]) -> np.ndarray:
    """The images of a binary column as ``uint8 [n, H, W, C]``, without a copy when the
    values lie back to back (as ingest writes them)."""
    size = shape[0] * shape[1] * shape[2]
    if col.null_count == 0 and n:
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int32)[col.offset : col.offset + n + 1]
        if np.all(np.diff(offsets) == size):
            data = np.frombuffer(col.buffers()[2], dtype=np.uint8)
            return data[offsets[0] : offsets[-1]].reshape(n, *shape)
    flat = np.frombuffer(b"".join(col.to_pylist()), dtype=np.uint8)
    if flat.size != n * size:
        raise StepError(
            f"image column holds {flat.size} bytes, {n} images of {shape} need {n * size}"
        )
    return flat.reshape(n, *shape)


def _pixel_keys(images: np.ndarray) -> list[bytes]:
    """A decoded image's identity: the sha256 of its pixels as stored."""
    return [hashlib.sha256(np.ascontiguousarray(im).tobytes()).digest() for im in images]


def idx_units(params: IngestParams) -> list[Unit]:
    return [Unit(f"{img}+{lbl}", (img, lbl)) for img, lbl in params.idx_files]


def read_idx_unit(params: IngestParams, unit: Unit) -> Iterator[UnitBatch]:
    img_name, lbl_name = unit.files
    img_uri, lbl_uri = join_uri(params.source, img_name), join_uri(params.source, lbl_name)
    img_bytes, lbl_bytes = read_bytes(img_uri), read_bytes(lbl_uri)
    inputs = {img_name: sha256_bytes(img_bytes), lbl_name: sha256_bytes(lbl_bytes)}
    imgs = parse_idx(img_bytes, img_uri, IDX_IMAGES_NDIM)
    lbls = parse_idx(lbl_bytes, lbl_uri, IDX_LABELS_NDIM)
    del img_bytes, lbl_bytes
    if imgs.shape[0] != lbls.shape[0]:
        raise StepError(
            f"{img_uri}: {imgs.shape[0]} images but {lbl_name} has {lbls.shape[0]} labels"
        )
    images, labels = _as_pixels(imgs, img_uri)[..., None], _as_labels(lbls, lbl_uri)
    for start in range(0, images.shape[0], IDX_BATCH):
        part = images[start : start + IDX_BATCH]
        batch = _image_batch(
            part, labels[start : start + IDX_BATCH], _pixel_keys(part), img_name, start
        )
        batch.inputs, inputs = inputs, {}  # the pair's hashes ride on its first batch
        yield batch


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
    batch = _image_batch(images[..., None], labels, _pixel_keys(images), params.source, 0)
    batch.inputs = {params.source: _builtin_sha(images, labels)}
    yield batch


def _builtin_sha(images: np.ndarray | None = None, labels: np.ndarray | None = None) -> str:
    if images is None or labels is None:
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


def folder_units(params: IngestParams) -> Units:
    """Runs of image files per class folder. Each directory's own files come first, in name
    order, then its sub-directories, each in turn (so a new dated sub-folder is new units
    after every old one, whatever the names). A run never crosses a directory; it ends at a
    file whose path hashes to a boundary once it holds ``unit_files // 4`` files, or at
    ``4 * unit_files`` files, and a directory's last run shorter than ``unit_files // 4`` joins
    the run before it: adding files touches only the runs they fall into (and, at a
    directory's end, the one before), so every other run keeps its shards. Files whose
    extension is not in ``ingest.extensions`` are skipped and counted by extension."""
    root = Path(params.source)
    classes = _class_folders(params)
    units = Units()
    every = max(1, int(params.unit_files))
    extensions = set(params.extensions)
    for idx, cls in enumerate(classes):
        for rels in _directory_files(str(root), cls, extensions, units.skipped):
            for run in _runs(rels, every):
                units.append(_folder_unit(run, idx))
    if not units:
        raise StepError(
            f"{root}: no {params.extensions} files in the class folders (ingest.extensions)"
        )
    return units


def _runs(rels: list[str], every: int) -> list[list[str]]:
    """One directory's files (in order) cut into runs at path-hash boundaries (see
    :func:`folder_units`)."""
    least = max(1, every // 4)
    runs: list[list[str]] = []
    run: list[str] = []
    for rel in rels:
        boundary = zlib.crc32(rel.encode()) % every == 0  # the path's hash, not its place
        if run and ((boundary and len(run) >= least) or len(run) >= 4 * every):
            runs.append(run)
            run = []
        run.append(rel)
    if run:
        if runs and len(run) < least and len(runs[-1]) + len(run) <= 4 * every:
            runs[-1].extend(run)
        else:
            runs.append(run)
    return runs


def _directory_files(
    root: str, rel_dir: str, extensions: set[str], skipped: Skipped
) -> Iterator[list[str]]:
    """The image files of ``root/rel_dir`` (relative to ``root``, in name order), then those
    of each sub-directory (in name order), depth first; one list per directory. Every other
    file is counted in ``skipped`` by its extension. An entry named like an image must be a
    readable regular file (or a link to one): a directory, a broken link or a device is an
    error naming the path."""
    files: list[str] = []
    subdirs: list[str] = []
    with os.scandir(os.path.join(root, rel_dir)) as entries:
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}"
            dot = entry.name.rfind(".")  # pathlib's suffix: none for .DS_Store or "a."
            ext = entry.name[dot:].lower() if 0 < dot < len(entry.name) - 1 else ""
            if ext in extensions:
                _check_image_entry(entry)
                files.append(rel)
            elif entry.is_dir(follow_symlinks=False):
                subdirs.append(rel)
            elif entry.is_dir():
                skipped.add("link to a directory (not followed)", rel)
            else:
                skipped.add(f"extension {ext}" if ext else "no extension", rel)
    files.sort()
    if files:
        yield files
    for sub in sorted(subdirs):
        yield from _directory_files(root, sub, extensions, skipped)


def _check_image_entry(entry: os.DirEntry) -> None:
    """An entry named like an image is a regular file or a link to one (see
    :func:`_directory_files`); costs no system call for a plain file."""
    if entry.is_file(follow_symlinks=False):
        return
    _check_image_file(Path(entry.path))


def _folder_unit(files: list[str], label: int) -> Unit:
    name = files[0] if len(files) == 1 else f"{files[0]} .. {files[-1]} ({len(files)} files)"
    return Unit(name, tuple(files), (("label", label),), rows_are_files=True)


def read_folder_unit(params: IngestParams, unit: Unit) -> Iterator[UnitBatch]:
    """The unit's images in batches of ``FOLDER_BATCH``; each file is read once, and that read
    is hashed (the file's sha256: its input hash and its sample key) and decoded."""
    label = dict(unit.context)["label"]
    size = tuple(params.image_size) if params.image_size else None
    for start in range(0, len(unit.files), FOLDER_BATCH):
        yield _folder_batch(params, unit, params.source, label, size, start)


def _folder_batch(
    params: IngestParams, unit: Unit, root: str, label: int, size: tuple | None, start: int
) -> UnitBatch:
    """Files ``start`` .. ``start + FOLDER_BATCH`` of a unit, hashed and decoded; a file that
    does not decode is left out and named in ``unreadable`` with its reason."""
    from PIL import Image, UnidentifiedImageError

    keys, pixels, shapes, rows, unreadable = [], [], [], [], []
    inputs: dict[str, str] = {}
    for row, rel in enumerate(unit.files[start : start + FOLDER_BATCH], start):
        path = os.path.join(root, rel)
        blob = _read_image_file(path)
        digest = hashlib.sha256(blob)
        inputs[rel] = digest.hexdigest()
        try:
            img = Image.open(io.BytesIO(blob)).convert(params.image_mode)
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
            unreadable.append((path, _unreadable_reason(blob, exc)))
            continue
        if size is not None and img.size != (size[1], size[0]):
            img = img.resize((size[1], size[0]), Image.BILINEAR)
        keys.append(digest.digest())
        pixels.append(img.tobytes())  # row-major H x W x C uint8, as np.asarray(img) lays out
        shapes.append((img.size[1], img.size[0], len(img.getbands())))
        rows.append(row)
    n = len(keys)
    shape = np.asarray(shapes, np.int32).reshape(n, 3)
    return UnitBatch(
        keys=keys,
        labels=np.full(n, label, dtype=np.int64),
        sources=[unit.files[r] for r in rows],
        rows=np.asarray(rows, dtype=np.int64),  # the file's place in the unit
        unreadable=unreadable,
        inputs=inputs,
        columns={
            "image": pixels,
            "height": np.ascontiguousarray(shape[:, 0]),
            "width": np.ascontiguousarray(shape[:, 1]),
            "channels": np.ascontiguousarray(shape[:, 2]),
        },
    )


_OBJECT_REPR = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


def _unreadable_reason(blob: bytes, exc: Exception) -> str:
    """Why an image file does not decode, for people: no Python object reprs."""
    from PIL import UnidentifiedImageError

    if not blob:
        return "empty file (0 bytes)"
    if isinstance(exc, UnidentifiedImageError):
        return f"no image format recognised in its {len(blob)} bytes (not an image, or cut short)"
    text = _OBJECT_REPR.sub("", str(exc)).strip() or type(exc).__name__
    return f"cannot be decoded: {text} ({len(blob)} bytes)"


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


def _read_image_file(path: str | Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise StepError(f"{path}: cannot read ({exc.strerror or exc})") from exc


# --------------------------------------------------------------------------- materialise


def write_idx(dest: Path, array: np.ndarray) -> None:
    """Write an uncompressed uint8 IDX file (deterministic bytes)."""
    arr = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with atomic_path(dest) as tmp:
        tmp.write_bytes(header + arr.tobytes())


def _harvest_idx(root: Path, name: str, rows: Iterable[tuple[str, Any, int]]) -> Harvested:
    """Harvested images as one more IDX pair ``<name>-images-idx3-ubyte`` /
    ``<name>-labels-idx1-ubyte`` (streamed through a temporary body: the header needs the
    count), listed in ``ingest.idx_files`` and forced into train."""
    files = (f"{name}-images-idx3-ubyte", f"{name}-labels-idx1-ubyte")
    shape: tuple[int, ...] | None = None
    count = 0
    with tempfile.TemporaryDirectory(dir=root, prefix=".harvest-") as tmp:
        body, labels = Path(tmp) / "images", Path(tmp) / "labels"
        with body.open("wb") as images_out, labels.open("wb") as labels_out:
            for _, image, label in rows:
                pixels = np.asarray(image, dtype=np.uint8)[..., 0]  # [h, w, 1] -> [h, w]
                if shape is None:
                    shape = pixels.shape
                if not 0 <= label < 256:
                    raise StepError(f"label {label}: an IDX label file holds 0-255")
                images_out.write(np.ascontiguousarray(pixels).tobytes())
                labels_out.write(bytes([label]))
                count += 1
        if count == 0 or shape is None:
            return Harvested({}, {}, 0)
        for dest, part, dims in ((files[0], body, (count, *shape)), (files[1], labels, (count,))):
            header = struct.pack(">BBBB", 0, 0, 0x08, len(dims)) + struct.pack(
                f">{len(dims)}I", *dims
            )
            with atomic_path(root / dest) as out, out.open("wb") as handle:
                handle.write(header)
                with part.open("rb") as src:
                    shutil.copyfileobj(src, handle)
    digests = {f: sha256_file(root / f) for f in files}
    return Harvested(
        digests,
        {"idx_files": [list(files)], "sha256": digests, "split": {"files": {f"{name}-*": "train"}}},
        count,
    )


def _harvest_folder(
    root: Path, name: str, rows: Iterable[tuple[str, Any, int]], classes: list[str]
) -> Harvested:
    """Harvested images as PNGs ``<class>/<name>/<request id>-<n>.png``: written under a
    hidden staging folder (ingest skips it), then moved in one folder per class."""
    staging = root / f".harvest-{name}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    count = 0
    try:
        for rid, image, label in rows:
            if not 0 <= label < len(classes):
                raise StepError(f"label {label}: the source has {len(classes)} class folders")
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", rid)
            dest = staging / classes[label] / name / f"{safe}-{count}.png"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(png_bytes(np.asarray(image, dtype=np.uint8)))
            count += 1
        moved = []
        for folder in sorted(staging.glob(f"*/{name}")):
            target = root / folder.parent.name / name
            if target.exists():
                raise StepError(f"{target}: a harvested unit of that name exists")
            folder.rename(target)
            moved.append(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if count == 0:
        return Harvested({}, {}, 0)
    return Harvested(
        {str(p.relative_to(root)): "" for p in moved},
        {"split": {"files": {f"*/{name}/*": "train"}}},
        count,
    )


def materialize_builtin_digits(out_dir: str | Path) -> dict[str, str]:
    """Write scikit-learn's digits as IDX files; returns their sha256 by file name."""
    out_dir = Path(out_dir)
    images, labels = builtin_digits()
    write_idx(out_dir / "digits-images-idx3-ubyte", images)
    write_idx(out_dir / "digits-labels-idx1-ubyte", labels.astype(np.uint8))

    return {p.name: sha256_file(p) for p in sorted(out_dir.glob("digits-*-ubyte"))}


# --------------------------------------------------------------------------- validation

DIMS = ("height", "width", "channels")
SHARD_COLUMNS = (
    "dtype", "dtype_found", "shape", "shape_found", "size_mismatch", "size_found",
    "pixel_min", "pixel_max", "pixel_low_found", "pixel_high_found", "nan_rows", "nan_found",
)  # fmt: skip


def _pixels(column: Any) -> tuple[str, np.ndarray | None, np.ndarray, np.ndarray]:
    """The pixels of an Arrow ``image`` column without copying them: (element dtype as
    stored, every row's values one after another, each row's start and length in values).

    Raw bytes (``binary``, as ingest writes them) are uint8; a list column holds its
    element type (a hand-written shard of int16 or float32 pixels); any other type has no
    pixels to read (values ``None``; the dtype rule reports it)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n, t = len(column), column.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        buffers = column.buffers()
        kind = np.int64 if pa.types.is_large_binary(t) else np.int32
        offsets = np.frombuffer(buffers[1], kind)[column.offset : column.offset + n + 1]
        data = buffers[2]
        values = (
            np.frombuffer(data, np.uint8)[int(offsets[0]) : int(offsets[-1])]
            if data is not None
            else np.zeros(0, np.uint8)
        )
        starts = (offsets[:-1] - offsets[0]).astype(np.int64)
        return "uint8", values, starts, np.diff(offsets).astype(np.int64)
    if pa.types.is_fixed_size_binary(t):
        width = t.byte_width
        data = np.frombuffer(column.buffers()[1], np.uint8)
        values = data[column.offset * width : (column.offset + n) * width]
        return "uint8", values, np.arange(n, dtype=np.int64) * width, np.full(n, width, np.int64)
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if is_list and (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)):
        values = column.flatten().to_numpy(zero_copy_only=False)
        lengths = pc.list_value_length(column).fill_null(0).to_numpy().astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        return str(values.dtype), values, starts, lengths
    return str(t), None, np.zeros(n, np.int64), np.zeros(n, np.int64)


class ImageShardStats(ShardStats):
    """One shard's images: the dtype and shapes as stored (schema and the ``height``,
    ``width``, ``channels`` columns), whether every image holds H x W x C values, and the
    pixel range and NaNs, computed with numpy per batch on the raw bytes."""

    def __init__(self, params: ValidateParams) -> None:
        self.lo, self.hi = params.pixel_min, params.pixel_max
        self.rows = 0
        self.dtypes: Counter[str] = Counter()
        self.shapes: Counter[str] = Counter()
        self.pixel_min: float | None = None
        self.pixel_max: float | None = None
        self.low, self.high, self.nan, self.size = Examples(), Examples(), Examples(), Examples()

    def add(self, batch: Any, first: int) -> None:
        n = batch.num_rows
        self.rows += n
        names = set(batch.schema.names)
        dims = None
        if {"height", "width", "channels"} <= names:
            dims = np.stack(
                [batch.column(c).fill_null(0).to_numpy().astype(np.int64) for c in DIMS], axis=1
            )
            found, counts = np.unique(dims, axis=0, return_counts=True)
            for (h, w, c), count in zip(found.tolist(), counts.tolist(), strict=True):
                self.shapes[f"{h}x{w}x{c}"] += count
        if "image" not in names:
            return
        dtype, values, starts, lengths = _pixels(batch.column("image"))
        self.dtypes[dtype] += n
        if dims is not None:
            wrong = np.flatnonzero(lengths != dims.prod(axis=1))
            self.size.add(batch, first, wrong, lengths[wrong])
        if values is None or not values.size:
            return
        rows = np.flatnonzero(lengths > 0)
        at = starts[rows]
        row_min = np.minimum.reduceat(values, at)
        row_max = np.maximum.reduceat(values, at)
        if values.dtype.kind == "f":
            has_nan = np.logical_or.reduceat(np.isnan(values), at)
            self.nan.add(batch, first, rows[has_nan])
            if has_nan.all():
                return
            lo, hi = float(np.nanmin(row_min)), float(np.nanmax(row_max))
        else:
            lo, hi = float(row_min.min()), float(row_max.max())
        self.pixel_min = lo if self.pixel_min is None else min(self.pixel_min, lo)
        self.pixel_max = hi if self.pixel_max is None else max(self.pixel_max, hi)
        below, above = np.flatnonzero(row_min < self.lo), np.flatnonzero(row_max > self.hi)
        self.low.add(batch, first, rows[below], row_min[below])
        self.high.add(batch, first, rows[above], row_max[above])

    def result(self) -> tuple[dict[str, Any], dict[str, Any]]:
        dtype = ", ".join(sorted(self.dtypes)) or None
        shape = None
        if len(self.shapes) == 1:
            shape = next(iter(self.shapes))
        elif self.shapes:
            shape = ", ".join(f"{s} ({n} rows)" for s, n in sorted(self.shapes.items()))
        every = f"all {self.rows} rows" if len(self.shapes) == 1 else "a shard of several shapes"
        columns = {
            "dtype": dtype,
            "dtype_found": f"found {dtype}",
            "shape": shape,
            "shape_found": f"found {shape} in {every}",
            "size_mismatch": self.size.count,
            "size_found": self.size.found(self.rows, "with another number of values"),
            "pixel_min": self.pixel_min,
            "pixel_max": self.pixel_max,
            "pixel_low_found": _extreme(
                self.pixel_min, self.low.found(self.rows, f"with a pixel below {show(self.lo)}")
            ),
            "pixel_high_found": _extreme(
                self.pixel_max, self.high.found(self.rows, f"with a pixel above {show(self.hi)}")
            ),
            "nan_rows": self.nan.count,
            "nan_found": self.nan.found(self.rows, "with NaN pixels"),
        }
        return columns, {"shapes": dict(self.shapes)}


def _extreme(value: float | None, found: str) -> str:
    """``found 300: 1 of 271 rows with a pixel above 255 (e.g. ...)``."""
    return f"found {show(value)}" + (f": {found.removeprefix('found ')}" if found else "")


def expected_shape(params: ValidateParams, facts: dict[str, dict[str, Any]]) -> list[int]:
    """``validate.image_shape``, else the train split's shape (its most common, by rows;
    the whole data set's when train holds no images)."""
    if params.image_shape is not None:
        return [int(d) for d in params.image_shape]
    shapes = facts.get("train", {}).get("shapes") or sum_facts(list(facts.values())).get(
        "shapes", {}
    )
    if not shapes:
        return []
    common = max(sorted(shapes), key=lambda s: shapes[s])
    return [int(d) for d in common.split("x")]


def shard_expectations(params: ValidateParams, shape: Sequence[int]) -> list[Any]:
    """Rules on the image columns of validate's shard tables (one row per shard)."""
    import great_expectations.expectations as gxe

    lo, hi = params.pixel_min, params.pixel_max
    where = "validate.image_shape" if params.image_shape is not None else "the train split's"
    text = "x".join(str(int(d)) for d in shape)
    return [
        gxe.ExpectColumnValuesToBeInSet(
            column="dtype",
            value_set=[params.expected_dtype],
            description="image dtype",
            meta={
                "column": "image",
                "rule": f"pixels must be stored as {params.expected_dtype} "
                "(validate.expected_dtype)",
                "found": "dtype_found",
            },
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="shape",
            value_set=[text],
            description="image shape",
            meta={
                "column": "shape",
                "rule": f"images must be {text} (H x W x C: {where})",
                "found": "shape_found",
            },
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="size_mismatch",
            max_value=0,
            description="image size",
            meta={
                "column": "image",
                "rule": "an image must hold height x width x channels values",
                "found": "size_found",
            },
        ),
        *[
            gxe.ExpectColumnValuesToBeBetween(
                column=column,
                min_value=lo,
                max_value=hi,
                description="pixel range",
                meta={"found": found},
            )
            for column, found in (
                ("pixel_min", "pixel_low_found"),
                ("pixel_max", "pixel_high_found"),
            )
        ],
        gxe.ExpectColumnValuesToBeBetween(
            column="nan_rows",
            max_value=0,
            description="no NaN",
            meta={"column": "image", "rule": "pixels must not be NaN", "found": "nan_found"},
        ),
    ]


# --------------------------------------------------------------------------- serving


def to_images(model_input: Any, shape: Sequence[int]) -> np.ndarray:
    """A request (see ``components.tracking.model``) as ``uint8 [N, H, W, C]`` with ``(H, W, C)
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
    shard_columns = SHARD_COLUMNS
    reader_modules = ("PIL.Image", "PIL.JpegImagePlugin", "PIL.PngImagePlugin")

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

    def input_path(self, params: IngestParams, name: str) -> str | None:
        if params.kind == "builtin" or "://" in params.source:
            return None
        return f"{params.source.rstrip('/')}/{name}"  # os.path.join costs 10x (100k files)

    def read_unit(self, params: IngestParams, unit: Unit, params_file: str) -> Iterator[UnitBatch]:
        if params.kind == "builtin":
            return read_builtin_unit(params)
        if params.kind == "mnist_idx":
            return read_idx_unit(params, unit)
        return read_folder_unit(params, unit)

    def write_harvest(
        self,
        params: IngestParams,
        name: str,
        rows: Iterable[tuple[str, Any, int]],
        params_file: str,
    ) -> Harvested:
        root = local_source(params.source, params.kind)
        if params.kind == "mnist_idx":
            return _harvest_idx(root, name, rows)
        return _harvest_folder(root, name, rows, _class_folders(params))

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
        return _image_array(batch.column("image"), batch.num_rows, (h, w, c))

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

    def shard_stats(self, params: ValidateParams) -> ImageShardStats:
        return ImageShardStats(params)

    def shard_expectations(
        self, params: ValidateParams, facts: dict[str, dict[str, Any]]
    ) -> tuple[list[Any], dict[str, Any]]:
        shape = expected_shape(params, facts)
        return shard_expectations(params, shape), {"image_shape": shape}
