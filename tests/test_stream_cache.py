"""The piece cache of the training input pipeline (``components.tasks.stream.PieceCache``,
``train.cache_mb``): preprocessed pieces kept on disk so preprocessing is paid once, not every
epoch. The cached path gives the uncached path's batches bit for bit, a changed shard or a
changed preprocessing is never served from the cache, and the cache stays within its bound.
Kill-and-resume with the cache: ``tests/test_train.py``. No timing is asserted."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.ml.data import snapshot
from components.ml.training.distributed import EpochShare, World
from components.steps.train import TrainParams
from components.tasks import get_task, stream
from components.tasks.trainer import Inputs

EPOCHS = (1, 2, 3)


def _params(**kw: object) -> TrainParams:
    # pieces of 100 rows through a 300-sample buffer: ~13 pieces that never fit it at once
    return TrainParams(**{"piece_rows": 100, "shuffle_buffer": 300, **kw})


def _epochs(data: Path, task, cache_dir: Path | None, **kw: object) -> list[list[list]]:
    """Every training batch (inputs, labels, keys) of epochs 1-3 as the train step reads
    them (``Inputs``: its reader over the run, the shuffle buffer, the batches)."""
    params = _params(**kw)
    snap = snapshot.load(data)
    share = EpochShare(snap.rows("train"), params.batch_size, 1)
    inputs = Inputs.build(snap, task, params, share, World(), task.objective(), cache_dir)
    reader = inputs.reader(EPOCHS, val=False)
    out = []
    try:
        for epoch in EPOCHS:
            rng = np.random.default_rng([params.seed, epoch, 0])
            out.append([[*b.inputs, b.labels, b.keys] for b in inputs.batches(reader, epoch, rng)])
    finally:
        reader.close()
    return out


def _assert_same(a: list[list[list]], b: list[list[list]]) -> None:
    assert len(a) == len(b)
    for epoch_a, epoch_b in zip(a, b, strict=True):
        assert len(epoch_a) == len(epoch_b)
        for batch_a, batch_b in zip(epoch_a, epoch_b, strict=True):
            for x, y in zip(batch_a, batch_b, strict=True):
                assert x.dtype == y.dtype and x.shape == y.shape
                np.testing.assert_array_equal(x, y)


def _entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("*/*.npz"))


class _Counting:
    """A task whose preprocess calls are counted (in this process: loader_workers 0); the
    count is private state, outside the preprocessing's fingerprint."""

    def __init__(self, task) -> None:
        self.task, self._calls = task, 0

    @property
    def calls(self) -> int:
        return self._calls

    def __getattr__(self, name: str):
        return getattr(self.task, name)

    def preprocess(self, raw: np.ndarray) -> list[np.ndarray]:
        self._calls += 1
        return self.task.preprocess(raw)


def test_cached_epochs_are_the_uncached_epochs_bit_for_bit(tmp_path, digits_data, digits_task):
    """Three epochs read without a cache, then with one (in-process and by 2 loader workers):
    the same batches in the same order, value for value. With the cache, preprocessing runs
    in the first epoch only."""
    plain = _epochs(digits_data, digits_task, None)
    counting = _Counting(digits_task)
    cached = _epochs(digits_data, counting, tmp_path / "c0", loader_workers=0)
    _assert_same(plain, cached)
    pieces = len(stream.piece_table(snapshot.load(digits_data), "train", 100))
    assert counting.calls == pieces  # epoch 1 only: epochs 2 and 3 were served from the cache
    assert len(_entries(tmp_path / "c0")) == pieces

    filled = _Counting(digits_task)  # counted in the loader workers, not here
    _assert_same(plain, _epochs(digits_data, filled, tmp_path / "c2", loader_workers=2))
    # a later run (a resumed one) reads the kept pieces: still the same batches
    again = _Counting(digits_task)
    _assert_same(plain, _epochs(digits_data, again, tmp_path / "c2", loader_workers=0))
    assert again.calls == 0


def test_no_cache_with_cache_mb_0(tmp_path, digits_data, digits_task):
    _epochs(digits_data, digits_task, tmp_path / "c", cache_mb=0, loader_workers=0)
    assert not (tmp_path / "c").exists()


