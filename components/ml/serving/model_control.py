"""Versions in a running server, over the KServe v2 repository API (library layer).

The :class:`components.core.deploy_target.ServerControl` of the podman and local targets:
whether a server is ready, swapping a new version in without a restart (the repository's
``load`` compiles it next to the serving one, switches new requests to it and drains the old
one), and loading a challenger beside the serving version for ``paddle-mlops judge``.
"""

from __future__ import annotations

import logging
from typing import Any

from components.core.artifacts import StepError
from components.core.deploy_target import DeploySettings, Release
from components.ml.serving.kserve_client import KServeClient, KServeError

log = logging.getLogger(__name__)


def ready(url: str, timeout_s: float) -> bool:
    """Whether the server at ``url`` answers ready."""
    return KServeClient(url, timeout=timeout_s).ready()


def load_version(rel: Release, params: DeploySettings, url: str, model_dir: str) -> bool:
    """Swap ``rel`` (its bundle at ``model_dir`` as the server sees it) into the server at
    ``url`` with the repository's load; False when that server is not ready."""
    client = KServeClient(url, timeout=params.rollout_timeout_s)
    if not client.ready():
        return False
    config = {"model_dir": model_dir, "version": str(rel.version), "variant": params.server_variant}
    try:
        client.load_model(rel.model, config)
    except KServeError as exc:
        raise StepError(
            f"the server at {url} could not load {rel.model} v{rel.version} ({exc}); the "
            "version it served before still serves"
        ) from None
    if str(rel.version) not in client.metadata(rel.model)["versions"]:
        raise StepError(f"{url} reports no version {rel.version} of {rel.model} after loading it")
    log.info("swapped %s v%d into the running server at %s", rel.model, rel.version, url)
    return True


def load_challenger(
    rel: Release, params: DeploySettings, url: str, model_dir: str, running_image: str
) -> dict[str, Any]:
    """Load ``rel`` (its bundle at ``model_dir`` as the server sees it) beside the version the
    server at ``url`` serves, under ``params.challenger``; what deployment.json records."""
    client = KServeClient(url, timeout=params.rollout_timeout_s)
    config = {
        "model_dir": model_dir,
        "version": str(rel.version),
        "variant": params.server_variant,
        "role": "challenger",
        "policy": params.challenger,
        "fraction": str(params.challenger_fraction),
    }
    try:
        client.load_model(rel.model, config)
    except KServeError as exc:
        raise StepError(
            f"the server at {url} could not load challenger v{rel.version}: {exc}"
        ) from None
    log.info(
        "%s v%d runs beside the champion as a %s challenger (%.0f%% of requests); judge it with "
        "paddle-mlops judge --server %s",
        rel.model, rel.version, params.challenger, 100 * params.challenger_fraction, url,
    )  # fmt: skip
    return {
        "method": "challenger",
        "policy": params.challenger,
        "fraction": params.challenger_fraction,
        **({"server_image": running_image} if running_image else {}),
    }
