"""serving_image: build context, builder detection, and infra validation of the real server."""

from __future__ import annotations

import shutil

import paddle
import pytest

from components.artifacts import StepError, read_json
from components.export import save_legacy
from components.serving_image import ServingImageParams, detect_builder
from components.serving_image import run as serving_run

FAST = dict(golden_samples=32, latency_requests=10)


def test_infra_validation_passes_for_fp32_and_int8(
    server_binary, exported_int8, digits_task, digits_data, tmp_path
):
    params = ServingImageParams(server_binary=str(server_binary), **FAST)
    result = serving_run(params, digits_task, exported_int8, digits_data, tmp_path / "out")
    assert result.infra_validated
    infra = read_json(tmp_path / "out" / "infra.json")
    assert [v["variant"] for v in infra["variants"]] == ["fp32", "int8"]
    fp32, int8 = infra["variants"]
    assert fp32["checks"]["answers"]["max_abs_diff"] < 1e-4
    assert int8["checks"]["answers"]["top1_agreement"] >= 0.99
    assert fp32["checks"]["answers"]["json_equals_binary"]
    assert fp32["checks"]["sigterm_exit_code"] == 0
    assert fp32["checks"]["latency"]["p50_ms"] < params.latency_budget_ms_p50
    manifest = read_json(tmp_path / "out" / "manifest.json")
    assert manifest["infra_validated"] is True and manifest["image"] == result.image
    # the build context holds everything a builder (docker, kaniko) needs
    ctx = tmp_path / "out" / "context"
    assert (ctx / "Dockerfile").exists() and (ctx / "serving" / "CMakeLists.txt").exists()
    assert (ctx / "model" / "signature.json").exists()
    assert (ctx / "model" / "int8" / "openvino" / "model.xml").exists()
    assert result.image.startswith("paddle-mlops/digits-server:")
    assert infra["built"] == (result.builder is not None)


def test_no_builder_is_reported_not_fatal():
    builder, why = detect_builder("none")
    assert builder is None and "none" in why
    builder, why = detect_builder("buildah-that-does-not-exist")
    assert builder is None and "not installed" in why


def test_a_server_that_answers_differently_fails_validation(
    server_binary, exported_int8, digits_task, digits_data, tmp_path
):
    broken = tmp_path / "model"
    shutil.copytree(exported_int8, broken)
    paddle.seed(99)
    other = digits_task.build_model(10)
    other.eval()
    shutil.rmtree(broken / "legacy")
    save_legacy(other, digits_task.paddle_input_specs(), broken / "legacy" / "model")
    params = ServingImageParams(server_binary=str(server_binary), variants=["fp32"], **FAST)
    with pytest.raises(StepError, match="server differs from Paddle Inference"):
        serving_run(params, digits_task, broken, digits_data, tmp_path / "out")
    # the decision is recorded either way
    infra = read_json(tmp_path / "out" / "infra.json")
    assert infra["infra_validated"] is False
    assert "server differs" in infra["variants"][0]["failures"][0]
