"""Bounded epochs (``train.max_steps_per_epoch``, ``train.max_val_steps``), their resume, the
ranks' equal steps, and the progress bar's tick per optimizer step."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest
import yaml

from components.core.artifacts import read_json
from components.steps.train import TrainParams, run
from tests.conftest import REPO


def _scalar(tensor: paddle.Tensor) -> float:
    return float(np.asarray(tensor.numpy()).reshape(-1)[0])


def _adam_steps(opt_file: Path) -> int:
    """Optimizer steps taken, read from Adam's own state (``beta1_pow_acc``), calibrated on a
    fresh Adam: Paddle keeps beta1 ** (steps + offset)."""
    layer = paddle.nn.Linear(2, 1)
    probe = paddle.optimizer.Adam(parameters=layer.parameters())
    layer(paddle.ones([1, 2])).sum().backward()
    probe.step()
    (one,) = [_scalar(v) for k, v in probe.state_dict().items() if "beta1_pow" in k][:1]
    offset = round(math.log(one) / math.log(0.9)) - 1
    pows = {round(_scalar(v), 6) for k, v in paddle.load(str(opt_file)).items() if "beta1_pow" in k}
    (pow_,) = pows  # every parameter took the same steps
    return round(math.log(pow_) / math.log(0.9)) - offset


def test_each_epoch_takes_max_steps_and_validates_max_val_steps(
    tmp_path, digits_data, digits_task, monkeypatch
):
    """2 epochs bounded to 5 steps and 2 validation batches of 16: Adam took 10 steps, the
    task collated 2 x (5 + 2) batches, and the scores are over the 32 validated samples."""
    calls = []
    collate = digits_task.collate
    monkeypatch.setattr(digits_task, "collate", lambda a: calls.append(len(a[0])) or collate(a))
    params = TrainParams(
        epochs=2,
        max_steps_per_epoch=5,
        max_val_steps=2,
        eval_batch_size=16,
        reader_probe_samples=0,
        loader_workers=0,
    )
    result = run(params, digits_task, digits_data, tmp_path / "out", checkpoint_dir=tmp_path / "c")
    assert result.epochs_run == 2
    assert _adam_steps(tmp_path / "c" / "last" / "opt.pdopt") == 2 * 5
    # per epoch: 5 training batches of 32, then 2 validation batches of 16
    assert calls == [32] * 5 + [16] * 2 + [32] * 5 + [16] * 2
    facts = read_json(tmp_path / "out" / "manifest.json")["distributed"]
    assert facts["steps_per_epoch"] == 5 and facts["samples_per_epoch"] == 5 * 32
    for row in read_json(tmp_path / "out" / "history.json"):
        assert (row["val_accuracy"] * 32) == pytest.approx(round(row["val_accuracy"] * 32))


def test_bounded_ranks_read_disjoint_samples_in_equal_steps(digits_data, digits_task):
    """3 ranks, a global batch of 32, 4 steps an epoch: every rank's batches are the plan's
    4, disjoint, and together the epoch's 128 samples."""
    from components.ml.data import snapshot
    from components.ml.training.distributed import Batching, DistributedParams, World
    from components.tasks import epochs, stream
    from components.tasks.trainer import Inputs

    params = TrainParams(max_steps_per_epoch=4, piece_rows=50, loader_workers=0)
    snap = snapshot.load(digits_data)
    keys = []
    for rank in range(3):
        world = World(rank, 3)
        batching = Batching.resolve(DistributedParams(), 32, 1e-3, 3)
        share = epochs.epoch_share(snap, batching, world, digits_data, 4)
        assert share.steps == 4
        inputs = Inputs.build(snap, digits_task, params, share, world, digits_task.objective())
        reader = inputs.reader([1], val=False)
        try:
            batches = list(inputs.batches(reader, 1, np.random.default_rng(0)))
        finally:
            reader.close()
        assert [len(b.labels) for b in batches] == [share.batch(rank, i) for i in range(4)]
        keys += stream.key_strings(np.concatenate([b.keys for b in batches])).tolist()
    assert len(keys) == len(set(keys)) == 4 * 32


