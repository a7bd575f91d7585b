"""The launch: create or reuse the run's job, wait for it, collect its outputs and clean
up, also after a failure or a SIGTERM (see the package's docstring, 5. to 8.)."""

import contextlib
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.core import overrides
from components.core.artifacts import StepError
from components.core.config import Params
from components.core.retry import SYSTEM_CLOCK, Backoff, Clock, poll
from pipelines.paddlejob.api import Kube, api_client, owner
from pipelines.paddlejob.spec import (
    KIND,
    MOUNT_ENV,
    PVC_ENV,
    RUN_ANNOTATION,
    SPEC_ANNOTATION,
    Outputs,
    PaddleJobParams,
    Topology,
    check_restart_policy,
    check_run,
    load_template,
    render,
    template_path,
    topology,
    typed,
    worker_image,
)
from pipelines.paddlejob.volume import collect, job_key, missing_outputs, stage
from pipelines.paddlejob.watch import (
    JobLeftRunning,
    PodLogs,
    PodStates,
    terminal,
    wait,
)

log = logging.getLogger(__package__)  # "pipelines.paddlejob": one logger, as before the split

# after SIGTERM, within the pod's termination grace period (Kubernetes' default: 30 s)
TERM_API_TIMEOUT_S = 10.0  # each request of the job's deletion (at most paddlejob.api_timeout_s)
TERM_LOGS_S = 5.0  # the pods' last log lines, after the deletion


@dataclass
class LaunchResult:
    job: str
    namespace: str
    state: str  # Succeeded (a failure raises)
    created: bool  # False: an existing job of the same name, run and spec was reused
    metrics: dict[str, Any] = field(default_factory=dict)


class ForeignJob(StepError):
    """A job of this name belongs to another run (or to none): neither reused nor deleted."""


class Terminated(StepError):
    """SIGTERM: the run was cancelled, or the launcher's pod is going away."""


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
        every = min(params.poll_interval_s, 1.0)
        backoff = Backoff(every, every, factor=1, deadline_s=params.delete_timeout_s)
        if not poll(lambda: kube.get(name) is None, backoff, clock=clock):
            raise StepError(
                f"{KIND} {kube.ns}/{name} was not gone {params.delete_timeout_s:.0f} s after "
                "its deletion (paddlejob.delete_timeout_s): a finalizer, or the operator "
                "is not running"
            )
    raise StepError(f"{KIND} {kube.ns}/{name}: created and deleted by someone else meanwhile")


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
    hpo_dir: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    source: str = "params.yaml",
    clock: Clock = SYSTEM_CLOCK,
) -> LaunchResult:
    """Run the train step as a PaddleJob of the KFP run ``run`` and copy its outputs (see
    the package's docstring); ``hpo_dir``: the hpo step's output (its adopted overlay is
    applied to ``task``/``train``, as the train step applies it); ``clock`` times its
    deadlines and polls."""
    env = os.environ if env is None else env
    run = check_run(run)
    task, train = overlaid(task, train, hpo_dir, source)
    params, topo = _checked_params(train, paddlejob, env, source)
    data_dir = Path(data_dir)
    name = f"{params.job_name_prefix}-{job_key(task, train, data_dir, run)}"
    run_dir = Path(params.mount_path) / params.runs_dir / name
    body = _job_body(name, params, topo, env, run_dir, worker_resources, run)
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
    sections = {"task": dict(task), "train": dict(train)}
    created, metrics = _run_job(
        kube, body, params, run, run_dir, data_dir, sections, outputs, clock
    )
    if not params.keep_run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    return LaunchResult(name, params.namespace, "Succeeded", created, metrics)


def overlaid(
    task: Mapping[str, Any],
    train: Mapping[str, Any],
    hpo_dir: str | Path | None,
    source: str = "params.yaml",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``task`` and ``train`` with a search's adopted overlay (``hpo_dir/overlay.yaml``)
    applied, as the train step's ``--hpo`` input applies it: what the workers' staged
    params.yaml holds and the job's name hashes. No directory, or not adopted: unchanged."""
    sets = overrides.read_overlay(hpo_dir)
    if not sets:
        return dict(task), dict(train)
    params = Params({"task": dict(task), "train": dict(train)})
    params.source = source
    what = f"{Path(str(hpo_dir)) / overrides.OVERLAY}: params:"
    merged = overrides.override(params, sets, what=what)
    return dict(merged["task"]), dict(merged["train"])


def _checked_params(
    train: Mapping[str, Any],
    paddlejob: Mapping[str, Any] | None,
    env: Mapping[str, str],
    source: str,
) -> tuple[PaddleJobParams, Topology]:
    """The ``paddlejob`` section and the topology, checked against each other, against the
    volume the pipeline was compiled with and against the volume mounted in this pod."""
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
    return params, topo


def _job_body(
    name: str,
    params: PaddleJobParams,
    topo: Topology,
    env: Mapping[str, str],
    run_dir: Path,
    worker_resources: Mapping[str, Any],
    run: str,
) -> dict[str, Any]:
    """The job of this run, rendered from the template and checked (the CRD's schema, the
    hardening policy, a real digest)."""
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
    return body


def _run_job(
    kube: Kube,
    body: Mapping[str, Any],
    params: PaddleJobParams,
    run: str,
    run_dir: Path,
    data_dir: Path,
    sections: Mapping[str, Any],
    outputs: Outputs,
    clock: Clock,
) -> tuple[bool, dict[str, Any]]:
    """Stage, create or reuse the job, wait for it and collect its outputs, under SIGTERM's
    handling; then delete the job (also after a failure, see the package's docstring, 8.).
    Returns (True when this launch created the job, the metrics)."""
    name = body["metadata"]["name"]
    logs = PodLogs(kube, name, params.log_tail_lines, clock)
    pods = PodStates(params.namespace, name, params.unschedulable_timeout_s, clock)
    created, uid = False, None
    with _termination() as term:
        try:
            term.armed = True
            stage(run_dir, data_dir, sections)
            created, uid = ensure_job(kube, body, params, run_dir, clock)
            wait(kube, name, params, logs, pods, clock)
            metrics = collect(run_dir, name, outputs)  # before any cleanup
            term.armed = False
        except (JobLeftRunning, ForeignJob):
            term.armed = False
            raise  # not this launcher's to delete (see the package's docstring, 6. and 2.)
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
    return created, metrics
