"""The train step on a Kubeflow training-operator PaddleJob: the pipeline's launcher task.

A pipeline compiled with ``params.yaml: train.distributed.backend: paddlejob`` runs this
component where the train task would be (``pipelines/training.py``); it has the train task's
inputs and outputs (``data``, ``validation`` in; ``model``, ``checkpoints``, ``metrics``,
``plots`` out), so every later step is wired to it unchanged. In its pod it:

1. checks the run's params: ``train.distributed.backend`` is ``paddlejob``,
   ``train.distributed.nnodes``/``nproc``, the ``paddlejob`` section (:class:`PaddleJobParams`);
   with nnodes > 1 ``paddlejob.restart_policy`` must be ``Never`` (the operator restarts only
   the failed pod, while the other ranks stay blocked in a collective and the restarted one
   waits in a rendezvous without a timeout: the job would hang until ``timeout_s``);
2. names the job ``<paddlejob.job_name_prefix>-<12 hex>``, a hash of the KFP run's id
   (the parameter ``run``: ``dsl.PIPELINE_JOB_ID_PLACEHOLDER``, passed by
   ``pipelines/training.py``), of the ``task`` and ``train`` sections and of the data it
   trains on (the train and val shards' pinned sha256, the class names), and records the run
   in the job's annotation ``paddle-mlops/run``. Every KFP retry of the task within one run
   has the same name, so a retry finds its job and its checkpoints;
   another run (a concurrent one, or a rerun) has its own job and its own directory. A job
   whose annotation names another run (or none) is never reused nor deleted: the launch fails
   with an error naming it. (The run in the inputs makes the task's KFP cache key unique to
   the run: it is never a cache hit.);
3. stages what the train step reads of the snapshot (``snapshot.json``, ``labels.json``,
   ``manifest.json`` and the train and val shards, each checked against its pinned sha256; the
   test split stays behind) and a ``params.yaml`` (``task`` + ``train``) into that job's
   directory on the shared ReadWriteMany volume (``paddlejob.pvc`` at ``paddlejob.mount_path``,
   mounted in this pod by the pipeline and in every worker by the PaddleJob);
4. renders ``k8s/paddlejob/paddlejob.yaml`` (Worker replicas = nnodes, the component image by
   digest from ``$PADDLE_MLOPS_IMAGE`` (``$PADDLE_MLOPS_GPU_IMAGE`` with GPUs) or
   ``paddlejob.image``, resources from ``params.yaml: resources.train`` (compiled in), GPUs per
   worker as limits of ``paddlejob.accelerator``, runPolicy) and checks it with
   ``components.kube.check`` (the CRD's schema, the hardening policy, a real digest);
5. creates it with the official ``kubernetes`` client (in-cluster config, else the kubeconfig:
   ``$KUBECONFIG``, context ``paddlejob.kube_context``). If a job of that name exists (a retry
   whose previous attempt died before its cleanup: SIGKILL, OOM, a lost node) it is reused when
   it belongs to this run, has the same spec (annotation ``paddle-mlops/spec-sha256``) and has
   not failed, else deleted and created again; the train step resumes from the checkpoints;
6. waits at most ``paddlejob.timeout_s``, polling every ``paddlejob.poll_interval_s``: each new
   status condition is logged, and the new lines of every pod's log (pods selected by the
   operator's label ``training.kubeflow.org/job-name``) go to this task's log. It fails fast
   when a pod cannot start (a container waiting with ErrImagePull, ImagePullBackOff,
   InvalidImageName, CreateContainerConfigError or CreateContainerError: the error names the
   pod, the reason and its message) and when a pod stays unschedulable (condition PodScheduled
   False, reason Unschedulable) for ``paddlejob.unschedulable_timeout_s`` (with the scheduler's
   message). Failed status reads (no answer, HTTP 429 or 5xx) are retried for
   ``paddlejob.api_outage_s``; then the launcher stops with an error that names the job and
   says it was left running: it does not delete it, and a retry of the task reattaches to it;
7. on ``Succeeded`` copies model, checkpoints, metrics and plots (global rank 0 wrote them to the
   job's directory) into the output artifacts, before any cleanup; on ``Failed``, a pod that
   cannot start or the timeout raises ``StepError`` naming the job and the reason (and the end
   of each pod's log);
8. then deletes the PaddleJob it created or reused (its pods and Services go with it; the
   delete carries the job's uid as a precondition, so it never deletes another object of the
   name), unless ``paddlejob.keep_job``, or the API could not be read (6.), or the job belongs
   to another run (2.). After a success a failed deletion is logged, not raised (the outputs are
   the task's already; ``ttlSecondsAfterFinished`` removes the job), and the job's directory is
   removed unless ``paddlejob.keep_run_dir``; after a failure it stays (the checkpoints a retry
   resumes from). A failure in any step from 3. on (staging included) is cleaned up the same
   way.

SIGTERM (KFP cancels the run, the launcher's pod is evicted or deleted) stops the launcher:
it deletes the job first (a cancel must not leave GPU pods running; at most
:data:`TERM_API_TIMEOUT_S` s per request) and only then fetches the pods' last log lines, for at
most :data:`TERM_LOGS_S` s, so the termination grace period (30 s by default) is not spent on
logs. A SIGKILL leaves the job to a retry of the task (5.), or to ``activeDeadlineSeconds`` and
the TTL.

The operator's env contract (training-operator release-1.9,
``pkg/controller.v1/paddlepaddle/envvar.go``): with Worker replicas only (collective mode)
``PADDLE_MASTER`` is worker 0's own pod IP (``$(POD_IP_DUMMY)``, from the downward API):<port
named master> in worker 0 and ``<job>-worker-0:<port>`` in the others, ``PADDLE_NNODES`` the
number of replicas, ``PADDLE_JOB_ID`` the job's name, and ``PYTHONUNBUFFERED=0`` (a non-empty
value, which Python takes as ``-u`` all the same: unbuffered). The template has no Master
replica on purpose: with one the operator runs its parameter-server mode (it adds
``PADDLE_SERVER_NUM``/``PADDLE_TRAINER_NUM``, which make ``paddle.distributed.launch`` start
PS training instead of collective data parallel).

Identity: the pipeline runner's ServiceAccount needs create/get/list/watch/delete on
``paddlejobs`` (kubeflow.org) and get/list on ``pods`` and ``pods/log``
(``k8s/pipelines/rbac.yaml``: Role ``paddle-mlops-paddlejob``).
"""

import calendar
import contextlib
import copy
import json
import logging
import math
import os
import re
import shutil
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output
from pydantic import Field, model_validator

