"""What a launch is made of: the ``paddlejob`` params, the run's topology and id, the
operator's and the template's contract, and the PaddleJob rendered from
``k8s/paddlejob/paddlejob.yaml`` (see the package's docstring, 1., 2. and 4.)."""

import copy
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from components.core.artifacts import StepError, sha256_bytes
from components.core.config import params_model, section

REPO = Path(__file__).resolve().parents[2]

# kubeflow/training-operator release-1.9 (pkg/apis/kubeflow.org/v1)
GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "paddlejobs", "PaddleJob"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"  # common_types.go JobNameLabel
REPLICA_TYPE = "Worker"  # collective mode: no Master replica (see the package's docstring)
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
_PREFIX = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# "<prefix>-<12 hex>-worker-<index>" names the operator's pods and Services (DNS-1035, <= 63)
MAX_PREFIX = 63 - len("-") - 12 - len("-worker-") - 4


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
