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
import struct
import sys
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm import tqdm

from components import dataset
from components.artifacts import StepError, atomic_path, sha256_bytes, write_manifest
from components.cli import run_cli, step_params

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


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
        if self.image_size is not None and len(self.image_size) != 2:
            raise ValueError(f"image_size must be [H, W], got {self.image_size}")


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

    try:
        with fsspec.open(uri, "rb") as fh:
            return fh.read()
    except FileNotFoundError as exc:
        raise StepError(f"{uri}: input file not found") from exc
    except ImportError as exc:  # e.g. s3:// without s3fs
        raise StepError(f"{uri}: cannot open ({exc}); install the extra it names") from exc
    except OSError as exc:
        raise StepError(f"{uri}: cannot read ({exc})") from exc


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def parse_idx(data: bytes, name: str) -> np.ndarray:
    """Parse an IDX file (optionally gzip-compressed) with strict length checks."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except EOFError as exc:  # the stream ends early: a cut-off download or copy
            raise StepError(f"{name}: {_describe_truncated_gzip(data)}") from exc
        except (OSError, zlib.error) as exc:
            raise StepError(f"{name}: corrupt gzip stream ({exc})") from exc
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise StepError(f"{name}: not an IDX file (magic must start with two zero bytes)")
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise StepError(f"{name}: unknown IDX element type 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise StepError(f"{name}: truncated IDX header ({len(data)} bytes, need {header})")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = int(np.prod(dims)) * dtype.itemsize
    body = len(data) - header
    if body != expected:
        kind = "truncated" if body < expected else "has trailing bytes"
        raise StepError(
            f"{name}: IDX file {kind}: header declares shape {list(dims)} "
            f"= {expected} bytes of data, file has {body}"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)


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


def read_mnist_idx(params: IngestParams) -> RawData:
    images, labels, hashes = [], [], {}
    for img_name, lbl_name in params.idx_files:
        pair = []
        for name in (img_name, lbl_name):
            uri = _join(params.source, name)
            blob = _read_bytes(uri)
            hashes[name] = sha256_bytes(blob)
            pair.append(parse_idx(blob, uri))
        imgs, lbls = pair
        if imgs.ndim != 3:
            raise StepError(f"{_join(params.source, img_name)}: images must be 3-D [N, H, W]")
        if lbls.ndim != 1:
            raise StepError(f"{_join(params.source, lbl_name)}: labels must be 1-D [N]")
        if imgs.shape[0] != lbls.shape[0]:
            raise StepError(
                f"{_join(params.source, img_name)}: {imgs.shape[0]} images but "
                f"{lbl_name} has {lbls.shape[0]} labels"
            )
        images.append(np.asarray(imgs, dtype=np.uint8)[..., None])
        labels.append(lbls.astype(np.int64))
    shapes = {im.shape[1:] for im in images}
    if len(shapes) != 1:
        raise StepError(f"{params.source}: IDX image files have different shapes {sorted(shapes)}")
    all_labels = np.concatenate(labels)
    return RawData(
        images=np.concatenate(images),
        labels=all_labels,
        label_names=_label_names(params, all_labels),
        input_sha256=hashes,
    )


def builtin_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's real 8x8 digits as uint8 0-255 images [N, 8, 8] and labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    return images, bunch.target.astype(np.int64)


def read_builtin(params: IngestParams) -> RawData:
    if params.source != "builtin:digits":
        raise StepError(f"params.yaml: ingest.source '{params.source}': only builtin:digits exists")
    images, labels = builtin_digits()
    return RawData(
        images=images[..., None],
        labels=labels,
        label_names=_label_names(params, labels),
        input_sha256={"builtin:digits": sha256_bytes(images.tobytes() + labels.tobytes())},
    )


def read_image_folder(params: IngestParams) -> RawData:
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
    size = tuple(params.image_size) if params.image_size else None
    images, labels, hashes = [], [], {}
    for path, idx in tqdm(files, desc="read images", unit="img", leave=False):
        blob = path.read_bytes()
        hashes[path.relative_to(root).as_posix()] = sha256_bytes(blob)
        try:
            img = Image.open(io.BytesIO(blob)).convert(params.image_mode)
        except (UnidentifiedImageError, OSError) as exc:
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
            f"params.yaml: ingest.label_names has {len(names)} names, {root} "
            f"has {len(classes)} class folders"
        )
    return RawData(np.stack(images), np.asarray(labels, np.int64), names, hashes)


def _label_names(params: IngestParams, labels: np.ndarray) -> list[str]:
    if labels.size and labels.min() < 0:
        raise StepError(f"{params.source}: negative label {int(labels.min())}")
    n = int(labels.max()) + 1 if labels.size else 0
    if params.label_names is None:
        return [str(i) for i in range(n)]
    if len(params.label_names) < n:
        raise StepError(
            f"params.yaml: ingest.label_names has {len(params.label_names)} names but "
            f"{params.source} has label {n - 1}"
        )
    return list(params.label_names)


READERS = {"builtin": read_builtin, "mnist_idx": read_mnist_idx, "image_folder": read_image_folder}


# --------------------------------------------------------------------------- split


def verify_sha256(declared: dict[str, str], actual: dict[str, str], source: str) -> None:
    for name, want in declared.items():
        got = actual.get(name)
        if got is None:
            raise StepError(f"params.yaml: ingest.sha256 names '{name}', not an input of {source}")
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


def source_fingerprint(params: IngestParams) -> str:
    """One sha256 over every raw input of the source: a cache key for orchestrators, so an
    ingest of a moving source (a URL, a bucket prefix) reruns exactly when its bytes change."""
    from components.artifacts import combined_sha256

    raw = READERS[params.kind](params)
    return combined_sha256(raw.input_sha256)


def run(params: IngestParams, out_dir: str | Path) -> IngestResult:
    """Read, verify and split the source; write the split files, labels.json and manifest."""
    out_dir = Path(out_dir)
    raw = READERS[params.kind](params)
    verify_sha256(params.sha256, raw.input_sha256, params.source)
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
            params=_params_dict(params),
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


def _params_dict(params: IngestParams) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(params)


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.ingest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command")
    p_run = sub.add_parser("run", help="ingest the configured source (default)")
    p_run.add_argument("--params", default="params.yaml")
    p_run.add_argument("--out", default="outputs/ingest")
    p_mat = sub.add_parser("materialize", help="write builtin:digits as IDX files")
    p_mat.add_argument("--out", default="data/raw/digits")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "materialize", "-h", "--help"):
        argv = ["run", *argv]
    args = parser.parse_args(argv)

    def _go() -> None:
        if args.command == "materialize":
            for name, digest in materialize_builtin_digits(args.out).items():
                log.info("wrote %s/%s sha256=%s", args.out, name, digest)
            return
        params, _ = step_params(args.params, "ingest", IngestParams)
        result = run(params, args.out)
        log.info("ingest done: %s (data sha256 %s)", result.out_dir, result.data_sha256)

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
