"""Infra validation of a serving bundle (library layer): the real server binary serves each
variant, and its answers, settings, latency and shutdown are checked against in-process
runtimes on the same files (``serving_image``'s step doc says which and within what)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from components.core.artifacts import read_json
from components.ml.decisions import gates
from components.ml.serving import model_config
from components.ml.serving.kserve_client import KServeError
from components.ml.serving.model_config import ModelConfig
from components.ml.serving.ov_runtime import OVPredictor
from components.ml.serving.runtime import BatchedPredictor, ModelFiles, PaddlePredictor
from components.ml.serving.server import RunningServer


class ValidationSettings(Protocol):
    """The ``serving_image`` params the checks read (``components.steps.serving_image``)."""

    fp32_atol: float
    fp32_rtol: float
    int8_atol: float
    int8_rtol: float
    latency_requests: int
    latency_budget_ms_p50: float
    startup_timeout_s: float
    startup_poll_s: float


# --------------------------------------------------------------------------- validation


def _paddle(model_dir: Path, signature: dict[str, Any], fmt: str) -> PaddlePredictor:
    program = model_dir / signature["formats"][fmt]["program"]
    return PaddlePredictor(ModelFiles.in_dir(program.parent, program.stem))


def _reference(model_dir: Path, signature: dict[str, Any], variant: str) -> BatchedPredictor:
    """What the served variant must match: fp32 Paddle Inference; int8 OpenVINO on its IR."""
    if variant == "fp32":
        return _paddle(model_dir, signature, "pir")

    return OVPredictor(model_dir / signature["formats"]["int8_openvino"]["program"])


def _check_raw(
    server: RunningServer,
    name: str,
    text_input: str,
    raw: np.ndarray,
    expected: np.ndarray,
    report: dict[str, Any],
    tolerance: tuple[float, float],
) -> list[str]:
    """Send the raw samples (texts) themselves; the server's own preprocessing (its C++
    tokenizer) must give the answers of the Python preprocessing + in-process runtime, within
    the variant's ``(atol, rtol)`` and with no top-1 difference beyond near-ties."""
    batch = max(1, min(len(raw), 64))
    output = server.client.metadata(name)["outputs"][0]["name"]
    got = np.concatenate(
        [
            server.client.infer(name, {text_input: raw[i : i + batch]}, binary=True)[output]
            for i in range(0, len(raw), batch)
        ]
    )
    got_json = server.client.infer(name, {text_input: raw[:4]})
    diff = np.abs(got - expected)
    atol, rtol = tolerance
    mismatches = gates.top1_mismatches(got, expected, atol, rtol)
    report["checks"]["raw_answers"] = {
        "input": text_input,
        "samples": int(len(raw)),
        "max_abs_diff": float(diff.max()),
        "top1_agreement": float((got.argmax(1) == expected.argmax(1)).mean()),
        "top1_mismatches": mismatches,
        "json_equals_binary": bool(np.array_equal(got_json[output], got[: len(raw[:4])])),
    }
    failures = []
    if mismatches or not (diff <= atol + rtol * np.abs(expected)).all():
        failures.append(
            f"raw {text_input} requests (the server tokenizes) differ from the Python "
            f"preprocessing: max |diff| {diff.max():.3g}, {mismatches} top-1 classes differ "
            "beyond near-ties"
        )
    if not report["checks"]["raw_answers"]["json_equals_binary"]:
        failures.append(f"raw {text_input}: JSON and binary requests gave different answers")
    return failures


def _check_settings(
    server: RunningServer,
    name: str,
    variant: str,
    bundled: ModelConfig,
    report: dict[str, Any],
    failures: list[str],
) -> None:
    """The server must report the bundle's model_config.json as its settings."""
    served = server.client.model_config(name)["settings"]
    report["checks"]["model_config"] = {"bundle": bundled.to_json(), "served": served}
    differ = {k: (v, served.get(k)) for k, v in bundled.to_json().items() if served.get(k) != v}
    if differ:
        failures.append(
            f"{variant}: the server runs with settings other than the bundle's "
            f"{model_config.MODEL_CONFIG_FILE}: "
            + ", ".join(f"{k} {got!r} (bundle {want!r})" for k, (want, got) in differ.items())
        )


