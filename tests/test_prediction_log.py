"""The C++ server's prediction log, read back the way the monitor reads it.

Real server binary on the digits export, bound to 127.0.0.1; every load loop is bounded.
"""

from __future__ import annotations

import http.server
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from components.ml.data.prediction_log import LogReader, parse_line, read_log
from components.ml.serving.server import RunningServer
from tests.conftest import fp32_bundle, untrained_export, with_model_config

NAME = "digits"


def start(binary: Path, model_dir: Path, tmp: Path, *extra: str) -> RunningServer:
    server = RunningServer(
        binary, model_dir, "fp32", NAME, tmp / f"server-{time.time()}.log", extra_args=list(extra)
    )
    server.wait_ready(60)
    return server


def metric(server: RunningServer, name: str) -> float:
    """One sample of the server's /metrics (labels included in ``name``), 0 when absent."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def wait_written(server: RunningServer, count: int, limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        done = metric(server, "serving_prediction_log_written_total") + metric(
            server, 'serving_prediction_log_dropped_total{reason="queue_full"}'
        )
        if done >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"the log did not account for {count} records in {limit_s} s")


@pytest.fixture(scope="module")
def golden(digits_task, digits_data):
    (images,), _ = digits_task.eval_head(digits_data, "test", 64)
    return images


def test_every_answer_is_logged_once_under_its_id_with_sampled_inputs(
    server_binary, exported_int8, golden, tmp_path
):
    """Outputs of every request the model answered, inputs of about the configured share
    (the model's own model_config.json: log_input_rate), under the client's ids. A request
    the protocol layer refuses (malformed, wrong shape) never reached a model: counted in
    the metrics, not logged."""
    bundle = with_model_config(exported_int8, tmp_path / "bundle", log_input_rate=0.3)
    log_dir = tmp_path / "log"
    server = start(server_binary, bundle, tmp_path, f"--prediction-log-dir={log_dir}")
    try:
        assert server.client.model_config(NAME)["settings"]["log_input_rate"] == pytest.approx(0.3)
        sent: dict[str, tuple[np.ndarray, np.ndarray]] = {}

        def one(i: int) -> None:
            x = golden[i % 64 : i % 64 + 1 + i % 3]
            out = server.client.infer(NAME, {"image": x}, binary=i % 2 == 0, request_id=f"r-{i}")
            sent[f"r-{i}"] = (x, next(iter(out.values())))

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, range(200)))
        bad = np.zeros((1, 1, 27, 28), np.float32)
        with pytest.raises(Exception, match="400"):
            server.client.infer(NAME, {"image": bad}, request_id="r-bad")
        wait_written(server, 200)
    finally:
        assert server.stop() == 0

    reader = LogReader(log_dir)
    records = list(reader)
    assert reader.torn == 0
    ids = [r.id for r in records]
    assert sorted(ids) == sorted(sent)  # each exactly once, and not r-bad
    by_id = {r.id: r for r in records}
    sampled = 0
    for rid, (x, logits) in sent.items():
        r = by_id[rid]
        assert r.ok and r.model == NAME and r.role == "default" and r.answered
        assert r.batch == len(x) and r.top1 == logits.argmax(1).tolist()
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        np.testing.assert_allclose(r.confidence, probs.max(1), rtol=1e-4)
        if r.inputs is not None:
            sampled += 1
            np.testing.assert_array_equal(r.inputs["image"], x)
    # Binomial(200, 0.3): mean 60, sd 6.5; outside [30, 90] has probability < 1e-5
    assert 30 <= sampled <= 90, sampled


def test_rotation_keeps_the_directory_within_its_bound(
    server_binary, exported_int8, golden, tmp_path
):
    log_dir = tmp_path / "log"
    server = start(
        server_binary,
        exported_int8,
        tmp_path,
        f"--prediction-log-dir={log_dir}",
        "--prediction-log-segment-bytes=8192",
        "--prediction-log-max-bytes=32768",
        "--log-input-rate=1",
    )
    try:
        for i in range(120):  # ~4.3 KB per record with its input: ~60 segments written
            server.client.infer(NAME, {"image": golden[i % 64 : i % 64 + 1]}, request_id=f"r-{i}")
        wait_written(server, 120)
        segments = metric(server, "serving_prediction_log_segments_total")
    finally:
        assert server.stop() == 0
    files = sorted(log_dir.glob("predictions-*.jsonl"))
    total = sum(f.stat().st_size for f in files)
    assert segments > len(files) >= 2
    assert total <= 32768
    ids = [r.id for r in read_log(log_dir)]
    assert ids and ids == [f"r-{i}" for i in range(120 - len(ids), 120)]  # the newest, in order


def test_sigkill_leaves_no_torn_record_a_reader_accepts(
    server_binary, exported_int8, golden, tmp_path
):
    log_dir = tmp_path / "log"
    server = start(
        server_binary,
        exported_int8,
        tmp_path,
        f"--prediction-log-dir={log_dir}",
        "--log-input-rate=1",
    )
    sent: set[str] = set()
    answered: list[str] = []
    stop = threading.Event()

    def load(worker: int) -> None:
        for i in range(5000):
            if stop.is_set():
                return
            rid = f"w{worker}-{i}"
            sent.add(rid)
            try:
                server.client.infer(NAME, {"image": golden[:8]}, binary=True, request_id=rid)
            except Exception:
                return
            answered.append(rid)

    threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while len(answered) < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    stop.set()
    for t in threads:
        t.join(30)
    server.stop()
    assert len(answered) >= 300

    reader = LogReader(log_dir)
    records = list(reader)
    assert reader.torn <= 1  # at most the unterminated tail of the segment being written
    ids = [r.id for r in records]
    assert len(ids) == len(set(ids)) and set(ids) <= sent and len(ids) >= 100
    for r in records:  # every accepted record is whole: its 8 inputs decode
        assert r.inputs["image"].shape == (8, 1, 28, 28) and len(r.top1) == 8
        np.testing.assert_array_equal(r.inputs["image"], golden[:8])

    segment = sorted(log_dir.glob("predictions-*.jsonl"))[-1]
    lines = segment.read_bytes().splitlines(keepends=True)
    for cut in (1, len(lines[0]) // 2, len(lines[0]) - 2):  # a cut record never parses
        assert parse_line(lines[0][:cut]) is None
    if reader.torn == 0:  # the kill fell between two writes: leave the tail it could have left
        segment.write_bytes(b"".join(lines) + lines[-1][: len(lines[-1]) // 2])
    torn = LogReader(log_dir)
    assert len(list(torn)) == len(ids) and torn.torn == 1

    # a restarted server writes a new segment: the torn tail is never followed by a record
    server = start(server_binary, exported_int8, tmp_path, f"--prediction-log-dir={log_dir}")
    try:
        server.client.infer(NAME, {"image": golden[:1]}, request_id="after-restart")
        wait_written(server, 1)
    finally:
        assert server.stop() == 0
    after = LogReader(log_dir)
    ids_after = [r.id for r in after]
    assert after.torn == 1 and ids_after == [*ids, "after-restart"]


class _Sink(http.server.BaseHTTPRequestHandler):
    events: list[tuple[dict[str, str], dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.events.append(({k.lower(): v for k, v in self.headers.items()}, json.loads(body)))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_sink_gets_cloudevents_with_kserve_logger_headers(
    server_binary, exported_int8, golden, tmp_path
):
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{sink.server_address[1]}/events"
    server = start(
        server_binary,
        exported_int8,
        tmp_path,
        f"--prediction-log-dir={tmp_path / 'log'}",
        f"--prediction-log-sink={url}",
    )
    try:
        for i in range(5):
            server.client.infer(NAME, {"image": golden[i : i + 2]}, request_id=f"s-{i}")
        deadline = time.monotonic() + 20
        while metric(server, "serving_prediction_log_sink_sent_total") < 5:
            assert time.monotonic() < deadline, "the sink did not get 5 events"
            time.sleep(0.05)
    finally:
        assert server.stop() == 0
        sink.shutdown()
    assert [h["ce-id"] for h, _ in _Sink.events] == [f"s-{i}" for i in range(5)]
    for headers, body in _Sink.events:
        assert headers["ce-specversion"] == "1.0"
        assert headers["ce-type"] == "org.kubeflow.serving.inference.response"
        assert headers["ce-inferenceservicename"] == NAME
        assert headers["content-type"] == "application/json"
        assert body["model_name"] == NAME and len(body["top1"]) == 2


# --------------------------------------------------------------------------- two versions


def _post(port: int, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as res:
            return res.status, json.loads(res.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _infer(port: int, x: np.ndarray, rid: str, version: str = "") -> tuple[str, list[int]]:
    path = f"/v2/models/{NAME}" + (f"/versions/{version}" if version else "") + "/infer"
    status, body = _post(
        port,
        path,
        {
            "id": rid,
            "inputs": [
                {"name": "image", "datatype": "FP32", "shape": list(x.shape),
                 "data": x.reshape(-1).tolist()}
            ],
        },
    )  # fmt: skip
    assert status == 200, body
    logits = np.asarray(body["outputs"][0]["data"], np.float32).reshape(len(x), -1)
    return body["model_version"], logits.argmax(1).tolist()


@pytest.fixture(scope="module")
def challenger_bundle(tmp_path_factory, digits_task, digits_data) -> Path:
    """Another real model (random weights, exported and packaged): other answers."""
    root = tmp_path_factory.mktemp("challenger")
    return fp32_bundle(untrained_export(root, digits_task, digits_data, 7), root / "bundle")


def test_shadow_canary_promote_and_rollback_of_a_challenger(
    server_binary, exported_int8, challenger_bundle, golden, tmp_path
):
    """Two versions of one model under a traffic policy: every request answered by exactly
    one version, both versions' answers logged under its id."""
    log_dir = tmp_path / "log"
    server = start(server_binary, exported_int8, tmp_path, f"--prediction-log-dir={log_dir}",
                   "--model-control=true")  # fmt: skip
    port = server.port
    load = f"/v2/repository/models/{NAME}/load"
    try:
        challenger = {"model_dir": str(challenger_bundle), "version": "2", "role": "challenger"}
        status, body = _post(port, load, {"parameters": {**challenger, "policy": "mirror"}})
        assert status == 400 and "shadow or canary" in body["error"]
        status, _ = _post(port, load, {"parameters": {**challenger, "policy": "shadow",
                                                      "fraction": "1"}})  # fmt: skip
        assert status == 200
        # the challenger's own answers, asked for by version
        own = {i: _infer(port, golden[i : i + 2], f"own-{i}", "2")[1] for i in range(0, 40, 2)}
        champion = {i: _infer(port, golden[i : i + 2], f"ref-{i}", "1")[1] for i in range(0, 40, 2)}
        assert own != champion
        for i in range(0, 40, 2):  # shadow: clients only ever get the champion's answer
            assert _infer(port, golden[i : i + 2], f"shadow-{i}") == ("1", champion[i])

        status, _ = _post(port, load, {"parameters": {**challenger, "policy": "canary",
                                                      "fraction": "0.5"}})  # fmt: skip
        assert status == 200
        answered_by = [_infer(port, golden[:2], f"canary-{i}")[0] for i in range(200)]
        # Binomial(200, 0.5): outside [60, 140] has probability < 1e-8
        assert 60 <= answered_by.count("2") <= 140 and set(answered_by) == {"1", "2"}

        status, _ = _post(port, f"/v2/repository/models/{NAME}/unload",
                          {"parameters": {"role": "challenger"}})  # fmt: skip
        assert status == 200  # rolled back: the champion alone
        assert {_infer(port, golden[:2], f"back-{i}")[0] for i in range(20)} == {"1"}
        status, _ = _post(port, load, {"parameters": {**challenger, "policy": "canary",
                                                      "fraction": "0.1"}})  # fmt: skip
        status, _ = _post(port, f"/v2/repository/models/{NAME}/promote", {})
        assert status == 200
        assert {_infer(port, golden[:2], f"promoted-{i}")[0] for i in range(20)} == {"2"}
        status, body = _post(port, "/v2/repository/index", {"ready": True})
        assert [(m["version"], m["state"]) for m in body] == [("2", "READY")]
        wait_written(server, 20 + 20 + 2 * 20 + 200 + answered_by.count("2") + 20 + 20)
    finally:
        assert server.stop() == 0

    records = list(read_log(log_dir))
    by_id: dict[str, list] = {}
    for r in records:
        by_id.setdefault(r.id, []).append(r)
    for i in range(0, 40, 2):  # shadowed: the champion's answer and the challenger's, once each
        pair = sorted(by_id[f"shadow-{i}"], key=lambda r: r.version)
        assert [(r.version, r.role, r.answered) for r in pair] == [
            ("1", "champion", True),
            ("2", "challenger", False),
        ]
        assert pair[0].top1 == champion[i] and pair[1].top1 == own[i]
    for i, version in enumerate(answered_by):  # each answered exactly once, as the client saw
        rs = by_id[f"canary-{i}"]
        assert [r.version for r in rs if r.answered] == [version]
        # what the challenger answered, the champion also ran (paired for the judge)
        expected = (
            [("1", "champion", True)]
            if version == "1"
            else [("1", "champion", False), ("2", "challenger", True)]
        )
        assert sorted((r.version, r.role, r.answered) for r in rs) == expected
    assert all(len(by_id[f"back-{i}"]) == 1 for i in range(20))


# --------------------------------------------------------------------------- label feedback


@pytest.fixture(scope="module")
def answered_log(server_binary, exported, golden, tmp_path_factory) -> Path:
    """The real server's log of three answered requests: r-4 (4 items), r-1 (1), r-2 (2)."""
    tmp = tmp_path_factory.mktemp("labelled")
    bundle = fp32_bundle(exported, tmp / "bundle")
    log_dir = tmp / "log"
    server = start(server_binary, bundle, tmp, f"--prediction-log-dir={log_dir}")
    try:
        for rid, n in (("r-4", 4), ("r-1", 1), ("r-2", 2)):
            server.client.infer(NAME, {"image": golden[:n]}, request_id=rid)
        wait_written(server, 3)
    finally:
        assert server.stop() == 0
    assert sorted((r.id, r.batch) for r in read_log(log_dir)) == [
        ("r-1", 1), ("r-2", 2), ("r-4", 4)
    ]  # fmt: skip
    return log_dir


def labels_file(tmp_path: Path, *lines: dict) -> Path:
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def label_error(path: Path, log_dir: Path, num_classes: int | None = 10) -> list[str]:
    """The lines of the one error a bad label file raises."""
    from components.core.artifacts import StepError
    from components.ml.data.prediction_log import read_labels

    with pytest.raises(StepError) as caught:
        read_labels(path, log_dir, {"r-4", "r-1", "r-2"}, num_classes)
    return str(caught.value).split("\nerror: ")


def test_labels_of_logged_requests_are_read_and_a_resend_is_accepted(answered_log, tmp_path):
    from components.ml.data.prediction_log import read_labels

    path = labels_file(
        tmp_path,
        {"id": "r-4", "labels": [1, 2, 3, 4]},
        {"id": "r-1", "label": 7},
        {"id": "r-1", "labels": [7]},  # the same answer again: a resend, not a conflict
        {"id": "r-2", "labels": [0, 9]},
    )
    got = read_labels(path, answered_log, {"r-4", "r-2"}, 10)
    assert dict(got) == {"r-4": [1, 2, 3, 4], "r-2": [0, 9]}
    assert got.lines == 4 and got.unknown == []


def test_unknown_label_ids_are_counted_and_named_in_a_warning(answered_log, tmp_path, caplog):
    """Ids no logged request has are never counted as labelled, and never silently."""
    from components.ml.data.prediction_log import read_labels

    path = labels_file(
        tmp_path,
        {"id": "r-1", "label": 3},
        {"id": "ghost-a", "label": 3},
        {"id": "ghost-b", "labels": [1, 2]},
    )
    with caplog.at_level("WARNING", logger="components.ml.data.prediction_log"):
        got = read_labels(path, answered_log, {"r-4", "r-1", "r-2"}, 10)
    assert dict(got) == {"r-1": [3]} and got.unknown == ["ghost-a", "ghost-b"]
    assert got.summary() == {
        "lines": 3, "unknown_ids": 2, "unknown_named": ["ghost-a", "ghost-b"]
    }  # fmt: skip
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert f"{path}: 2 of 3 labelled request id(s) match no request in the log" in warnings[0]
    assert "'ghost-a', 'ghost-b'" in warnings[0]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (
            {"id": "r-4", "labels": [1, 12, 3, 4]},
            "label 12 of request 'r-4' is out of range: a label is a class index 0..9",
        ),
        (
            {"id": "r-1", "label": -1},
            "label -1 of request 'r-1' is out of range: a label is a class index 0..9",
        ),
        (
            {"id": "r-4", "labels": [5]},
            "1 label(s) for request 'r-4', which the log holds with 4 item(s): one label per "
            "item, in the request's order",
        ),
        (
            {"id": "r-1", "labels": [1, 2]},
            "2 label(s) for request 'r-1', which the log holds with 1 item(s)",
        ),
        (
            {"id": "r-2", "labels": [1, "two"]},
            "a label line must be JSON with a string 'id' and an integer 'label'",
        ),
    ],
    ids=["class-12", "class-minus-1", "one-label-for-four-items", "two-for-one", "not-int"],
)
def test_each_label_fault_is_one_error_line_naming_file_line_and_rule(
    answered_log, tmp_path, line, error
):
    path = labels_file(tmp_path, {"id": "r-2", "labels": [0, 1]}, line)
    (message,) = label_error(path, answered_log)
    assert message.startswith(f"{path}:2: ") and error in message, message
    assert "\n" not in message


