"""The C++ server as a process: build its binary, start it on a free loopback port with a
bundle, stop it with SIGTERM. Used by infra validation (``serving_image``), the serving-config
search (``package``'s tuning), the benchmarks and the tests: all of them run the real binary
exactly as the image and the k8s pods do.

Library layer: imported by steps, imports no step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from components.core.artifacts import StepError
from components.core.ports import free_port
from components.core.retry import SYSTEM_CLOCK, Clock, every, poll
from components.ml.serving.kserve_client import KServeClient

REPO = Path(__file__).resolve().parents[3]  # components/ml/serving/server.py -> the checkout
SERVER_NAME = "paddle-mlops-server"
# how often a starting server is asked whether it is ready (serving_image.startup_poll_s)
READY_POLL_S = 0.1


# Read by the binary besides SERVING_* (KServe's names); never inherited by a validation run.
_LEGACY_SERVER_ENV = ("PORT", "MODEL_DIR", "MODEL_NAME")

# --------------------------------------------------------------------------- server binary


def build_server(source: Path, build_dir: Path) -> Path:
    """Configure and build the C++ server (incremental: reuses an up-to-date build)."""
    import openvino

    ov_cmake = Path(openvino.__file__).parent / "cmake"
    for cmd in (
        [
            "cmake",
            "-S",
            str(source),
            "-B",
            str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DOpenVINO_DIR={ov_cmake}",
            f"-DPython3_EXECUTABLE={sys.executable}",  # builds the C++ tests' model fixture
        ],
        ["cmake", "--build", str(build_dir), "-j2", "--target", SERVER_NAME],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise StepError(f"building the server failed ({' '.join(cmd[:2])}):\n{tail}")
    binary = build_dir / SERVER_NAME
    if not binary.exists():
        raise StepError(f"{binary}: the build produced no server binary")
    return binary


class ServerProcess:
    """A KServe-v2 server process on a free loopback port, stopped with SIGTERM."""

    def __init__(
        self,
        argv: Callable[[int], list[str]],
        name: str,
        log_file: Path,
        env: Mapping[str, str] | None = None,  # None: this process's environment
    ):
        self.port = free_port()
        self.name = name
        self.log_file = log_file  # the server's stdout and stderr
        self._log = open(log_file, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv(self.port),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
        )
        self.client = KServeClient(f"http://127.0.0.1:{self.port}")

    free_port = staticmethod(free_port)

    def wait_ready(
        self, timeout_s: float, clock: Clock = SYSTEM_CLOCK, *, poll_s: float = READY_POLL_S
    ) -> None:
        """Until the server answers ready (asked every ``poll_s``), at most ``timeout_s``;
        a server that exits first fails at once."""

        def _ready() -> bool:
            if self.proc.poll() is not None:
                raise StepError(
                    f"the server exited with code {self.proc.returncode} "
                    f"before it was ready (log: {self._log.name})"
                )
            return self.client.ready()

        if not poll(_ready, every(poll_s, timeout_s), clock=clock):
            raise StepError(
                f"the server was not ready within {timeout_s:.0f} s (log: {self._log.name})"
            )

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait; the exit code, or None when it had to be killed."""
        code = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        else:
            code = self.proc.returncode
        self._log.close()
        return code


def server_process_env() -> dict[str, str]:
    """This process's environment without anything the server would read as configuration
    (``SERVING_*``, ``PORT``, ``MODEL_DIR``, ``MODEL_NAME``): the bundle's model config and
    the command line are all it reads."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SERVING_") and k not in _LEGACY_SERVER_ENV
    }


class RunningServer(ServerProcess):
    """The real C++ server binary serving one variant of a bundle with the bundle's own
    ``model_config.json``, exactly as the image and the k8s pods do; a settings flag in
    ``extra_args`` (an operator's choice: a benchmark's grid cell) wins over the file."""

    def __init__(
        self,
        binary: Path,
        model_dir: Path,
        variant: str,
        name: str,
        log_file: Path,
        extra_args: Sequence[str] = (),
    ):
        self.grpc_port = free_port()  # KServe v2 gRPC, next to the REST port
        super().__init__(
            lambda port: [
                str(binary),
                f"--model-dir={model_dir}",
                f"--variant={variant}",
                f"--model-name={name}",
                "--host=127.0.0.1",
                f"--port={port}",
                f"--grpc-port={self.grpc_port}",
                *extra_args,
            ],
            name,
            log_file,
            env=server_process_env(),
        )


def server_binary(serving_src: Path, build_dir: Path) -> Path:
    """The server binary every step runs (infra validation, the serving-config search):
    ``$PADDLE_MLOPS_SERVER_BINARY`` (the component image's prebuilt one), else built from
    ``serving_src`` into ``build_dir`` (a dev checkout, incremental)."""
    configured = os.environ.get("PADDLE_MLOPS_SERVER_BINARY")
    binary = Path(configured) if configured else build_server(serving_src, build_dir)
    if not binary.exists():
        raise StepError(f"PADDLE_MLOPS_SERVER_BINARY: {binary} does not exist")
    return binary


def default_build_dir() -> Path:
    """Where a dev checkout builds the server: ``$SERVING_BUILD_DIR`` or ``build/serving``."""
    return Path(os.environ.get("SERVING_BUILD_DIR") or REPO / "build" / "serving")