def _params_file(tmp_path: Path, name: str, **train) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["task"]["options"].update(conv_channels=[6, 16])
    params["train"].update(
        early_stopping={"patience": 100, "min_delta": 0.0},
        piece_rows=100,
        shuffle_buffer=300,
        reader_probe_samples=0,
        **train,
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def _train_cli(
    params: Path, data: Path, out: Path, ckpt: Path, **env: str
) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "components", "train", "--params", str(params)]
    argv += ["--data", str(data), "--model", str(out), "--checkpoints", str(ckpt)]
    argv += ["--metrics", f"{out}.json", "--plots", f"{out}.csv"]
    environ = {k: v for k, v in os.environ.items() if k != "PADDLE_MLOPS_FAILPOINTS"}
    return subprocess.run(
        argv,
        env={**environ, "PYTHONPATH": str(REPO), "TQDM_MININTERVAL": "0", **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _ticks(stderr: str) -> list[tuple[int, int]]:
    """The (done, total) counts the train bar drew, in order."""
    return [(int(a), int(b)) for a, b in re.findall(r"train:[^\r\n]*?\| *(\d+)/(\d+) ", stderr)]


def test_a_bounded_run_killed_mid_epoch_resumes_to_the_same_result(tmp_path, digits_data):
    """3 epochs of 6 steps: killed in epoch 2 (after its first step), resumed from epoch 1's
    checkpoint, it ends with the uninterrupted run's weights and history; both bars count
    steps, the resumed one from the 6 steps done."""
    train = {"epochs": 3, "max_steps_per_epoch": 6, "max_val_steps": 1, "loader_workers": 1}
    ref = _train_cli(
        _params_file(tmp_path, "p", **train), digits_data, tmp_path / "ref", tmp_path / "rc"
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert sorted(set(_ticks(ref.stderr))) == [(k, 18) for k in range(19)]

    params, ckpt = _params_file(tmp_path, "p2", **train), tmp_path / "ckpt"
    killed = _train_cli(
        params, digits_data, tmp_path / "run", ckpt, PADDLE_MLOPS_FAILPOINTS="train.mid_epoch=kill"
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert read_json(ckpt / "last" / "state.json")["epoch"] == 1
    resumed = _train_cli(params, digits_data, tmp_path / "run", ckpt)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from checkpoint after epoch 1" in resumed.stderr
    assert sorted(set(_ticks(resumed.stderr))) == [(k, 18) for k in range(6, 19)]

    ref_w = paddle.load(str(tmp_path / "ref" / "model.pdparams"))
    run_w = paddle.load(str(tmp_path / "run" / "model.pdparams"))
    for key in ref_w:
        np.testing.assert_array_equal(ref_w[key].numpy(), run_w[key].numpy(), err_msg=key)
    assert read_json(tmp_path / "ref" / "history.json") == read_json(
        tmp_path / "run" / "history.json"
    )
    assert _adam_steps(ckpt / "last" / "opt.pdopt") == 18


def test_one_epoch_shows_every_step_and_a_trial_shows_no_bar(tmp_path, digits_data):
    """``epochs: 1`` used to show "0/1 epoch" for the whole run: the bar ticks at every step.
    A search's trial (PADDLE_MLOPS_TRIAL=1) draws none and prints its metric line."""
    params = _params_file(tmp_path, "p", epochs=1, max_steps_per_epoch=4, max_val_steps=1)
    one = _train_cli(params, digits_data, tmp_path / "one", tmp_path / "c1")
    assert one.returncode == 0, one.stderr[-3000:]
    ticks = _ticks(one.stderr)
    assert sorted(set(ticks)) == [(k, 4) for k in range(5)]
    assert [k for k, _ in ticks] == sorted(k for k, _ in ticks)  # in order

    trial = _train_cli(
        params, digits_data, tmp_path / "trial", tmp_path / "c2", PADDLE_MLOPS_TRIAL="1"
    )
    assert trial.returncode == 0, trial.stderr[-3000:]
    assert _ticks(trial.stderr) == [] and "val_accuracy=" in trial.stdout
