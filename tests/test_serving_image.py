"""serving_image: build context, builder detection, and infra validation of the real server."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import paddle
import pytest

from components.core.artifacts import StepError, read_json, write_json
from components.core.config import section
from components.kube.images import detect_builder
from components.ml.training.modelio import save_legacy
from components.steps.package import PackageParams
from components.steps.serving_image import ServingImageParams
from components.steps.serving_image import run as serving_run
from tests.conftest import WIRING_LATENCY_BUDGET, package_params, run_module, with_model_config

FAST = dict(golden_samples=32, latency_requests=10, **WIRING_LATENCY_BUDGET)


def test_infra_validation_passes_for_fp32_and_int8(
    server_binary, exported_int8, digits_task, digits_data, tmp_path
):
    params = ServingImageParams(**FAST)
    result = serving_run(params, digits_task, exported_int8, digits_data, tmp_path / "out")
    assert result.infra_validated
    infra = read_json(tmp_path / "out" / "infra.json")
    assert [v["variant"] for v in infra["variants"]] == ["fp32", "int8"]
    fp32, int8 = infra["variants"]
    assert fp32["checks"]["answers"]["max_abs_diff"] < 1e-4
    assert int8["checks"]["answers"]["top1_agreement"] >= 0.99
    assert fp32["checks"]["answers"]["json_equals_binary"]
    assert fp32["checks"]["sigterm_exit_code"] == 0
    assert fp32["checks"]["latency"]["p50_ms"] > 0
    assert fp32["checks"]["latency"]["budget_ms_p50"] == params.latency_budget_ms_p50
    manifest = read_json(tmp_path / "out" / "manifest.json")
    assert manifest["infra_validated"] is True and manifest["image"] == result.image
    # the build context holds everything a builder (podman, kaniko) needs: the model layer
    # on the prebuilt server image (nothing is compiled in the image build)
    ctx = tmp_path / "out" / "context"
    dockerfile = (ctx / "Dockerfile").read_text()
    assert "FROM ${SERVER_IMAGE}" in dockerfile and "COPY model /mnt/models" in dockerfile
    assert "RUN " not in dockerfile and not (ctx / "serving").exists()
    assert (ctx / "model" / "signature.json").exists()
    assert (ctx / "model" / "int8" / "openvino" / "model.xml").exists()
    assert result.image.startswith("localhost/paddle-mlops/digits-server:")
    assert infra["built"] == (result.builder is not None)


def test_a_server_over_the_latency_budget_fails_infra_validation_and_says_why(
    server_binary, exported_int8, digits_task, digits_data, tmp_path
):
    """A budget no server can meet (a nanosecond): the step fails naming the variant, its p50
    and the budget, and its report says the model is not infra-validated (the rule, not this
    host's speed)."""
    params = ServingImageParams(
        builder="none", variants=["fp32"], **{**FAST, "latency_budget_ms_p50": 1e-6}
    )
    with pytest.raises(StepError) as info:
        serving_run(params, digits_task, exported_int8, digits_data, tmp_path / "out")
    assert "fp32: p50 latency" in str(info.value) and "over the budget 1e-06 ms" in str(info.value)
    infra = read_json(tmp_path / "out" / "infra.json")
    assert infra["infra_validated"] is False
    assert infra["variants"][0]["checks"]["latency"]["budget_ms_p50"] == 1e-6


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
    params = ServingImageParams(builder="none", variants=["fp32"], **FAST)
    result = serving_run(params, digits_task, exported_int8, digits_data, tmp_path / "out")
    assert not calls.exists(), calls.read_text()  # no builder was even probed
    assert (result.built, result.builder, result.image_id) == (False, None, None)
    assert result.infra_validated
    infra = read_json(tmp_path / "out" / "infra.json")
    assert infra["built"] is False and infra["builder"] is None
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
        "components", "serving_image", "--params", str(params), "--infra", str(tmp_path / "out")
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
    params = ServingImageParams(variants=["fp32"], **FAST)
    with pytest.raises(StepError, match="server differs from Paddle Inference"):
        serving_run(params, digits_task, broken, digits_data, tmp_path / "out")
    # the decision is recorded either way
    infra = read_json(tmp_path / "out" / "infra.json")
    assert infra["infra_validated"] is False
    assert "server differs" in infra["variants"][0]["failures"][0]


def test_an_unknown_builder_from_python_is_a_readable_error():
    with pytest.raises(StepError, match=r"serving_image.builder: 'kaniko' is not one of"):
        detect_builder("kaniko")


def _served_config(log_file) -> dict:
    """The configuration the server reports it runs with (its ``listening`` log line)."""
    for line in log_file.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("msg") == "listening":
            return json.loads(line)["config"]
    raise AssertionError(f"no 'listening' line in {log_file}")


def test_the_bundles_model_config_is_what_validation_served_and_the_image_bakes(
    server_binary, exported_int8, digits_task, digits_data, tmp_path, monkeypatch
):
    settings = dict(workers=1, threads_per_worker=2, max_batch_size=16, max_queue_delay_us=500)
    bundle = with_model_config(exported_int8, tmp_path / "bundle", **settings)
    # a stray SERVING_* in the caller's environment must not reach the validated server
    monkeypatch.setenv("SERVING_WORKERS", "3")
    monkeypatch.setenv("SERVING_DYNAMIC_BATCHING", "not-a-bool")
    params = ServingImageParams(builder="none", variants=["fp32"], **FAST)
    assert serving_run(params, digits_task, bundle, digits_data, tmp_path / "out")
    out = tmp_path / "out"
    expected = read_json(bundle / "model_config.json")
    assert {k: expected[k] for k in settings} == settings
    infra = read_json(out / "infra.json")
    assert infra["model_config"] == expected
    # the server reported (GET .../config) that it ran with the bundle's file, and said so
    # in its own log line too
    (report,) = infra["variants"]
    served = report["checks"]["model_config"]["served"]
    assert {k: served[k] for k in expected} == expected
    logged = _served_config(out / "server-fp32.log")
    assert {k: logged[k] for k in settings} == settings
    # the image: the same bundle, file included, and no setting restated as ENV or flag
    ctx = out / "context"
    assert read_json(ctx / "model" / "model_config.json") == expected
    dockerfile = (ctx / "Dockerfile").read_text()
    assert "SERVING_" not in dockerfile and "ENV " not in dockerfile
    assert not (out / "server.env").exists() and not (ctx / "server.env").exists()


def test_golden_replay_is_chunked_to_the_bundles_max_batch_size(
    server_binary, exported_int8, digits_task, digits_data, tmp_path, monkeypatch
):
    monkeypatch.setenv("SERVING_MAX_BATCH_SIZE", "1")  # ignored: not the bundle's
    bundle = with_model_config(exported_int8, tmp_path / "bundle", max_batch_size=8)
    params = ServingImageParams(
        builder="none", golden_samples=20, latency_requests=5, **WIRING_LATENCY_BUDGET
    )
    result = serving_run(params, digits_task, bundle, digits_data, tmp_path / "out")
    assert result.infra_validated
    infra = read_json(tmp_path / "out" / "infra.json")
    for report in infra["variants"]:
        answers = report["checks"]["answers"]
        assert (answers["samples"], answers["requests"]) == (20, 3), report  # 8 + 8 + 4
        assert answers["json_equals_binary"] and report["passed"], report
        assert report["checks"]["model_config"]["served"]["max_batch_size"] == 8


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"max_batch_size": 0}, "field 'max_batch_size': must be >= 1, got 0"),
        ({"workers": "2"}, "field 'workers': must be int, got '2'"),
        ({"max_batch": 8}, "field 'max_batch': not a per-model setting"),
        (None, "model_config.json: missing; the bundle must come from package"),
    ],
)
def test_a_bundle_with_a_bad_or_no_model_config_is_refused_naming_file_and_field(
    server_binary, exported_int8, digits_task, digits_data, tmp_path, doc, message
):
    bundle = with_model_config(exported_int8, tmp_path / "bundle")
    if doc is None:
        (bundle / "model_config.json").unlink()
    else:
        write_json(bundle / "model_config.json", {**read_json(bundle / "model_config.json"), **doc})
    params = ServingImageParams(builder="none", **FAST)
    with pytest.raises(StepError) as err:
        serving_run(params, digits_task, bundle, digits_data, tmp_path / "out")
    assert str(bundle / "model_config.json") in str(err.value)
    assert message in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"workers": 0}, "workers"),
        ({"threads_per_worker": -1}, "threads_per_worker"),
        ({"max_queue_delay_us": -5}, "max_queue_delay_us"),
        ({"request_timeout_ms": 0}, "request_timeout_ms"),
    ],
)
def test_nonsense_model_config_params_are_rejected_naming_the_field(values, field):
    config = {**dataclasses.asdict(package_params().model_config), **values}
    with pytest.raises(StepError, match=rf"params.yaml: package.model_config.{field}: must be >= "):
        section({"package": {"model_config": config}}, "package", PackageParams)


def test_every_model_config_setting_must_be_in_params():
    config = dataclasses.asdict(package_params().model_config)
    del config["workers"]
    with pytest.raises(StepError, match=r"package.model_config: missing required field.*workers"):
        section({"package": {"model_config": config}}, "package", PackageParams)


def test_zero_threads_queue_delay_and_queue_size_are_the_servers_own_meanings_not_errors():
    config = {
        **dataclasses.asdict(package_params().model_config),
        "threads_per_worker": 0,
        "max_queue_delay_us": 0,
        "max_queue_size": 0,
    }
    params = section(
        {"package": {"model_config": config, "tune": {"budget_s": 0}}}, "package", PackageParams
    )
    assert params.model_config.threads_per_worker == 0


def test_golden_samples_must_be_positive():
    with pytest.raises(StepError, match=r"params.yaml: serving_image.golden_samples: must be >= "):
        section({"serving_image": {"golden_samples": 0}}, "serving_image", ServingImageParams)