from components.core.artifacts import (
    StepError,
    atomic_path,
    read_json,
    sha256_bytes,
    sha256_file,
    write_text,
)
from components.core.config import params_model, section
from components.faults import failpoints
from components.ml import snapshot

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]

# kubeflow/training-operator release-1.9 (pkg/apis/kubeflow.org/v1)
GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "paddlejobs", "PaddleJob"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"  # common_types.go JobNameLabel
REPLICA_TYPE = "Worker"  # collective mode: no Master replica (see the module's docstring)
CONTAINER = "paddle"  # PaddleJobDefaultContainerName
PORT_NAME = "master"  # PaddleJobDefaultPortName
TERMINAL = ("Succeeded", "Failed")  # JobConditionType values that end a job

# the template's contract (k8s/paddlejob/paddlejob.yaml)
RUN_DIR_ENV = "PADDLE_MLOPS_RUN_DIR"  # the job's directory: every path of the train CLI
SHARED_VOLUME, SHM_VOLUME = "shared", "dshm"
SPEC_ANNOTATION = "paddle-mlops/spec-sha256"
RUN_ANNOTATION = "paddle-mlops/run"  # the KFP run whose launcher owns the job
# set on the launcher task by pipelines/training.py
IMAGE_ENV, GPU_IMAGE_ENV = "PADDLE_MLOPS_IMAGE", "PADDLE_MLOPS_GPU_IMAGE"
PVC_ENV, MOUNT_ENV = "PADDLE_MLOPS_SHARED_PVC", "PADDLE_MLOPS_SHARED_MOUNT"
# params.yaml resources.<task> keys -> the container's resources
RESOURCE_FIELDS = {
    "cpu_request": ("requests", "cpu"),
    "cpu_limit": ("limits", "cpu"),
    "memory_request": ("requests", "memory"),
    "memory_limit": ("limits", "memory"),
}
# what the job writes into its directory (the train CLI's paths in the template)
OUTPUTS = {
    "model": "model",
    "checkpoints": "checkpoints",
    "metrics": "metrics/train.json",
    "plots": "plots/train.csv",
}
_PREFIX = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# "<prefix>-<12 hex>-worker-<index>" names the operator's pods and Services (DNS-1035, <= 63)
MAX_PREFIX = 63 - len("-") - 12 - len("-worker-") - 4
# a container waiting for one of these will not start by waiting longer: the launch fails
NOT_STARTING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
# after SIGTERM, within the pod's termination grace period (Kubernetes' default: 30 s)
TERM_API_TIMEOUT_S = 10.0  # each request of the job's deletion (at most paddlejob.api_timeout_s)
TERM_LOGS_S = 5.0  # the pods' last log lines, after the deletion


Seconds = Annotated[float, Field(gt=0)]


@params_model
class PaddleJobParams:
    """``params.yaml: paddlejob``: where and how the launcher runs training as a PaddleJob."""

    namespace: str = "paddle-mlops"  # of the PaddleJob: the pipeline's (the PVC is there)
    pvc: str = "paddle-mlops-shared"  # ReadWriteMany claim shared by launcher and workers
    mount_path: str = "/mnt/shared"  # where the launcher and every worker mount it
    runs_dir: str = "paddlejob-runs"  # below mount_path: one directory per job
    image: str | None = None  # worker image ref@sha256; default $PADDLE_MLOPS_(GPU_)IMAGE
    gpus_per_worker: Annotated[int, Field(ge=0)] = 0  # accelerators per pod, for its ranks
    accelerator: str = "nvidia.com/gpu"  # the extended resource name of one accelerator
    # the container port named master: the rendezvous on worker 0
    master_port: Annotated[int, Field(gt=0, lt=65536)] = 36543
    shm_size: str = "1Gi"  # /dev/shm (memory-backed emptyDir): DataLoader workers, NCCL
    # Never with nnodes > 1 (launch refuses the others: a restarted pod hangs the job)
    restart_policy: Literal["Never", "OnFailure", "ExitCode"] = "Never"
    # runPolicy.backoffLimit (restarts with OnFailure/ExitCode)
    backoff_limit: Annotated[int, Field(ge=0)] = 0
    clean_pod_policy: Literal["None", "Running", "All"] = "None"
    # runPolicy: cleanup of a job left behind
    ttl_seconds_after_finished: Annotated[int, Field(ge=0)] = 86400
    timeout_s: Seconds = 86400.0  # the launcher's wait, and runPolicy.activeDeadlineSeconds
    poll_interval_s: Seconds = 10.0  # status and logs
    delete_timeout_s: Seconds = 120.0  # wait for a replaced job to be gone
    api_timeout_s: Seconds = 30.0  # one API request
    api_outage_s: Seconds = 300.0  # failed status reads tolerated for this long; then the
    # launcher stops and leaves the job running (a retry of the task reattaches to it)
    unschedulable_timeout_s: Seconds = 600.0  # a pod the scheduler cannot place fails it
    # of each pod's log, quoted in the error of a failed job
    log_tail_lines: Annotated[int, Field(ge=1)] = 20
    keep_job: bool = False  # leave the finished PaddleJob (and its pods) for inspection
    keep_run_dir: bool = False  # leave the job's directory on the volume after a success
    job_name_prefix: str = "paddle-mlops-train"
    kube_context: str | None = None  # kubeconfig context (outside a cluster)
    template: str = "k8s/paddlejob/paddlejob.yaml"

    @model_validator(mode="after")
    def _names_and_paths(self) -> "PaddleJobParams":
        if not _PREFIX.fullmatch(self.job_name_prefix) or len(self.job_name_prefix) > MAX_PREFIX:
            raise ValueError(
                f"job_name_prefix: {self.job_name_prefix!r} must be a DNS-1035 label of at most "
                f"{MAX_PREFIX} characters (the job's pods and Services are named after it)"
            )
        if not Path(self.mount_path).is_absolute():
            raise ValueError(f"mount_path: {self.mount_path!r} is not an absolute path")
        if (
            not self.runs_dir
            or Path(self.runs_dir).is_absolute()
            or ".." in Path(self.runs_dir).parts
        ):
            raise ValueError(
                f"runs_dir: {self.runs_dir!r} must be a relative path below mount_path"
            )
        return self


@dataclass(frozen=True)
class Topology:
    """``train.distributed`` as the launcher needs it."""

    nnodes: int
    nproc: int


@dataclass(frozen=True)
class Outputs:
    """Where the launcher's output artifacts live (the train step's ports)."""

    model: Path
    checkpoints: Path
    metrics: Path
    plots: Path


