"""ingest: read raw data, verify it, split it and write the documented data set format.

Sources (``params.yaml: ingest.source`` + ``ingest.kind``):

- ``builtin`` with source ``builtin:digits``: scikit-learn's 1,797 real 8x8 handwritten digits
  (scaled from 0-16 to 0-255).
- ``mnist_idx``: IDX files (raw or ``.gz``) in a local directory or under an ``http(s)://`` or
  ``s3://`` prefix (read through fsspec). ``ingest.idx_files`` lists ``[images, labels]`` pairs.
- ``image_folder``: a directory with one sub-directory per class holding PNG/JPEG files.

Every input file's sha256 is checked against ``ingest.sha256`` when declared. The split is
stratified by class and deterministic for a seed; identical samples always land in the same
split, so no sample can leak between train, val and test. See ``components.dataset`` for the
output format.

``python -m components.ingest materialize`` writes the built-in digits as IDX files under
``data/raw/digits`` byte-identically on every machine, which is what ``data.dvc`` tracks.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import logging
import math
import re
import socket
import struct
import sys
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm import tqdm

from components import dataset
from components.artifacts import StepError, atomic_path, sha256_bytes, write_manifest
from components.cli import output_dir, run_cli
from components.config import DEFAULT_PARAMS
from components.step import Out, Step, Value

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IDX_IMAGES_NDIM, IDX_LABELS_NDIM = 3, 1  # [N, H, W] images, [N] labels
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
DEFAULT_PARAMS_FILE = str(DEFAULT_PARAMS)  # named in messages when no --params is given


@dataclass(frozen=True)
class SplitParams:
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    seed: int = 42

    def check(self) -> None:
        if not (0 < self.val_fraction < 1 and 0 < self.test_fraction < 1):
            raise ValueError("split.val_fraction and split.test_fraction must be in (0, 1)")
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError("split: val_fraction + test_fraction must leave >= 10% for train")


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

    def check(self) -> None:
        if self.kind == "mnist_idx":
            if not self.idx_files:
                raise ValueError("kind mnist_idx needs idx_files: [[images, labels], ...]")
            for pair in self.idx_files:
                if len(pair) != 2:
                    raise ValueError(f"idx_files entries must be [images, labels], got {pair}")
        if self.image_size is not None and (len(self.image_size) != 2 or min(self.image_size) < 1):
            raise ValueError(f"image_size must be [H, W] with H, W >= 1, got {self.image_size}")
        for name, digest in self.sha256.items():
            if not _SHA256.fullmatch(digest):
                raise ValueError(f"sha256.{name} must be 64 hex digits, got {digest!r}")
        if self.label_names is not None and not self.label_names:
            raise ValueError("label_names must list at least one name (or be left out)")


@dataclass(frozen=True)
class RawData:
    images: np.ndarray  # uint8 [N, H, W, C]
    labels: np.ndarray  # int64 [N]
    label_names: list[str]
    input_sha256: dict[str, str]


@dataclass(frozen=True)
class IngestResult:
    out_dir: Path
    counts: dict[str, dict[str, int]]
    data_sha256: str


# --------------------------------------------------------------------------- readers


def _read_bytes(uri: str) -> bytes:
    import fsspec

    no_credentials, no_endpoint = _s3_errors(uri)
    try:
        with fsspec.open(uri, "rb") as fh:
            return fh.read()
    except no_credentials as exc:
        raise StepError(
            f"{uri}: no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE with ~/.aws/credentials), and "
            "AWS_ENDPOINT_URL_S3 for an S3-compatible server"
        ) from exc
    except no_endpoint as exc:
        raise StepError(
            f"{uri}: cannot connect to the S3 endpoint {exc.kwargs.get('endpoint_url', '')} "
            "(check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and that the server is up)"
        ) from exc
    except FileNotFoundError as exc:
        cause = _network_cause(exc, uri)
        raise StepError(f"{uri}: {cause or 'input file not found'}") from exc
    except IsADirectoryError as exc:
        raise StepError(f"{uri}: is a directory, not an input file") from exc
    except ImportError as exc:  # e.g. s3:// without s3fs
        raise StepError(f"{uri}: cannot open ({exc}); install the extra it names") from exc
    except OSError as exc:
        cause = _network_cause(exc, uri)
        raise StepError(f"{uri}: {cause or f'cannot read ({exc})'}") from exc


def _s3_errors(uri: str) -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """botocore's missing-credentials and unreachable-endpoint errors (none off s3://)."""
    if not uri.startswith(("s3://", "s3a://")):
        return (), ()
    try:
        from botocore import exceptions as boto
    except ImportError:  # s3fs missing: fsspec raises ImportError, handled above
        return (), ()
    return (boto.NoCredentialsError, boto.PartialCredentialsError), (boto.EndpointConnectionError,)


