"""The real C++ server binary on the digits export, driven by unmodified ``tritonclient.http``.

Servers bind to 127.0.0.1 on free ports; every load loop is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from components.ml.serving.kserve_client import KServeClient
from components.ml.serving.ov_runtime import OVPredictor
from components.ml.serving.server import RunningServer, ServerProcess
from tests.conftest import CONTAINERS_CONF, HAVE_PODMAN, NO_PODMAN, with_model_config

NAME = "digits"


def start(
    binary: Path,
    model_dir: Path,
    tmp: Path,
    *extra: str,
    variant: str = "fp32",
    settings: dict | None = None,
) -> RunningServer:
    """The binary serving ``model_dir``; ``settings``: a copy of it whose model_config.json
    has these (the server reads them from there, as from any bundle)."""
    if settings:
        model_dir = with_model_config(model_dir, tmp / f"bundle-{time.time()}", **settings)
    server = RunningServer(
        binary,
        model_dir,
        variant,
        NAME,
        tmp / f"server-{time.time()}.log",
        extra_args=list(extra),
    )
    server.wait_ready(60)
    return server


@pytest.fixture(scope="module")
def golden(digits_task, digits_data):
    (images,), _ = digits_task.eval_head(digits_data, "test", 64)
    return images


@pytest.fixture(scope="module")
def reference(exported_int8, golden):
    """OpenVINO in-process on the same legacy program the server loads (f32 precision)."""
    return OVPredictor(exported_int8 / "legacy" / "model.pdmodel").predict([golden])


def start_container(image: str, model_dir: Path, tmp: Path) -> ServerProcess:
    """The server image under podman, published on a loopback port, the bundle mounted
    read-only at /mnt/models (as KServe does): its model_config.json configures it."""
    server = ServerProcess(
        lambda port: [
            "podman", "run", "--rm", "--read-only",
            "-p", f"127.0.0.1:{port}:8080", "-v", f"{model_dir}:/mnt/models:ro",
            image, "--variant=fp32", f"--model-name={NAME}",
        ],
        NAME,
        tmp / f"container-{time.time()}.log",
        env={**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)},
    )  # fmt: skip
    server.wait_ready(120)
    return server


@pytest.fixture(
    scope="module",
    params=[
        "binary",
        pytest.param("container", marks=pytest.mark.skipif(not HAVE_PODMAN, reason=NO_PODMAN)),
    ],
)
def server(request, server_binary, exported_int8, tmp_path_factory):
    """The server as built here, and as its image runs under podman: the same tests."""
    tmp = tmp_path_factory.mktemp("srv")
    bundle = with_model_config(
        exported_int8, tmp / "bundle", workers=2, max_batch_size=16, max_queue_delay_us=2000
    )
    if request.param == "binary":
        srv = start(server_binary, bundle, tmp)
    else:
        srv = start_container(request.getfixturevalue("images")["server"]["ref"], bundle, tmp)
    yield srv
    assert srv.stop() == 0


def client(srv: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=f"127.0.0.1:{srv.port}", network_timeout=30)


def infer(c: httpclient.InferenceServerClient, x: np.ndarray, binary: bool) -> np.ndarray:
    inp = httpclient.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("logits", binary_data=binary)
    return c.infer(NAME, [inp], outputs=[out]).as_numpy("logits")


def raw_request(
    port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None
) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(payload)
    except ValueError:
        return resp.status, {"raw": payload.decode(errors="replace")}


def test_health_and_metadata_through_tritonclient(server):
    c = client(server)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready(NAME)
    meta = c.get_model_metadata(NAME)
    assert meta["name"] == NAME
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    assert "binary_tensor_data" in c.get_server_metadata()["extensions"]
    assert c.is_model_ready(NAME, model_version=str(meta["versions"][0]))


def test_the_server_runs_with_the_bundles_model_config_and_says_so(server, golden):
    """The binary and the image read model_config.json from the model directory (no flag, no
    variable): GET .../config answers the file's settings, and the batch limit holds."""
    answer = KServeClient(f"http://127.0.0.1:{server.port}").model_config(NAME)
    settings = answer["settings"]
    assert (settings["workers"], settings["max_batch_size"], settings["max_queue_delay_us"]) == (
        2,
        16,
        2000,
    )
    assert answer["model_config_file"].endswith("/model_config.json")
    c = client(server)
    assert infer(c, golden[:16], True).shape[0] == 16
    with pytest.raises(InferenceServerException, match="16"):
        infer(c, golden[:17], True)


