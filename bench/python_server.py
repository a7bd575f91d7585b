"""The Python serving baseline: FastAPI + uvicorn around the same OpenVINO runtime.

Implements the KServe v2 (Open Inference Protocol) REST subset that the C++ server
(``serving/``) speaks, so the same load generator and clients drive both:

- ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2/models/{name}[/ready]``
- ``POST /v2/models/{name}/infer`` with JSON tensors (``data``) or the binary tensor
  extension: ``Inference-Header-Content-Length`` gives the JSON header's length, each input's
  ``parameters.binary_data_size`` its raw little-endian bytes after it; outputs come back as
  raw bytes when the request asks for them (``parameters.binary_data_output`` or an output's
  ``parameters.binary_data``).

Runtime: ``components.ml.serving.ov_runtime.OVPredictor`` on the file the C++ server loads for the
variant (``formats.legacy.program`` for fp32, ``formats.int8_openvino.program`` for int8),
f32 precision hint, CPU pinning off like the C++ server's default (``--cpu-pinning``).
``--workers W --threads T`` mirrors the C++ server's ``--workers --threads-per-worker``: W
compiled models of T OpenVINO threads each, one per thread of an inference thread pool. The
endpoint is async; parsing happens on the event loop (binary inputs are zero-copy views of
the request body), inference and output serialisation run in the pool (OpenVINO releases the
GIL while it computes). One uvicorn process, uvloop and httptools when installed, access log
off. No dynamic batching: one inference per request.

    .venv/bin/python bench/python_server.py --model-dir outputs/export --port 8001 --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import queue
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.ml.serving.ov_runtime import OVPredictor, read_model  # noqa: E402

try:
    import orjson

    _loads, _dumps = orjson.loads, orjson.dumps
except ImportError:  # pragma: no cover - orjson is in the venv; stdlib json otherwise
    _loads = json.loads

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402

log = logging.getLogger("python_server")

# KServe v2 datatype <-> numpy (little-endian on the wire)
DTYPES = {
    "FP32": "<f4",
    "FP64": "<f8",
    "FP16": "<f2",
    "INT64": "<i8",
    "INT32": "<i4",
    "INT16": "<i2",
    "INT8": "i1",
    "UINT8": "u1",
    "BOOL": "?",
}
# signature.json dtypes (numpy names) -> KServe v2 datatypes
SIG_DTYPES = {
    "float32": "FP32",
    "float64": "FP64",
    "float16": "FP16",
    "int64": "INT64",
    "int32": "INT32",
    "int16": "INT16",
    "int8": "INT8",
    "uint8": "UINT8",
    "bool": "BOOL",
}
VARIANT_FORMATS = {"fp32": "legacy", "int8": "int8_openvino"}


class BadRequest(Exception):
    pass


class ServedModel:
    """The signature, a pool of predictors and the thread pool that runs them."""

    def __init__(
        self,
        model_dir: Path,
        variant: str,
        name: str,
        workers: int,
        threads: int,
        cpu_pinning: bool = False,
    ):
        signature = json.loads((model_dir / "signature.json").read_text())
        fmt = signature["formats"][VARIANT_FORMATS[variant]]
        self.path = model_dir / fmt["program"]
        self.name = name
        self.inputs = [
            {
                "name": s["name"],
                "datatype": SIG_DTYPES.get(s["dtype"], s["dtype"]),
                "shape": list(s["shape"]),
            }
            for s in signature["inputs"]
        ]
        self.outputs = [
            {
                "name": s["name"],
                "datatype": SIG_DTYPES.get(s["dtype"], s["dtype"]),
                "shape": list(s["shape"]),
            }
            for s in signature["outputs"]
        ]
        self._out_dtypes = [np.dtype(DTYPES[o["datatype"]]) for o in self.outputs]
        ov_model = read_model(self.path)  # read once, compiled once per worker
        self._pool: queue.SimpleQueue[OVPredictor] = queue.SimpleQueue()
        for _ in range(workers):
            self._pool.put(OVPredictor(ov_model, threads=threads, cpu_pinning=cpu_pinning))
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="infer")
        self.metadata = _dumps(
            {
                "name": name,
                "versions": ["1"],
                "platform": "openvino",
                "inputs": self.inputs,
                "outputs": self.outputs,
            }
        )

    # -- request decoding (event loop) ----------------------------------------------------

    def decode(self, body: bytes, header_len: int | None) -> tuple[dict, list[np.ndarray]]:
        if header_len is None:
            header_len = len(body)
        if not 0 < header_len <= len(body):
            raise BadRequest(f"Inference-Header-Content-Length {header_len} out of range")
        try:
            request = _loads(memoryview(body)[:header_len])
        except ValueError as exc:
            raise BadRequest(f"malformed JSON header: {exc}") from None
        if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
            raise BadRequest("the request has no 'inputs' list")
        by_name = {}
        offset = header_len
        for spec in request["inputs"]:
            name, shape, datatype = spec.get("name"), spec.get("shape"), spec.get("datatype")
            if datatype not in DTYPES or not isinstance(shape, list):
                raise BadRequest(f"input {name!r}: bad datatype {datatype!r} or shape")
            dtype = np.dtype(DTYPES[datatype])
            count = math.prod(shape)
            size = (spec.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                if size != count * dtype.itemsize or offset + size > len(body):
                    raise BadRequest(
                        f"input {name!r}: binary_data_size {size} does not fit shape "
                        f"{shape} {datatype} or the body"
                    )
                arr = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
                offset += size
            else:
                if "data" not in spec:
                    raise BadRequest(f"input {name!r}: neither data nor binary_data_size")
                arr = np.asarray(spec["data"], dtype=dtype)
                if arr.size != count:
                    raise BadRequest(f"input {name!r}: {arr.size} values for shape {shape}")
            by_name[name] = arr.reshape(shape)
        if offset != len(body):
            raise BadRequest(f"{len(body) - offset} unexpected bytes after the tensors")
        arrays = []
        for sig in self.inputs:
            arr = by_name.get(sig["name"])
            if arr is None:
                raise BadRequest(f"missing input {sig['name']!r}")
            want = sig["shape"]
            if arr.ndim != len(want) or any(
                w != -1 and w != g for w, g in zip(want, arr.shape, strict=True)
            ):
                raise BadRequest(f"input {sig['name']!r}: shape {list(arr.shape)}, want {want}")
            if np.dtype(DTYPES[sig["datatype"]]) != arr.dtype:
                raise BadRequest(f"input {sig['name']!r}: datatype, want {sig['datatype']}")
            arrays.append(arr)
        return request, arrays

    # -- inference + output serialisation (thread pool) ------------------------------------

    def infer(self, arrays: list[np.ndarray], binary: list[bool]) -> list[tuple[list, Any]]:
        predictor = self._pool.get_nowait()  # as many predictors as pool threads
        try:
            outs = predictor.run(arrays)
            # The outputs view the infer request's buffers: serialise before handing it back.
            return [
                (list(o.shape), o.astype(dt, copy=False).tobytes() if b else o.tolist())
                for o, b, dt in zip(outs, binary, self._out_dtypes, strict=True)
            ]
        finally:
            self._pool.put(predictor)


def _error(status: int, message: str) -> Response:
    return Response(_dumps({"error": message}), status, media_type="application/json")


def create_app(model: ServedModel) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
        yield
        model.executor.shutdown(wait=True)

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    ok = Response(status_code=200)

    @app.get("/v2/health/live")
    @app.get("/v2/health/ready")
    async def health() -> Response:
        return ok

    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str) -> Response:
        return ok if name == model.name else _error(404, f"unknown model {name!r}")

    @app.get("/v2/models/{name}")
    async def metadata(name: str) -> Response:
        if name != model.name:
            return _error(404, f"unknown model {name!r}")
        return Response(model.metadata, media_type="application/json")

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request) -> Response:
        if name != model.name:
            return _error(404, f"unknown model {name!r}")
        body = await request.body()
        length = request.headers.get("inference-header-content-length")
        try:
            req, arrays = model.decode(body, int(length) if length is not None else None)
            wanted = req.get("outputs")
            default_binary = bool((req.get("parameters") or {}).get("binary_data_output"))
            if wanted:
                known = {o["name"] for o in model.outputs}
                unknown = [o.get("name") for o in wanted if o.get("name") not in known]
                if unknown:
                    raise BadRequest(f"unknown outputs {unknown}")
                flags = {
                    o["name"]: bool((o.get("parameters") or {}).get("binary_data", default_binary))
                    for o in wanted
                }
            else:
                flags = {o["name"]: default_binary for o in model.outputs}
        except (BadRequest, ValueError, TypeError, KeyError) as exc:
            return _error(400, str(exc))
        binary = [flags.get(o["name"], False) for o in model.outputs]
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(model.executor, model.infer, arrays, binary)
        except RuntimeError as exc:  # OpenVINO rejected the input
            return _error(400, str(exc).splitlines()[0])

        outputs, blobs = [], []
        for sig, (shape, payload) in zip(model.outputs, results, strict=True):
            if sig["name"] not in flags:
                continue
            out = {"name": sig["name"], "datatype": sig["datatype"], "shape": shape}
            if isinstance(payload, bytes):
                out["parameters"] = {"binary_data_size": len(payload)}
                blobs.append(payload)
            else:
                out["data"] = payload
            outputs.append(out)
        response: dict[str, Any] = {"model_name": model.name, "outputs": outputs}
        if "id" in req:
            response["id"] = req["id"]
        header = _dumps(response)
        if not blobs:
            return Response(header, media_type="application/json")
        return Response(
            b"".join([header, *blobs]),
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(len(header))},
        )

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--variant", choices=sorted(VARIANT_FORMATS), default="fp32")
    parser.add_argument("--model-name", help="served name (default: signature task)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--threads", type=int, default=1, help="OpenVINO threads per worker")
    parser.add_argument("--workers", type=int, default=1, help="predictors (inference threads)")
    parser.add_argument(
        "--cpu-pinning",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="OpenVINO ENABLE_CPU_PINNING (off, like the C++ server's default)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    import uvicorn

    name = args.model_name or json.loads((args.model_dir / "signature.json").read_text()).get(
        "task", "model"
    )
    model = ServedModel(
        args.model_dir, args.variant, name, args.workers, args.threads, args.cpu_pinning
    )
    log.info(
        "serving %s (%s) as %r on %s:%d: %d worker(s) x %d thread(s)",
        model.path,
        args.variant,
        name,
        args.host,
        args.port,
        args.workers,
        args.threads,
    )
    uvicorn.run(
        create_app(model),
        host=args.host,
        port=args.port,
        loop="auto",  # uvloop when installed
        http="auto",  # httptools when installed
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