def _served_answers(
    server: RunningServer,
    name: str,
    signature: dict[str, Any],
    golden: list[np.ndarray],
    batch: int,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The server's answers to ``golden`` in binary requests of at most ``batch`` (the
    server's max batch size: it answers 400 to larger ones), its answers to the first few in
    one JSON request, the request count and how many the JSON request held."""
    input_names = [s["name"] for s in signature["inputs"]]
    output_name = signature["outputs"][0]["name"]
    starts = range(0, len(golden[0]), batch)
    got = np.concatenate(
        [
            server.client.infer(
                name,
                {n: x[i : i + batch] for n, x in zip(input_names, golden, strict=True)},
                binary=True,
            )[output_name]
            for i in starts
        ]
    )
    n_json = min(4, batch)
    got_json = server.client.infer(
        name, {n: x[:n_json] for n, x in zip(input_names, golden, strict=True)}
    )[output_name]
    return got, got_json, len(starts), n_json


def _check_answers(
    server: RunningServer,
    name: str,
    variant: str,
    model_dir: Path,
    signature: dict[str, Any],
    golden: list[np.ndarray],
    expected: np.ndarray,
    tolerance: tuple[float, float],
    batch: int,
    logits: bool,
    report: dict[str, Any],
    failures: list[str],
) -> None:
    """The served answers within ``tolerance`` of ``expected`` (the in-process reference),
    top-1 classes equal but for near-ties (``logits``), JSON and binary requests alike."""
    got, got_json, requests, n_json = _served_answers(server, name, signature, golden, batch)
    diff = np.abs(got - expected)
    atol, rtol = tolerance
    mismatches = gates.top1_mismatches(got, expected, atol, rtol) if logits else 0
    report["checks"]["answers"] = {
        "reference": "paddle_inference" if variant == "fp32" else "openvino",
        "samples": int(len(expected)),
        "requests": requests,
        "max_abs_diff": float(diff.max()),
        "json_equals_binary": bool(np.array_equal(got_json, got[:n_json])),
    }
    if logits:
        report["checks"]["answers"]["top1_agreement"] = float(
            (got.argmax(1) == expected.argmax(1)).mean()
        )
        report["checks"]["answers"]["top1_mismatches"] = mismatches
    if variant != "fp32" and logits:  # recorded: another runtime's int8 kernels round differently
        other = _paddle(model_dir, signature, "int8_paddle").predict(golden)
        report["checks"]["answers"]["top1_agreement_paddle_inference_int8"] = float(
            (got.argmax(1) == other.argmax(1)).mean()
        )
    bound = atol + rtol * np.abs(expected)
    runtime = "Paddle Inference" if variant == "fp32" else "OpenVINO"
    if not (diff <= bound).all():
        failures.append(
            f"{variant}: server differs from {runtime} "
            f"in-process by up to {diff.max():.3g} (serving_image.{variant}_atol {atol}, "
            f"{variant}_rtol {rtol})"
        )
    if mismatches:
        failures.append(
            f"{variant}: {mismatches} of {len(expected)} top-1 classes differ from "
            f"{runtime} beyond near-ties"
        )
    if not report["checks"]["answers"]["json_equals_binary"]:
        failures.append(f"{variant}: JSON and binary requests gave different answers")


def _check_latency(
    server: RunningServer,
    name: str,
    variant: str,
    input_names: list[str],
    golden: list[np.ndarray],
    params: ValidationSettings,
    report: dict[str, Any],
    failures: list[str],
) -> None:
    """The p50 latency of single-sample requests within the budget."""
    times = []
    for i in range(params.latency_requests):
        one = {n: x[i % len(x)][None] for n, x in zip(input_names, golden, strict=True)}
        t0 = time.perf_counter()
        server.client.infer(name, one, binary=True)
        times.append((time.perf_counter() - t0) * 1000)
    p50 = float(np.median(times))
    report["checks"]["latency"] = {
        "p50_ms": p50,
        "p99_ms": float(np.percentile(times, 99)),
        "budget_ms_p50": params.latency_budget_ms_p50,
    }
    if p50 > params.latency_budget_ms_p50:
        failures.append(
            f"{variant}: p50 latency {p50:.2f} ms over the budget {params.latency_budget_ms_p50} ms"
        )


def validate_variant(
    binary: Path,
    model_dir: Path,
    variant: str,
    golden: list[np.ndarray],
    params: ValidationSettings,
    bundled: ModelConfig,
    log_dir: Path,
    raw: np.ndarray | None = None,
    logits: bool = True,
) -> dict[str, Any]:
    """Serve one variant and check answers, latency and graceful shutdown; the server must
    report ``bundled`` (the bundle's model_config.json) as its settings; a server that
    also takes raw samples (a text model's ``text_inputs``: it tokenizes in C++) must answer
    ``raw`` (the stored samples ``golden`` was preprocessed from) the same. ``logits``: the
    output is class logits, whose top-1 classes are compared too (not a generator's image)."""
    signature = read_json(model_dir / "signature.json")
    input_names = [s["name"] for s in signature["inputs"]]
    expected = _reference(model_dir, signature, variant).predict(golden)
    name = f"{signature.get('task', 'model')}-{variant}"
    server = RunningServer(binary, model_dir, variant, name, log_dir / f"server-{variant}.log")
    report: dict[str, Any] = {"variant": variant, "checks": {}}
    failures: list[str] = []
    tolerance = (
        (params.fp32_atol, params.fp32_rtol)
        if variant == "fp32"
        else (params.int8_atol, params.int8_rtol)
    )
    try:
        server.wait_ready(params.startup_timeout_s, poll_s=params.startup_poll_s)
        _check_settings(server, name, variant, bundled, report, failures)
        _check_answers(
            server, name, variant, model_dir, signature, golden, expected, tolerance,
            bundled.max_batch_size, logits, report, failures,
        )  # fmt: skip
        text_inputs = server.client.metadata(name).get("text_inputs") or []
        if text_inputs and raw is not None:
            checked = _check_raw(
                server, name, text_inputs[0]["name"], raw, expected, report, tolerance
            )
            failures += [f"{variant}: {f}" for f in checked]
        _check_latency(server, name, variant, input_names, golden, params, report, failures)
    except KServeError as exc:
        failures.append(f"{variant}: the server answered {exc}")
    finally:
        code = server.stop()
    report["checks"]["sigterm_exit_code"] = code
    if code != 0:
        failures.append(f"{variant}: the server did not exit cleanly on SIGTERM (code {code})")
    report["failures"] = failures
    report["passed"] = not failures
    return report