@pytest.mark.parametrize("binary", [False, True])
def test_infer_matches_the_in_process_runtime(server, golden, reference, binary):
    got = infer(client(server), golden[:8], binary)
    np.testing.assert_allclose(got, reference[:8], atol=1e-4, rtol=1e-3)


def _infer_body(name: str, shape: list[int], datatype: str, data: list) -> bytes:
    return json.dumps(
        {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]}
    ).encode()


# Each case: the request body and what the error must say (every substring, case-insensitive;
# the messages are serving/src/codec.cc's).
BAD_REQUESTS = {
    "malformed-json": (b"{not json", ("malformed json in request",)),
    "wrong-shape": (
        _infer_body("image", [1, 1, 28, 27], "FP32", [0.0] * 756),
        ("input 'image'", "shape [1,1,28,27] does not match the model's [-1,1,28,28]"),
    ),
    "wrong-datatype": (
        _infer_body("image", [1, 1, 28, 28], "INT64", [0] * 784),
        ("input 'image'", "datatype int64 is not supported", "expects fp32"),
    ),
    "short-data": (
        _infer_body("image", [1, 1, 28, 28], "FP32", [0.0] * 700),
        ("input 'image'", "'data' has 700 elements but shape [1,1,28,28] needs 784"),
    ),
    "unknown-input": (
        _infer_body("pixels", [1, 1, 28, 28], "FP32", [0.0] * 784),
        ("unexpected input 'pixels'", "the model expects 'image'"),
    ),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_get_a_readable_4xx_and_the_server_keeps_serving(
    server, golden, reference, case
):
    body, needles = BAD_REQUESTS[case]
    assert needles and all(n.strip() for n in needles), f"{case}: no expected message"
    code, payload = raw_request(
        server.port, "POST", f"/v2/models/{NAME}/infer", body, {"Content-Type": "application/json"}
    )
    assert code == 400 and "error" in payload, payload
    for needle in needles:
        assert needle.lower() in payload["error"].lower(), (needle, payload["error"])
    np.testing.assert_allclose(
        infer(client(server), golden[:1], True), reference[:1], atol=1e-4, rtol=1e-3
    )


def test_unknown_model_is_404(server):
    code, payload = raw_request(server.port, "GET", "/v2/models/nope")
    assert code == 404 and "error" in payload
    code, payload = raw_request(server.port, "POST", "/v2/models/nope/infer", b"{}")
    assert code == 404 and "error" in payload


def test_oversized_body_is_rejected(server_binary, exported_int8, tmp_path, golden):
    srv = start(server_binary, exported_int8, tmp_path, "--max-body-bytes=65536")
    try:
        big = np.zeros((64, 1, 28, 28), np.float32)  # 200 KB binary, ~1 MB as JSON
        code, payload = raw_request(
            srv.port,
            "POST",
            f"/v2/models/{NAME}/infer",
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "image",
                            "shape": list(big.shape),
                            "datatype": "FP32",
                            "data": big.ravel().tolist(),
                        }
                    ]
                }
            ).encode(),
            {"Content-Type": "application/json"},
        )
        assert code == 413
        assert infer(client(srv), golden[:2], True).shape == (2, 10)
    finally:
        assert srv.stop() == 0


