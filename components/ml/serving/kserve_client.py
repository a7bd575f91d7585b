"""A small Open Inference Protocol (KServe v2) REST client, JSON and binary tensors.

Used by infra validation, deploy, ``traffic`` and the package step's tuning; users and tests
can equally use ``tritonclient.http`` (the tests and the serving bench use it as the
independent client the server and this one are checked against).

Why not ``tritonclient.http`` here (checked against tritonclient 2.73):

- **JSON answers.** A request that names no outputs gets ``"binary_data_output": true`` added
  (``tritonclient/http/_utils.py``: ``_get_inference_request``), and that parameter is
  reserved (setting it raises). Our JSON requests ask for every output as JSON without naming
  them: the example request ``traffic`` writes for curl users, the requests it sends, and the
  JSON path infra validation compares with the binary one. tritonclient would need a
  metadata call first, and the example file would change.
- **Loading a version.** ``load_model`` sends only ``config`` and ``file:`` parameters; the
  server's repository load takes ``model_dir``, ``version``, ``variant``, ``role``,
  ``policy`` and ``fraction`` (deploy's swap and its challengers).
- **The image.** ``tritonclient[http]`` would add gevent, geventhttpclient, greenlet,
  zope.event/interface, brotli, python-rapidjson and ml-dtypes (about 50 MB) to the
  component image, for the binary request path alone.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np

_DTYPES = {
    "FP32": np.float32,
    "FP64": np.float64,
    "INT64": np.int64,
    "INT32": np.int32,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "FP16": np.float16,
    "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def encode_request(
    inputs: dict[str, np.ndarray], *, binary: bool = False, request_id: str | None = None
) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 infer request: (body, headers). ``binary`` puts the raw tensor bytes after
    the JSON header (and asks for binary outputs); string arrays are sent as BYTES (UTF-8)."""
    specs, blobs = [], []
    for name, arr in inputs.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype.kind in "OUS":  # texts: BYTES, UTF-8, 4-byte length prefixes
            items = [
                t if isinstance(t, bytes) else str(t).encode("utf-8")
                for t in arr.reshape(-1).tolist()
            ]
            spec = {"name": name, "shape": list(arr.shape), "datatype": "BYTES"}
            if binary:
                raw = b"".join(len(b).to_bytes(4, "little") + b for b in items)
                spec["parameters"] = {"binary_data_size": len(raw)}
                blobs.append(raw)
            else:
                spec["data"] = [b.decode("utf-8", "replace") for b in items]
            specs.append(spec)
            continue
        spec: dict[str, Any] = {
            "name": name,
            "shape": list(arr.shape),
            "datatype": _NAMES[arr.dtype],
        }
        if binary:
            raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
            spec["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            spec["data"] = arr.reshape(-1).tolist()
        specs.append(spec)
    request: dict[str, Any] = {"inputs": specs}
    if request_id is not None:
        request["id"] = request_id
    if binary:
        request["parameters"] = {"binary_data_output": True}
    header = json.dumps(request).encode()
    headers = {"Content-Type": "application/json"}
    if binary:
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        }
    return header + b"".join(blobs), headers


class KServeError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KServeClient:
    def __init__(self, base_url: str, timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(
            self.base_url + path, data=body, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            try:
                message = json.loads(payload).get("error", payload.decode())
            except (ValueError, AttributeError):
                message = payload.decode(errors="replace")
            raise KServeError(exc.code, message) from None

    def metadata(self, model: str) -> dict[str, Any]:
        """``GET /v2/models/{model}``: name, versions, platform, inputs, outputs."""
        return json.loads(self._request("GET", f"/v2/models/{model}")[2])

    def model_config(self, model: str) -> dict[str, Any]:
        """The settings the served version runs with (``GET /v2/models/<model>/config``:
        ``settings`` and the ``model_config_file`` it read)."""
        return json.loads(self._request("GET", f"/v2/models/{model}/config")[2])

    def ready(self) -> bool:
        return self._status("/v2/health/ready") == 200

    def load_model(self, model: str, parameters: dict[str, str]) -> None:
        """``POST /v2/repository/models/{model}/load`` (Triton's model repository extension):
        returns once the server swapped the new version in; KServeError if it refused."""
        body = json.dumps({"parameters": parameters}).encode()
        headers = {"Content-Type": "application/json"}
        self._request("POST", f"/v2/repository/models/{model}/load", body, headers)

    def _status(self, path: str) -> int:
        try:
            return self._request("GET", path)[0]
        except KServeError as exc:
            return exc.status
        except OSError:
            return 0

    def infer(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        binary: bool = False,
        request_id: str | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one request; ``binary`` sends and receives raw tensor bytes. String arrays
        (dtype object, str or bytes) are sent as BYTES (UTF-8). ``request_id`` is the
        request's ``id``: the server's prediction log files the answer under it (labels fed
        back later join on it)."""
        payload, headers = encode_request(inputs, binary=binary, request_id=request_id)
        _, resp_headers, body = self._request("POST", f"/v2/models/{model}/infer", payload, headers)
        length = {k.lower(): v for k, v in resp_headers.items()}.get(
            "inference-header-content-length"
        )
        json_len = int(length) if length is not None else len(body)
        response = json.loads(body[:json_len])
        out, offset = {}, json_len
        for o in response["outputs"]:
            dtype = np.dtype(_DTYPES[o["datatype"]]).newbyteorder("<")
            size = (o.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                arr = np.frombuffer(body[offset : offset + size], dtype=dtype)
                offset += size
            else:
                arr = np.asarray(o["data"], dtype=dtype)
            out[o["name"]] = arr.reshape(o["shape"]).astype(dtype.newbyteorder("="))
        return out
