"""The real C++ server's KServe v2 gRPC endpoint (``--grpc-port``), driven by unmodified
``tritonclient.grpc`` and by raw protobuf requests, next to its REST endpoint.

Servers bind to 127.0.0.1 on free ports; every loop is bounded.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from components.ml.serving.ov_runtime import OVPredictor
from components.ml.serving.server import RunningServer
from tests import test_server
from tests.test_server import infer, start

# tests/test_server.py's fixtures: the golden digits and the in-process OpenVINO answers
golden = test_server.golden
reference = test_server.reference

NAME = "digits"
MAX_BATCH = 16
ATOL, RTOL = 1e-4, 1e-3  # tests/test_server.py's fp32 tolerance against the in-process runtime


@pytest.fixture(scope="module")
def server(server_binary, exported_int8, tmp_path_factory) -> Iterator[RunningServer]:
    settings = dict(workers=2, max_batch_size=MAX_BATCH, max_queue_delay_us=2000)
    srv = start(server_binary, exported_int8, tmp_path_factory.mktemp("grpc"), settings=settings)
    yield srv
    assert srv.stop() == 0


def grpc_client(srv: RunningServer) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url=f"127.0.0.1:{srv.grpc_port}")


def rest_client(srv: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=f"127.0.0.1:{srv.port}", network_timeout=30)


def grpc_infer(c: grpcclient.InferenceServerClient, x: np.ndarray, **kwargs) -> np.ndarray:
    inp = grpcclient.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out = grpcclient.InferRequestedOutput("logits")
    return c.infer(NAME, [inp], outputs=[out], client_timeout=30, **kwargs).as_numpy("logits")


def stub(srv: RunningServer) -> tuple[grpc.Channel, service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def image_request(x: np.ndarray, *, raw: bool = True, **fields) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest for the digits model: ``x`` as raw_input_contents or as typed
    fp32_contents; ``fields`` override the request's or the input's fields."""
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name=fields.pop("input_name", "image"),
        datatype=fields.pop("datatype", "FP32"),
        shape=fields.pop("shape", list(x.shape)),
    )
    request = service_pb2.ModelInferRequest(
        model_name=fields.pop("model_name", NAME), inputs=[tensor], **fields
    )
    if raw:
        request.raw_input_contents.append(x.astype(np.float32).tobytes())
    else:
        tensor = request.inputs[0]
        tensor.contents.fp32_contents.extend(x.astype(np.float32).ravel().tolist())
    return request


def logits_of(response: service_pb2.ModelInferResponse) -> np.ndarray:
    (out,) = response.outputs
    assert out.name == "logits" and out.datatype == "FP32"
    return np.frombuffer(response.raw_output_contents[0], np.float32).reshape(list(out.shape))


def assert_still_serving(srv: RunningServer, golden: np.ndarray, reference: np.ndarray) -> None:
    got = grpc_infer(grpc_client(srv), golden[:2])
    np.testing.assert_allclose(got, reference[:2], atol=ATOL, rtol=RTOL)


def test_health_and_metadata_through_tritonclient_grpc(server):
    c = grpc_client(server)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready(NAME)
    assert c.is_model_ready(NAME, model_version="1")
    meta = c.get_model_metadata(NAME, as_json=True)
    rest_meta = rest_client(server).get_model_metadata(NAME)
    assert meta["name"] == NAME and meta["versions"] == ["1"]
    assert meta["platform"] == rest_meta["platform"]
    for key in ("inputs", "outputs"):  # int64 shapes come back as strings in protobuf JSON
        got = [{**t, "shape": [int(d) for d in t["shape"]]} for t in meta[key]]
        assert got == rest_meta[key], key
    server_meta = c.get_server_metadata(as_json=True)
    rest_server = rest_client(server).get_server_metadata()
    assert server_meta["name"] == "paddle-mlops-server"
    assert server_meta["version"] == rest_server["version"]
    assert {"binary_tensor_data", "classification", "statistics", "model_repository"} <= set(
        server_meta["extensions"]
    )
    for call in (
        lambda: c.get_model_metadata("nope"),
        lambda: c.is_model_ready("nope"),
        lambda: c.get_model_metadata(NAME, model_version="7"),
    ):
        with pytest.raises(InferenceServerException) as err:
            call()
        assert err.value.status() == "StatusCode.NOT_FOUND", err.value


