"""Data-parallel training: the launch, the env contract and the collectives the train step uses.

Library layer (imports no step). One process per rank, started by Paddle's own launcher,
``python -m paddle.distributed.launch``; every rank runs the ordinary train CLI again.

- **Locally** (``dvc repro``, a test, a KFP task): ``train.distributed.nproc`` > 1 makes the
  train step start ``nproc`` ranks on this machine (gloo on CPU, NCCL on GPU), bound to
  ``train.distributed.host`` (127.0.0.1: the traffic stays on loopback).
- **On a cluster**: the Kubeflow training-operator starts every replica of a ``PaddleJob``
  with ``PADDLE_MASTER`` (host:port of the rendezvous), ``PADDLE_NNODES`` (replicas) and
  ``PADDLE_JOB_ID`` in its environment. The same train CLI reads them (:func:`plan`) and
  starts ``nproc`` ranks per node the same way: a local launch and a PaddleJob run identical
  code. ``PADDLE_MASTER``/``PADDLE_NNODES`` set by hand do the same on any set of machines.

Inside a rank (:class:`World`), the train step reads its own disjoint run of each epoch's
samples (:class:`EpochShare`: equal steps on every rank, the remainder rule), averages
gradients with ``paddle.DataParallel`` and keeps every side effect (checkpoints, outputs,
metrics) on global rank 0.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from components.core import children
from components.core.artifacts import StepError
from components.core.config import params_model

log = logging.getLogger(__name__)

# set in the environment of the ranks we launch: a rank runs the step, it does not launch
LAUNCHED_ENV = "PADDLE_MLOPS_RANK"
# the env contract of the Kubeflow training-operator (PaddleJob, collective mode)
MASTER_ENV, NNODES_ENV, JOB_ID_ENV = "PADDLE_MASTER", "PADDLE_NNODES", "PADDLE_JOB_ID"
# what paddle.distributed.launch reads from the environment over its flags: the values we
# resolved go in as flags, so these are taken out of the launcher's environment
_LAUNCH_ENV = (
    MASTER_ENV,
    NNODES_ENV,
    JOB_ID_ENV,
    "PADDLE_NPROC_PER_NODE",
    "PADDLE_LOG_DIR",
    "PADDLE_LOG_OVERWRITE",
    "PADDLE_TRAINER_ID",
    "PADDLE_RANK",
    "POD_IP",
)
# What a rank's environment keeps of the step's: an allowlist (the launcher also dumps each
# rank's environment to backup_env.N.json in the log dir), minus anything named like a
# credential. A rank trains on local files: it needs no tracking or storage credentials.
_RANK_ENV = re.compile(
    r"^(PATH|HOME|USER|LOGNAME|SHELL|LANG|LANGUAGE|TZ|TMPDIR|TERM|HOSTNAME|VIRTUAL_ENV"
    r"|LD_LIBRARY_PATH|LC_\w+|PYTHON\w*|PADDLE\w*|FLAGS_\w+|GLOG_\w+|CUDA\w*|NCCL_\w+"
    r"|GLOO_\w+|NVIDIA_\w+|OMP_\w+|MKL_\w+|KMP_\w+|OPENBLAS_\w+|HF_\w+|PPNLP_\w+"
    r"|XDG_\w+|SSL_CERT_\w+|REQUESTS_CA_BUNDLE|POD_\w+|LOG_LEVEL|MPLCONFIGDIR)$"
)
_SECRET = re.compile(r"PASSW|SECRET|TOKEN|CREDENTIAL|_KEY|PRIVATE|AUTH", re.IGNORECASE)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_MASTER = re.compile(r"^\[?[A-Za-z0-9_.:-]+?\]?:(\d{1,5})$")


@params_model
class DistributedParams:
    """``train.distributed``: how many ranks, where they meet, how the batch is split."""

    nproc: Annotated[int, Field(ge=1)] = 1  # ranks on each node (GPU: one per device)
    nnodes: Annotated[int, Field(ge=1)] = 1  # nodes; a PaddleJob's PADDLE_NNODES wins

    # gloo (CPU) | nccl (GPU) | auto: by device | paddlejob: Kubeflow starts the nodes
    # (the train step in a PaddleJob pod runs like auto)
    backend: Literal["auto", "gloo", "nccl", "paddlejob"] = "auto"
    master: str | None = None  # host:port of the rendezvous; PADDLE_MASTER wins
    host: str | None = "127.0.0.1"  # address of this node's ranks on one node or loopback
    # global: train.batch_size is the batch of one optimizer step over all ranks (same math
    # at any world size); per_rank: each rank takes train.batch_size (global = x world size)
    batch: Literal["global", "per_rank"] = "global"
    # learning rate actually used = train.learning_rate x (global batch / lr_base_batch)^k,
    # k = 1 (linear, Goyal et al. 2017), 1/2 (sqrt) or 0 (none)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    lr_base_batch: Annotated[int, Field(ge=1)] = 32
    log_dir: str | None = None  # the ranks' logs (workerlog.N); default: a temporary dir

    @model_validator(mode="after")
    def _master_is_host_port(self) -> DistributedParams:
        if self.master is not None and not is_master(self.master):
            raise ValueError(f"master: {self.master!r} is not host:port (e.g. 10.0.0.5:36543)")
        return self


def is_master(value: str) -> bool:
    """``value`` is ``host:port`` with a port in 1..65535."""
    match = _MASTER.match(value)
    return bool(match) and 0 < int(match.group(1)) < 65536


@dataclass(frozen=True)
class Batching:
    """The batch and learning rate one run really uses, recorded with the model."""

    world_size: int
    global_batch: int  # samples per optimizer step, all ranks together
    per_rank_batch: int  # the most samples one rank takes per step
    learning_rate: float  # after lr_scaling
    lr_scaling: str
    lr_base_batch: int

    @classmethod
    def resolve(
        cls, params: DistributedParams, batch_size: int, learning_rate: float, world_size: int
    ) -> Batching:
        global_batch = batch_size * world_size if params.batch == "per_rank" else batch_size
        power = {"none": 0.0, "linear": 1.0, "sqrt": 0.5}[params.lr_scaling]
        return cls(
            world_size=world_size,
            global_batch=global_batch,
            per_rank_batch=-(-global_batch // world_size),
            learning_rate=learning_rate * (global_batch / params.lr_base_batch) ** power,
            lr_scaling=params.lr_scaling,
            lr_base_batch=params.lr_base_batch,
        )

    def facts(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "per_rank_batch": self.per_rank_batch,
            "learning_rate_effective": self.learning_rate,
            "lr_scaling": self.lr_scaling,
        }


@dataclass(frozen=True)
class EpochShare:
    """How the ranks share one epoch of ``rows`` training samples (docs/distributed.md).

    The epoch's samples, in its piece order (the same on every rank), are cut into one
    contiguous run per rank, so the ranks read disjoint samples. Every optimizer step takes
    ``global_batch`` samples, ``global_batch // world_size`` from each rank (the first
    ``global_batch % world_size`` ranks one more). The ``rows % global_batch`` samples left
    form a last, smaller step shared the same way when there are at least ``world_size`` of
    them; fewer (a rank would have none) are **not read in that epoch**: at most
    ``world_size - 1`` samples, the last in that epoch's order, which changes every epoch. One
    process drops nothing. Every rank therefore runs :attr:`steps` steps, and each weights
    its mean loss by :meth:`weight` so that the gradient average ``paddle.DataParallel`` takes
    is the global batch's mean."""

    rows: int
    global_batch: int
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.global_batch < self.world_size:
            raise ValueError(
                f"a global batch of {self.global_batch} cannot be shared by {self.world_size} ranks"
            )

    @property
    def full_steps(self) -> int:
        return self.rows // self.global_batch

    @property
    def last(self) -> int:
        """Samples of the last, smaller step (0: none)."""
        rest = self.rows % self.global_batch
        return rest if rest >= self.world_size else 0

    @property
    def steps(self) -> int:
        return self.full_steps + (1 if self.last else 0)

    @property
    def used(self) -> int:
        """Samples read in an epoch, all ranks together."""
        return self.full_steps * self.global_batch + self.last

    @property
    def dropped(self) -> int:
        return self.rows - self.used

    @staticmethod
    def _part(total: int, rank: int, size: int) -> int:
        return total // size + (1 if rank < total % size else 0)

    def batch(self, rank: int, step: int) -> int:
        """Samples rank ``rank`` takes in step ``step``."""
        if step < self.full_steps:
            return self._part(self.global_batch, rank, self.world_size)
        return self._part(self.last, rank, self.world_size)

    def rank_rows(self, rank: int) -> int:
        """Samples rank ``rank`` reads in an epoch."""
        return self.full_steps * self._part(self.global_batch, rank, self.world_size) + self._part(
            self.last, rank, self.world_size
        )

    def weight(self, rank: int, step: int) -> float:
        """The factor on rank ``rank``'s mean loss in step ``step``: ``world_size`` times
        its share of the step's samples (1 when the ranks take equal shares)."""
        total = self.global_batch if step < self.full_steps else self.last
        return self.world_size * self.batch(rank, step) / total

    def start(self, rank: int) -> int:
        """Where rank ``rank``'s run begins in the epoch's order."""
        return sum(self.rank_rows(r) for r in range(rank))

    def facts(self) -> dict[str, Any]:
        return {
            "steps_per_epoch": self.steps,
            "samples_per_epoch": self.used,
            "dropped_per_epoch": self.dropped,
            "rank_samples_per_epoch": [self.rank_rows(r) for r in range(self.world_size)],
        }


