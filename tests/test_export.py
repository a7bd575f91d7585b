"""Export: PIR + legacy formats, dynamic batch, signature, and the parity gate."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from components.core.artifacts import StepError, read_json
from components.ml.serving.runtime import ModelFiles, PaddlePredictor
from components.ml.training.exporting import check_parity
from components.steps.export import ExportParams, ParityParams
from components.steps.export import run as export_run
from components.tasks.trained import load_trained


def test_export_writes_both_formats_and_signature(exported, digits_task):
    assert (exported / "model.json").exists() and (exported / "model.pdiparams").exists()
    assert (exported / "legacy" / "model.pdmodel").exists()
    sig = read_json(exported / "signature.json")
    assert sig["inputs"] == [{"name": "image", "shape": [-1, 1, 28, 28], "dtype": "float32"}]
    assert sig["outputs"] == [{"name": "logits", "shape": [-1, 10], "dtype": "float32"}]
    assert sig["label_names"] == [str(i) for i in range(10)]
    assert sig["formats"]["pir"]["program"] == "model.json"
    assert sig["formats"]["legacy"]["program"] == "legacy/model.pdmodel"
    assert sig["formats"]["pir"]["input_names"] == ["image"]
    steps = [s["op"] for s in sig["preprocessing"]["steps"]]
    assert steps == ["Resize", "ToTensor", "Normalize"]
    parity = read_json(exported / "parity.json")
    assert parity["pir"]["passed"] and parity["legacy"]["passed"]
    # on the first parity.samples validation samples (the stream stops there)
    assert parity["pir"]["samples"] == parity["legacy"]["samples"] == ParityParams().samples
    manifest = read_json(exported / "manifest.json")
    assert "model.json" in manifest["outputs"] and manifest["inputs"]["model.pdparams"]["sha256"]
    assert "warmup.json" in manifest["outputs"] and "warmup/0.bin" in manifest["outputs"]


def test_export_ships_the_first_validation_samples_for_the_servers_warm_up(
    exported, digits_task, digits_data
):
    """components/ml/serving/warmup.py: the model inputs of the first export.warmup_samples
    validation samples, raw little-endian in signature order (what serving/src/model.cc reads)."""
    doc = read_json(exported / "warmup.json")
    n = ExportParams().warmup_samples
    assert doc == {"samples": n, "inputs": [{"name": "image", "file": "warmup/0.bin"}]}
    (expected,), _ = digits_task.eval_head(digits_data, "val", n)
    got = np.frombuffer((exported / "warmup" / "0.bin").read_bytes(), "<f4")
    np.testing.assert_array_equal(got.reshape(n, 1, 28, 28), expected)


@pytest.mark.parametrize("fmt", ["pir", "legacy"])
@pytest.mark.parametrize("batch", [1, 7, 64])
def test_exported_model_has_a_dynamic_batch(
    exported, trained, digits_task, digits_data, fmt, batch
):
    directory = exported if fmt == "pir" else exported / "legacy"
    predictor = PaddlePredictor(ModelFiles.in_dir(directory))
    raw, _ = digits_task.read_head(digits_data, "test", batch)
    inputs = digits_task.preprocess(raw)
    out = predictor.run(inputs)[0]
    assert out.shape == (batch, 10)
    model, _ = load_trained(digits_task, trained)
    with paddle.no_grad():
        ref = model(paddle.to_tensor(inputs[0])).numpy()
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-3)


def test_parity_check_rejects_a_different_model(
    exported, trained, digits_task, digits_data, tmp_path
):
    model, _ = load_trained(digits_task, trained)
    paddle.seed(1234)
    other = digits_task.build_model(10)
    other.eval()
    paddle.jit.save(other, str(tmp_path / "model"), input_spec=digits_task.paddle_input_specs())
    wrong = PaddlePredictor(ModelFiles.in_dir(tmp_path))
    inputs, _ = digits_task.eval_head(digits_data, "val", 16)
    report = check_parity(model, wrong, inputs, ParityParams(), wrong.files.program)
    assert not report["passed"]
    assert report["batch_full"]["violations"] > 0
    assert report["batch_full"]["top1_agreement"] < 1.0


def test_export_stage_fails_beyond_tolerance_and_writes_nothing(
    trained, digits_task, digits_data, tmp_path, monkeypatch
):
    """The failpoint export.parity makes the exported program's outputs drift by 1e-2 as the
    parity check reads them (what a broken kernel or pass would do): the real export stage
    must fail its parity check and leave nothing behind."""
    from components.faults import failpoints

    monkeypatch.setenv(failpoints.ENV, "export.parity=corrupt")
    out = tmp_path / "export"
    with pytest.raises(StepError) as err:
        export_run(ExportParams(), digits_task, trained, digits_data, out)
    msg = str(err.value)
    assert "exported model differs from the trained model" in msg
    assert "atol 0.0001" in msg and "max |diff|" in msg
    for fmt in digits_task.export_formats:  # every format's check saw the drift
        assert f"{fmt}: batch_full max |diff|" in msg and f"{fmt}: batch_1 max |diff|" in msg
    assert not out.exists(), "a failed export must not leave a complete-looking model"


def test_export_refuses_weights_of_another_architecture(trained, digits_data, tmp_path):
    from components.tasks import get_task

    bigger = get_task("digits", {"conv_channels": [32, 64]})
    with pytest.raises(StepError, match="weights do not fit the task's model"):
        export_run(ExportParams(), bigger, trained, digits_data, tmp_path / "x")
