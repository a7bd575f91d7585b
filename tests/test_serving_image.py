"""serving_image: build context, builder detection, and infra validation of the real server."""

from __future__ import annotations

import os
import shutil

import paddle
import pytest

from components.artifacts import StepError, read_json
from components.modelio import save_legacy
from components.serving_image import ServingImageParams, detect_builder
from components.serving_image import run as serving_run
from tests.conftest import run_module

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


def fake_tools(bin_dir, log, **exit_codes):
    """Stand-ins for docker/podman/buildah on PATH: each logs its argv, prints, exits as told."""
    bin_dir.mkdir(exist_ok=True)
    for tool, code in exit_codes.items():
        script = bin_dir / tool
        script.write_text(
            f'#!/bin/sh\necho "{tool} $*" >> {log}\n'
            f'echo "{tool}: Cannot connect to the daemon" >&2\nexit {code}\n'
        )
        script.chmod(0o755)


def test_builder_none_skips_the_build_but_still_validates_the_server(
    server_binary, exported_int8, digits_task, digits_data, tmp_path, monkeypatch
):
    calls = tmp_path / "calls.log"
    fake_tools(tmp_path / "bin", calls, docker=0, podman=0, buildah=0)  # all would "work"
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    params = ServingImageParams(
        server_binary=str(server_binary), builder="none", push=True, variants=["fp32"], **FAST
    )
    result = serving_run(params, digits_task, exported_int8, digits_data, tmp_path / "out")
    assert not calls.exists(), calls.read_text()  # no builder was even probed
    assert (result.built, result.builder, result.digest) == (False, None, None)
    assert result.infra_validated
    infra = read_json(tmp_path / "out" / "infra.json")
    assert infra["built"] is False and infra["builder"] is None and infra["pushed"] is False
    assert "builder: none" in infra["builder_note"]  # the reason, for whoever reads infra.json
    # the infra check ran against the real server all the same
    (fp32,) = infra["variants"]
    assert fp32["variant"] == "fp32" and fp32["passed"] and fp32["checks"]["answers"]["samples"]
    assert fp32["checks"]["sigterm_exit_code"] == 0
    assert infra["infra_validated"] is True
    assert (tmp_path / "out" / "context" / "Dockerfile").exists()  # the context a kaniko job uses
    assert read_json(tmp_path / "out" / "manifest.json")["image"] == result.image


def test_auto_builder_picks_a_working_one_or_says_why_none_works(tmp_path, monkeypatch):
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    fake_tools(tmp_path / "bin", calls)  # nothing installed
    builder, why = detect_builder("auto")
    assert builder is None
    assert why == "docker: not installed; podman: not installed; buildah: not installed"
    fake_tools(tmp_path / "bin", calls, docker=1, podman=0)  # a docker client without engine
    builder, why = detect_builder("auto")
    assert builder == "podman", why
    fake_tools(tmp_path / "bin", calls, podman=1)
    builder, why = detect_builder("auto")
    assert builder is None
    assert "docker: docker: Cannot connect to the daemon" in why
    assert "podman: podman: Cannot connect to the daemon" in why
    assert "buildah: not installed" in why
    assert "docker info" in calls.read_text()


def test_unknown_builder_is_a_readable_params_error(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("serving_image:\n  builder: kaniko\n")
    proc = run_module(
        "components.serving_image", "--params", str(params), "--out", str(tmp_path / "out")
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    assert "serving_image.builder: 'kaniko' is not one of" in last, last
    for allowed in ("auto", "docker", "podman", "buildah", "none"):
        assert f"'{allowed}'" in last, last
    assert not (tmp_path / "out").exists()


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


def test_an_unknown_builder_from_python_is_a_readable_error():
    with pytest.raises(StepError, match=r"serving_image.builder: 'kaniko' is not one of"):
        detect_builder("kaniko")