# --------------------------------------------------------------------------- the launch


@dataclass(frozen=True)
class LaunchPlan:
    nnodes: int
    nproc: int
    backend: Literal["gloo", "nccl"]
    master: str | None
    job_id: str
    host: str | None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc


def in_rank(env: Mapping[str, str] | None = None) -> bool:
    """True inside a rank we launched (it must not launch again)."""
    return bool((os.environ if env is None else env).get(LAUNCHED_ENV))


def plan(
    params: DistributedParams, device: str, env: Mapping[str, str] | None = None
) -> LaunchPlan | None:
    """How to launch the ranks, or None: run in this process (one rank, or already a rank)."""
    env = os.environ if env is None else env
    if in_rank(env):
        return None
    where = f"${NNODES_ENV}"
    try:
        nnodes = int(env.get(NNODES_ENV) or params.nnodes)
    except ValueError:
        raise StepError(f"{where}: {env.get(NNODES_ENV)!r} is not a number of nodes") from None
    if nnodes < 1:
        raise StepError(f"{where}: {nnodes} nodes; it must be >= 1")
    if nnodes * params.nproc == 1:
        return None
    master = env.get(MASTER_ENV) or params.master
    if master and not is_master(master):
        raise StepError(f"${MASTER_ENV}: {master!r} is not host:port (e.g. 10.0.0.5:36543)")
    if nnodes > 1 and not master:
        raise StepError(
            f"train.distributed.nnodes is {nnodes} but no rendezvous is set: start every node "
            f"with {MASTER_ENV}=host:port (a Kubeflow PaddleJob injects it) or set "
            "train.distributed.master"
        )
    master_host = master.rsplit(":", 1)[0].strip("[]") if master else None
    local = nnodes == 1 or master_host in _LOOPBACK
    return LaunchPlan(
        nnodes=nnodes,
        nproc=params.nproc,
        backend=resolve_backend(params.backend, device),
        master=master,
        job_id=env.get(JOB_ID_ENV) or "paddle-mlops-train",
        # on a cluster: the pod's address (POD_IP from the downward API), else the launcher
        # finds it from the host name
        host=params.host if local else (env.get("POD_IP") or None),
    )