@dataclass
class LaunchResult:
    job: str
    namespace: str
    state: str  # Succeeded (a failure raises)
    created: bool  # False: an existing job of the same name, run and spec was reused
    metrics: dict[str, Any] = field(default_factory=dict)


class ApiError(StepError):
    """A request of the Kubernetes API failed; the message names its object.
    ``status`` None: no answer (connection refused or reset, timeout)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def retryable(self) -> bool:
        """Worth repeating: the API server unreachable, busy or failing for a moment."""
        return self.status is None or self.status == 429 or self.status >= 500


class JobLeftRunning(StepError):
    """The launcher stops without deleting its job (its status could not be read)."""


class ForeignJob(StepError):
    """A job of this name belongs to another run (or to none): neither reused nor deleted."""


class Terminated(StepError):
    """SIGTERM: the run was cancelled, or the launcher's pod is going away."""


class Clock(Protocol):
    """The launcher's time: every deadline (``timeout_s``, ``api_outage_s``,
    ``unschedulable_timeout_s``, ``delete_timeout_s``, the log budgets) is read from
    ``monotonic`` and every wait between polls is a ``sleep``. (A request's own timeout,
    ``api_timeout_s``, is the socket's.)"""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """:func:`time.monotonic` and :func:`time.sleep`: the launcher's clock in its pod."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


# --------------------------------------------------------------------------- params


def typed(paddlejob: Mapping[str, Any] | None, source: str = "params.yaml") -> PaddleJobParams:
    """The ``paddlejob`` section (as KFP passes it) typed by the params loader every step
    uses (``components.core.config.section``); errors name ``source: paddlejob.<field>``."""
    return section(
        {"paddlejob": dict(paddlejob or {})}, "paddlejob", PaddleJobParams, source=source
    )


def _int(value: Any, where: str) -> int:
    if isinstance(value, float) and value.is_integer():  # KFP's Struct makes numbers floats
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise StepError(f"{where}: expected an integer >= 1, got {value!r}")
    return value


def topology(train: Mapping[str, Any], source: str = "params.yaml") -> Topology:
    """nnodes and nproc of ``train.distributed``, which must select this backend."""
    dist = train.get("distributed") or {}
    if not isinstance(dist, Mapping):
        raise StepError(f"{source}: train.distributed: expected a mapping, got {dist!r}")
    backend = dist.get("backend", "auto")
    if backend != "paddlejob":
        raise StepError(
            f"{source}: train.distributed.backend is {backend!r}, but this pipeline was compiled "
            "for 'paddlejob' (its train task is the PaddleJob launcher): set it to paddlejob, "
            "or recompile with the params you run (python -m pipelines.training compile "
            "--params ...)"
        )
    return Topology(
        nnodes=_int(dist.get("nnodes", 1), f"{source}: train.distributed.nnodes"),
        nproc=_int(dist.get("nproc", 1), f"{source}: train.distributed.nproc"),
    )


def check_restart_policy(params: PaddleJobParams, topo: Topology, source: str) -> None:
    """Only ``Never`` with several nodes: the operator restarts just the failed pod, while
    the ranks of the others stay blocked in a collective and the restarted launcher waits in
    its rendezvous without a timeout, so the job would hang until ``timeout_s``."""
    if topo.nnodes > 1 and params.restart_policy != "Never":
        raise StepError(
            f"{source}: paddlejob.restart_policy is {params.restart_policy!r} but "
            f"train.distributed.nnodes is {topo.nnodes}: with more than one node only 'Never' "
            "works (the operator would restart only the failed pod while the other ranks stay "
            "blocked in a collective: the job hangs); a failed rank fails the job, and a retry "
            "of the task resumes from the checkpoints"
        )


def check_run(run: str) -> str:
    """The KFP run's id, as the launcher's parameter ``run`` got it."""
    if not isinstance(run, str) or not run.strip():
        raise StepError(
            "run: the KFP run's id is empty (pipelines/training.py passes "
            "dsl.PIPELINE_JOB_ID_PLACEHOLDER): the job's name and owner need it"
        )
    if "{{" in run:
        raise StepError(
            f"run: {run!r} is a KFP placeholder that was not substituted: run the pipeline on "
            "a Kubeflow Pipelines backend (the job's name and owner are the run's id)"
        )
    return run.strip()


def job_key(task: Mapping[str, Any], train: Mapping[str, Any], data_dir: Path, run: str) -> str:
    """12 hex digits of the KFP run and of what the training's result depends on: the
    ``task`` and ``train`` sections and the data it reads: the train and val shards (the
    sha256 the snapshot's manifest pins for each, no shard is read) and the class names. The
    same for every retry of the task within the run."""
    snap = snapshot.load(data_dir)  # not a snapshot: one line (run ingest)
    data = {split: snap.split_sha256(split) for split in STAGED_SPLITS}
    data["labels.json"] = sha256_file(_staged_file(data_dir, "labels.json"))
    blob = json.dumps({"run": run, "task": task, "train": train, "data": data}, sort_keys=True)
    return sha256_bytes(blob.encode())[:12]


def worker_image(params: PaddleJobParams, env: Mapping[str, str]) -> str:
    """The image of the workers: ``paddlejob.image``, else the pipeline's component image
    (the GPU one when the workers get accelerators)."""
    if params.image:
        return params.image
    var = GPU_IMAGE_ENV if params.gpus_per_worker > 0 else IMAGE_ENV
    image = env.get(var)
    if not image:
        raise StepError(
            f"no worker image: set params.yaml paddlejob.image (ref@sha256:...) or ${var} "
            "(the pipeline sets it to the image it was compiled with)"
        )
    return image


# --------------------------------------------------------------------------- rendering


def template_path(params: PaddleJobParams) -> Path:
    path = Path(params.template)
    if not path.is_absolute() and not path.exists():
        path = REPO / params.template  # the package's own (/opt/paddle-mlops/k8s in the image)
    return path


def load_template(path: Path) -> dict[str, Any]:
    from components.kube.check import load_manifests

    if not path.is_file():
        raise StepError(f"{path}: the PaddleJob template is missing (paddlejob.template)")
    docs = load_manifests([path])
    if len(docs) != 1 or docs[0].get("kind") != KIND:
        raise StepError(
            f"{path}: must hold exactly one {KIND}, found {[d.get('kind') for d in docs]}"
        )
    return docs[0]


def _named(items: list[dict[str, Any]], name: str, where: str) -> dict[str, Any]:
    for item in items:
        if item.get("name") == name:
            return item
    raise StepError(f"{where}: no entry named {name!r} (the launcher fills it)")


def container_resources(
    worker_resources: Mapping[str, Any], params: PaddleJobParams
) -> dict[str, dict[str, Any]]:
    """``resources.train`` of params.yaml (cpu/memory requests and limits) + the GPUs."""
    unknown = sorted(set(worker_resources) - set(RESOURCE_FIELDS))
    if unknown:
        raise StepError(f"params.yaml: resources.train: unknown keys {unknown}")
    out: dict[str, dict[str, Any]] = {"requests": {}, "limits": {}}
    for key, value in worker_resources.items():
        bound, resource = RESOURCE_FIELDS[key]
        out[bound][resource] = str(value)
    if params.gpus_per_worker > 0:
        out["limits"][params.accelerator] = params.gpus_per_worker
    return out


def render(
    template: Mapping[str, Any],
    *,
    name: str,
    params: PaddleJobParams,
    topo: Topology,
    image: str,
    run_dir: Path,
    worker_resources: Mapping[str, Any],
    run: str,
    source: str = "k8s/paddlejob/paddlejob.yaml",
) -> dict[str, Any]:
    """The PaddleJob of one run, from the template; annotated with the sha256 of its spec
    and with the KFP run that owns it."""
    doc = copy.deepcopy(dict(template))
    meta = doc.setdefault("metadata", {})
    meta["name"], meta["namespace"] = name, params.namespace
    spec = doc.setdefault("spec", {})
    replicas = spec.get("paddleReplicaSpecs") or {}
    if set(replicas) != {REPLICA_TYPE}:
        raise StepError(
            f"{source}: spec.paddleReplicaSpecs must hold {REPLICA_TYPE} only (collective mode; "
            "a Master replica makes the operator run parameter-server mode), found "
            f"{sorted(replicas)}"
        )
    spec["runPolicy"] = {
        **(spec.get("runPolicy") or {}),
        "cleanPodPolicy": params.clean_pod_policy,
        "backoffLimit": params.backoff_limit,
        "activeDeadlineSeconds": math.ceil(params.timeout_s),
        "ttlSecondsAfterFinished": params.ttl_seconds_after_finished,
    }
    worker = replicas[REPLICA_TYPE]
    worker["replicas"] = topo.nnodes
    worker["restartPolicy"] = params.restart_policy
    pod = worker["template"]["spec"]
    where = f"{source}: spec.paddleReplicaSpecs.{REPLICA_TYPE}.template.spec"
    container = _named(pod.get("containers") or [], CONTAINER, f"{where}.containers")
    container["image"] = image
    env = _named(container.get("env") or [], RUN_DIR_ENV, f"{where}.containers[{CONTAINER}].env")
    env["value"] = str(run_dir)
    port = _named(container.get("ports") or [], PORT_NAME, f"{where}.containers[{CONTAINER}].ports")
    port["containerPort"] = params.master_port
    container["resources"] = container_resources(worker_resources, params)
    mount = _named(
        container.get("volumeMounts") or [],
        SHARED_VOLUME,
        f"{where}.containers[{CONTAINER}].volumeMounts",
    )
    mount["mountPath"] = params.mount_path
    volumes = pod.get("volumes") or []
    _named(volumes, SHARED_VOLUME, f"{where}.volumes")["persistentVolumeClaim"] = {
        "claimName": params.pvc
    }
    _named(volumes, SHM_VOLUME, f"{where}.volumes")["emptyDir"] = {
        "medium": "Memory",
        "sizeLimit": params.shm_size,
    }
    annotations = meta.setdefault("annotations", {})
    annotations[SPEC_ANNOTATION] = spec_sha256(doc)
    annotations[RUN_ANNOTATION] = run
    return doc


def spec_sha256(doc: Mapping[str, Any]) -> str:
    return sha256_bytes(json.dumps(doc.get("spec"), sort_keys=True).encode())


# --------------------------------------------------------------------------- the volume


# what the train step reads of a snapshot: the test split never goes to the shared volume
STAGED_SPLITS = ("train", "val")
STAGED_FILES = (snapshot.SNAPSHOT_FILE, "labels.json", "manifest.json")


def _staged_file(data_dir: Path, name: str) -> Path:
    path = data_dir / name
    if not path.is_file():
        raise StepError(f"{path}: missing; the data set is not a complete snapshot (run ingest)")
    return path


def stage(run_dir: Path, data_dir: Path, sections: Mapping[str, Any]) -> None:
    """The data the train step reads and params.yaml in the job's directory: the snapshot's
    ``snapshot.json``, ``labels.json`` and ``manifest.json`` and its train and val shards,
    each checked against the sha256 the manifest pins once copied (the test shards stay
    behind). Copied once: the shards' hashes are part of the job's name, so an existing copy
    is the same data."""
    import yaml

    data = run_dir / "data"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if data.is_dir():
            log.info("data already staged in %s (a retry of the same run)", data)
        else:
            snap = snapshot.load(data_dir)
            shards = [s for s in snap.shards if s.split in STAGED_SPLITS]
            with atomic_path(data) as tmp:
                tmp.mkdir()
                for name in STAGED_FILES:
                    shutil.copyfile(_staged_file(data_dir, name), tmp / name)
                for shard in shards:
                    _stage_shard(snap, shard, tmp)
            log.info(
                "staged the snapshot (%d train and val shards, %d bytes) into %s",
                len(shards),
                sum(s.bytes for s in shards),
                data,
            )
        failpoints.hit("paddlejob.stage", str(run_dir / "params.yaml"))
        write_text(run_dir / "params.yaml", yaml.safe_dump(dict(sections), sort_keys=False))
    except OSError as exc:
        raise StepError(f"staging the job's inputs into {run_dir} failed: {exc}") from exc


def _stage_shard(snap: snapshot.Snapshot, shard: snapshot.Shard, dest_root: Path) -> None:
    """Copy one shard below ``dest_root``; a missing or corrupt one is one line naming it."""
    src, dest = snap.path(shard), dest_root / shard.path
    if not src.is_file():
        raise StepError(
            f"{src}: shard missing (snapshot.json pins sha256 {shard.sha256}); run `dvc pull` "
            "or ingest again"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    got = sha256_file(dest)
    if got != shard.sha256:
        raise StepError(
            f"{src}: shard sha256 is {got}, snapshot.json pins {shard.sha256}: it is corrupt; "
            "run `dvc pull` or ingest again"
        )


def missing_outputs(run_dir: Path) -> list[str]:
    """The outputs rank 0 has not written (yet)."""
    return [rel for rel in OUTPUTS.values() if not (run_dir / rel).exists()]


def collect(run_dir: Path, job: str, outputs: Outputs) -> dict[str, Any]:
    """Copy the job's outputs into the artifacts; returns the metrics."""
    missing = missing_outputs(run_dir)
    if missing:
        raise StepError(
            f"PaddleJob {job} succeeded but {', '.join(str(run_dir / m) for m in missing)} "
            "is missing: global rank 0 writes every output of the train CLI there"
        )
    for name, rel in OUTPUTS.items():
        src, dst = run_dir / rel, Path(getattr(outputs, name))
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)
    return read_json(outputs.metrics)