def _changed_copy(data: Path, dest: Path) -> Path:
    """A copy of the snapshot whose training shard holds other pixels (each inverted) under
    the same path, its new sha256 in snapshot.json."""
    shutil.copytree(data, dest)
    doc = json.loads((dest / "snapshot.json").read_text())
    (shard,) = [s for s in doc["shards"] if s["split"] == "train"]
    path = dest / shard["path"]
    table = pq.read_table(path)
    column = table.schema.get_field_index("image")
    inverted = [bytes(255 - np.frombuffer(b, np.uint8)) for b in table["image"].to_pylist()]
    table = table.set_column(column, table.schema.field(column), pa.array(inverted, pa.binary()))
    pq.write_table(table, path)
    shard["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    shard["bytes"] = path.stat().st_size
    (dest / "snapshot.json").write_text(json.dumps(doc))
    return dest


def test_a_changed_shard_is_not_served_from_the_cache(tmp_path, digits_data, digits_task):
    """The cache filled from the digits snapshot, then a snapshot whose training shard (same
    path, same keys and rows) holds other pixels: its batches are its own, as read uncached."""
    cache = tmp_path / "cache"
    _epochs(digits_data, _Counting(digits_task), cache, loader_workers=0)
    changed = _changed_copy(digits_data, tmp_path / "changed")
    assert snapshot.load(changed).split_shards("train")[0].path == (
        snapshot.load(digits_data).split_shards("train")[0].path
    )
    plain = _epochs(changed, digits_task, None)
    counting = _Counting(digits_task)  # the same preprocessing: the same fingerprint
    _assert_same(plain, _epochs(changed, counting, cache, loader_workers=0))
    assert counting.calls > 0  # read and preprocessed, not served
    original = _epochs(digits_data, digits_task, None)
    assert not np.array_equal(original[0][0][0], plain[0][0][0])  # the change shows


class _Offset(type(get_task("digits"))):
    """Digits whose fitted preprocessing state (saved as an asset, not an attribute) shifts
    every input: a vocabulary's stand-in."""

    def __init__(self, offset: float) -> None:
        base = get_task("digits", {"conv_channels": [6, 16]})
        self.__dict__.update(base.__dict__)
        self._offset = offset

    def preprocess(self, raw: np.ndarray) -> list[np.ndarray]:
        return [x + np.float32(self._offset) for x in super().preprocess(raw)]

    def save_assets(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "offset.json").write_text(json.dumps(self._offset))


@pytest.mark.parametrize(
    "first, second",
    [
        ({"mean": [0.5]}, {"mean": [0.25]}),  # the task's options
        (0.0, 1.0),  # the fitted preprocessing's state (its assets)
    ],
    ids=["options", "fitted-state"],
)
def test_a_changed_preprocessing_is_not_served_from_the_cache(tmp_path, digits_data, first, second):
    """The same cache directory and snapshot, the preprocessing changed: a new fingerprint,
    the batches of the new preprocessing (as read uncached), the old entries removed."""

    def make(spec):
        if isinstance(spec, dict):
            return get_task("digits", {"conv_channels": [6, 16], **spec})
        return _Offset(spec)

    cache = tmp_path / "cache"
    before = make(first)
    _epochs(digits_data, before, cache, loader_workers=0)
    old = _entries(cache)
    after = make(second)
    assert stream.preprocessing_fingerprint(before) != stream.preprocessing_fingerprint(after)
    assert stream.preprocessing_fingerprint(make(second)) == (
        stream.preprocessing_fingerprint(after)
    )
    plain = _epochs(digits_data, after, None)
    _assert_same(plain, _epochs(digits_data, after, cache, loader_workers=0))
    assert old and not any(p.exists() for p in old)  # the other fingerprint's: removed
    assert len(_entries(cache)) == len(old)


def test_the_cache_stays_within_its_bound(tmp_path, digits_data, digits_task):
    """1 MB holds 3 of the 13 pieces (100 x 28 x 28 float32 = 314 KB each): two loader
    workers fill it together without passing the bound; every epoch is still the uncached
    one, bit for bit."""
    cache = tmp_path / "cache"
    plain = _epochs(digits_data, digits_task, None)
    _assert_same(plain, _epochs(digits_data, digits_task, cache, cache_mb=1, loader_workers=2))
    sizes = [p.stat().st_size for p in _entries(cache)]
    assert 0 < len(sizes) < len(stream.piece_table(snapshot.load(digits_data), "train", 100))
    assert sum(sizes) <= 2**20
    assert not list(cache.glob("*/.tmp-*"))  # no temporary file left behind


def test_a_cache_that_cannot_be_written_is_no_error(tmp_path, digits_data, digits_task):
    """The cache directory removed under a run (another fingerprint's run pruned it, a
    cleanup): the run reads and preprocesses as without a cache, same batches."""
    params = _params(loader_workers=0)
    snap = snapshot.load(digits_data)
    share = EpochShare(snap.rows("train"), params.batch_size, 1)
    cache = tmp_path / "cache"
    inputs = Inputs.build(snap, digits_task, params, share, World(), digits_task.objective(), cache)
    shutil.rmtree(cache)
    reader = inputs.reader(EPOCHS, val=False)
    try:
        got = [
            [[*b.inputs, b.labels, b.keys] for b in inputs.batches(reader, e, rng)]
            for e in EPOCHS
            for rng in [np.random.default_rng([params.seed, e, 0])]
        ]
    finally:
        reader.close()
    _assert_same(_epochs(digits_data, digits_task, None), got)
    assert not cache.exists()


def test_the_fingerprint_covers_every_module_of_the_tasks_package(tmp_path, monkeypatch):
    """Preprocessing may call a helper anywhere in the package that defines the task: a change
    to any of its modules (not only the task's own) gives another fingerprint, so no piece
    preprocessed by the old code is served."""
    import importlib

    from components.tasks.stream import _code_sha256

    package = tmp_path / "fakepkg_piece_cache"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("SCALE = 1.0\n")
    (package / "task.py").write_text(
        "from fakepkg_piece_cache import helpers\n\n\nclass T:\n    scale = helpers.SCALE\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    task_class = importlib.import_module("fakepkg_piece_cache.task").T
    before = _code_sha256([task_class])
    assert _code_sha256([task_class]) == before
    (package / "helpers.py").write_text("SCALE = 2.0\n")
    assert _code_sha256([task_class]) != before


def test_the_cache_size_is_no_part_of_a_checkpoints_identity():
    """Changing train.cache_mb changes no sample nor step: a checkpoint resumes across it."""
    from components.ml.training.distributed import Batching
    from components.ml.training.training import fingerprint

    batching = Batching(1, 32, 32, 0.01, "none", 32)
    one = fingerprint({"epochs": 3, "cache_mb": 1024}, {}, "sha", batching)
    assert fingerprint({"epochs": 3, "cache_mb": 0}, {}, "sha", batching) == one
    assert fingerprint({"epochs": 4, "cache_mb": 1024}, {}, "sha", batching) != one
