"""The train step on a Kubeflow training-operator PaddleJob: the pipeline's launcher task.

A pipeline compiled with ``params.yaml: train.distributed.backend: paddlejob`` runs this
component where the train task would be (``pipelines/training.py``); it has the train task's
inputs and outputs (``data``, ``validation`` in; ``model``, ``checkpoints``, ``metrics``,
``plots`` out), so every later step is wired to it unchanged. In its pod it:

1. checks the run's params: ``train.distributed.backend`` is ``paddlejob``,
   ``train.distributed.nnodes``/``nproc``, the ``paddlejob`` section (:class:`PaddleJobParams`);
2. names the job ``<paddlejob.job_name_prefix>-<12 hex>``, a hash of the ``task`` and ``train``
   sections and of the data set's bytes: the same on every KFP retry (and rerun) of the same
   training, so a retry finds its job and its checkpoints;
3. stages the data set and a ``params.yaml`` (``task`` + ``train``) into that job's directory on
   the shared ReadWriteMany volume (``paddlejob.pvc`` at ``paddlejob.mount_path``, mounted in
   this pod by the pipeline and in every worker by the PaddleJob);
4. renders ``k8s/paddlejob/paddlejob.yaml`` (Worker replicas = nnodes, the component image by
   digest from ``$PADDLE_MLOPS_IMAGE`` (``$PADDLE_MLOPS_GPU_IMAGE`` with GPUs) or
   ``paddlejob.image``, resources from ``params.yaml: resources.train`` (compiled in), GPUs per
   worker as limits of ``paddlejob.accelerator``, runPolicy) and checks it with
   ``components.k8s_check`` (the CRD's schema, the hardening policy, a real digest);
5. creates it with the official ``kubernetes`` client (in-cluster config, else the kubeconfig:
   ``$KUBECONFIG``, context ``paddlejob.kube_context``). If a job of that name exists (a retry)
   it is reused when it has the same spec (annotation ``paddle-mlops/spec-sha256``) and has
   not failed, else deleted and created again; the train step resumes from the checkpoints;
6. waits at most ``paddlejob.timeout_s``, polling every ``paddlejob.poll_interval_s``: each new
   status condition is logged, and the new lines of every pod's log (pods selected by the
   operator's label ``training.kubeflow.org/job-name``) go to this task's log;
7. on ``Succeeded`` copies model, checkpoints, metrics and plots (global rank 0 wrote them to the
   job's directory) into the output artifacts; on ``Failed`` or the timeout raises
   ``StepError`` naming the job and the operator's condition message (and the end of each
   pod's log);
8. always deletes the PaddleJob at the end (its pods and Services go with it), unless
   ``paddlejob.keep_job``; removes the job's directory after a success unless
   ``paddlejob.keep_run_dir`` (after a failure it stays: the checkpoints a retry resumes from).

The operator's env contract (training-operator release-1.9,
``pkg/controller.v1/paddlepaddle/envvar.go``): with Worker replicas only (collective mode)
``PADDLE_MASTER`` is ``$(POD_IP):<port named master>`` in worker 0 and
``<job>-worker-0:<port>`` in the others, ``PADDLE_NNODES`` the number of replicas,
``PADDLE_JOB_ID`` the job's name, ``PYTHONUNBUFFERED=1``. The template has no Master replica
on purpose: with one the operator runs its parameter-server mode (it adds
``PADDLE_SERVER_NUM``/``PADDLE_TRAINER_NUM``, which make ``paddle.distributed.launch`` start
PS training instead of collective data parallel).

Identity: the pipeline runner's ServiceAccount needs create/get/list/watch/delete on
``paddlejobs`` (kubeflow.org) and get/list on ``pods`` and ``pods/log``
(``k8s/pipelines/rbac.yaml``: Role ``paddle-mlops-paddlejob``).
"""

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from components.artifacts import (
    StepError,
    atomic_path,
    combined_sha256,
    read_json,
    sha256_bytes,
    sha256_tree,
    write_text,
)

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