def test_conflicting_duplicate_labels_are_an_error_naming_both_lines(answered_log, tmp_path):
    path = labels_file(
        tmp_path,
        {"id": "r-1", "label": 3},
        {"id": "r-2", "labels": [0, 1]},
        {"id": "r-1", "label": 5},
    )
    (message,) = label_error(path, answered_log)
    assert message == (
        f"{path}:3: request 'r-1' labelled [5] here but [3] at line 1: one answer per request "
        "id (a resend must repeat the same labels)"
    )


def test_every_fault_of_a_label_file_is_listed_once_in_file_order(answered_log, tmp_path):
    """All faults at once, one line each (a user fixes the file in one go); the range is not
    checked where the classes are unknown."""
    path = labels_file(
        tmp_path,
        {"id": "r-1", "label": 3},
        {"id": "r-4", "labels": [1, 2]},
        {"id": "r-2", "labels": [0, 10]},
        {"id": "r-1", "label": 4},
    )
    lines = label_error(path, answered_log)
    assert [m.split(": ", 1)[0] for m in lines] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert "out of range" in lines[1] and "labelled [4] here but [3]" in lines[2]
    lines = label_error(path, answered_log, num_classes=None)
    assert [m.split(": ", 1)[0] for m in lines] == [f"{path}:2", f"{path}:4"]