def resolve_backend(requested: str, device: str) -> Literal["gloo", "nccl"]:
    if requested == "nccl" and device != "gpu":
        raise StepError("train.distributed.backend is 'nccl' but training runs on CPU: use gloo")
    if requested == "gloo" or (requested in ("auto", "paddlejob") and device != "gpu"):
        return "gloo"
    return "nccl"


def launch_command(plan: LaunchPlan, argv: Sequence[str], log_dir: Path) -> list[str]:
    """``paddle.distributed.launch`` running ``python -m components <argv>`` in every rank."""
    cmd = [sys.executable, "-m", "paddle.distributed.launch"]
    cmd += ["--nnodes", str(plan.nnodes), "--nproc_per_node", str(plan.nproc)]
    cmd += ["--job_id", plan.job_id, "--log_dir", str(log_dir), "--log_overwrite", "True"]
    if plan.master:
        cmd += ["--master", plan.master]
    if plan.host:
        cmd += ["--host", plan.host]
    return [*cmd, sys.executable, "-m", "components", *argv]


def rank_env(env: Mapping[str, str], plan: LaunchPlan) -> dict[str, str]:
    """The environment of the launcher and its ranks: :data:`_RANK_ENV` of ``env`` without
    credentials and without what the launch flags set."""
    kept = {
        k: v
        for k, v in env.items()
        if _RANK_ENV.match(k) and not _SECRET.search(k) and k not in _LAUNCH_ENV
    }
    kept.update({LAUNCHED_ENV: "1", "PADDLE_DISTRI_BACKEND": plan.backend, "PYTHONUNBUFFERED": "1"})
    return kept


