"""The whole training DAG with every step in the component image (``make kfp-containers``).

``kfp.local.DockerRunner`` drives podman through its Docker-compatible socket: each step runs
in the component image that ``make images`` built (``build/images.json``), as uid 10001, with
a read-only root filesystem (only ``/tmp``, a tmpfs, and the mounted pipeline root are
writable) and host networking, against a real ``mlflow server`` on 127.0.0.1. The image
reference and id that ran the steps are recorded on the MLflow run and the registered version
(``component_image``).

    python -m pipelines.containers --params params.yaml --pipeline-root outputs/kfp-containers
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from components.core import children
from components.core.ports import free_port
from components.core.retry import SYSTEM_CLOCK, Backoff, Clock, poll

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "containers" / "containers.conf"
log = logging.getLogger("kfp-containers")
WAIT_POLL_S = 0.3  # how often wait_for asks


def wait_for(
    check: Callable[[], Any], what: str, timeout_s: float = 60.0, clock: Clock = SYSTEM_CLOCK
) -> None:
    """Until ``check()`` answers true (every :data:`WAIT_POLL_S`), at most ``timeout_s``."""
    backoff = Backoff(first_s=WAIT_POLL_S, max_s=WAIT_POLL_S, factor=1, deadline_s=timeout_s)
    if not poll(check, backoff, clock=clock):
        raise SystemExit(f"{what} did not come up within {timeout_s:.0f} s")


@contextmanager
def podman_socket(workdir: Path) -> Iterator[str]:
    """``podman system service`` on a private socket; yields its ``DOCKER_HOST``."""
    sock = workdir / "podman.sock"
    env = {**os.environ, "CONTAINERS_CONF": str(CONF)}
    proc = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{sock}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=children.die_with_parent,  # noqa: PLW1509 - a killed caller leaves none
    )
    try:
        wait_for(sock.exists, "podman system service", 30)
        yield f"unix://{sock}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


# MLflow 3's server starts a job runner by default: a process and eight huey consumers, each
# importing mlflow, for GenAI jobs (prompt optimization, scorers) that this pipeline never
# submits. Off, a server costs 8 CPU-seconds to start instead of 33 (measured on 2 vCPU, AMD
# EPYC; docs/testing.md) and leaves no consumers polling beside it.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@contextmanager
def mlflow_server_process(
    root: Path, *, app_name: str | None = None, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real tracking server on 127.0.0.1 (SQLite, proxied artifact store): (URI, process).

    ``app_name`` e.g. ``basic-auth``; ``env`` its environment (default: this process's), on
    top of :data:`MLFLOW_SERVER_ENV`. The backend store URI is passed as
    ``MLFLOW_BACKEND_STORE_URI``, as k8s/mlflow does (no database credentials on a command
    line).
    """
    port = free_port()
    log_path = root / "mlflow-server.log"
    log_file = open(log_path, "w")  # noqa: SIM115 - closed below
    cmd = [str(Path(sys.executable).parent / "mlflow"), "server"]
    cmd += ["--app-name", app_name] if app_name else []
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += ["--artifacts-destination", str(root / "mlartifacts")]
    proc = subprocess.Popen(
        cmd,
        env={
            **MLFLOW_SERVER_ENV,
            **(os.environ if env is None else env),
            "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{root / 'mlflow.db'}",
        },
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=children.die_with_parent,  # noqa: PLW1509 - a killed caller leaves none
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(uri) or proc.poll() is not None, "mlflow server", 120)
        if proc.poll() is not None:
            raise SystemExit(log_path.read_text()[-2000:])
        yield uri, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log_file.close()


@contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """:func:`mlflow_server_process`, no authentication: yields the URI."""
    with mlflow_server_process(root) as (uri, _):
        yield uri