def test_a_body_over_the_limit_gets_a_413_the_client_can_read(
    server_binary, exported_int8, tmp_path, golden
):
    """A 65 MiB upload against the default 64 MiB limit, as http.client sends it (the whole
    body, then it reads): the server answers 413 with Connection: close and drains the rest
    of the body (nginx's lingering close) instead of resetting the upload, so the client
    reads the answer, not EPIPE. The drain's time bound is set far out: only the byte bound
    (default 128 MiB) may end it here, however slow the host."""
    srv = start(server_binary, exported_int8, tmp_path, "--lingering-close-ms=3600000")
    try:
        body = bytes(65 << 20)
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            try:
                conn.request(
                    "POST",
                    f"/v2/models/{NAME}/infer",
                    body=body,
                    headers={"Content-Type": "application/octet-stream"},
                )
                resp = conn.getresponse()
                payload = json.loads(resp.read())
            finally:
                conn.close()
            assert resp.status == 413, payload
            assert resp.getheader("Connection") == "close"
            assert "67108864 bytes (--max-body-bytes)" in payload["error"]
        assert infer(client(srv), golden[:2], True).shape == (2, 10)
    finally:
        assert srv.stop() == 0


def test_client_disconnecting_mid_request_does_not_hurt(server, golden, reference):
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        s.sendall(
            b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            b'{"inputs": [{"name": "image", "shape": [1,1,28,28], "data": [0.1, 0.2'
        )
        s.close()
    # and one that disconnects while its (valid) request is being computed
    x = golden[:16]
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.ravel().tolist(),
                }
            ]
        }
    ).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(
        b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
        b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    s.close()
    np.testing.assert_allclose(
        infer(client(server), golden[:4], True), reference[:4], atol=1e-4, rtol=1e-3
    )
    assert client(server).is_server_ready()


def host_pid(srv: ServerProcess) -> int:
    """The host PID of the server process: the binary's own, or the one podman runs (its
    container publishes ``srv.port``)."""
    if Path(str(srv.proc.args[0])).name != "podman":
        return srv.proc.pid
    from tests.test_containers import podman

    ids = podman("ps", "--format", "{{.ID}} {{.Ports}}").stdout.splitlines()
    (cid,) = [line.split()[0] for line in ids if f"127.0.0.1:{srv.port}->" in line]
    return int(podman("inspect", "--format", "{{.State.Pid}}", cid).stdout.strip())


@contextlib.contextmanager
def stopped(pid: int):
    """The process stopped (SIGSTOP) for the block, continued after, however it ends."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def burst_infer(
    port: int, batches: list[tuple[np.ndarray, bool]], pid: int | None = None
) -> list[np.ndarray]:
    """Send every request at once, one per pre-opened keep-alive connection, then read the
    answers: the requests reach the server within microseconds, as a burst from many clients
    does. With ``pid`` (the server's) the requests are sent while the server is stopped, so
    they are all in its sockets when it continues, however slowly this process sends them on
    a loaded host."""
    requests = []
    for x, binary in batches:
        inp = httpclient.InferInput("image", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("logits", binary_data=binary)
        body, json_size = httpclient.InferenceServerClient.generate_request_body([inp], [out])
        headers = {"Content-Type": "application/octet-stream"}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        requests.append((body, headers))
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in requests]
    try:
        for conn in conns:
            conn.connect()
        with stopped(pid) if pid is not None else contextlib.nullcontext():
            for conn, (body, headers) in zip(conns, requests, strict=True):
                conn.request("POST", f"/v2/models/{NAME}/infer", body=body, headers=headers)
        got = []
        for conn in conns:
            resp = conn.getresponse()
            payload = resp.read()
            assert resp.status == 200, payload[:500]
            length = resp.getheader("Inference-Header-Content-Length")
            result = httpclient.InferenceServerClient.parse_response_body(
                payload, header_length=int(length) if length else None
            )
            got.append(result.as_numpy("logits"))
        return got
    finally:
        for conn in conns:
            conn.close()


def test_concurrent_clients_get_their_own_answers_under_batching(server, golden, reference):
    rng = np.random.default_rng(0)
    jobs = []
    for _ in range(96):
        start_i = int(rng.integers(0, 60))
        n = int(rng.integers(1, 4))  # 1..3 samples per request
        jobs.append((start_i, n, bool(rng.integers(0, 2))))

    # this module's server has served other tests already: compare /metrics before and after,
    # once the batches of earlier tests (a timed-out request still runs) have all finished
    before = settled_metrics(server.port)
    pid = host_pid(server)
    for r in range(0, len(jobs), 16):  # 6 bursts of 16 clients, sent while the server stops
        burst = jobs[r : r + 16]
        answers = burst_infer(server.port, [(golden[i : i + n], b) for i, n, b in burst], pid)
        for (start_i, n, _), got in zip(burst, answers, strict=True):
            np.testing.assert_allclose(got, reference[start_i : start_i + n], atol=1e-4, rtol=1e-3)
    after = client_metrics(server.port)

    samples = histogram_delta(before, after, "kserve_batch_size")
    requests = histogram_delta(before, after, "kserve_batch_requests")
    sent = sum(n for _, n, _ in jobs)
    # every request and every one of its samples ran in exactly one executed batch
    assert samples["sum"] == sent and requests["sum"] == len(jobs), (samples, requests)
    assert samples["count"] == requests["count"], (samples, requests)  # both: one per batch
    assert counter_delta(before, after, "kserve_inference_samples_total") == sent
    # requests were merged: fewer batches than requests (none over --max-batch-size=16), some
    # batch held several requests and more samples than one request carries (at most 3).
    # Bucket counts are cumulative (le = upper bound): batches above le=4 held >= 5 samples.
    assert sent / 16 <= samples["count"] < len(jobs), samples
    assert requests["count"] - requests["le"][1.0] > 0, requests
    assert samples["count"] - samples["le"][4.0] > 0, samples


def settled_metrics(port: int, quiet_s: float = 0.5, limit_s: float = 30.0) -> str:
    """/metrics once no batch has run for ``quiet_s`` (bounded by ``limit_s``)."""
    deadline = time.monotonic() + limit_s
    text = client_metrics(port)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = client_metrics(port)
        if _series(again, "kserve_batch_size_count") == _series(text, "kserve_batch_size_count"):
            return again
        text = again
    return text


def client_metrics(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return text


def _series(text: str, metric: str) -> list[tuple[dict[str, str], float]]:
    """This model's ``metric{labels} value`` lines (Prometheus text format)."""
    out = []
    for m in re.finditer(rf"^{metric}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("model") == NAME:
            out.append((labels, float(m.group(2))))
    return out


def histogram(text: str, metric: str) -> dict:
    """Cumulative ``_bucket`` counts by upper bound ``le`` (+Inf included), ``_sum``, ``_count``."""
    buckets = {float(labels["le"]): v for labels, v in _series(text, metric + "_bucket")}
    ((_, total),) = _series(text, metric + "_sum")
    ((_, count),) = _series(text, metric + "_count")
    bounds = sorted(buckets)
    assert bounds and bounds[-1] == float("inf"), text[:2000]
    assert [buckets[b] for b in bounds] == sorted(buckets.values()), buckets  # cumulative
    assert buckets[float("inf")] == count, (buckets, count)
    return {"le": buckets, "sum": total, "count": count}


def histogram_delta(before: str, after: str, metric: str) -> dict:
    b, a = histogram(before, metric), histogram(after, metric)
    assert set(b["le"]) == set(a["le"]), (b, a)
    return {
        "le": {le: a["le"][le] - b["le"][le] for le in a["le"]},
        "sum": a["sum"] - b["sum"],
        "count": a["count"] - b["count"],
    }


def counter_delta(before: str, after: str, metric: str) -> float:
    ((_, b),) = _series(before, metric)
    ((_, a),) = _series(after, metric)
    return a - b


def test_metrics_are_prometheus_text(server, golden):
    infer(client(server), golden[:2], True)
    text = client_metrics(server.port)
    for needle in ("# TYPE", "_count", "_sum", "_bucket", "queue", "compute", "batch_size"):
        assert needle in text, needle
    assert re.search(r"request\w*_total\{[^}]*\} [1-9]", text), text[:1500]
    assert re.search(r"fail\w*_total", text), text[:1500]


def test_sigterm_drains_in_flight_requests(
    server_binary, exported_int8, tmp_path, golden, reference
):
    srv = start(
        server_binary,
        exported_int8,
        tmp_path,
        settings=dict(workers=1, max_batch_size=64, max_queue_delay_us=300_000),
    )
    results: dict[int, object] = {}

    def call(i: int) -> None:
        c = client(srv)
        try:
            results[i] = infer(c, golden[i : i + 1], True)
        except Exception as exc:  # recorded, asserted below
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.1)  # requests are queued: the batcher waits up to 300 ms to fill a batch
    srv.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=60)
    code = srv.proc.wait(timeout=60)
    srv.stop()
    assert code == 0
    for i in range(8):
        assert isinstance(results[i], np.ndarray), results[i]
        np.testing.assert_allclose(results[i], reference[i : i + 1], atol=1e-4, rtol=1e-3)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()


def test_int8_variant_serves_the_int8_model(server_binary, exported_int8, tmp_path, golden):
    srv = start(server_binary, exported_int8, tmp_path, variant="int8")
    try:
        got = infer(client(srv), golden[:32], True)
        ref = OVPredictor(exported_int8 / "int8" / "openvino" / "model.xml").predict([golden[:32]])
        np.testing.assert_allclose(got, ref, atol=1e-3, rtol=1e-3)
    finally:
        assert srv.stop() == 0


def test_port_env_is_honoured(server_binary, exported_int8, tmp_path):
    port = RunningServer.free_port()
    log = open(tmp_path / "env.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            str(server_binary),
            f"--model-dir={exported_int8}",
            "--host=127.0.0.1",
            f"--model-name={NAME}",
        ],
        env={"PORT": str(port), "SERVING_GRPC_PORT": "-1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        c = httpclient.InferenceServerClient(url=f"127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if c.is_server_ready():
                    break
            except Exception:
                time.sleep(0.2)
        assert c.is_model_ready(NAME)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        log.close()


# ------------------------------------------------------------- connections, versions, stats


def _raise_fd_limit(need: int) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))


