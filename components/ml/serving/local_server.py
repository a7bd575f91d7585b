"""The C++ server as a detached service on this machine (``deploy.target: local``).

``deploy`` starts the built binary (``components.ml.serving.server``) in its own session, with no
file descriptor of its caller (``dvc repro`` returns while it serves), bound to 127.0.0.1. What
runs is recorded in ``STATE_DIR/server.json`` (the pid file: pid, port, model, version, argv,
the binary's sha256), its output goes to ``STATE_DIR/server.log``. ``paddle-mlops deploy stop``
(``make stop``) ends it with SIGTERM. A pid file whose process is gone, or is another program
(a reused pid), is stale: it is removed and said so.

Library layer: imported by steps, imports no step.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, write_json
from components.core.deploy_target import (
    Release,
    Rollout,
    local_state_dir,
    prediction_log_dir,
    server_args,
)
from components.core.retry import SYSTEM_CLOCK, Clock, every, poll
from components.ml.serving import model_control
from components.ml.serving.kserve_client import KServeClient
from components.ml.serving.server import REPO, default_build_dir, server_binary, server_process_env

log = logging.getLogger(__name__)

STATE_FILE = "server.json"
LOG_FILE = "server.log"
# how often start asks the new server whether it is ready (deploy.local_ready_poll_s)
READY_POLL_S = 0.2
STOP_POLL_S = 0.1  # how often stop looks whether the server is gone (deploy.local_stop_poll_s)


@dataclass(frozen=True)
class LocalServer:
    """One server process this machine runs for a pipeline."""

    pid: int
    port: int
    model: str
    version: int
    model_dir: str
    binary: str
    binary_sha256: str
    argv: list[str]
    model_control: bool

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _alive(pid: int, binary: str) -> bool:
    """``pid`` runs ``binary`` (not a zombie, not another program that got the pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
    except (OSError, UnicodeDecodeError):
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X") and exe == binary


def read_state(state_dir: Path) -> LocalServer | None:
    """The server the pid file names, if it still runs; a stale pid file is removed."""
    path = state_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        server = LocalServer(**json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as exc:
        log.warning("%s: not a server record (%s): removed", path, exc)
        path.unlink(missing_ok=True)
        return None
    if not _alive(server.pid, server.binary):
        log.warning(
            "%s: stale pid file (pid %d, %s v%d, is gone): removed",
            path, server.pid, server.model, server.version,
        )  # fmt: skip
        path.unlink(missing_ok=True)
        return None
    return server


def record_version(state_dir: Path, server: LocalServer, version: int, model_dir: str) -> None:
    """The running server now serves ``version`` (swapped in with the repository's load)."""
    updated = {**asdict(server), "version": version, "model_dir": model_dir}
    write_json(state_dir / STATE_FILE, updated)


def args_of(server: LocalServer) -> list[str]:
    """The flags ``server`` was started with, as :func:`start` takes them."""
    return server.argv[1:-2]  # without the binary, and the --host and --port start adds


def _port_taken(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start(
    binary: Path,
    args: list[str],
    *,
    state_dir: Path,
    port: int,
    model: str,
    version: int,
    model_dir: str,
    model_control: bool,
    timeout_s: float,
    clock: Clock = SYSTEM_CLOCK,
    poll_s: float = READY_POLL_S,
) -> LocalServer:
    """Start ``binary args`` detached on 127.0.0.1:``port`` and wait until it is ready (asked
    every ``poll_s``, at most ``timeout_s``)."""
    grpc_ports = [int(a.split("=", 1)[1]) for a in args if a.startswith("--grpc-port=")]
    for taken, key in [(port, "local_port"), *((p, "local_grpc_port") for p in grpc_ports)]:
        if taken != -1 and _port_taken(taken):
            raise StepError(
                f"127.0.0.1:{taken} is taken by a process this deploy did not start (no live "
                f"{state_dir / STATE_FILE}); stop it, or set deploy.{key} to a free port"
            )
    state_dir.mkdir(parents=True, exist_ok=True)
    argv = [str(binary), *args, "--host=127.0.0.1", f"--port={port}"]
    log_path = state_dir / LOG_FILE
    with log_path.open("ab") as out, open(os.devnull, "rb") as null:
        proc = subprocess.Popen(
            argv,
            stdin=null,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=server_process_env(),
            start_new_session=True,  # no signal of the caller's terminal or of dvc reaches it
            close_fds=True,
        )
    server = LocalServer(
        proc.pid, port, model, version, model_dir, str(binary),
        sha256_file(binary), argv, model_control,
    )  # fmt: skip
    write_json(state_dir / STATE_FILE, asdict(server))
    client = KServeClient(server.url, timeout=5)

    def _state() -> str | None:
        if proc.poll() is not None:
            return "exited"
        return "ready" if client.ready() else None

    if poll(_state, every(poll_s, timeout_s), clock=clock) == "ready":
        log.info("%s v%d: serving at %s (pid %d)", model, version, server.url, proc.pid)
        return server
    code = proc.poll()
    if code is None:
        proc.kill()
        proc.wait()
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
    what = f"exited with code {code}" if code is not None else f"not ready in {timeout_s:.0f} s"
    raise StepError(f"the server for {model} v{version} {what} (log {log_path}):\n{tail}")


def stop(
    state_dir: Path,
    timeout_s: float = 30.0,
    clock: Clock = SYSTEM_CLOCK,
    *,
    poll_s: float = STOP_POLL_S,
) -> LocalServer | None:
    """SIGTERM the server the pid file names and wait until it is gone (asked every
    ``poll_s``; SIGKILL after ``timeout_s``, then at most ``timeout_s`` more); the pid
    file is removed. None when nothing ran."""
    server = read_state(state_dir)
    if server is None:
        return None

    def _gone() -> bool:
        if not _alive(server.pid, server.binary):
            return True
        _reap(server.pid)
        return False

    backoff = every(poll_s, timeout_s)
    os.kill(server.pid, signal.SIGTERM)
    if not poll(_gone, backoff, clock=clock):
        log.warning("pid %d did not stop within %.0f s: killed", server.pid, timeout_s)
        os.kill(server.pid, signal.SIGKILL)
        if not poll(_gone, backoff, clock=clock):
            raise StepError(
                f"pid {server.pid} ({server.binary}) still runs {timeout_s:.0f} s after its "
                f"SIGKILL; its pid file {state_dir / STATE_FILE} stays"
            )
    _reap(server.pid)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    log.info("stopped %s v%d (pid %d, %s)", server.model, server.version, server.pid, server.url)
    return server


def _reap(pid: int) -> None:
    """Collect ``pid`` when this process started it (else it is init's to collect)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


# --------------------------------------------------------------------------- the target


def _settings(args: list[str]) -> list[str]:
    """A server's flags without the version it serves: equal ones can swap a version in."""
    return [a for a in args if not a.startswith(("--model-dir=", "--model-version="))]


def _load_challenger(rel: Release, rollout: Rollout, url: str) -> dict[str, Any]:
    """Load ``rel`` beside the version the local server serves, under the policy."""
    params = rollout.params
    server = read_state(Path(params.local_state_dir).resolve())
    if server is None or server.model != rel.model or not server.model_control:
        raise StepError(
            f"deploy.challenger {params.challenger}: no local server of {rel.model} with "
            f"model control ({Path(params.local_state_dir) / STATE_FILE}); "
            "deploy the champion first (deploy.challenger: none)"
        )
    return model_control.load_challenger(rel, params, url, str(rollout.model_dir), "")


def _restart(
    binary: Path, args: list[str], rollout: Rollout, running: LocalServer | None
) -> LocalServer:
    """Stop ``running`` (if any) and start ``binary args`` serving the rollout's version; if
    that never becomes ready, the previous server is started again."""
    rel, params = rollout.rel, rollout.params
    state_dir = local_state_dir(params)
    if params.prediction_log:
        prediction_log_dir(params).mkdir(parents=True, exist_ok=True)
    timeout_s = params.rollout_timeout_s
    previous = stop(state_dir, timeout_s, poll_s=params.local_stop_poll_s) if running else None
    options = dict(
        state_dir=state_dir, port=params.local_port, model=rel.model, timeout_s=timeout_s,
        poll_s=params.local_ready_poll_s,
    )  # fmt: skip
    try:
        return start(
            binary, args, **options, version=rel.version, model_dir=str(rollout.model_dir),
            model_control=params.swap == "load",
        )  # fmt: skip
    except StepError:
        if previous is not None:
            start(
                Path(previous.binary), args_of(previous), **options,
                version=previous.version, model_dir=previous.model_dir,
                model_control=previous.model_control,
            )  # fmt: skip
            log.error("v%d never became ready: v%d serves again", rel.version, previous.version)
        raise


def deploy(rollout: Rollout) -> dict[str, Any]:
    """The ``local`` target (``components.core.deploy_target``): serve the rollout's verified
    bundle with the built server binary, a detached process on ``127.0.0.1:local_port``:
    swapped into the running one with the repository's load when that runs the same binary
    (``swap: load``), else (re)started; a new server that never becomes ready gives way to the
    previous one."""
    rel, params, model_dir = rollout.rel, rollout.params, rollout.model_dir
    binary = server_binary(REPO / "serving", default_build_dir()).resolve()
    state_dir = local_state_dir(params)
    url = f"http://127.0.0.1:{params.local_port}"
    local: dict[str, Any] = {
        "url": url,
        "model_dir": str(model_dir),
        "pid_file": str(state_dir / STATE_FILE),
        "log_file": str(state_dir / LOG_FILE),
        "binary": str(binary),
    }
    log_dir = prediction_log_dir(params)
    if params.prediction_log:
        local["prediction_log"] = str(log_dir)
    if params.challenger != "none":
        return {"local": {**local, **_load_challenger(rel, rollout, url)}}
    control = params.swap == "load"
    args = server_args(rel, params, model_dir=str(model_dir), log_dir=str(log_dir))
    args.append(f"--model-control={str(control).lower()}")
    # the server's own default gRPC port (8081) would collide between two tasks served here
    args.append(f"--grpc-port={params.local_grpc_port}")
    running = read_state(state_dir)
    if (
        running is not None
        and control
        and running.model_control
        and running.model == rel.model
        and running.port == params.local_port
        and running.binary_sha256 == sha256_file(binary)
        and _settings(args_of(running)) == _settings(args)
    ):
        if model_control.load_version(rel, params, url, str(model_dir)):
            record_version(state_dir, running, rel.version, str(model_dir))
            return {"local": {**local, "method": "load", "pid": running.pid}}
    server = _restart(binary, args, rollout, running)
    return {"local": {**local, "method": "restart", "pid": server.pid}}