@pytest.mark.parametrize("batch", [1, 8])
def test_grpc_and_rest_give_identical_outputs(server, golden, reference, batch):
    x = golden[:batch]
    by_grpc = grpc_infer(grpc_client(server), x)
    by_rest = infer(rest_client(server), x, True)
    assert by_grpc.shape == (batch, 10) and by_grpc.dtype == np.float32
    assert np.array_equal(by_grpc, by_rest)
    np.testing.assert_allclose(by_grpc, reference[:batch], atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(by_rest, reference[:batch], atol=ATOL, rtol=RTOL)


def test_typed_contents_equal_raw_contents(server, golden, reference):
    x = golden[:4]
    channel, s = stub(server)
    with channel:
        typed = s.ModelInfer(image_request(x, raw=False, id="typed"), timeout=30)
        raw = s.ModelInfer(image_request(x, raw=True, id="raw"), timeout=30)
    assert (typed.id, raw.id) == ("typed", "raw")
    assert (typed.model_name, typed.model_version) == (NAME, "1")
    assert np.array_equal(logits_of(typed), logits_of(raw))
    np.testing.assert_allclose(logits_of(typed), reference[:4], atol=ATOL, rtol=RTOL)


def test_classification_matches_rest(server, golden):
    x = golden[:3]
    inp = grpcclient.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out = grpcclient.InferRequestedOutput("logits", class_count=3)
    by_grpc = grpc_client(server).infer(NAME, [inp], outputs=[out]).as_numpy("logits")
    hin = httpclient.InferInput("image", list(x.shape), "FP32")
    hin.set_data_from_numpy(x, binary_data=True)
    hout = httpclient.InferRequestedOutput("logits", binary_data=True, class_count=3)
    by_rest = rest_client(server).infer(NAME, [hin], outputs=[hout]).as_numpy("logits")
    assert by_grpc.shape == (3, 3)
    assert by_grpc.tolist() == by_rest.tolist()
    assert all(len(v.split(b":")) >= 2 for v in by_grpc.ravel())


def _with_raw(request: service_pb2.ModelInferRequest, *raw: bytes) -> service_pb2.ModelInferRequest:
    del request.raw_input_contents[:]
    request.raw_input_contents.extend(raw)
    return request


def _timeout(us: int) -> dict:
    return {"parameters": {"timeout": service_pb2.InferParameter(int64_param=us)}}


_ONE = np.zeros((1, 1, 28, 28), np.float32)
# Each case: the request, the status code and what the message must say (the messages are
# serving/src/codec.cc's, shared with the REST endpoint).
HOSTILE = {
    "wrong-datatype": (
        lambda: image_request(_ONE, datatype="INT64"),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("input 'image'", "datatype INT64 is not supported", "expects FP32"),
    ),
    "unknown-datatype": (
        lambda: image_request(_ONE, datatype="FLOAT"),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("input 'image'", "unknown datatype 'FLOAT'"),
    ),
    "wrong-shape": (
        lambda: image_request(np.zeros((1, 1, 28, 27), np.float32)),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("input 'image'", "shape [1,1,28,27] does not match the model's [-1,1,28,28]"),
    ),
    "negative-dim": (
        lambda: image_request(_ONE, shape=[1, 1, -28, 28]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("input 'image'", "'shape' must hold non-negative integers"),
    ),
    "batch-over-max": (
        lambda: image_request(np.zeros((MAX_BATCH + 1, 1, 28, 28), np.float32)),
        grpc.StatusCode.INVALID_ARGUMENT,
        (f"batch size {MAX_BATCH + 1} exceeds the max batch size {MAX_BATCH}",),
    ),
    "raw-size-mismatch": (
        lambda: _with_raw(image_request(_ONE), b"\0" * 100),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("input 'image'", "raw_input_contents[0] size 100", "[1,1,28,28] of FP32 (3136 bytes)"),
    ),
    "raw-count-mismatch": (
        lambda: _with_raw(image_request(_ONE), _ONE.tobytes(), _ONE.tobytes()),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("raw_input_contents has 2 entries but the request has 1 inputs",),
    ),
    "typed-count-mismatch": (
        lambda: image_request(_ONE.ravel()[:700], raw=False, shape=[1, 1, 28, 28]),
        grpc.StatusCode.INVALID_ARGUMENT,
        (
            "input 'image'",
            "contents.fp32_contents has 700 elements but shape [1,1,28,28] needs 784",
        ),
    ),
    "typed-wrong-list": (
        lambda: service_pb2.ModelInferRequest(
            model_name=NAME,
            inputs=[
                service_pb2.ModelInferRequest.InferInputTensor(
                    name="image",
                    datatype="FP32",
                    shape=[1, 1, 28, 28],
                    contents=service_pb2.InferTensorContents(int64_contents=[0] * 784),
                )
            ],
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("input 'image'", "FP32 elements go in contents.fp32_contents"),
    ),
    "unknown-input": (
        lambda: image_request(_ONE, input_name="pixels"),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("unexpected input 'pixels'", "the model expects 'image'"),
    ),
    "missing-input": (
        lambda: service_pb2.ModelInferRequest(model_name=NAME),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("missing input 'image'",),
    ),
    "unknown-output": (
        lambda: image_request(
            _ONE, outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="probs")]
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("unknown output 'probs'", "the model has 'logits'"),
    ),
    "negative-timeout": (
        lambda: image_request(_ONE, **_timeout(-5)),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("'timeout' must be >= 0",),
    ),
    "unknown-model": (
        lambda: image_request(_ONE, model_name="nope"),
        grpc.StatusCode.NOT_FOUND,
        ("unknown model 'nope'", "this server serves 'digits'"),
    ),
    "unknown-version": (
        lambda: image_request(_ONE, model_version="9"),
        grpc.StatusCode.NOT_FOUND,
        ("unknown version '9'",),
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_bad_requests_get_a_clean_status_and_the_server_keeps_serving(
    server, golden, reference, case
):
    make, code, needles = HOSTILE[case]
    assert needles and all(n.strip() for n in needles), f"{case}: no expected message"
    channel, s = stub(server)
    with channel, pytest.raises(grpc.RpcError) as err:
        s.ModelInfer(make(), timeout=30)
    assert err.value.code() == code, (case, err.value.code(), err.value.details())
    for needle in needles:
        assert needle.lower() in err.value.details().lower(), (needle, err.value.details())
    assert_still_serving(server, golden, reference)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x0a\x64digits",  # model_name claims 100 bytes, 6 follow
        b"\x0a\x02\xff\xfe",  # model_name is not UTF-8
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # a tag varint that never ends
        b"\x2a\x05\x0a\x03im",  # inputs[0] truncated inside its name
    ],
)
def test_malformed_protobuf_is_refused_not_a_crash(server, golden, reference, garbage):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=None,
            response_deserializer=None,
        )
        with pytest.raises(grpc.RpcError) as err:
            call(garbage, timeout=30)
    assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), (
        err.value.code(),
        err.value.details(),
    )
    assert server.proc.poll() is None
    assert_still_serving(server, golden, reference)


