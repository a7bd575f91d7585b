"""Training: AMP decisions, early stopping, checkpoints, kill-and-resume and the streaming
input pipeline (pieces, loader workers, shuffle buffer)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import paddle
import pytest
import yaml

from components.core.artifacts import read_json
from components.ml.data import snapshot
from components.steps.train import EarlyStopping, TrainParams, resolve_amp, run
from components.tasks import stream
from tests.conftest import REPO


def test_amp_on_cpu_is_recorded_as_off():
    for requested in ("auto", "O1", "O2"):
        mode = resolve_amp(requested, "float16", "cpu")
        assert mode.level == "off" and not mode.enabled
        assert "CPU" in mode.reason


def test_amp_on_cuda_resolves_levels():
    assert resolve_amp("auto", "float16", "gpu").level == "O1"
    assert resolve_amp("O2", "bfloat16", "gpu").level == "O2"
    assert resolve_amp("O2", "bfloat16", "gpu").dtype == "bfloat16"
    assert resolve_amp("off", "float16", "gpu").level == "off"


def test_train_writes_metrics_curves_and_warns_about_amp(
    tmp_path, digits_data, digits_task, caplog
):
    caplog.set_level(logging.WARNING, logger="components.steps.train")
    result = run(
        TrainParams(epochs=2, amp="auto"),
        digits_task,
        digits_data,
        tmp_path / "out",
        checkpoint_dir=tmp_path / "ckpt",
        metrics_file=tmp_path / "m.json",
        plots_file=tmp_path / "curves.csv",
    )
    metrics = read_json(tmp_path / "m.json")
    assert metrics["amp_effective"] == "off"
    assert metrics["amp_requested"] == "auto"
    assert metrics["epochs_run"] == 2 == result.epochs_run
    assert metrics["samples_per_second"] > 0
    # the reader alone, timed before training, beside the train step
    assert metrics["reader_samples_per_second"] > 0
    assert metrics["reader_vs_train"] == pytest.approx(
        metrics["reader_samples_per_second"] / metrics["samples_per_second"], rel=1e-2
    )
    assert 0.5 < metrics["best_val_accuracy"] <= 1.0
    assert any("AMP" in r.message and "unavailable on CPU" in r.message for r in caplog.records)
    lines = (tmp_path / "curves.csv").read_text().splitlines()
    assert lines[0] == "epoch,train_loss,train_accuracy,val_loss,val_accuracy,lr"
    assert len(lines) == 3
    assert (tmp_path / "out" / "model.pdparams").exists()
    assert read_json(tmp_path / "out" / "manifest.json")["amp"]["level"] == "off"


def test_early_stopping_stops_before_max_epochs(tmp_path, digits_data, digits_task):
    # lr so small the model cannot improve on val accuracy for long
    params = TrainParams(epochs=30, learning_rate=1e-7, early_stopping=EarlyStopping(patience=2))
    result = run(params, digits_task, digits_data, tmp_path / "out", checkpoint_dir=tmp_path / "c")
    assert result.epochs_run < 30
    history = read_json(tmp_path / "out" / "history.json")
    best = max(h["val_accuracy"] for h in history)
    after_best = [h for h in history if h["epoch"] > result.best_epoch]
    assert len(after_best) == 2 and all(h["val_accuracy"] <= best for h in after_best)


def test_checkpoint_from_other_params_is_not_resumed(tmp_path, digits_data, digits_task):
    ckpt = tmp_path / "ckpt"
    run(TrainParams(epochs=2), digits_task, digits_data, tmp_path / "a", checkpoint_dir=ckpt)
    same = run(TrainParams(epochs=3), digits_task, digits_data, tmp_path / "b", checkpoint_dir=ckpt)
    assert same.resumed_from_epoch is None  # epochs changed -> fingerprint differs
    again = run(
        TrainParams(epochs=3), digits_task, digits_data, tmp_path / "c", checkpoint_dir=ckpt
    )
    assert again.resumed_from_epoch == 4  # the finished run is picked up, nothing retrained
    assert again.epochs_run == 3


def _params_file(
    tmp_path: Path, epochs: int, workers: int = 1, name: str = "params", cache_mb: int = 64
) -> Path:
    """A small LeNet; pieces of 100 rows and a 300-sample shuffle buffer, so the ~1.2k
    training samples are 13 pieces that never fit the buffer at once; ``cache_mb`` of
    preprocessed pieces (0: none)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["task"]["options"].update(conv_channels=[6, 16])
    params["train"].update(
        epochs=epochs,
        early_stopping={"patience": 100, "min_delta": 0.0},
        piece_rows=100,
        shuffle_buffer=300,
        loader_workers=workers,
        cache_mb=cache_mb,
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def _train_cli(params: Path, data: Path, out: Path, ckpt: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "components",
            "train",
            "--params",
            str(params),
            "--data",
            str(data),
            "--model",
            str(out),
            "--checkpoints",
            str(ckpt),
            "--metrics",
            str(out) + ".json",
            "--plots",
            str(out) + ".csv",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_killed_training_resumes_to_the_same_result(tmp_path, digits_data):
    """Streamed epochs, killed mid-run and resumed: bit-identical weights and history. The
    reference reads in-process without the piece cache, the killed run with 2 loader workers
    and the resumed one with 1, both with it (the resumed run reads the pieces the killed one
    kept): neither the workers nor the cache change the sample order or a value."""
    epochs = 10
    reference = _train_cli(
        _params_file(tmp_path, epochs, workers=0, name="ref", cache_mb=0),
        digits_data,
        tmp_path / "ref",
        tmp_path / "ref_ckpt",
    )
    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err

    ckpt = tmp_path / "ckpt"
    params = _params_file(tmp_path, epochs, workers=2, name="killed")
    proc = _train_cli(params, digits_data, tmp_path / "run", ckpt)
    state = ckpt / "last" / "state.json"
    deadline = time.monotonic() + 240
    killed_after = None
    while time.monotonic() < deadline and proc.poll() is None:
        if state.exists():
            epoch = read_json(state)["epoch"]
            if epoch >= 3:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                killed_after = epoch
                break
        time.sleep(0.02)
    assert killed_after is not None and killed_after < epochs, "training was not killed mid-run"
    assert not (tmp_path / "run").exists(), "a killed run must not leave a complete-looking model"

    params = _params_file(tmp_path, epochs, workers=1, name="resumed")
    resumed = _train_cli(params, digits_data, tmp_path / "run", ckpt)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    resumed_epoch = read_json(state)["epoch"]
    assert "resuming from checkpoint after epoch" in err
    assert resumed_epoch == epochs
    assert not (tmp_path / "ref_ckpt" / "pieces").exists()
    # every piece kept: the training split's (of 100 rows) and the validation split's (256)
    snap = snapshot.load(digits_data)
    pieces = len(stream.piece_table(snap, "train", 100)) + len(stream.piece_table(snap, "val", 256))
    assert len(list((ckpt / "pieces").glob("*/*.npz"))) == pieces

    ref_w = paddle.load(str(tmp_path / "ref" / "model.pdparams"))
    run_w = paddle.load(str(tmp_path / "run" / "model.pdparams"))
    assert ref_w.keys() == run_w.keys()
    for key in ref_w:
        np.testing.assert_array_equal(ref_w[key].numpy(), run_w[key].numpy(), err_msg=key)
    ref_h = read_json(tmp_path / "ref" / "history.json")
    run_h = read_json(tmp_path / "run" / "history.json")
    assert ref_h == run_h  # every epoch's train and val loss and accuracy, exactly


def test_bad_params_give_a_readable_error(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["amp"] = "O3"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "components",
            "train",
            "--params",
            str(path),
            "--data",
            str(tmp_path / "nodata"),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "train.amp: 'O3' is not one of ['auto', 'off', 'O1', 'O2']" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("epochs", 0, "p.yaml: train.epochs: must be >= 1, got 0"),
        ("batch_size", 0, "p.yaml: train.batch_size: must be >= 1, got 0"),
        ("learning_rate", -1.0, "p.yaml: train.learning_rate: must be > 0, got -1.0"),
        ("learning_rate", "fast", "p.yaml: train.learning_rate: expected a number, got 'fast'"),
        ("amp", "O3", "p.yaml: train.amp: 'O3' is not one of ['auto', 'off', 'O1', 'O2']"),
        ("epoch", 3, "p.yaml: train: unknown field(s) ['epoch']; did you mean 'epochs'?"),
        ("epochs", True, "p.yaml: train.epochs: expected an integer, got True"),
        ("epochs", 3.5, "p.yaml: train.epochs: expected an integer, got 3.5"),
    ],
)
def test_params_checks(field, value, message):
    from components.core.artifacts import StepError
    from components.core.config import from_dict

    with pytest.raises(StepError) as info:
        from_dict(TrainParams, {field: value}, where="p.yaml: train")
    assert str(info.value).startswith(message), str(info.value)


def _lrs(curves: Path) -> list[float]:
    return [float(line.split(",")[-1]) for line in curves.read_text().splitlines()[1:]]


def test_the_task_owns_its_optimizer_and_schedule(tmp_path, digits_data, digits_task):
    """The default recipe (image tasks): Adam, step decay per epoch. A task that brings its
    own (warmup then linear decay, advanced every batch, clipped gradients) is trained with
    it: train knows no optimizer."""
    from components.ml.data import snapshot
    from components.tasks.base import Optimization

    run(
        TrainParams(epochs=3, lr_step_size=2, lr_gamma=0.5, learning_rate=0.01),
        digits_task,
        digits_data,
        tmp_path / "a",
        checkpoint_dir=tmp_path / "ca",
        plots_file=tmp_path / "a.csv",
    )
    assert _lrs(tmp_path / "a.csv") == pytest.approx([0.01, 0.01, 0.005])

    used = {}

    class WarmupTask(type(digits_task)):
        def optimization(self, model, settings):
            total = settings.epochs * settings.steps_per_epoch
            decay = paddle.optimizer.lr.PolynomialDecay(settings.learning_rate, total, 0.0)
            scheduler = paddle.optimizer.lr.LinearWarmup(
                decay, settings.steps_per_epoch, 0.0, settings.learning_rate
            )
            used["steps_per_epoch"] = settings.steps_per_epoch
            optimizer = paddle.optimizer.AdamW(
                learning_rate=scheduler,
                parameters=model.parameters(),
                grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0),
            )
            return Optimization(optimizer, scheduler, per_batch=True)

    task = WarmupTask.from_options({})
    run(
        TrainParams(epochs=3, batch_size=32, learning_rate=0.01),
        task,
        digits_data,
        tmp_path / "b",
        checkpoint_dir=tmp_path / "cb",
        plots_file=tmp_path / "b.csv",
    )
    n_train = snapshot.load(digits_data).rows("train")
    assert used["steps_per_epoch"] == -(-n_train // 32)
    # at each epoch's start: 0 (warmup begins), the peak after one epoch of batches, then decay
    lrs = _lrs(tmp_path / "b.csv")
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(0.01, rel=1e-6) and 0 < lrs[2] < 0.01


# --------------------------------------------------------------------------- the input pipeline


def test_pieces_cover_the_split_once_in_an_order_drawn_per_epoch(digits_data):
    """Even a one-shard split is read in bounded pieces; each epoch reads every piece once,
    in an order drawn from (seed, epoch)."""
    from components.ml.data import snapshot
    from components.tasks import stream

    snap = snapshot.load(digits_data)
    assert len(snap.split_shards("train")) == 1
    pieces = stream.piece_table(snap, "train", 100)
    sizes = pieces[:, 3] - pieces[:, 2]
    assert len(pieces) > 10 and sizes.max() <= 100 and sizes.sum() == snap.rows("train")
    orders = [stream.epoch_order(pieces, (42, epoch)) for epoch in (1, 2, 1)]
    assert sorted(map(tuple, orders[0].tolist())) == sorted(map(tuple, pieces.tolist()))
    assert not np.array_equal(orders[0], orders[1])
    np.testing.assert_array_equal(orders[0], orders[2])

    # a rank's run of the order: rows 150..649 of the pieces read one after the other
    def rows(table: np.ndarray) -> list[tuple[int, int, int]]:
        return [(int(s), int(g), r) for s, g, a, b in table.tolist() for r in range(a, b)]

    run = stream.cut(orders[0], 150, 500)
    assert stream.rows_of(run) == 500 and rows(run) == rows(orders[0])[150:650]


def test_the_shuffle_buffer_hands_out_every_sample_once_in_a_seeded_order():
    from components.tasks.stream import ShuffleBuffer

    def drain(seed: int) -> list[int]:
        buffer, out = ShuffleBuffer(64, np.random.default_rng(seed)), []
        for start in range(0, 1000, 100):  # pieces of 100 through a buffer of 64
            buffer.add([np.arange(start, start + 100), np.arange(start, start + 100) * 2])
            while len(buffer) >= 64:
                values, doubled = buffer.take(16)
                np.testing.assert_array_equal(doubled, values * 2)  # rows stay whole
                out += values.tolist()
            assert len(buffer) < 64 + 100  # bounded: the buffer and one piece
        while len(buffer):
            out += buffer.take(16)[0].tolist()
        return out

    first = drain(1)
    assert sorted(first) == list(range(1000))
    assert first != list(range(1000)) and first == drain(1) and first != drain(2)


def test_the_shuffle_buffer_holds_its_capacity_and_one_piece_when_pieces_grow():
    """Pieces come in any order of size (a shard's tail first, then whole pieces): the
    buffer's storage is allocated once, for its capacity and the largest piece, and never
    copied (it once grew by np.resize, which held two copies of the buffer, at 24k images a
    +200 MB spike at random steps and +100 MB kept)."""
    import tracemalloc

    from components.tasks.stream import ShuffleBuffer

    row = np.zeros((1, 64, 64, 3), dtype=np.float32)  # 48 KiB a sample, as the benchmark's
    capacity, piece_rows = 512, 128
    buffer = ShuffleBuffer(capacity, np.random.default_rng(0), piece_rows)
    sizes = [7, 60, 128, 90, 128, 33, 128, 128, 5, 128] * 3  # the first piece is the smallest
    pieces = [np.repeat(row, k, axis=0) for k in sizes]
    tracemalloc.start()
    try:
        for piece in pieces:
            buffer.add([piece, np.zeros(len(piece), np.int64)])
            while len(buffer) >= capacity:
                buffer.take(128)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    storage = (capacity + piece_rows) * row.nbytes
    assert peak < 1.5 * storage  # the storage, a taken block (np.resize's way: 3.8x)
    big = np.arange(3 * piece_rows)  # larger than piece_rows: the storage moves, rows kept
    kept = len(buffer)
    buffer.add([np.repeat(row, len(big), axis=0), big])
    drained = []
    while len(buffer):
        drained += buffer.take(64)[1].tolist()
    assert len(drained) == kept + len(big) and sorted(drained)[-len(big) :] == big.tolist()


def _keys_read(data_dir: Path, task, workers: int, rank: int = 0, size: int = 1) -> list:
    """The keys of the samples one rank's training batches hold in epoch 1."""
    from components.ml.data import snapshot
    from components.ml.training.distributed import EpochShare, World
    from components.steps.train import TrainParams
    from components.tasks import stream
    from components.tasks.trainer import Inputs

    params = TrainParams(piece_rows=100, shuffle_buffer=300, loader_workers=workers)
    snap = snapshot.load(data_dir)
    share = EpochShare(snap.rows("train"), params.batch_size, size)
    inputs = Inputs.build(snap, task, params, share, World(rank, size), task.objective())
    reader = inputs.reader([1], val=False)
    try:
        batches = list(inputs.batches(reader, 1, np.random.default_rng(0)))
    finally:
        reader.close()
    assert [len(b.labels) for b in batches] == [share.batch(rank, i) for i in range(share.steps)]
    return stream.key_strings(np.concatenate([b.keys for b in batches])).tolist()


def test_the_sample_order_does_not_depend_on_the_loader_workers(digits_data, digits_task):
    """Pieces are dealt to the workers in turn and handed on in plan order: in-process, one
    worker or three give the same batches; every training sample is read once."""
    from components.ml.data import snapshot

    in_process = _keys_read(digits_data, digits_task, 0)
    assert _keys_read(digits_data, digits_task, 1) == in_process
    assert _keys_read(digits_data, digits_task, 3) == in_process
    train = snapshot.split_keys(digits_data, ["train"]).tolist()
    assert sorted(in_process) == train and in_process != train
