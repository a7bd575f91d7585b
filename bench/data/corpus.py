"""The generated image folders: RGB JPEGs of 10 classes (noise plus a class-dependent shape),
deterministic from the seed, cached and reused; per-size folders of hard links to them."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import numpy as np

from bench.data.common import (
    CLASSES,
    COLOURS,
    GENERATOR_VERSION,
    IMAGE_SUFFIXES,
    NEW_FOLDER,
    SHAPES,
    log,
)


def draw(cls: int, index: int, size: int, seed: int) -> np.ndarray:
    """Image ``index`` of class ``cls``: uint8 noise with the class's shape in its colour."""
    rng = np.random.default_rng([seed, cls, index])
    img = rng.integers(0, 90, size=(size, size, 3), dtype=np.int16)
    r = int(rng.integers(size // 8, size // 4 + 1))
    cy, cx = (int(v) for v in rng.integers(r, size - r, size=2))
    yy, xx = np.ogrid[:size, :size]
    dy, dx = np.abs(yy - cy), np.abs(xx - cx)
    d2 = dy**2 + dx**2
    shape = SHAPES[cls % len(SHAPES)]
    if shape == "square":
        mask = (dy <= r) & (dx <= r)
    elif shape == "disc":
        mask = d2 <= r * r
    elif shape == "hbar":
        mask = (dy <= max(1, r // 3)) & (dx <= r + r // 2)
    elif shape == "vbar":
        mask = (dx <= max(1, r // 3)) & (dy <= r + r // 2)
    else:  # ring
        mask = (d2 <= r * r) & (d2 >= (r * 6 // 10) ** 2)
    colour = np.asarray(COLOURS[list(COLOURS)[cls // len(SHAPES)]]) + rng.integers(-30, 31, 3)
    img[mask] = np.clip(colour, 0, 255)
    return img.astype(np.uint8)


def _write_images(job: tuple[str, int, int, int, int, int]) -> int:
    """Write images [start, stop) of one class (a pool task)."""
    from PIL import Image

    root, size, seed, cls, start, stop = job
    folder = Path(root) / CLASSES[cls]
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, stop):
        buf = io.BytesIO()
        Image.fromarray(draw(cls, i, size, seed)).save(buf, format="JPEG", quality=90)
        tmp = folder / f".{i:06d}.tmp"
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, folder / f"{i:06d}.jpg")
    return stop - start


def generated(cache: Path, size: int, per_class: int, seed: int, workers: int) -> Path:
    """The cached folder of generated ``size``px images, holding at least ``per_class``
    images per class (only the missing ones are made)."""
    root = cache / f"gen-{size}px-seed{seed}-v{GENERATOR_VERSION}"
    marker = root / ".complete.json"
    have = json.loads(marker.read_text())["per_class"] if marker.exists() else 0
    if have >= per_class:
        return root
    jobs = [
        (str(root), size, seed, c, s, min(per_class, s + 500))
        for c in range(len(CLASSES))
        for s in range(have, per_class, 500)
    ]
    log.info("generating %d %dpx images in %s", len(CLASSES) * (per_class - have), size, root)
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for _ in pool.imap_unordered(_write_images, jobs):
            pass
    marker.write_text(json.dumps({"per_class": per_class}))
    log.info("  in %.0f s", time.perf_counter() - started)
    return root


def link_folder(dest: Path, source: Path, per_class: int, extra: int = 0) -> Path:
    """``dest``: the first ``per_class`` images of each class of ``source`` as hard links,
    plus the next ``extra`` under ``<class>/<NEW_FOLDER>/`` (made again when it differs)."""
    marker = dest / ".complete.json"
    want = {"source": source.name, "per_class": per_class, "extra": extra}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    for cls in CLASSES:
        (dest / cls).mkdir(parents=True)
        for i in range(per_class):
            os.link(source / cls / f"{i:06d}.jpg", dest / cls / f"{i:06d}.jpg")
        if extra:
            (dest / cls / NEW_FOLDER).mkdir()
            for i in range(per_class, per_class + extra):
                os.link(source / cls / f"{i:06d}.jpg", dest / cls / NEW_FOLDER / f"{i:06d}.jpg")
    marker.write_text(json.dumps(want))
    return dest


def add_new_folder(folder: Path, source: Path, per_class: int, extra: int) -> None:
    """The week's new data: ``extra`` more images per class in ``<class>/<NEW_FOLDER>/``."""
    for cls in CLASSES:
        (folder / cls / NEW_FOLDER).mkdir()
        for i in range(per_class, per_class + extra):
            os.link(source / cls / f"{i:06d}.jpg", folder / cls / NEW_FOLDER / f"{i:06d}.jpg")


def image_files(root: Path) -> list[Path]:
    """The image files of a class folder tree, in the order ingest lists them."""
    return sorted(
        f
        for cls in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        for f in cls.rglob("*")
        if f.suffix.lower() in IMAGE_SUFFIXES
    )