def test_request_timeout_parameter_is_honoured(server, golden, reference):
    """A 1 µs ``timeout`` parameter (tritonclient's ``timeout=``) expires in the queue: the
    server answers DEADLINE_EXCEEDED instead of computing it, and keeps serving."""
    c = grpc_client(server)
    with pytest.raises(InferenceServerException) as err:
        grpc_infer(c, golden[:1], timeout=1)
    assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED", err.value
    assert_still_serving(server, golden, reference)


def test_statistics_count_grpc_requests(server, golden):
    c = grpc_client(server)
    n = 5

    def success() -> int:
        stats = c.get_inference_statistics(NAME, as_json=True)["model_stats"]
        assert [(s["name"], s["version"]) for s in stats] == [(NAME, "1")]
        return int(stats[0]["inference_stats"]["success"].get("count", 0))

    before = success()
    for _ in range(n):
        grpc_infer(c, golden[:2])
    assert success() - before == n
    stats = c.get_inference_statistics(NAME, "1", as_json=True)["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] and int(stats["inference_count"]) >= 2 * n
    assert int(stats["inference_stats"]["compute_infer"]["ns"]) > 0
    assert c.get_model_repository_index(as_json=True)["models"] == [
        {"name": NAME, "version": "1", "state": "READY"}
    ]
    with pytest.raises(InferenceServerException, match="model-control"):
        c.load_model(NAME)
    with pytest.raises(InferenceServerException) as err:
        c.get_inference_statistics("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND"


def test_message_over_max_body_bytes_is_resource_exhausted(
    server_binary, exported_int8, tmp_path, golden
):
    srv = start(server_binary, exported_int8, tmp_path, "--max-body-bytes=65536")
    try:
        big = np.zeros((32, 1, 28, 28), np.float32)  # 100 KB of raw contents
        with pytest.raises(InferenceServerException) as err:
            grpc_infer(grpc_client(srv), big)
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED", err.value
        assert grpc_infer(grpc_client(srv), golden[:2]).shape == (2, 10)
    finally:
        assert srv.stop() == 0


def test_load_and_unload_through_grpc(server_binary, exported_int8: Path, tmp_path, golden):
    """RepositoryModelLoad builds version 2 (the int8 model) off the gRPC threads while
    version 1 serves, then swaps it in; RepositoryModelUnload stops serving."""
    x = golden[:4]
    int8_ref = OVPredictor(exported_int8 / "int8" / "openvino" / "model.xml").predict([x])
    srv = start(server_binary, exported_int8, tmp_path, "--model-control=true")
    try:
        c = grpc_client(srv)
        with pytest.raises(InferenceServerException, match="unknown load parameter 'colour'"):
            c.load_model(NAME, config=json.dumps({"colour": "red"}))
        assert c.is_model_ready(NAME, "1")
        c.load_model(NAME, config=json.dumps({"version": "2", "variant": "int8"}))
        assert c.is_model_ready(NAME, "2")
        got = grpc_infer(c, x)
        assert np.abs(got - int8_ref).max() < 1e-3
        index = {
            (m["version"], m["state"]) for m in c.get_model_repository_index(as_json=True)["models"]
        }
        assert ("2", "READY") in index, index
        c.unload_model(NAME)
        assert not c.is_model_ready(NAME)
        with pytest.raises(InferenceServerException) as err:
            grpc_infer(c, x)
        assert err.value.status() == "StatusCode.UNAVAILABLE", err.value
    finally:
        assert srv.stop() == 0


def test_sigterm_turns_grpc_readiness_off_while_requests_are_still_served(
    server_binary, exported_int8, tmp_path, golden, reference
):
    """During the drain delay after SIGTERM the gRPC readiness RPCs say not ready (so
    KServe stops routing here) while requests are still answered; then a clean exit."""
    srv = start(server_binary, exported_int8, tmp_path, "--drain-delay-ms=4000")
    try:
        c = grpc_client(srv)
        assert c.is_server_ready() and c.is_model_ready(NAME)
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 3
        while c.is_server_ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not c.is_server_ready() and not c.is_model_ready(NAME)
        np.testing.assert_allclose(grpc_infer(c, golden[:2]), reference[:2], atol=ATOL, rtol=RTOL)
        assert srv.proc.wait(timeout=60) == 0
    finally:
        srv.stop()