@dataclass(frozen=True)
class PaddleJobParams:
    """``params.yaml: paddlejob``: where and how the launcher runs training as a PaddleJob."""

    namespace: str = "paddle-mlops"  # of the PaddleJob: the pipeline's (the PVC is there)
    pvc: str = "paddle-mlops-shared"  # ReadWriteMany claim shared by launcher and workers
    mount_path: str = "/mnt/shared"  # where the launcher and every worker mount it
    runs_dir: str = "paddlejob-runs"  # below mount_path: one directory per job
    image: str | None = None  # worker image ref@sha256; default $PADDLE_MLOPS_(GPU_)IMAGE
    gpus_per_worker: int = 0  # accelerators per pod, shared by its nproc ranks
    accelerator: str = "nvidia.com/gpu"  # the extended resource name of one accelerator
    master_port: int = 36543  # the container port named master: the rendezvous on worker 0
    shm_size: str = "1Gi"  # /dev/shm (memory-backed emptyDir): DataLoader workers, NCCL
    restart_policy: Literal["Never", "OnFailure", "ExitCode"] = "Never"
    backoff_limit: int = 0  # runPolicy.backoffLimit (restarts with OnFailure/ExitCode)
    clean_pod_policy: Literal["None", "Running", "All"] = "None"
    ttl_seconds_after_finished: int = 86400  # runPolicy: cleanup of a job left behind
    timeout_s: float = 86400.0  # the launcher's wait, and runPolicy.activeDeadlineSeconds
    poll_interval_s: float = 10.0  # status and logs
    delete_timeout_s: float = 120.0  # wait for a replaced job to be gone
    api_timeout_s: float = 30.0  # one API request
    api_retries: int = 5  # consecutive failed status reads tolerated while waiting
    log_tail_lines: int = 20  # of each pod's log, quoted in the error of a failed job
    keep_job: bool = False  # leave the finished PaddleJob (and its pods) for inspection
    keep_run_dir: bool = False  # leave the job's directory on the volume after a success
    job_name_prefix: str = "paddle-mlops-train"
    kube_context: str | None = None  # kubeconfig context (outside a cluster)
    template: str = "k8s/paddlejob/paddlejob.yaml"

    def check(self) -> None:
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
        if self.gpus_per_worker < 0:
            raise ValueError("gpus_per_worker must be >= 0")
        if not 0 < self.master_port < 65536:
            raise ValueError("master_port must be a TCP port")
        for name in ("timeout_s", "poll_interval_s", "delete_timeout_s", "api_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("backoff_limit", "ttl_seconds_after_finished", "api_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.log_tail_lines < 1:
            raise ValueError("log_tail_lines must be >= 1")


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
    created: bool  # False: an existing job of the same name and spec was reused
    metrics: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- params


def load_params(section: Mapping[str, Any] | None, source: str = "params.yaml") -> PaddleJobParams:
    """The ``paddlejob`` section, typed; errors name ``source: paddlejob.<field>``."""
    from components.config import from_dict

    return from_dict(PaddleJobParams, dict(section or {}), where=f"{source}: paddlejob")


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


def job_key(task: Mapping[str, Any], train: Mapping[str, Any], data_dir: Path) -> str:
    """12 hex digits of what the training's result depends on: the ``task`` and ``train``
    sections and the data set's bytes (its ``manifest.json``, with a timestamp, left out)."""
    files = {k: v for k, v in sha256_tree(data_dir).items() if k != "manifest.json"}
    if not files:
        raise StepError(f"{data_dir}: the data set is empty (did ingest run?)")
    blob = json.dumps(
        {"task": task, "train": train, "data": combined_sha256(files)}, sort_keys=True
    )
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
    from components.k8s_check import load_manifests

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
    source: str = "k8s/paddlejob/paddlejob.yaml",
) -> dict[str, Any]:
    """The PaddleJob of one run, from the template; annotated with the sha256 of its spec."""
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
    meta.setdefault("annotations", {})[SPEC_ANNOTATION] = spec_sha256(doc)
    return doc


def spec_sha256(doc: Mapping[str, Any]) -> str:
    return sha256_bytes(json.dumps(doc.get("spec"), sort_keys=True).encode())


# --------------------------------------------------------------------------- the volume


def stage(run_dir: Path, data_dir: Path, sections: Mapping[str, Any]) -> None:
    """The data set and params.yaml in the job's directory (the data copied once: its
    bytes are part of the job's name, so an existing copy is the same data)."""
    import yaml

    run_dir.mkdir(parents=True, exist_ok=True)
    data = run_dir / "data"
    if data.is_dir():
        log.info("data already staged in %s (a retry of the same training)", data)
    else:
        with atomic_path(data) as tmp:
            shutil.copytree(data_dir, tmp)
        log.info("staged the data set into %s", data)
    write_text(run_dir / "params.yaml", yaml.safe_dump(dict(sections), sort_keys=False))


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
    return client.ApiClient(configuration)