def test_a_thousand_slow_clients_do_not_starve_good_ones(
    server_binary, exported_int8, tmp_path, golden, reference
):
    """Half the connections send nothing, half send part of a request's headers and stop: each
    costs the server a socket, not a thread, so well-behaved clients are served as usual.
    (The old thread-per-connection server stalled a health check for seconds with 64.)"""
    _raise_fd_limit(4096)
    srv = start(server_binary, exported_int8, tmp_path, "--access-log=false")
    slow: list[socket.socket] = []
    try:
        partial = b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Le"
        for i in range(1000):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            if i % 2:
                s.sendall(partial)
            slow.append(s)
        c = client(srv)
        worst = 0.0
        for i in range(200):
            t0 = time.perf_counter()
            got = infer(c, golden[i % 8 : i % 8 + 1], True)
            worst = max(worst, time.perf_counter() - t0)
            np.testing.assert_allclose(got, reference[i % 8 : i % 8 + 1], atol=1e-4, rtol=1e-3)
        assert c.is_server_ready()
        # not a latency benchmark (bench/serving/ is): a stall would take seconds
        assert worst < 2.0, f"a good request took {worst:.2f} s next to 1,000 slow clients"
        # the slow clients are still connected (the header timeout is 10 s): none was dropped
        # to make room
        lost = 0
        for s in slow:
            s.setblocking(False)
            try:
                lost += s.recv(1) == b""
            except BlockingIOError:
                pass
        assert lost == 0
    finally:
        for s in slow:
            s.close()
        assert srv.stop() == 0


