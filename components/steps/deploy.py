"""deploy: the champion in the registry becomes what is served.

Runs after ``promote`` (and by hand after ``paddle-mlops registry rollback``: it always deploys
whatever ``deploy.alias``, default ``champion``, names *now*). It resolves the alias once to an
immutable version and refuses a version without an image digest (``serving_image_digest``,
recorded by ``promote`` when the image was pushed) or with incomplete lineage, and one whose
signed provenance (matching its lineage tags) or image signature does not verify against the
trusted keys (``components.kube.verify``; docs/provenance.md). Then:

1. **Renders** the serving manifests from the templates in ``k8s/serving`` (Deployment,
   Service, HPA, PodDisruptionBudget + the server's ConfigMap) and ``k8s/kserve``
   (ServingRuntime, InferenceService, the ``models:/`` storage initializer), pinned to that
   version: the server image by digest, the model as ``models:/NAME/VERSION`` (fetched and
   sha256-verified by ``paddle-mlops fetch-model`` in the init container / KServe storage
   initializer), the version in labels and in the server's ``--model-version``. They are
   checked (``components.kube.check``) and written to ``serving.yaml`` / ``kserve.yaml``.
2. **Applies** them where ``deploy.target`` says:

   - ``none``: rendering only (a laptop without a cluster; the files are the deliverable);
   - ``kubernetes``: server-side apply with the official client (in-cluster config, else the
     kubeconfig), ``deploy.dry_run`` for a server-side dry run, then waits for the rollout;
   - ``podman``: this machine. The bundle is fetched and verified exactly as the init
     container does (into ``local_state_dir/models/MODEL/vN``, mounted read-only), and served
     by the server image on ``127.0.0.1:deploy.local_port`` (read-only root, no
     capabilities). With ``deploy.swap: load`` (the default) and a server already running
     the same server image and environment, the new version is **swapped in without a
     restart**: the server's repository ``load`` compiles it next to the serving version
     with the version's own settings (its bundle's ``model_config.json``), switches new
     requests to it and drains the old one, so no request fails. Otherwise (``swap:
     restart``, the first deploy, another server image or environment) the
     container is replaced by one running the version's image; if that never becomes ready
     the previous one is restarted.

With ``deploy.challenger: shadow | canary`` the ``deploy.alias`` version runs beside the
champion for ``paddle-mlops judge``: podman loads it into the running server; a cluster's
Deployment pods fetch both and start the server with ``--challenger-*`` (``manifests:
[deployment]``). A challenger never blessed, rolled back by the judge, or already promoted
is not deployed: the champion alone is (so ``judge`` then ``deploy`` converge).

``deployment.json`` records the version, image, model URI, target and what was applied. With
no champion yet (nothing was ever blessed) there is nothing to deploy: it says so and succeeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, model_validator

from components.core.artifacts import StepError, atomic_path, read_json, write_json, write_text
from components.core.config import load_params, params_model, section
from components.core.deploy_target import Release, Rollout, Target, local_state_dir
from components.core.uris import redact_uri
from components.kernel.cli import run_cli, step_main
from components.kernel.step import REPO, In, Out, Step
from components.kube import cluster, podman
from components.kube.check import check_manifests
from components.kube.release import Choice, choose, fetch_verified, release, verify_release
from components.kube.render import render
from components.ml.serving import local_server, model_control
from components.tracking.registry import (
    CHAMPION,
    Registry,
    RegistryParams,
    tracking_uri,
)
from components.tracking.registry import client as mlflow_client

log = logging.getLogger(__name__)

VARIANTS = ("deployment", "kserve")
# each target but none, behind one interface (components.core.deploy_target)
DEPLOY: dict[str, Target] = {
    "kubernetes": cluster.deploy,
    "podman": functools.partial(podman.deploy, control=model_control),
    "local": local_server.deploy,
}
ON_THIS_MACHINE = ("local", "podman")  # the targets that serve a fetched, verified bundle


Port = Annotated[int, Field(gt=0, lt=65536)]  # a TCP port


@params_model
class DeployParams:
    target: Literal["none", "local", "podman", "kubernetes"] = "local"
    alias: str = CHAMPION  # the alias deployed (resolved once, to an immutable version)
    # a non-empty subset of VARIANTS
    manifests: Annotated[list[Literal["deployment", "kserve"]], Field(min_length=1)] = field(
        default_factory=lambda: list(VARIANTS)
    )
    templates: str = "k8s"  # below it: serving/ and kserve/ (kustomization.yaml lists files)
    namespace: str = "paddle-mlops"
    dry_run: bool = False  # kubernetes: server-side dry run, nothing changes
    kube_context: str | None = None  # kubeconfig context (outside a cluster)
    components_image: str | None = None  # ref@sha256 of fetch-model; default $PADDLE_MLOPS_IMAGE
    server_variant: Literal["fp32", "int8"] = "int8"  # the bundle variant the server runs
    rollout_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    # how often the rollout is looked at: kubernetes objects, the podman container's and the
    # local server's readiness, the stopped local server
    rollout_poll_s: Annotated[float, Field(gt=0)] = cluster.ROLLOUT_POLL_S
    podman_ready_poll_s: Annotated[float, Field(gt=0)] = podman.READY_POLL_S
    local_ready_poll_s: Annotated[float, Field(gt=0)] = local_server.READY_POLL_S
    local_stop_poll_s: Annotated[float, Field(gt=0)] = local_server.STOP_POLL_S
    local_port: Port = 8501  # podman: the server on 127.0.0.1:local_port
    # local: its KServe v2 gRPC port on 127.0.0.1 (-1: none)
    local_grpc_port: Annotated[int, Field(ge=-1, lt=65536)] = 8601
    local_name: str = "paddle-mlops-server"  # podman container name
    local_state_dir: str = ".deploy"  # podman: verified model copies, by version
    # podman: load (in place, no restart, when possible) | restart
    swap: Literal["load", "restart"] = "load"
    # the server logs every answer (serving/src/prediction_log.h) under PREDICTION_LOG_DIR:
    # podman mounts local_state_dir/predictions there, the k8s templates a volume
    prediction_log: bool = True
    prediction_log_max_bytes: Annotated[int, Field(ge=1 << 20)] = 1 << 30  # at least 1 MiB
    # none replaces the served version; shadow | canary runs the alias's version beside the
    # champion as a challenger for `paddle-mlops judge` (challenger_fraction of the traffic):
    # podman loads it into the running server, a cluster's pods start with both versions
    challenger: Literal["none", "shadow", "canary"] = "none"
    challenger_fraction: Annotated[float, Field(gt=0, le=1)] = 0.1

    @model_validator(mode="after")
    def _rules(self) -> DeployParams:
        if self.local_grpc_port == 0:
            raise ValueError("local_grpc_port must be a TCP port, or -1 (no gRPC)")
        if self.local_grpc_port == self.local_port:
            raise ValueError("local_grpc_port must differ from local_port")
        on_this_machine = self.target in ("local", "podman")
        if self.challenger != "none" and not on_this_machine and "kserve" in self.manifests:
            raise ValueError(
                "challenger on a cluster: manifests [deployment] only (the server pods run both "
                "versions and log both answers per request; KServe's canaryTrafficPercent would "
                "split requests without pairing them, which the judge needs)"
            )
        return self


# --------------------------------------------------------------------------- step


def _checked(params: DeployParams) -> DeployParams:
    """``target: local`` in a Kubernetes pod renders only (the params were validated when
    built)."""
    if params.target == "local" and os.environ.get("KUBERNETES_SERVICE_HOST"):
        # a KFP task's pod: a process started here ends with the pod. Rendered as with none
        log.warning(
            "deploy.target local in a Kubernetes pod: nothing on this machine outlives it; "
            "rendering only (deploy.target kubernetes applies the manifests)"
        )
        return dataclasses.replace(params, target="none")
    return params


def _nothing(
    tmp: Path, record: dict[str, Any], shown: dict[str, Any], **written: Any
) -> dict[str, Any]:
    """deployment.json of a deploy that deploys nothing (``shown``: also in what it returns)."""
    write_json(tmp / "deployment.json", {**record, "deployed": False, **written, **shown})
    return {**record, "deployed": False, **shown}


def _verified(
    registry: Registry,
    tracking: str,
    params: DeployParams,
    choice: Choice,
    record: dict[str, Any],
    tmp: Path,
    out_dir: Path,
) -> Release:
    """The release of ``choice.version``, verified (and its challenger's), into ``record``."""
    rel = release(registry, choice.version, image=params.target != "local")
    policy_dir = tmp if rel.image else None  # podman's image policy: an image's only
    record["verified"] = verify_release(registry, tracking, rel, policy_dir, out_dir)
    if choice.challenger is not None:
        record["challenger"]["verified"] = verify_release(registry, tracking, choice.challenger)
    return rel


def _rendered(
    rel: Release, params: DeployParams, templates: Path, challenger: Release | None, tmp: Path
) -> dict[str, list[dict[str, Any]]]:
    """The checked manifests of each variant, written to ``tmp/VARIANT.yaml``."""
    components_image = params.components_image or os.environ.get("PADDLE_MLOPS_IMAGE", "")
    rendered = {}
    if rel.image:  # target local serves the bundle: manifests need the version's image
        rendered = render(
            rel, params, templates, components_image or "paddle-mlops-components", challenger
        )
    for variant, docs in rendered.items():
        check_manifests(docs, require_digest=params.target == "kubernetes")
        write_text(tmp / f"{variant}.yaml", yaml.safe_dump_all(docs, sort_keys=False))
    return rendered


def run(
    params: DeployParams,
    promotion_dir: str | Path,
    out_dir: str | Path,
    *,
    registry_params: RegistryParams | None = None,
    templates_root: str | Path | None = None,
) -> dict[str, Any]:
    params = _checked(params)
    promotion = read_json(Path(promotion_dir) / "promotion.json")
    templates = Path(templates_root) if templates_root else _templates(params.templates)
    tracking = tracking_uri()
    registry = Registry(
        mlflow_client(tracking), str(promotion["model"]), registry_params or RegistryParams()
    )
    aliases = registry.aliases()
    version = aliases.get(params.alias)
    record: dict[str, Any] = {
        "model": registry.name,
        "alias": params.alias,
        "target": params.target,
        "tracking_uri": redact_uri(tracking),
    }
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        if version is None:
            log.warning("%s has no '%s' alias: nothing to deploy", registry.name, params.alias)
            return _nothing(tmp, record, {}, version=None)
        choice = choose(registry, aliases, version, params)
        if choice.challenger_record is not None:
            record["challenger"] = choice.challenger_record
        if choice.refusal:
            log.warning("%s: nothing deployed", choice.refusal)
            return _nothing(tmp, record, {"refused": choice.refusal}, version=version)
        try:
            rel = _verified(registry, tracking, params, choice, record, tmp, Path(out_dir))
        except StepError as exc:
            if params.target != "none":
                raise
            log.warning("nothing rendered: %s", exc)  # a laptop run without a pushed image
            return _nothing(tmp, record, {"refused": str(exc)})
        rendered = _rendered(rel, params, templates, choice.challenger, tmp)
        record.update(asdict(rel), manifests=sorted(rendered), dry_run=params.dry_run)
        if params.target in DEPLOY:
            on_machine = params.target in ON_THIS_MACHINE
            model_dir = fetch_verified(rel, params, tracking) if on_machine else None
            record.update(DEPLOY[params.target](Rollout(rel, params, rendered, model_dir)))
        record["deployed"] = params.target != "none" and not params.dry_run
        write_json(tmp / "deployment.json", record)
    log.info(
        "%s v%d (%s): %s",
        rel.model,
        rel.version,
        params.alias,
        "rendered only" if params.target == "none" else f"deployed with {params.target}",
    )
    return record


def _templates(configured: str) -> Path:
    path = Path(configured)
    if not path.is_absolute() and not path.exists():
        path = REPO / configured  # the package's own (e.g. /opt/paddle-mlops/k8s in the image)
    return path


STEP = Step(
    name="deploy",
    doc=__doc__,
    params=DeployParams,
    sections=("deploy", "registry"),
    shared=(("registry", "registry_params", RegistryParams),),
    run=run,
    inputs=(
        In(
            "promotion",
            "outputs/promote",
            "promotion_dir",
            source="promote.promotion",
            help="promotion.json (which model; runs after the champion may have moved)",
        ),
    ),
    outputs=(Out("deployment", "outputs/deploy", "out_dir", dvc="uncached"),),
    extra_deps=("k8s/serving", "k8s/kserve"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """The step CLI, plus ``stop`` (end the ``target: local`` server, ``make stop``) and
    ``status`` (what it serves)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] not in (["stop"], ["status"]):
        return step_main(STEP, argv)
    parser = argparse.ArgumentParser(
        prog=f"paddle-mlops deploy {argv[0]}",
        description="stop: SIGTERM the local server (deploy.target: local) and remove its pid "
        "file. status: the server its pid file names, if it runs (exit code 3 if none).",
    )
    parser.add_argument("--params", default="params.yaml", help="params file (%(default)s)")
    args = parser.parse_args(argv[1:])
    code = 0

    def _go() -> None:
        nonlocal code
        params = section(load_params(args.params), "deploy", DeployParams)
        state_dir = local_state_dir(params)
        if argv[0] == "stop":
            server = local_server.stop(
                state_dir, params.rollout_timeout_s, poll_s=params.local_stop_poll_s
            )
            if server is None:
                log.info("no local server runs (%s)", state_dir / local_server.STATE_FILE)
            return
        server = local_server.read_state(state_dir)
        if server is None:
            log.info("no local server runs (%s)", state_dir / local_server.STATE_FILE)
            code = 3
            return
        log.info(
            "%s v%d served at %s (pid %d, log %s)", server.model, server.version, server.url,
            server.pid, state_dir / local_server.LOG_FILE,
        )  # fmt: skip

    return run_cli(_go) or code