def api_message(exc: Exception) -> str:
    """An ApiException's status, reason and the API server's message."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    body = getattr(exc, "body", None)
    message = ""
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = str(body)[:300]
    return f"HTTP {status} {reason}" + (f": {message}" if message else "")


class Kube:
    """The few calls the launcher makes, with the client's typed APIs."""

    def __init__(self, api: Any, params: PaddleJobParams) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.ns = params.namespace
        self.timeout = params.api_timeout_s

    def create(self, body: Mapping[str, Any]) -> bool:
        """True when created, False when a job of that name exists."""
        from kubernetes.client.exceptions import ApiException

        name = body["metadata"]["name"]
        try:
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, body, _request_timeout=self.timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise StepError(f"create {KIND} {self.ns}/{name}: {api_message(exc)}") from exc
        return True

    def get(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, name, _request_timeout=self.timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, name: str) -> bool:
        """Delete the job (its pods and Services are its dependents); False if it was gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.ns,
                PLURAL,
                name,
                propagation_policy="Background",
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise StepError(f"delete {KIND} {self.ns}/{name}: {api_message(exc)}") from exc
        return True

    def pods(self, job: str) -> list[Any]:
        found = self.core.list_namespaced_pod(
            self.ns, label_selector=f"{JOB_NAME_LABEL}={job}", _request_timeout=self.timeout
        )
        return sorted(found.items or [], key=lambda p: p.metadata.name)

    def log(self, pod: str, since_seconds: int | None) -> str:
        kwargs: dict[str, Any] = {"container": CONTAINER, "timestamps": True}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        return self.core.read_namespaced_pod_log(
            pod, self.ns, _request_timeout=self.timeout, **kwargs
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


def _timestamp(ts: str) -> tuple[str, int]:
    """An RFC 3339 timestamp of the kubelet (UTC, fraction with its zeros trimmed) as a key
    that sorts like time."""
    whole, _, frac = ts.rstrip("Z").partition(".")
    return whole, int((frac + "000000000")[:9]) if frac.isdigit() else 0


class PodLogs:
    """New lines of the ``paddle`` container of every pod of a job, into this log.

    Each pass asks for the lines since the previous pass (plus a margin) with the kubelet's
    timestamps and drops those already shown; the last lines of each pod are kept for the
    error of a failed job."""

    MARGIN_S = 5

    def __init__(self, kube: Kube, job: str, tail: int) -> None:
        self.kube, self.job = kube, job
        self.last: dict[str, tuple[tuple[str, int], int]] = {}  # pod -> (newest ts, lines at it)
        self.fetched: dict[str, float] = {}  # pod -> monotonic time of its last fetch
        self.tails: dict[str, deque[str]] = {}
        self.tail = tail
        self.failures = 0

    def poll(self) -> None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            pods = self.kube.pods(self.job)
        except (ApiException, HTTPError) as exc:
            self._failed(f"list pods of {self.job}", exc)
            return
        for pod in pods:
            name = pod.metadata.name
            if (pod.status and pod.status.phase) == "Pending":
                continue
            since = None
            if name in self.fetched:
                since = math.ceil(time.monotonic() - self.fetched[name]) + self.MARGIN_S
            started = time.monotonic()
            try:
                text = self.kube.log(name, since)
            except (ApiException, HTTPError) as exc:
                if getattr(exc, "status", None) == 400:  # the container is not running yet
                    log.debug("no log of %s yet: %s", name, api_message(exc))
                else:
                    self._failed(f"log of pod {name}", exc)
                continue
            self.fetched[name] = started
            self._emit(name, text)

    def _failed(self, what: str, exc: Exception) -> None:
        self.failures += 1
        reason = api_message(exc) if hasattr(exc, "status") else str(exc)
        log.warning("%s: %s (the job's status still decides)", what, reason)

    def _emit(self, pod: str, text: str) -> None:
        newest, count = self.last.get(pod, (("", -1), 0))
        tail = self.tails.setdefault(pod, deque(maxlen=self.tail))
        seen_at_newest = 0
        for line in text.splitlines():
            ts, _, message = line.partition(" ")
            key = _timestamp(ts)
            if key < newest:
                continue
            if key == newest:
                seen_at_newest += 1
                if seen_at_newest <= count:
                    continue
                count += 1
            else:
                newest, count, seen_at_newest = key, 1, 1
            tail.append(message)
            log.info("[%s] %s", pod, message)
        self.last[pod] = (newest, count)

    def excerpt(self) -> str:
        return "".join(
            f"\n{pod} (last lines):\n  " + "\n  ".join(lines)
            for pod, lines in sorted(self.tails.items())
            if lines
        )


@contextlib.contextmanager
def _terminated_as_error() -> Iterator[None]:
    """SIGTERM (the pod stopped, the run cancelled) raises here, so the job is deleted."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: Any) -> None:
        raise StepError(f"the launcher received signal {signum}: stopping")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def ensure_job(kube: Kube, body: Mapping[str, Any], params: PaddleJobParams, run_dir: Path) -> bool:
    """Create the job; a job of the same name (a retry) is reused when it has the same spec
    and has not failed (a succeeded one only if its outputs are there), else replaced.
    True when this call created it."""
    name = body["metadata"]["name"]
    if kube.create(body):
        log.info("created %s %s/%s", KIND, kube.ns, name)
        return True
    existing = kube.get(name)
    if existing is not None:
        theirs = (existing.get("metadata", {}).get("annotations") or {}).get(SPEC_ANNOTATION)
        same = theirs == body["metadata"]["annotations"][SPEC_ANNOTATION]
        end = terminal(existing)
        state = end.get("type") if end else "running"
        done_without_outputs = state == "Succeeded" and missing_outputs(run_dir)
        if same and state != "Failed" and not done_without_outputs:
            log.info("reusing %s %s/%s of the same spec (%s)", KIND, kube.ns, name, state)
            return False
        why = "another spec" if not same else f"it is {state}"
        if done_without_outputs:
            why = "it succeeded but its outputs are gone"
        log.info("replacing %s %s/%s: %s", KIND, kube.ns, name, why)
        kube.delete(name)
        deadline = time.monotonic() + params.delete_timeout_s
        while kube.get(name) is not None:
            if time.monotonic() >= deadline:
                raise StepError(
                    f"{KIND} {kube.ns}/{name} was not gone {params.delete_timeout_s:.0f} s after "
                    "its deletion (paddlejob.delete_timeout_s): a finalizer, or the operator "
                    "is not running"
                )
            time.sleep(min(params.poll_interval_s, 1.0))
    if not kube.create(body):
        raise StepError(f"{KIND} {kube.ns}/{name} exists again right after its deletion")
    log.info("created %s %s/%s", KIND, kube.ns, name)
    return True