def _why(e: Exception) -> str:
    """A client failure for the assertion message (tritonclient's repr drops its message)."""
    status = getattr(e, "status", None)
    message = getattr(e, "message", None)
    return (
        f"{type(e).__name__}(status={status() if callable(status) else status}, "
        f"message={message() if callable(message) else message or str(e)!r})"
    )


def _answers_while_loading(
    srv: RunningServer, x: np.ndarray, load: Any, clients: int = 3, each_side: int = 40
) -> tuple[list[tuple[str, np.ndarray]], list[str]]:
    """``clients`` threads stream requests; ``load()`` runs once each has seen the old version
    answer; streaming goes on until ``each_side`` answers of a new version arrived (bounded)."""
    answers: list[tuple[str, np.ndarray]] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def stream() -> None:
        c = client(srv)
        inp = httpclient.InferInput("image", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        for _ in range(20_000):
            if stop.is_set():
                return
            try:
                r = c.infer(NAME, [inp])
                with lock:
                    answers.append((r.get_response()["model_version"], r.as_numpy("logits")))
            except Exception as e:  # noqa: BLE001 - every failure is the finding
                with lock:
                    errors.append(_why(e))

    threads = [threading.Thread(target=stream) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while len(answers) < each_side and time.monotonic() < deadline:
            time.sleep(0.01)
        load()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if sum(v != answers[0][0] for v, _ in answers) >= each_side:
                    break
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    return answers, errors


def test_loading_a_new_version_under_load_fails_no_request(
    server_binary, exported_int8, tmp_path, golden
):
    """`load` of version 2 (here: the int8 model of the same export) while clients stream
    requests: the old version serves until the new one is compiled, then drains. No request
    fails, and every answer is the one of the version it names."""
    x = golden[:4]
    refs = {
        "1": OVPredictor(exported_int8 / "legacy" / "model.pdmodel").predict([x]),
        "2": OVPredictor(exported_int8 / "int8" / "openvino" / "model.xml").predict([x]),
    }
    assert np.abs(refs["1"] - refs["2"]).max() > 1e-3, "the versions must be told apart"
    srv = start(server_binary, exported_int8, tmp_path, "--model-control=true")
    try:
        c = client(srv)
        answers, errors = _answers_while_loading(
            srv,
            x,
            lambda: c.load_model(NAME, config=json.dumps({"version": "2", "variant": "int8"})),
        )
        assert errors == []
        versions = [v for v, _ in answers]
        assert versions[0] == "1" and versions.count("2") >= 40, versions[-5:]
        for version, got in answers:
            other = "2" if version == "1" else "1"
            own_err = np.abs(got - refs[version]).max()
            assert own_err < 1e-3
            assert own_err < np.abs(got - refs[other]).max()
        # after the swap only version 2 is served; version 1 drained
        index = {(m["version"], m["state"]) for m in c.get_model_repository_index()}
        assert ("2", "READY") in index and ("1", "UNAVAILABLE") in index, index
        assert c.is_model_ready(NAME, "2") and not c.is_model_ready(NAME, "1")
        stats = c.get_inference_statistics(NAME)["model_stats"]
        served = {s["version"]: s["inference_stats"]["success"]["count"] for s in stats}
        assert served["1"] + served["2"] >= len(answers)
        assert served["2"] >= versions.count("2")
    finally:
        assert srv.stop() == 0


def test_a_failed_load_leaves_no_index_entry_and_the_old_version_serves(
    server_binary, exported_int8, tmp_path, golden, reference
):
    """A load from a bundle whose model OpenVINO cannot read fails; the server keeps serving
    version 1, and the repository index, the statistics and the model's readiness show that
    alone: no UNAVAILABLE entry of the failed version lingers, nor one of version 1 when the
    failed load was of version 1 itself. The reason is in the answer and in the log."""
    bad = with_model_config(exported_int8, tmp_path / "bad")
    (bad / "legacy" / "model.pdmodel").write_bytes(b"not a paddle program")
    srv = start(server_binary, exported_int8, tmp_path, "--model-control=true")
    try:
        c = client(srv)
        for parameters in ({"model_dir": str(bad), "version": "2"}, {"model_dir": str(bad)}):
            status, body = raw_request(
                srv.port,
                "POST",
                f"/v2/repository/models/{NAME}/load",
                json.dumps({"parameters": parameters}).encode(),
            )
            assert status == 400, body
            assert f"OpenVINO cannot read {bad}/legacy/model.pdmodel" in body["error"]
        assert c.get_model_repository_index() == [
            {"name": NAME, "version": "1", "state": "READY", "reason": ""}
        ]
        stats = c.get_inference_statistics(NAME)["model_stats"]
        assert [s["version"] for s in stats] == ["1"]
        assert c.is_model_ready(NAME, "1")
        np.testing.assert_allclose(infer(c, golden[:4], True), reference[:4], atol=1e-4)
        failed = _log_records(srv.log_file, "model load failed")
        assert [(r["version"], r["serving"]) for r in failed] == [("2", "1"), ("1", "1")]
        assert all("cannot read" in r["error"] for r in failed)
    finally:
        assert srv.stop() == 0


def test_statistics_and_repository_through_tritonclient(server, golden):
    c = client(server)
    before = c.get_inference_statistics(NAME)["model_stats"][0]["inference_stats"]
    for _ in range(5):
        infer(c, golden[:2], True)
    stats = c.get_inference_statistics(NAME, "1")["model_stats"][0]
    assert stats["name"] == NAME and stats["version"] == "1"
    done = stats["inference_stats"]["success"]["count"] - before["success"]["count"]
    assert done == 5
    assert stats["inference_stats"]["compute_infer"]["ns"] > 0
    assert (
        sum(b["batch_size"] * b["compute_infer"]["count"] for b in stats["batch_stats"])
        == (stats["inference_count"])
    )
    assert c.get_model_repository_index() == [
        {"name": NAME, "version": "1", "state": "READY", "reason": ""}
    ]
    # loading needs --model-control (off by default): a clear refusal, nothing changes
    with pytest.raises(Exception, match="model-control"):
        c.load_model(NAME)
    assert c.is_model_ready(NAME)


def _log_records(log_file: Path, msg: str) -> list[dict]:
    out = []
    for line in log_file.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("msg") == msg:
                out.append(record)
    return out


def test_the_bundle_warms_every_batch_size_before_ready_and_before_a_swap(
    server_binary, exported_int8, tmp_path, golden, reference
):
    """The bundle's warm-up samples (export.warmup_samples): the server runs every batch size
    on every worker before it reports ready, and a ``load`` runs them on the new version before
    it is swapped in. The answers afterwards are still the model's."""
    doc = json.loads((exported_int8 / "warmup.json").read_text())
    assert doc["samples"] == 8 and [e["name"] for e in doc["inputs"]] == ["image"]
    bundle = with_model_config(exported_int8, tmp_path / "bundle", workers=2, max_batch_size=5)
    srv = start(server_binary, bundle, tmp_path, "--model-control=true")
    try:
        (started,) = _log_records(srv.log_file, "warmed up")
        assert started["version"] == "1" and started["workers"] == 2
        assert started["max_batch_size"] == 5
        c = client(srv)
        c.load_model(NAME, config=json.dumps({"version": "2"}))
        records = [
            json.loads(line)
            for line in srv.log_file.read_text().splitlines()
            if line.startswith("{")
        ]
        order = [(r["msg"], r.get("version")) for r in records]
        assert order.index(("warmed up", "2")) < order.index(("model version swapped in", "2"))
        for batch in (1, 3, 5):
            got = infer(c, golden[:batch], binary=True)
            np.testing.assert_allclose(got, reference[:batch], atol=1e-4)
    finally:
        assert srv.stop() == 0


def test_no_warmup_file_no_warmup_and_a_bad_one_is_one_readable_error(
    server_binary, exported_int8, tmp_path
):
    plain = with_model_config(exported_int8, tmp_path / "plain", max_batch_size=4)
    (plain / "warmup.json").unlink()
    srv = start(server_binary, plain, tmp_path, "--model-control=true")
    try:
        assert _log_records(srv.log_file, "warmed up") == []
        # a swap to a bundle whose warm-up file is cut short is refused; the old one serves
        bad = with_model_config(exported_int8, tmp_path / "bad", max_batch_size=4)
        sample = bad / "warmup" / "0.bin"
        sample.write_bytes(sample.read_bytes()[:-4])
        status, body = raw_request(
            srv.port,
            "POST",
            f"/v2/repository/models/{NAME}/load",
            json.dumps({"parameters": {"model_dir": str(bad), "version": "2"}}).encode(),
        )
        assert status == 400, body
        assert f"{sample}: 25084 bytes, but 8 samples of input 'image' take 25088" in body["error"]
        assert client(srv).is_model_ready(NAME, "1")
    finally:
        assert srv.stop() == 0
    # at start: the server exits with that one line
    proc = subprocess.run(
        [str(server_binary), f"--model-dir={bad}", "--host=127.0.0.1", "--grpc-port=-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    errors = [r for r in map(json.loads, proc.stderr.splitlines()) if r["level"] == "error"]
    assert len(errors) == 1 and "25084 bytes" in errors[0]["error"], proc.stderr
