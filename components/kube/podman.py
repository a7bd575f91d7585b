"""The ``podman`` deploy target: the server image as a container on this machine (library
layer; the interface: ``components.core.deploy_target``).

The version's bundle was fetched and verified as the init container does (into
``local_state_dir/models/MODEL/vN``); it is mounted read-only and served by the version's
image on ``127.0.0.1:deploy.local_port`` (read-only root, no capabilities). With ``swap: load``
and a running server of the same server image and environment, the version is swapped in
without a restart (``components.ml.serving.model_control``); otherwise the container is
replaced, and the previous one restarted if the new one never becomes ready.
"""

from __future__ import annotations

import logging
import subprocess
from typing import Any

import yaml

from components.core.artifacts import StepError
from components.core.deploy_target import (
    MODEL_LABEL,
    PREDICTION_LOG_DIR,
    VERSION_LABEL,
    DeploySettings,
    Release,
    Rollout,
    ServerControl,
    prediction_log_dir,
    server_args,
)
from components.core.retry import SYSTEM_CLOCK, Clock, every, poll
from components.kube.images import _run

log = logging.getLogger(__name__)

SERVER_IMAGE_LABEL = "paddle-mlops.server-image"  # set by the serving image's model layer
READY_POLL_S = 0.5  # how often _wait_ready asks the new container (deploy.podman_ready_poll_s)
MODELS_ROOT = "/mnt/models-root"  # podman: local_state_dir/models/MODEL, read-only


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:

    proc = _run(["podman", *args])
    if check and proc.returncode != 0:
        raise StepError(f"podman {args[0]} failed: {proc.stderr.strip()[-600:]}")
    return proc


def _exists(name: str) -> bool:
    return _podman("container", "exists", name, check=False).returncode == 0


def _wait_ready(
    control: ServerControl,
    url: str,
    timeout_s: float,
    name: str,
    clock: Clock = SYSTEM_CLOCK,
    *,
    poll_s: float = READY_POLL_S,
) -> bool:
    """Whether the container ``name`` answers ready at ``url`` within ``timeout_s`` (asked
    every ``poll_s``); False at once when it has exited."""

    def _state() -> str | None:
        if control.ready(url, 5):
            return "ready"
        state = _podman("inspect", "--format", "{{.State.Status}}", name, check=False)
        return "exited" if state.stdout.strip() in ("exited", "stopped") else None

    return poll(_state, every(poll_s, timeout_s), clock=clock) == "ready"


def _image_config(ref: str) -> tuple[str, list[str]]:
    """The server image a serving image was built on, and its environment."""
    proc = _podman(
        "image", "inspect", "--format",
        '{{index .Config.Labels "' + SERVER_IMAGE_LABEL + '"}}\n{{json .Config.Env}}', ref,
    )  # fmt: skip
    label, env = proc.stdout.strip().split("\n", 1)
    return label, sorted(yaml.safe_load(env) or [])


def _running_server(params: DeploySettings, rel: Release) -> dict[str, str] | None:
    """The container of ``params.local_name`` if it runs ``rel.model`` with model control."""
    if not _exists(params.local_name):
        return None
    proc = _podman(
        "inspect", "--format",
        "{{.State.Status}}\n{{.Image}}\n{{index .Config.Labels \"" + MODEL_LABEL + '"}}\n'
        '{{index .Config.Labels "paddle-mlops/model-control"}}',
        params.local_name, check=False,
    )  # fmt: skip
    fields = proc.stdout.strip().split("\n")
    if proc.returncode != 0 or len(fields) != 4:
        return None
    state, image, model, control = fields
    if state != "running" or model != rel.model or control != "true":
        return None
    return {"image": image}


def _swap_in_place(
    control: ServerControl, rel: Release, params: DeploySettings, url: str, running_image: str
) -> dict[str, Any] | None:
    """Load ``rel`` into the running server when its image differs from ``rel.image`` only
    by the model (same server image, same environment); None when it does not."""

    if _image_config(running_image) != _image_config(rel.image):
        log.info("the running server's image or configuration differs: restarting it")
        return None
    if not control.load_version(rel, params, url, f"{MODELS_ROOT}/v{rel.version}"):
        return None
    return {"method": "load", "server_image": running_image}