# --------------------------------------------------------------------------- the API


def api_client(params: PaddleJobParams) -> Any:
    """A client of the cluster's API: in-cluster config, else the kubeconfig (``$KUBECONFIG``,
    default ~/.kube/config) with context ``paddlejob.kube_context``."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException
    from urllib3.util.retry import Retry

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        try:
            config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None,
                context=params.kube_context,
                client_configuration=configuration,
            )
        except (ConfigException, OSError) as exc:
            raise StepError(
                f"PaddleJob backend: no in-cluster config and no usable kubeconfig ({exc})"
            ) from exc
    # a request that got no answer within paddlejob.api_timeout_s is not sent again by
    # urllib3 (its default repeats reads up to 3 times): the launcher decides (status reads
    # are retried for paddlejob.api_outage_s), and the timeout bounds each call
    configuration.retries = Retry(total=2, read=0, redirect=0)
    return client.ApiClient(configuration)


def api_message(exc: BaseException) -> str:
    """An ApiException's status, reason and the API server's message; else the error."""
    if not hasattr(exc, "status"):
        return f"no answer from the API server ({exc})"
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    body = getattr(exc, "body", None)
    message = ""
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = str(body)[:300]
    return f"HTTP {status} {reason}" + (f": {message}" if message else "")


def _request_errors() -> tuple[type[BaseException], ...]:
    """What a request of the client raises when it fails: the API server's answer
    (ApiException), or none (urllib3's errors: refused, reset, timed out; OSError)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return ApiException, HTTPError, OSError


def owner(obj: Mapping[str, Any]) -> str | None:
    """The KFP run named by the job's annotation ``paddle-mlops/run``."""
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(RUN_ANNOTATION)


class Kube:
    """The few calls the launcher makes, with the client's typed APIs. ``create``, ``get`` and
    ``delete`` raise :class:`ApiError` naming the job; ``timeout`` overrides
    ``paddlejob.api_timeout_s`` for one request."""

    def __init__(self, api: Any, params: PaddleJobParams) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.ns = params.namespace
        self.timeout = params.api_timeout_s

    def _timeout(self, timeout: float | None) -> tuple[float, float]:
        """(connect, read) seconds: the client ignores a float (it takes an int or a pair)."""
        seconds = timeout or self.timeout
        return seconds, seconds

    def _error(self, what: str, name: str, exc: BaseException) -> ApiError:
        return ApiError(
            f"{what} {KIND} {self.ns}/{name}: {api_message(exc)}", getattr(exc, "status", None)
        )

    def create(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The created job, or None when a job of that name exists."""
        name = body["metadata"]["name"]
        try:
            return self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, body, _request_timeout=self._timeout(None)
            )
        except _request_errors() as exc:
            if getattr(exc, "status", None) == 409:
                return None
            raise self._error("create", name, exc) from exc

    def get(self, name: str, timeout: float | None = None) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, name, _request_timeout=self._timeout(timeout)
            )
        except _request_errors() as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self._error("read", name, exc) from exc

    def delete(self, name: str, uid: str | None, timeout: float | None = None) -> bool:
        """Delete the job (its pods and Services are its dependents), only if its uid is
        ``uid`` when given; False if it was gone, or is another object of that name."""
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.ns,
                PLURAL,
                name,
                propagation_policy="Background",
                body={"preconditions": {"uid": uid}} if uid else None,
                _request_timeout=self._timeout(timeout),
            )
        except _request_errors() as exc:
            status = getattr(exc, "status", None)
            if status == 404:
                return False
            if status == 409 and uid:  # the uid precondition: not the job this launcher knows
                log.warning(
                    "not deleting %s %s/%s: it is not the object of uid %s any more (%s)",
                    KIND,
                    self.ns,
                    name,
                    uid,
                    api_message(exc),
                )
                return False
            raise self._error("delete", name, exc) from exc
        return True

    def pods(self, job: str, timeout: float | None = None) -> list[Any]:
        found = self.core.list_namespaced_pod(
            self.ns,
            label_selector=f"{JOB_NAME_LABEL}={job}",
            _request_timeout=self._timeout(timeout),
        )
        return sorted(found.items or [], key=lambda p: p.metadata.name)

    def log(self, pod: str, since_seconds: int | None, timeout: float | None = None) -> str:
        kwargs: dict[str, Any] = {"container": CONTAINER, "timestamps": True}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        return self.core.read_namespaced_pod_log(
            pod, self.ns, _request_timeout=self._timeout(timeout), **kwargs
        )


# --------------------------------------------------------------------------- watching


def conditions(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((obj.get("status") or {}).get("conditions") or [])


def terminal(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The condition that ended the job (Failed wins), or None while it runs."""
    true = {c.get("type"): c for c in conditions(obj) if c.get("status") == "True"}
    for kind in ("Failed", "Succeeded"):
        if kind in true:
            return true[kind]
    return None


# the kubelet's prefix of each line with timestamps=true: RFC 3339 (RFC3339Nano in UTC, the
# fraction's trailing zeros trimmed), then one space
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"([Zz]|[+-]\d{2}:\d{2})"
)


def kubelet_timestamp(piece: str) -> tuple[tuple[int, int], str] | None:
    """``(seconds since the epoch, nanoseconds)`` of a line's kubelet timestamp, a key that
    sorts like time, and the line's text; None when the piece does not start with one."""
    stamp, _, message = piece.partition(" ")
    match = _RFC3339.fullmatch(stamp)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return None
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    zone = match.group(8)
    if zone not in ("Z", "z"):
        sign = -1 if zone[0] == "+" else 1
        seconds += sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return (seconds, int((match.group(7) or "").ljust(9, "0"))), message


def terminal_view(message: str) -> str:
    """A line as a terminal shows it: of progress updates overwritten with ``\\r`` (tqdm's
    bars) the last one that is not blank."""
    if "\r" not in message:
        return message
    shown = [part for part in message.split("\r") if part.strip()]
    return shown[-1] if shown else ""


class PodLogs:
    """New lines of the ``paddle`` container of every pod of a job, into this log.

    Each pass asks for the lines since the previous pass (plus a margin) with the kubelet's
    timestamps and drops those already shown; the last lines of each pod are kept for the
    error of a failed job. Lines are split at ``\\n`` only (a ``\\r`` of a progress bar does
    not end a line); a piece without a timestamp continues the line before it: it is shown
    when that line is, and does not count in the bookkeeping of what was seen."""

    MARGIN_S = 5

    def __init__(self, kube: Kube, job: str, tail: int, clock: Clock = SYSTEM_CLOCK) -> None:
        self.kube, self.job, self.clock = kube, job, clock
        # pod -> (newest timestamp shown, lines shown at it)
        self.last: dict[str, tuple[tuple[int, int], int]] = {}
        self.fetched: dict[str, float] = {}  # pod -> the clock's time of its last fetch
        self.tails: dict[str, deque[str]] = {}
        self.tail = tail
        self.failures = 0

    def poll(
        self, deadline: float | None = None, stop: Callable[[], bool] | None = None
    ) -> list[Any]:
        """One pass over the job's pods; returns them (none when listing them failed). With
        ``deadline`` (the clock's time) no request outlasts it, and the pods not reached by
        then (or once ``stop()`` is true) are skipped."""

        def budget() -> float | None:
            if stop is not None and stop():
                return 0.0
            if deadline is None:
                return None
            return min(self.kube.timeout, deadline - self.clock.monotonic())

        left = budget()
        if left is not None and left <= 0:
            return []
        try:
            pods = self.kube.pods(self.job, timeout=left)
        except _request_errors() as exc:
            self._failed(f"list pods of {self.job}", exc)
            return []
        for pod in pods:
            name = pod.metadata.name
            if (pod.status and pod.status.phase) == "Pending":
                continue
            left = budget()
            if left is not None and left <= 0:
                log.info("no time left for the logs of %s", name)
                continue
            since = None
            if name in self.fetched:
                since = math.ceil(self.clock.monotonic() - self.fetched[name]) + self.MARGIN_S
            started = self.clock.monotonic()
            try:
                text = self.kube.log(name, since, timeout=left)
            except _request_errors() as exc:
                if getattr(exc, "status", None) == 400:  # the container is not running yet
                    log.debug("no log of %s yet: %s", name, api_message(exc))
                else:
                    self._failed(f"log of pod {name}", exc)
                continue
            self.fetched[name] = started
            self._emit(name, text)
        return pods

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        log.warning("%s: %s (the job's status still decides)", what, api_message(exc))

    def _emit(self, pod: str, text: str) -> None:
        newest, count = self.last.get(pod, ((-1, -1), 0))
        tail = self.tails.setdefault(pod, deque(maxlen=self.tail))
        seen_at_newest = 0
        shown = True  # of the line a piece without a timestamp continues
        for piece in text.split("\n"):
            if not piece:
                continue
            stamped = kubelet_timestamp(piece)
            if stamped is None:  # a continuation of the line before
                message = piece
            else:
                key, message = stamped
                if key < newest:
                    shown = False
                elif key == newest:
                    seen_at_newest += 1
                    shown = seen_at_newest > count
                    if shown:
                        count += 1
                else:
                    newest, count, seen_at_newest, shown = key, 1, 1, True
            if shown:
                message = terminal_view(message)
                tail.append(message)
                log.info("[%s] %s", pod, message)
        self.last[pod] = (newest, count)

    def excerpt(self) -> str:
        return "".join(
            f"\n{pod} (last lines):\n  " + "\n  ".join(lines)
            for pod, lines in sorted(self.tails.items())
            if lines
        )


class PodStates:
    """Pods of the job that will not run: a container waiting for a reason in
    :data:`NOT_STARTING` fails the launch at once, a pod the scheduler cannot place fails it
    after ``paddlejob.unschedulable_timeout_s``."""

    def __init__(
        self,
        namespace: str,
        job: str,
        unschedulable_timeout_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.ns, self.job, self.clock = namespace, job, clock
        self.limit = unschedulable_timeout_s
        self.unschedulable: dict[tuple[str, str], float] = {}  # (pod, uid) -> the clock's since

    def check(self, pods: list[Any]) -> None:
        now = self.clock.monotonic()
        still: set[tuple[str, str]] = set()
        for pod in pods:
            status = pod.status
            if status is None:
                continue
            name = pod.metadata.name
            for container in [
                *(status.init_container_statuses or []),
                *(status.container_statuses or []),
            ]:
                waiting = container.state.waiting if container.state else None
                if waiting is not None and waiting.reason in NOT_STARTING:
                    raise StepError(
                        f"{KIND} {self.ns}/{self.job}: pod {name} cannot start: its container "
                        f"{container.name} is waiting with {waiting.reason}: "
                        f"{waiting.message or '(no message)'}"
                    )
            if status.phase != "Pending":
                continue
            for cond in status.conditions or []:
                if (cond.type, cond.status, cond.reason) != (
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                ):
                    continue
                key = (name, pod.metadata.uid or "")
                still.add(key)
                if key not in self.unschedulable:
                    self.unschedulable[key] = now
                    log.warning(
                        "pod %s is unschedulable (the launch fails if it still is after %g s, "
                        "paddlejob.unschedulable_timeout_s): %s",
                        name,
                        self.limit,
                        cond.message,
                    )
                waited = now - self.unschedulable[key]
                if waited >= self.limit:
                    raise StepError(
                        f"{KIND} {self.ns}/{self.job}: pod {name} was unschedulable for "
                        f"{waited:.0f} s (paddlejob.unschedulable_timeout_s {self.limit:g}): "
                        f"{cond.message or '(no message)'}"
                    )
        for key in set(self.unschedulable) - still:  # scheduled (or gone) since
            del self.unschedulable[key]


class _Termination:
    """SIGTERM in the main thread: the first one raises :class:`Terminated` while armed (the
    launch's work); one during the cleanup, and any later one, is only recorded and logged,
    so the cleanup finishes within the grace period."""

    def __init__(self) -> None:
        self.received = False
        self.armed = False

    def is_set(self) -> bool:
        return self.received

    def handle(self, signum: int, _frame: Any) -> None:
        first, self.received = not self.received, True
        if first and self.armed:
            self.armed = False
            raise Terminated(
                f"the launcher received signal {signum} (the run was cancelled, or its pod is "
                "going away): stopping"
            )
        log.warning("signal %d during the cleanup: finishing the cleanup first", signum)


@contextlib.contextmanager
def _termination() -> Iterator[_Termination]:
    """SIGTERM handled by a :class:`_Termination` (only in the main thread: elsewhere a
    signal handler cannot be set, and the signal keeps its previous action)."""
    state = _Termination()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = signal.signal(signal.SIGTERM, state.handle)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, previous)


def _uid(obj: Mapping[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("uid")


def ensure_job(
    kube: Kube,
    body: Mapping[str, Any],
    params: PaddleJobParams,
    run_dir: Path,
    clock: Clock = SYSTEM_CLOCK,
) -> tuple[bool, str | None]:
    """Create the job; a job of the same name (a retry of this run, whose previous attempt
    died before its cleanup) is reused when it belongs to this run (annotation
    ``paddle-mlops/run``), has the same spec and has not failed (a succeeded one only if its
    outputs are there), else replaced. A job of the name that belongs to another run (or to
    none) raises :class:`ForeignJob`: it is neither reused nor deleted.
    Returns (True when this call created it, the job's uid)."""
    name = body["metadata"]["name"]
    run = body["metadata"]["annotations"][RUN_ANNOTATION]
    for attempt in range(2):  # create; or reuse, or replace the job there and create again
        created = kube.create(body)
        if created is not None:
            log.info("created %s %s/%s", KIND, kube.ns, name)
            return True, _uid(created)
        existing = kube.get(name)
        if existing is None:  # deleted between the create and the read
            continue
        theirs = owner(existing)
        if theirs != run:
            raise ForeignJob(
                f"{KIND} {kube.ns}/{name} exists but belongs to "
                + (f"run {theirs!r}" if theirs else f"no run (no annotation {RUN_ANNOTATION})")
                + f", not to this run {run!r} (annotation {RUN_ANNOTATION}): it was left "
                "alone; delete it (kubectl delete paddlejob -n "
                f"{kube.ns} {name}) if it is stale, or change paddlejob.job_name_prefix"
            )
        if attempt:
            raise StepError(f"{KIND} {kube.ns}/{name} exists again right after its deletion")
        annotations = existing.get("metadata", {}).get("annotations") or {}
        same = annotations.get(SPEC_ANNOTATION) == body["metadata"]["annotations"][SPEC_ANNOTATION]
        end = terminal(existing)
        state = end.get("type") if end else "running"
        done_without_outputs = state == "Succeeded" and missing_outputs(run_dir)
        if same and state != "Failed" and not done_without_outputs:
            log.info("reusing %s %s/%s of this run and spec (%s)", KIND, kube.ns, name, state)
            return False, _uid(existing)
        why = "another spec" if not same else f"it is {state}"
        if done_without_outputs:
            why = "it succeeded but its outputs are gone"
        log.info("replacing %s %s/%s: %s", KIND, kube.ns, name, why)
        kube.delete(name, _uid(existing))
        deadline = clock.monotonic() + params.delete_timeout_s
        while kube.get(name) is not None:
            if clock.monotonic() >= deadline:
                raise StepError(
                    f"{KIND} {kube.ns}/{name} was not gone {params.delete_timeout_s:.0f} s after "
                    "its deletion (paddlejob.delete_timeout_s): a finalizer, or the operator "
                    "is not running"
                )
            clock.sleep(min(params.poll_interval_s, 1.0))
    raise StepError(f"{KIND} {kube.ns}/{name}: created and deleted by someone else meanwhile")


def wait(
    kube: Kube,
    name: str,
    params: PaddleJobParams,
    logs: PodLogs,
    pods: PodStates,
    clock: Clock = SYSTEM_CLOCK,
) -> dict[str, Any]:
    """Poll the job until it succeeds (returned), fails, cannot run or times out (raised).
    Failed status reads are retried for ``paddlejob.api_outage_s``; then
    :class:`JobLeftRunning`."""
    deadline = clock.monotonic() + params.timeout_s
    seen: set[tuple[Any, ...]] = set()
    last: dict[str, Any] = {}
    outage_since: float | None = None
    while True:
        try:
            obj = kube.get(name)
        except ApiError as exc:
            if not exc.retryable:
                raise
            now = clock.monotonic()
            if outage_since is None:
                outage_since = now
            if now - outage_since >= params.api_outage_s:
                raise JobLeftRunning(
                    f"{KIND} {kube.ns}/{name}: its status could not be read for "
                    f"{now - outage_since:.0f} s (paddlejob.api_outage_s "
                    f"{params.api_outage_s:g}): {exc}. The job was left running: a retry of "
                    "this task reattaches to it (or: kubectl delete paddlejob -n "
                    f"{kube.ns} {name})"
                ) from exc
            log.warning("%s; retrying", exc)
        else:
            outage_since = None
            if obj is None:
                raise StepError(
                    f"{KIND} {kube.ns}/{name} disappeared while the launcher waited for it "
                    "(deleted by someone else, or by its TTL)"
                )
            for cond in conditions(obj):
                key = tuple(cond.get(k) for k in ("type", "status", "reason", "message"))
                if key not in seen:
                    seen.add(key)
                    last = cond
                    log.info(
                        "%s %s: %s=%s %s: %s",
                        KIND,
                        name,
                        cond.get("type"),
                        cond.get("status"),
                        cond.get("reason", ""),
                        cond.get("message", ""),
                    )
            listed = logs.poll()
            end = terminal(obj)
            if end is not None and end.get("type") == "Succeeded":
                return obj
            if end is not None:
                raise StepError(
                    f"{KIND} {kube.ns}/{name} failed: {end.get('reason', '')}: "
                    f"{end.get('message', '(no message)')}{logs.excerpt()}"
                )
            pods.check(listed)
        now = clock.monotonic()
        if now >= deadline:
            state = f"{last.get('type')}: {last.get('message', '')}" if last else "none yet"
            raise StepError(
                f"{KIND} {kube.ns}/{name} did not finish within {params.timeout_s:g} s "
                f"(paddlejob.timeout_s); last condition: {state}{logs.excerpt()}"
            )
        clock.sleep(min(params.poll_interval_s, deadline - now))


# --------------------------------------------------------------------------- the launch


def _delete_own(
    kube: Kube,
    name: str,
    run: str,
    uid: str | None,
    params: PaddleJobParams,
    timeout: float | None = None,
) -> None:
    """Delete the job of this launch unless ``paddlejob.keep_job``: by its uid when known,
    else the job of that name if its annotation names this run. Never raises: a failure is
    logged (beside the launch's own error, or after its success)."""
    where = f"{KIND} {params.namespace}/{name}"
    if params.keep_job:
        log.info("keeping %s (paddlejob.keep_job)", where)
        return
    try:
        if uid is None:  # the launch failed before it knew the job: is there one of this run?
            found = kube.get(name, timeout=timeout)
            if found is None:
                return
            if owner(found) != run:
                log.warning("not deleting %s: it belongs to run %r", where, owner(found))
                return
            uid = _uid(found)
        if kube.delete(name, uid, timeout=timeout):
            log.info("deleted %s", where)
    except Exception as exc:  # an ApiError; anything else is logged all the same
        log.error("could not delete %s: %s (ttlSecondsAfterFinished removes it)", where, exc)


def launch(
    *,
    task: Mapping[str, Any],
    train: Mapping[str, Any],
    paddlejob: Mapping[str, Any] | None,
    worker_resources: Mapping[str, Any],
    data_dir: str | Path,
    outputs: Outputs,
    run: str,
    env: Mapping[str, str] | None = None,
    source: str = "params.yaml",
    clock: Clock = SYSTEM_CLOCK,
) -> LaunchResult:
    """Run the train step as a PaddleJob of the KFP run ``run`` and copy its outputs (see
    the module's docstring); ``clock`` times its deadlines and polls."""
    env = os.environ if env is None else env
    run = check_run(run)
    params = typed(paddlejob, source)
    topo = topology(train, source)
    check_restart_policy(params, topo, source)
    if params.gpus_per_worker and topo.nproc > params.gpus_per_worker:
        raise StepError(
            f"{source}: train.distributed.nproc is {topo.nproc} but paddlejob.gpus_per_worker "
            f"is {params.gpus_per_worker}: each rank needs its own accelerator"
        )
    for var, value, name in (
        (PVC_ENV, params.pvc, "pvc"),
        (MOUNT_ENV, params.mount_path, "mount_path"),
    ):
        if env.get(var) and env[var] != value:
            raise StepError(
                f"{source}: paddlejob.{name} is {value!r} but the pipeline was compiled with "
                f"{env[var]!r} (it mounts the volume in the launcher): recompile with these params"
            )
    mount = Path(params.mount_path)
    if not mount.is_dir():
        raise StepError(
            f"paddlejob.mount_path {mount}: not a directory; the shared volume "
            f"(claim {params.pvc}) must be mounted there in this pod"
        )
    data_dir = Path(data_dir)
    name = f"{params.job_name_prefix}-{job_key(task, train, data_dir, run)}"
    run_dir = mount / params.runs_dir / name
    template = template_path(params)
    body = render(
        load_template(template),
        name=name,
        params=params,
        topo=topo,
        image=worker_image(params, env),
        run_dir=run_dir,
        worker_resources=worker_resources,
        run=run,
        source=str(template),
    )
    from components.kube.check import check_manifests

    check_manifests([body], require_digest=True, what=f"{KIND} {name} (from {template})")
    log.info(
        "%s %s/%s of run %s: %d node(s) x %d rank(s), %d %s per node, directory %s",
        KIND,
        params.namespace,
        name,
        run,
        topo.nnodes,
        topo.nproc,
        params.gpus_per_worker,
        params.accelerator,
        run_dir,
    )
    kube = Kube(api_client(params), params)
    logs = PodLogs(kube, name, params.log_tail_lines, clock)
    pods = PodStates(params.namespace, name, params.unschedulable_timeout_s, clock)
    created, uid = False, None
    with _termination() as term:
        try:
            term.armed = True
            stage(run_dir, data_dir, {"task": dict(task), "train": dict(train)})
            created, uid = ensure_job(kube, body, params, run_dir, clock)
            wait(kube, name, params, logs, pods, clock)
            metrics = collect(run_dir, name, outputs)  # before any cleanup
            term.armed = False
        except (JobLeftRunning, ForeignJob):
            term.armed = False
            raise  # not this launcher's to delete (see the module's docstring, 6. and 2.)
        except BaseException as exc:
            term.armed = False
            quick = min(params.api_timeout_s, TERM_API_TIMEOUT_S)
            if isinstance(exc, Terminated) or term.received:  # the job first, then the logs
                _delete_own(kube, name, run, uid, params, timeout=quick)
                logs.poll(deadline=clock.monotonic() + TERM_LOGS_S)
            else:  # the end of the logs, before the pods go (cut short by a SIGTERM)
                logs.poll(deadline=clock.monotonic() + params.api_timeout_s, stop=term.is_set)
                _delete_own(kube, name, run, uid, params, timeout=quick if term.is_set() else None)
            raise
        _delete_own(kube, name, run, uid, params)  # logged, not raised: the outputs are in
    if not params.keep_run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    return LaunchResult(name, params.namespace, "Succeeded", created, metrics)


# --------------------------------------------------------------------------- KFP


def kfp_main(args: Mapping[str, Any]) -> None:
    """Body of the KFP component: :func:`launch` on the artifacts' paths, then the metrics
    KFP shows (as the train task's ``Metrics`` output does)."""
    from components.kernel.cli import setup_logging
    from components.kernel.kfp import numeric

    setup_logging()
    result = launch(
        task=args["task"],
        train=args["train"],
        paddlejob=args["paddlejob"],
        worker_resources=args["worker_resources"],
        data_dir=args["data"].path,
        outputs=Outputs(
            model=Path(args["model"].path),
            checkpoints=Path(args["checkpoints"].path),
            metrics=Path(args["metrics"].path),
            plots=Path(args["plots"].path),
        ),
        run=args["run"],
    )
    for key, value in numeric(result.metrics).items():
        args["metrics"].log_metric(key, value)


def paddlejob_train_op(
    task: dict,
    train: dict,
    paddlejob: dict,
    worker_resources: dict,
    run: str,
    data: Input[Dataset],
    validation: Input[Artifact],
    model: Output[Model],
    checkpoints: Output[Artifact],
    metrics: Output[Metrics],
    plots: Output[Artifact],
):
    """train on a Kubeflow PaddleJob (train.distributed.nnodes pods on a shared volume);
    ``run``: the KFP run's id (dsl.PIPELINE_JOB_ID_PLACEHOLDER), the job's owner."""
    from pipelines.paddlejob import kfp_main

    kfp_main(locals())


def paddlejob_component(image: str) -> Any:
    """The launcher's component in ``image`` (the component image, kfp preinstalled)."""
    return dsl.component(base_image=image, install_kfp_package=False)(paddlejob_train_op)