def _network_cause(exc: BaseException, uri: str) -> str | None:
    """What really happened when fsspec reports a URL as missing: the host could not be
    resolved, the connection was refused, or the server answered with an HTTP error."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return None
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return f"invalid port in URL {uri!r}"
    try:
        from aiohttp import ClientResponseError
    except ImportError:  # fsspec's HTTP filesystem needs aiohttp: without it, no HTTP error
        ClientResponseError = ()  # type: ignore[assignment,misc]  # noqa: N806
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, socket.gaierror):
            return f"host '{host}' could not be resolved ({current.strerror or current})"
        if isinstance(current, ConnectionRefusedError):
            return f"connection refused by {host}:{port} (is the server running?)"
        if isinstance(current, TimeoutError):
            return f"connection to {host}:{port} timed out"
        if isinstance(current, ClientResponseError):
            if current.status == 404:
                return "input file not found (HTTP 404)"
            return f"server {host}:{port} answered HTTP {current.status} {current.message}".rstrip()
        current = current.__cause__ or current.__context__
    return None


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


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


def read_mnist_idx(params: IngestParams, params_file: str = DEFAULT_PARAMS_FILE) -> RawData:
    images, labels, hashes = [], [], {}
    label_files: list[tuple[str, np.ndarray]] = []
    for img_name, lbl_name in params.idx_files:
        img_uri, lbl_uri = _join(params.source, img_name), _join(params.source, lbl_name)
        blob = _read_bytes(img_uri)
        hashes[img_name] = sha256_bytes(blob)
        imgs = parse_idx(blob, img_uri, IDX_IMAGES_NDIM)
        blob = _read_bytes(lbl_uri)
        hashes[lbl_name] = sha256_bytes(blob)
        lbls = parse_idx(blob, lbl_uri, IDX_LABELS_NDIM)
        if imgs.shape[0] != lbls.shape[0]:
            raise StepError(
                f"{img_uri}: {imgs.shape[0]} images but {lbl_name} has {lbls.shape[0]} labels"
            )
        images.append(_as_pixels(imgs, img_uri)[..., None])
        labels.append(_as_labels(lbls, lbl_uri))
        label_files.append((lbl_uri, labels[-1]))
    shapes = {im.shape[1:] for im in images}
    if len(shapes) != 1:
        raise StepError(f"{params.source}: IDX image files have different shapes {sorted(shapes)}")
    return RawData(
        images=np.concatenate(images),
        labels=np.concatenate(labels),
        label_names=_label_names(params, label_files, params_file),
        input_sha256=hashes,
    )


def builtin_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's real 8x8 digits as uint8 0-255 images [N, 8, 8] and labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    return images, bunch.target.astype(np.int64)


def read_builtin(params: IngestParams, params_file: str = DEFAULT_PARAMS_FILE) -> RawData:
    if params.source != "builtin:digits":
        raise StepError(
            f"{params_file}: ingest.source '{params.source}': only builtin:digits exists"
        )
    images, labels = builtin_digits()
    return RawData(
        images=images[..., None],
        labels=labels,
        label_names=_label_names(params, [(params.source, labels)], params_file),
        input_sha256={"builtin:digits": sha256_bytes(images.tobytes() + labels.tobytes())},
    )


def read_image_folder(params: IngestParams, params_file: str = DEFAULT_PARAMS_FILE) -> RawData:
    from PIL import Image, UnidentifiedImageError

    root = Path(params.source)
    if not root.is_dir():
        raise StepError(f"{root}: image folder not found")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise StepError(f"{root}: need at least two class sub-folders, found {classes}")
    files = [
        (f, idx)
        for idx, cls in enumerate(classes)
        for f in sorted((root / cls).rglob("*"))
        if f.suffix.lower() in IMAGE_SUFFIXES
    ]
    if not files:
        raise StepError(f"{root}: no {sorted(IMAGE_SUFFIXES)} files in the class folders")
    for path, _ in files:  # before reading any: fail fast on entries that are not files
        _check_image_file(path)
    size = tuple(params.image_size) if params.image_size else None
    images, labels, hashes = [], [], {}
    for path, idx in tqdm(files, desc="read images", unit="img", leave=False):
        blob = _read_image_file(path)
        hashes[path.relative_to(root).as_posix()] = sha256_bytes(blob)
        try:
            img = Image.open(io.BytesIO(blob)).convert(params.image_mode)
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
            raise StepError(f"{path}: not a readable image ({exc})") from exc
        if size is not None and img.size != (size[1], size[0]):
            img = img.resize((size[1], size[0]), Image.BILINEAR)
        arr = np.asarray(img, dtype=np.uint8)
        images.append(arr[..., None] if arr.ndim == 2 else arr)
        labels.append(idx)
    shapes = Counter(im.shape for im in images)
    if len(shapes) != 1:
        raise StepError(
            f"{root}: images have different sizes {dict(shapes)}; set ingest.image_size: [H, W]"
        )
    names = list(params.label_names) if params.label_names else classes
    if len(names) != len(classes):
        raise StepError(
            f"{params_file}: ingest.label_names has {len(names)} names, {root} "
            f"has {len(classes)} class folders"
        )
    return RawData(np.stack(images), np.asarray(labels, np.int64), names, hashes)


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


def _span(labels: list[int]) -> str:
    """``0..9`` for contiguous ids, else the ids themselves (at most a few)."""
    if not labels:
        return "(none)"
    if labels == list(range(labels[0], labels[-1] + 1)) and len(labels) > 2:
        return f"{labels[0]}..{labels[-1]}"
    shown = ", ".join(str(v) for v in labels[:5])
    return shown + (", ..." if len(labels) > 5 else "")


def _label_names(
    params: IngestParams, label_files: list[tuple[str, np.ndarray]], params_file: str
) -> list[str]:
    """Class names for the labels read from ``label_files`` ([(name, labels)]).

    The label set is ``ingest.label_names`` when declared, else ``0..K-1`` for the largest
    K whose ids all occur: a label beyond it (say 11 when no sample has label 10) is reported
    as outside the label set, never as a class missing from every split later.
    """
    present = sorted(set(np.concatenate([lb for _, lb in label_files]).tolist()))
    if params.label_names is not None:
        allowed = len(params.label_names)
        declared = f"the declared labels 0..{allowed - 1} ({params_file}: ingest.label_names "
        declared += f"has {allowed} names)"
    else:
        ids, allowed = set(present), 0
        while allowed in ids:
            allowed += 1
        reason = "label ids must run from 0 without gaps"
        if present and present[-1] > allowed:
            reason += f" and no sample has label {allowed}"
        declared = (
            f"the data set's labels {_span(list(range(allowed)))} ({reason}; fix the labels "
            f"or list every class in {params_file}: ingest.label_names)"
        )
    outside = [v for v in present if not 0 <= v < allowed]
    if outside:
        for name, lbls in label_files:  # name the first file holding an offending label
            hits = np.flatnonzero(np.isin(lbls, outside))
            if hits.size:
                bad = sorted(set(lbls[hits].tolist()))
                noun = "label" if len(bad) == 1 else "labels"
                verb = "is" if len(bad) == 1 else "are"
                raise StepError(
                    f"{name}: {noun} {_span(bad)} {verb} not one of {declared}; "
                    f"{hits.size} sample(s), first at index {int(hits[0])}"
                )
    if params.label_names is None:
        return [str(i) for i in range(allowed)]
    return list(params.label_names)


READERS = {"builtin": read_builtin, "mnist_idx": read_mnist_idx, "image_folder": read_image_folder}


# --------------------------------------------------------------------------- split


def verify_sha256(
    declared: dict[str, str],
    actual: dict[str, str],
    source: str,
    params_file: str = DEFAULT_PARAMS_FILE,
) -> None:
    for name, want in declared.items():
        got = actual.get(name)
        if got is None:
            raise StepError(
                f"{params_file}: ingest.sha256 names '{name}', not an input of {source} "
                f"(inputs: {', '.join(sorted(actual)[:5])}{', ...' if len(actual) > 5 else ''})"
            )
        if got != want.lower():
            raise StepError(f"{_join(source, name)}: sha256 {got} does not match declared {want}")


def stratified_split(
    images: np.ndarray, labels: np.ndarray, params: SplitParams
) -> dict[str, np.ndarray]:
    """Indices per split: stratified by label, seeded, identical samples kept together."""
    groups: dict[bytes, list[int]] = {}
    for i in range(images.shape[0]):
        groups.setdefault(hashlib.sha256(images[i].tobytes()).digest(), []).append(i)
    conflicting = [g for g in groups.values() if len(set(labels[g].tolist())) > 1]
    if conflicting:
        raise StepError(
            f"{len(conflicting)} identical image(s) carry different labels, e.g. sample indices "
            f"{conflicting[0][:5]}; fix the labels in the source"
        )
    rng = np.random.default_rng(params.seed)
    out: dict[str, list[int]] = {s: [] for s in dataset.SPLITS}
    by_class: dict[int, list[list[int]]] = {}
    for members in sorted(groups.values(), key=lambda g: g[0]):
        by_class.setdefault(int(labels[members[0]]), []).append(members)
    for label in sorted(by_class):
        class_groups = by_class[label]
        order = rng.permutation(len(class_groups))
        n = len(class_groups)
        n_test = int(round(n * params.test_fraction))
        n_val = int(round(n * params.val_fraction))
        for rank, gi in enumerate(order):
            split = "test" if rank < n_test else "val" if rank < n_test + n_val else "train"
            out[split].extend(class_groups[gi])
    return {s: np.asarray(sorted(v), dtype=np.int64) for s, v in out.items()}


# --------------------------------------------------------------------------- step


def source_fingerprint(params: IngestParams, params_file: str = DEFAULT_PARAMS_FILE) -> str:
    """One sha256 over every raw input of the source: a cache key for orchestrators, so an
    ingest of a moving source (a URL, a bucket prefix) reruns exactly when its bytes change."""
    from components.artifacts import combined_sha256

    raw = READERS[params.kind](params, params_file)
    return combined_sha256(raw.input_sha256)


def run(
    params: IngestParams,
    out_dir: str | Path,
    *,
    params_file: str = DEFAULT_PARAMS_FILE,
    expected_source_sha256: str = "",
) -> IngestResult:
    """Read, verify and split the source; write the split files, labels.json and manifest.

    ``params_file`` is only named in error messages about the params. With
    ``expected_source_sha256`` (the orchestrator's fingerprint, its cache key) the source
    must still hold those bytes, or nothing is written."""
    from components.artifacts import combined_sha256

    out_dir = Path(out_dir)
    raw = READERS[params.kind](params, params_file)
    verify_sha256(params.sha256, raw.input_sha256, params.source, params_file)
    if expected_source_sha256 and combined_sha256(raw.input_sha256) != expected_source_sha256:
        raise StepError(
            f"{params.source} changed while the pipeline ran (its fingerprint was "
            f"{expected_source_sha256[:12]}…, now {combined_sha256(raw.input_sha256)[:12]}…); "
            "run the pipeline again"
        )
    if raw.images.shape[0] == 0:
        raise StepError(f"{params.source}: no samples")
    log.info("read %d samples %s from %s", raw.images.shape[0], raw.images.shape[1:], params.source)
    indices = stratified_split(raw.images, raw.labels, params.split)

    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        counts: dict[str, dict[str, int]] = {}
        for split, idx in indices.items():
            dataset.write_split(tmp, split, dataset.Split(raw.images[idx], raw.labels[idx]))
            per_class = Counter(raw.labels[idx].tolist())
            counts[split] = {
                raw.label_names[k]: int(per_class.get(k, 0)) for k in range(len(raw.label_names))
            }
            log.info("%s: %d samples", split, len(idx))
        dataset.write_label_names(tmp, raw.label_names)
        outputs = {f"{s}.npz": tmp / f"{s}.npz" for s in dataset.SPLITS}
        outputs["labels.json"] = tmp / "labels.json"
        manifest = write_manifest(
            tmp,
            "ingest",
            inputs={},
            outputs=outputs,
            params=asdict(params),
            extra={
                "source": params.source,
                "kind": params.kind,
                "input_sha256": raw.input_sha256,
                "counts": counts,
                "totals": {s: int(len(i)) for s, i in indices.items()},
                "image_shape": list(raw.images.shape[1:]),
            },
        )
        data_sha = _data_sha(manifest)
    return IngestResult(out_dir=out_dir, counts=counts, data_sha256=data_sha)


def _data_sha(manifest_path: Path) -> str:
    import json

    outputs = json.loads(manifest_path.read_text())["outputs"]
    joined = "".join(f"{k}:{v['sha256']}" for k, v in sorted(outputs.items()))
    return sha256_bytes(joined.encode())


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


# --------------------------------------------------------------------------- CLI


STEP = Step(
    name="ingest",
    doc=__doc__,
    params=IngestParams,
    sections=("ingest",),
    run=run,
    outputs=(Out("data", "outputs/ingest", "out_dir", kfp="Dataset", help="the data set"),),
    values=(
        Value(
            "source_sha256",
            "expected_source_sha256",
            help="refuse to write unless the source still has this fingerprint",
        ),
    ),
    extra_deps=("data/raw",),
)


def main(argv: Sequence[str] | None = None) -> int:
    """The step CLI, plus ``materialize`` (write builtin:digits as IDX files)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["materialize"]:
        return STEP.main(argv[1:] if argv[:1] == ["run"] else argv)
    parser = argparse.ArgumentParser(prog="python -m components.ingest materialize")
    parser.add_argument("--out", default="data/raw/digits")
    args = parser.parse_args(argv[1:])

    def _go() -> None:
        for name, digest in materialize_builtin_digits(output_dir(args.out)).items():
            log.info("wrote %s/%s sha256=%s", args.out, name, digest)

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