def _load_challenger(
    control: ServerControl, rel: Release, params: DeploySettings, url: str
) -> dict[str, Any]:
    """Load ``rel`` beside the version the running container serves, under the policy."""
    running = _running_server(params, rel)
    if running is None:
        raise StepError(
            f"deploy.challenger {params.challenger}: no running server of {rel.model} with "
            f"model control ({params.local_name}); deploy the champion first "
            "(deploy.challenger: none)"
        )
    running_image = running["image"]
    if _image_config(running_image) != _image_config(rel.image):
        raise StepError(
            f"{rel.model} v{rel.version}'s server image differs from the running one: a "
            "challenger must run in the champion's server (same image and configuration)"
        )
    model_dir = f"{MODELS_ROOT}/v{rel.version}"
    return control.load_challenger(rel, params, url, model_dir, running_image)


def _start(rel: Release, params: DeploySettings, models_root: str) -> None:
    """``podman run`` the version's image as ``params.local_name`` (read-only root, no
    capabilities, the models read-only, the prediction log mounted)."""
    control = "true" if params.swap == "load" else "false"
    log_mount: list[str] = []
    if params.prediction_log:
        log_dir = prediction_log_dir(params)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_dir.chmod(0o777)  # the server runs as 10001; the monitor reads as whoever runs it
        log_mount = ["--volume", f"{log_dir}:{PREDICTION_LOG_DIR}"]
    _podman(
        "run", "--detach", "--name", params.local_name,
        "--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges",
        "--user", "10001:10001", "--tmpfs", "/tmp",
        "--publish", f"127.0.0.1:{params.local_port}:8080",
        "--volume", f"{models_root}:{MODELS_ROOT}:ro", *log_mount,
        "--label", f"{MODEL_LABEL}={rel.model}",
        "--label", f"{VERSION_LABEL}={rel.version}",
        "--label", f"paddle-mlops/model-control={control}",
        rel.image, *server_args(rel, params),
        f"--model-dir={MODELS_ROOT}/v{rel.version}", f"--model-control={control}",
    )  # fmt: skip


def _replace(
    control: ServerControl, rel: Release, params: DeploySettings, models_root: str, url: str
) -> None:
    """Replace the container by one running ``rel``; if that never becomes ready, the
    previous one runs again."""
    name, previous = params.local_name, f"{params.local_name}-previous"
    if _exists(previous):
        _podman("rm", "--force", previous)
    had_previous = _exists(name)
    if had_previous:
        _podman("rename", name, previous)
        _podman("stop", "--time", "10", previous)
    _start(rel, params, models_root)
    if not _wait_ready(
        control, url, params.rollout_timeout_s, name, poll_s=params.podman_ready_poll_s
    ):
        logs = _podman("logs", "--tail", "30", name, check=False)
        _podman("rm", "--force", name, check=False)
        if had_previous:
            _podman("rename", previous, name)
            _podman("start", name)
            log.error("v%d never became ready: the previous container runs again", rel.version)
        raise StepError(
            f"{rel.image} (v{rel.version}) did not become ready on {url} within "
            f"{params.rollout_timeout_s:.0f} s; its log:\n{(logs.stdout + logs.stderr)[-2000:]}"
        )
    if had_previous:
        _podman("rm", "--force", previous)


def deploy(rollout: Rollout, *, control: ServerControl) -> dict[str, Any]:
    """Run the rollout's version on this machine as the init container + server pod would
    (module doc); ``control`` talks to the server (``components.ml.serving.model_control``)."""
    rel, params = rollout.rel, rollout.params
    assert rollout.model_dir is not None  # the step fetched the verified bundle
    model_dir, models_root = rollout.model_dir, str(rollout.model_dir.parent)
    _podman("pull", "--quiet", rel.image)
    url = f"http://127.0.0.1:{params.local_port}"
    local = {"url": url, "container": params.local_name, "model_dir": str(model_dir)}
    if params.prediction_log:
        local["prediction_log"] = str(prediction_log_dir(params))
    if params.challenger != "none":
        return {"local": {**local, **_load_challenger(control, rel, params, url)}}
    running = _running_server(params, rel) if params.swap == "load" else None
    if running is not None:
        swapped = _swap_in_place(control, rel, params, url, running["image"])
        if swapped is not None:
            return {"local": {**local, **swapped}}
    _replace(control, rel, params, models_root, url)
    log.info("serving %s v%d at %s (%s)", rel.model, rel.version, url, rel.image)
    return {"local": {**local, "method": "restart", "server_image": rel.image}}
