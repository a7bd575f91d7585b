"""serving_image: build context, builder detection, and infra validation of the real server."""

from __future__ import annotations

import json
import os
import shutil

import paddle
import pytest

from components.core.artifacts import StepError, read_json, sha256_file
from components.core.config import section
from components.kube.images import detect_builder
from components.ml.modelio import save_legacy
from components.steps.serving_image import (
    ServerFlags,
    ServingImageParams,
    render_server_env,
    server_env,
)
from components.steps.serving_image import run as serving_run
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
        server_binary=str(server_binary), builder="none", variants=["fp32"], **FAST
    )
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


def _served_config(log_file) -> dict:
    """The configuration the server reports it runs with (its ``listening`` log line)."""
    for line in log_file.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("msg") == "listening":
            return json.loads(line)["config"]
    raise AssertionError(f"no 'listening' line in {log_file}")


def test_server_env_is_what_validation_ran_the_image_bakes_and_the_step_records(
    server_binary, exported_int8, digits_task, digits_data, tmp_path
):
    flags = ServerFlags(workers=1, threads_per_worker=2, max_batch_size=16, max_queue_delay_us=500)
    params = ServingImageParams(
        server_binary=str(server_binary), builder="none", variants=["fp32"], server=flags, **FAST
    )
    assert serving_run(params, digits_task, exported_int8, digits_data, tmp_path / "out")
    out = tmp_path / "out"
    text = render_server_env(flags)
    assert text.splitlines()[0].startswith("# ") and "serving_image.server" in text.splitlines()[0]
    assert text.splitlines()[1:] == [
        "SERVING_MAX_BATCH_SIZE=16",
        "SERVING_MAX_QUEUE_DELAY_US=500",
        "SERVING_THREADS_PER_WORKER=2",
        "SERVING_WORKERS=1",
    ]
    assert (out / "server.env").read_text() == text
    assert (out / "context" / "server.env").read_text() == text
    infra = read_json(out / "infra.json")
    assert infra["server_env_sha256"] == sha256_file(out / "server.env")
    assert (
        read_json(out / "manifest.json")["outputs"]["server.env"]["sha256"]
        == (infra["server_env_sha256"])
    )
    # the image: one ENV line with the same values, after the (only) FROM
    dockerfile = (out / "context" / "Dockerfile").read_text().splitlines()
    (env_line,) = [line for line in dockerfile if line.startswith("ENV SERVING_")]
    assert env_line.split()[1:] == text.splitlines()[1:]
    assert dockerfile.index(env_line) > max(
        i for i, line in enumerate(dockerfile) if line.startswith("FROM")
    )
    # and the server that was validated ran with exactly these values (from the environment)
    served = _served_config(out / "server-fp32.log")
    assert {k: served[k] for k in ("workers", "threads_per_worker")} == {
        "workers": 1,
        "threads_per_worker": 2,
    }
    assert (served["max_batch_size"], served["max_queue_delay_us"]) == (16, 500)


def test_golden_replay_is_chunked_to_the_servers_max_batch_size(
    server_binary, exported_int8, digits_task, digits_data, tmp_path, monkeypatch
):
    # a stray SERVING_* in the caller's environment must not reach the validated server
    monkeypatch.setenv("SERVING_MAX_BATCH_SIZE", "1")
    monkeypatch.setenv("SERVING_DYNAMIC_BATCHING", "not-a-bool")
    params = ServingImageParams(
        server_binary=str(server_binary),
        builder="none",
        golden_samples=20,
        latency_requests=5,
        server=ServerFlags(max_batch_size=8),
    )
    result = serving_run(params, digits_task, exported_int8, digits_data, tmp_path / "out")
    assert result.infra_validated
    infra = read_json(tmp_path / "out" / "infra.json")
    for report in infra["variants"]:
        answers = report["checks"]["answers"]
        assert (answers["samples"], answers["requests"]) == (20, 3), report  # 8 + 8 + 4
        assert answers["json_equals_binary"] and report["passed"], report
        served = _served_config(tmp_path / "out" / f"server-{report['variant']}.log")
        assert served["max_batch_size"] == 8


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"golden_samples": 0}, "golden_samples"),
        ({"server": {"max_batch_size": 0}}, "server.max_batch_size"),
        ({"server": {"workers": 0}}, "server.workers"),
        ({"server": {"threads_per_worker": -1}}, "server.threads_per_worker"),
        ({"server": {"max_queue_delay_us": -5}}, "server.max_queue_delay_us"),
    ],
)
def test_nonsense_serving_params_are_rejected_naming_the_field(values, field):
    with pytest.raises(StepError, match=rf"params.yaml: serving_image: {field}: must be >= "):
        section({"serving_image": values}, "serving_image", ServingImageParams)


def test_zero_threads_and_queue_delay_are_the_servers_own_defaults_not_errors():
    params = section(
        {"serving_image": {"server": {"threads_per_worker": 0, "max_queue_delay_us": 0}}},
        "serving_image",
        ServingImageParams,
    )
    assert server_env(params.server)["SERVING_THREADS_PER_WORKER"] == "0"