def launch(
    plan: LaunchPlan,
    argv: Sequence[str],
    log_dir: str | Path | None = None,
    stop_grace_s: float = 30.0,
) -> None:
    """Run ``python -m components <argv>`` as ``plan.nproc`` ranks on this node; return when
    every rank ended. A failed rank raises :class:`StepError` with the end of its log. A
    SIGTERM to this process is passed to the launcher, which stops the ranks (``stop_grace_s``
    to do so, then they are killed); if this process dies, the launcher and the ranks die too.
    Must be called from the main thread (signal handling, PR_SET_PDEATHSIG)."""
    if threading.current_thread() is not threading.main_thread():
        raise StepError("data-parallel training must be launched from the main thread")
    keep = log_dir is not None
    logs = Path(log_dir) if keep else Path(tempfile.mkdtemp(prefix="paddle-mlops-ranks-"))
    if keep and plan.nnodes > 1:  # a log dir on a shared volume: one directory per node
        logs = logs / socket.gethostname()
    logs.mkdir(parents=True, exist_ok=True)
    cmd = launch_command(plan, argv, logs)
    log.info(
        "data-parallel: %d node(s) x %d rank(s), %s, master %s, logs in %s",
        plan.nnodes,
        plan.nproc,
        plan.backend,
        plan.master or "local",
        logs,
    )
    log.debug("launch: %s", " ".join(cmd))
    children.load()  # before the fork: the child only calls prctl
    previous = signal.getsignal(signal.SIGTERM)
    proc: subprocess.Popen[bytes] | None = None
    code: int | None = None

    def _stop(signum: int, _frame: Any) -> None:  # e.g. a pod's SIGTERM: the ranks stop too
        if proc is not None:
            proc.send_signal(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        proc = subprocess.Popen(  # noqa: PLW1509 - preexec_fn: only prctl
            cmd, env=rank_env(os.environ, plan), preexec_fn=children.die_with_parent
        )
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc is not None and proc.poll() is None:  # interrupted: give the ranks a moment
            try:
                proc.wait(timeout=stop_grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for dump in logs.glob("backup_env.*.json"):  # the launcher's copies of the environment
            dump.unlink(missing_ok=True)
        if not keep and code == 0:
            shutil.rmtree(logs, ignore_errors=True)
    if code != 0:
        raise StepError(
            f"data-parallel training failed (paddle.distributed.launch exit {code}); "
            f"rank logs in {logs}{failure_excerpt(logs)}"
        )


def failure_excerpt(log_dir: Path, lines: int = 12) -> str:
    """The end of the logs of ranks that reported an error (``error: ...`` or a traceback)."""
    parts = []
    for path in sorted(log_dir.glob("workerlog.*")):
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        if any(line.startswith(("error: ", "Traceback")) for line in text):
            tail = "\n  ".join(text[-lines:])
            parts.append(f"\n{path.name}:\n  {tail}")
    return "".join(parts)


# --------------------------------------------------------------------------- inside a rank


@dataclass(frozen=True)
class World:
    """This process's place among the ranks (rank 0 of 1 when not launched)."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> World:
        env = os.environ if env is None else env
        if not in_rank(env):
            return cls()
        return cls(int(env.get("PADDLE_TRAINER_ID", 0)), int(env.get("PADDLE_TRAINERS_NUM", 1)))

    def init(self) -> None:
        """Join the process group (every rank must call it)."""
        if in_rank():
            children.die_with_parent()
            if os.getppid() == 1:  # the launcher died before we asked
                raise StepError("the launcher of this rank is gone")
        if self.size > 1:
            import paddle.distributed as dist

            dist.init_parallel_env()
            if dist.get_rank() != self.rank or dist.get_world_size() != self.size:
                raise StepError(
                    f"rank {self.rank}/{self.size} from the environment, but the process "
                    f"group says {dist.get_rank()}/{dist.get_world_size()}"
                )

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64)."""
        if self.size == 1:
            return [float(v) for v in values]
        import paddle
        import paddle.distributed as dist

        tensor = paddle.to_tensor(np.asarray(values, dtype="float64"))
        dist.all_reduce(tensor)
        return [float(v) for v in tensor.numpy()]

    def average_buffers(self, layer: Any) -> int:
        """Average ``layer``'s float buffers and frozen parameters (BatchNorm running
        statistics) over ranks:
        DataParallel averages gradients, not buffers, and Paddle's CPU wheel has no
        SyncBatchNorm. Returns how many buffers were averaged."""
        if self.size == 1:
            return 0
        import paddle
        import paddle.distributed as dist

        count = 0
        # Paddle keeps BatchNorm's running mean/variance as non-trainable parameters
        frozen = [p for p in layer.parameters() if p.stop_gradient]
        for buffer in [*frozen, *layer.buffers()]:
            if buffer.dtype not in (paddle.float32, paddle.float64):
                continue
            total = buffer.clone()
            dist.all_reduce(total)
            buffer.set_value(total / self.size)
            count += 1
        return count

    def all_gather(self, value: Any) -> list[Any]:
        """``value`` of every rank, in rank order (picklable objects)."""
        if self.size == 1:
            return [value]
        import paddle.distributed as dist

        out: list[Any] = []
        dist.all_gather_object(out, value)
        return out
