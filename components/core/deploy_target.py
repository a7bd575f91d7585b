"""The small interface every ``deploy.target`` implements (library layer).

``deploy`` resolves the alias to a :class:`Release`, renders and checks the manifests, and, for
a target on this machine, fetches and verifies the bundle; then it hands one :class:`Rollout`
to the target's :data:`Target` function, which returns what it adds to ``deployment.json``:

- ``kubernetes`` (``components.kube.cluster``): server-side apply, then the rollout wait;
- ``podman`` (``components.kube.podman``): the server image as a container on 127.0.0.1;
- ``local`` (``components.ml.serving.local_server``): the built server binary as a detached process.

The targets live in different rooms (the cluster and podman next to the manifests and images,
the local server next to the server binary), so what they share is here: the release, the
settings they read, the server's command line and the paths it is started with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MODEL_LABEL = "paddle-mlops/model"
VERSION_LABEL = "paddle-mlops/model-version"  # the version a container was started with
PREDICTION_LOG_DIR = "/var/log/predictions"  # the server's prediction log, in its container
CHALLENGER_DIR = "/mnt/challenger"  # a cluster pod's challenger bundle (fetch-challenger)


@dataclass(frozen=True)
class Release:
    """One registered version, as it is deployed."""

    model: str
    version: int
    image: str  # repository@sha256:...
    model_uri: str  # models:/NAME/VERSION
    bundle_sha256: str


class DeploySettings(Protocol):
    """The ``deploy`` params a target reads (``components.steps.deploy.DeployParams``)."""

    target: str
    alias: str
    manifests: list[str]
    namespace: str
    dry_run: bool
    kube_context: str | None
    server_variant: str
    rollout_timeout_s: float
    rollout_poll_s: float
    podman_ready_poll_s: float
    local_ready_poll_s: float
    local_stop_poll_s: float
    local_port: int
    local_grpc_port: int
    local_name: str
    local_state_dir: str
    swap: str
    prediction_log: bool
    prediction_log_max_bytes: int
    challenger: str
    challenger_fraction: float


@dataclass(frozen=True)
class Rollout:
    """What a target gets: the version, the settings, the checked manifests by variant (those
    a cluster applies), and, on this machine, the version's verified bundle directory
    (``local_state_dir/models/MODEL/vN``; None for a cluster)."""

    rel: Release
    params: DeploySettings
    rendered: dict[str, list[dict[str, Any]]]
    model_dir: Path | None = None


# a target deploys the rollout and returns what it adds to deployment.json
Target = Callable[[Rollout], dict[str, Any]]


class ServerControl(Protocol):
    """Talks to a running server (``components.ml.serving.model_control``): is it ready, swap a
    version in, load a challenger beside the serving version."""

    def ready(self, url: str, timeout_s: float) -> bool: ...

    def load_version(
        self, rel: Release, params: DeploySettings, url: str, model_dir: str
    ) -> bool: ...

    def load_challenger(
        self, rel: Release, params: DeploySettings, url: str, model_dir: str, running_image: str
    ) -> dict[str, Any]: ...


def server_args(
    rel: Release,
    params: DeploySettings,
    challenger: Release | None = None,
    *,
    model_dir: str = "/mnt/models",
    log_dir: str = PREDICTION_LOG_DIR,
) -> list[str]:
    """The server's flags for ``rel`` (and a ``challenger`` beside it)."""
    args = [
        f"--model-dir={model_dir}",
        f"--variant={params.server_variant}",
        f"--model-name={rel.model}",
        f"--model-version={rel.version}",
    ]
    if params.prediction_log:
        args += [
            f"--prediction-log-dir={log_dir}",
            f"--prediction-log-max-bytes={params.prediction_log_max_bytes}",
        ]
    if challenger is not None:
        args += [
            f"--challenger-model-dir={CHALLENGER_DIR}",
            f"--challenger-version={challenger.version}",
            f"--challenger-policy={params.challenger}",
            f"--challenger-fraction={params.challenger_fraction}",
        ]
    return args


def local_state_dir(params: DeploySettings) -> Path:
    return Path(params.local_state_dir).resolve()


def prediction_log_dir(params: DeploySettings) -> Path:
    """Where the podman server's prediction log is on this machine (``monitor --log``)."""
    return Path(params.local_state_dir).resolve() / "predictions"