def run_container(
    client: Any, image: str, command: list[str], volumes: dict[str, Any], **args: Any
) -> int:
    """kfp.local's ``run_docker_container`` without ``auto_remove``: podman's Docker API
    removes an auto-removed container before ``wait`` reads its exit code, and kfp.local then
    counts a failed step as SUCCESS (measured: kfp 2.17.3, podman 4.3). Here the exit code is
    read first and the container removed after. No pull either: the image is local."""
    args.pop("auto_remove", None)
    container = client.containers.run(
        image=image,
        command=command,
        detach=True,
        stdout=True,
        stderr=True,
        volumes=volumes,
        **args,
    )
    try:
        for line in container.logs(stream=True, follow=True):
            sys.stdout.write(line.decode(errors="replace"))
        return int(container.wait()["StatusCode"])
    finally:
        container.remove(force=True)


def component_image() -> tuple[str, str]:
    """The component image ``make images`` built: (reference, image id)."""
    record = REPO / "build" / "images.json"
    if not record.is_file():
        raise SystemExit("no build/images.json: run `make images` first")
    ref = json.loads(record.read_text())["components"]["ref"]
    proc = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", ref],
        env={**os.environ, "CONTAINERS_CONF": str(CONF)},
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"{ref} is not on this machine: run `make images`")
    return ref, proc.stdout.strip()


def run(params: dict[str, Any], pipeline_root: Path, tracking_uri: str | None = None) -> None:
    from kfp import local
    from kfp.local import docker_task_handler

    from pipelines.training import make_pipeline, pipeline_params, shared_volume, train_backend
    from pipelines.training_cluster import typed_resources

    docker_task_handler.run_docker_container = run_container  # see run_container
    ref, image_id = component_image()
    pipeline_root.mkdir(parents=True, exist_ok=True)
    pipeline_root.chmod(0o777)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        os.environ["DOCKER_HOST"] = stack.enter_context(podman_socket(tmp))
        uri = tracking_uri or stack.enter_context(mlflow_server(pipeline_root))
        runner = local.DockerRunner(
            user="10001:10001",
            read_only=True,
            tmpfs={"/tmp": "rw,exec,size=2g,mode=1777"},  # the only writable path
            network_mode="host",
            environment={
                "MLFLOW_TRACKING_URI": uri,
                "PADDLE_MLOPS_IMAGE": f"{ref}@{image_id}",
                "LOG_LEVEL": os.environ.get("LOG_LEVEL", "INFO"),
                "HOME": "/tmp",  # caches (Paddle's dy2static sources, matplotlib)
            },
        )
        local.init(runner=runner, pipeline_root=str(pipeline_root))
        old = os.umask(0)  # directories KFP creates here are writable by uid 10001
        try:
            t0 = time.monotonic()
            backend = train_backend(params)  # compiled like the run's arguments
            pipeline = make_pipeline(
                image=ref,
                resources=typed_resources(params),
                backend=backend,
                paddlejob=shared_volume(params, backend),
            )
            pipeline(**pipeline_params(params, backend))
            log.info("the DAG ran in %s in %.0f s", ref, time.monotonic() - t0)
        finally:
            os.umask(old)
        log.info("MLflow: %s (database %s)", uri, pipeline_root / "mlflow.db")


def main(argv: list[str] | None = None) -> int:
    from components.core.config import load_params
    from pipelines.training import local_ingest_source

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--pipeline-root", default="outputs/kfp-containers")
    parser.add_argument("--tracking-uri", default=None, help="default: a fresh mlflow server")
    args = parser.parse_args(argv)
    if shutil.which("podman") is None:
        raise SystemExit("make kfp-containers needs podman (apt-get install podman runc)")
    loaded = load_params(args.params)
    source = local_ingest_source(loaded)
    params = json.loads(json.dumps(loaded))
    if source is not None:
        # the source is read inside the container: put it under the (mounted) pipeline root
        root = Path(args.pipeline_root).resolve()
        dest = root / "source"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(source.resolve(), dest)
        params["ingest"]["source"] = str(dest)
    run(params, Path(args.pipeline_root).resolve(), args.tracking_uri)
    return 0


if __name__ == "__main__":
    sys.exit(main())