def _retryable(exc: Exception) -> bool:
    """A failed read worth repeating: the API server busy or unreachable for a moment."""
    status = getattr(exc, "status", None)
    return status is None or status == 429 or status >= 500


def wait(kube: Kube, name: str, params: PaddleJobParams, logs: PodLogs) -> dict[str, Any]:
    """Poll the job until it succeeds (returned), fails or times out (raised)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    deadline = time.monotonic() + params.timeout_s
    seen: set[tuple[Any, ...]] = set()
    last: dict[str, Any] = {}
    errors = 0
    while True:
        obj: dict[str, Any] | None = None
        try:
            obj = kube.get(name)
        except (ApiException, HTTPError) as exc:
            errors += 1
            what = api_message(exc) if isinstance(exc, ApiException) else str(exc)
            if not _retryable(exc) or errors > params.api_retries:
                raise StepError(
                    f"{KIND} {kube.ns}/{name}: reading its status failed ({errors} time(s) in a "
                    f"row, paddlejob.api_retries {params.api_retries}): {what}"
                ) from exc
            log.warning("reading %s %s failed (%s); retrying", KIND, name, what)
        else:
            errors = 0
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
            logs.poll()
            end = terminal(obj)
            if end is not None and end.get("type") == "Succeeded":
                return obj
            if end is not None:
                raise StepError(
                    f"{KIND} {kube.ns}/{name} failed: {end.get('reason', '')}: "
                    f"{end.get('message', '(no message)')}{logs.excerpt()}"
                )
        now = time.monotonic()
        if now >= deadline:
            state = f"{last.get('type')}: {last.get('message', '')}" if last else "none yet"
            raise StepError(
                f"{KIND} {kube.ns}/{name} did not finish within {params.timeout_s:g} s "
                f"(paddlejob.timeout_s); last condition: {state}{logs.excerpt()}"
            )
        time.sleep(min(params.poll_interval_s, deadline - now))


# --------------------------------------------------------------------------- the launch


def _cleanup(kube: Kube, name: str, params: PaddleJobParams, *, raise_errors: bool) -> None:
    """Delete the job unless ``paddlejob.keep_job``; a failed deletion is an error of its own
    only when nothing failed before (else it is logged beside the first error)."""
    if params.keep_job:
        log.info("keeping %s %s/%s (paddlejob.keep_job)", KIND, params.namespace, name)
        return
    try:
        if kube.delete(name):
            log.info("deleted %s %s/%s", KIND, params.namespace, name)
    except Exception as exc:
        if raise_errors:
            raise
        log.error("could not delete %s %s/%s: %s", KIND, params.namespace, name, exc)


def launch(
    *,
    task: Mapping[str, Any],
    train: Mapping[str, Any],
    paddlejob: Mapping[str, Any] | None,
    worker_resources: Mapping[str, Any],
    data_dir: str | Path,
    outputs: Outputs,
    env: Mapping[str, str] | None = None,
    source: str = "params.yaml",
) -> LaunchResult:
    """Run the train step as a PaddleJob and copy its outputs (see the module's docstring)."""
    env = os.environ if env is None else env
    params = load_params(paddlejob, source)
    topo = topology(train, source)
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
    name = f"{params.job_name_prefix}-{job_key(task, train, data_dir)}"
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
        source=str(template),
    )
    from components.k8s_check import check_manifests

    check_manifests([body], require_digest=True, what=f"{KIND} {name} (from {template})")
    stage(run_dir, data_dir, {"task": dict(task), "train": dict(train)})
    log.info(
        "%s %s/%s: %d node(s) x %d rank(s), %d %s per node, directory %s",
        KIND,
        params.namespace,
        name,
        topo.nnodes,
        topo.nproc,
        params.gpus_per_worker,
        params.accelerator,
        run_dir,
    )
    from kubernetes.client.exceptions import ApiException

    kube = Kube(api_client(params), params)
    logs = PodLogs(kube, name, params.log_tail_lines)
    created, failed = False, False
    try:
        with _terminated_as_error():
            created = ensure_job(kube, body, params, run_dir)
            wait(kube, name, params, logs)
    except ApiException as exc:
        failed = True
        raise StepError(f"{KIND} {params.namespace}/{name}: {api_message(exc)}") from exc
    except BaseException:
        failed = True
        raise
    finally:
        with contextlib.suppress(Exception):  # the end of the logs, before the pods go
            logs.poll()
        _cleanup(kube, name, params, raise_errors=not failed)
    metrics = collect(run_dir, name, outputs)
    if not params.keep_run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    return LaunchResult(name, params.namespace, "Succeeded", created, metrics)


# --------------------------------------------------------------------------- KFP


def kfp_main(args: Mapping[str, Any]) -> None:
    """Body of the KFP component: :func:`launch` on the artifacts' paths, then the metrics
    KFP shows (as the train task's ``Metrics`` output does)."""
    from components.cli import setup_logging
    from components.step import numeric

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
    )
    for key, value in numeric(result.metrics).items():
        args["metrics"].log_metric(key, value)


def paddlejob_train_op(
    task: dict,
    train: dict,
    paddlejob: dict,
    worker_resources: dict,
    data: Input[Dataset],
    validation: Input[Artifact],
    model: Output[Model],
    checkpoints: Output[Artifact],
    metrics: Output[Metrics],
    plots: Output[Artifact],
):
    """train on a Kubeflow PaddleJob (train.distributed.nnodes pods on a shared volume)."""
    from pipelines.paddlejob import kfp_main

    kfp_main(locals())


def paddlejob_component(image: str) -> Any:
    """The launcher's component in ``image`` (the component image, kfp preinstalled)."""
    return dsl.component(base_image=image, install_kfp_package=False)(paddlejob_train_op)
