"""Training: AMP decisions, early stopping, checkpoints and kill-and-resume."""

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

from components.artifacts import read_json
from components.train import EarlyStopping, TrainParams, resolve_amp, run
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
    caplog.set_level(logging.WARNING, logger="components.train")
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


def _params_file(tmp_path: Path, epochs: int) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["task"]["options"].update(conv_channels=[6, 16])
    params["train"].update(epochs=epochs, early_stopping={"patience": 100, "min_delta": 0.0})
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def _train_cli(params: Path, data: Path, out: Path, ckpt: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "components.train",
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
    epochs = 10
    params = _params_file(tmp_path, epochs)

    reference = _train_cli(params, digits_data, tmp_path / "ref", tmp_path / "ref_ckpt")
    assert reference.wait(timeout=300) == 0, reference.stderr.read()

    ckpt = tmp_path / "ckpt"
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

    resumed = _train_cli(params, digits_data, tmp_path / "run", ckpt)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    resumed_epoch = read_json(state)["epoch"]
    assert "resuming from checkpoint after epoch" in err
    assert resumed_epoch == epochs

    ref_w = paddle.load(str(tmp_path / "ref" / "model.pdparams"))
    run_w = paddle.load(str(tmp_path / "run" / "model.pdparams"))
    assert ref_w.keys() == run_w.keys()
    for key in ref_w:
        np.testing.assert_array_equal(ref_w[key].numpy(), run_w[key].numpy(), err_msg=key)
    ref_h = read_json(tmp_path / "ref" / "history.json")
    run_h = read_json(tmp_path / "run" / "history.json")
    assert [h["val_accuracy"] for h in ref_h] == [h["val_accuracy"] for h in run_h]


def test_bad_params_give_a_readable_error(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["amp"] = "O3"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.train",
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
        ("epochs", 0, "p.yaml: train: epochs, batch_size and eval_batch_size must be >= 1"),
        ("batch_size", 0, "p.yaml: train: epochs, batch_size and eval_batch_size must be >= 1"),
        ("learning_rate", -1.0, "p.yaml: train: learning_rate must be > 0"),
        ("learning_rate", "fast", "p.yaml: train.learning_rate: expected a number, got 'fast'"),
        ("amp", "O3", "p.yaml: train.amp: 'O3' is not one of ['auto', 'off', 'O1', 'O2']"),
        ("epoch", 3, "p.yaml: train: unknown field(s) ['epoch']"),
    ],
)
def test_params_checks(field, value, message):
    from components.artifacts import StepError
    from components.config import from_dict

    with pytest.raises(StepError) as info:
        from_dict(TrainParams, {field: value}, where="p.yaml: train")
    assert str(info.value).startswith(message), str(info.value)


def _lrs(curves: Path) -> list[float]:
    return [float(line.split(",")[-1]) for line in curves.read_text().splitlines()[1:]]


def test_the_task_owns_its_optimizer_and_schedule(tmp_path, digits_data, digits_task):
    """The default recipe (image tasks): Adam, step decay per epoch. A task that brings its
    own (warmup then linear decay, advanced every batch, clipped gradients) is trained with
    it: train knows no optimizer."""
    from components.dataset import read_split
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
    n_train = len(read_split(digits_data, "train").labels)
    assert used["steps_per_epoch"] == -(-n_train // 32)
    # at each epoch's start: 0 (warmup begins), the peak after one epoch of batches, then decay
    lrs = _lrs(tmp_path / "b.csv")
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(0.01, rel=1e-6) and 0 < lrs[2] < 0.01
