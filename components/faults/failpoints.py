"""Named failpoints: places where the fault-injection tests make a step die, or its data go
wrong, for real.

``PADDLE_MLOPS_FAILPOINTS=<point>=<action>[,<point>=<action>...]`` arms them; unset (the
normal case) :func:`hit` returns at once. Actions:

- ``kill``: the process sends itself SIGKILL, as a preempted node or the OOM killer would
  (nothing is flushed, no handler runs);
- ``term``: SIGTERM, as Kubernetes sends before it deletes a pod;
- ``enospc``: an ``OSError(ENOSPC)`` as a full disk raises, from where the point is;
- ``hang``: the process stops there for good, printing nothing, as on a deadlock or a stuck
  network read (only a signal ends it: what stops a hung child is its parent's doing);
- ``corrupt``: the data the point holds goes wrong the way its entry below says (a broken
  kernel, pass or calibration), and the step runs on with it, so its own checks must catch
  it. Only the points that name a corruption take it (they call :func:`corrupts`); armed at
  another point it raises ``ValueError``, as a bad spec does.

The points in the code:

- ``train.mid_epoch``: after the first batch of the second epoch;
- ``track.mid_upload``: between two nested runs' artifact uploads;
- ``register.after_version``: a version exists, the challenger alias is not set yet;
- ``promote.between_aliases``: the promotion lock is held, the previous-champion alias set,
  the champion alias not moved yet;
- ``promote.after_alias``: the champion alias moved, history and holdout not recorded yet;
- ``artifacts.write``: every atomic write, before its rename;
- ``paddlejob.stage``: the PaddleJob launcher writing the job's ``params.yaml`` into its
  directory on the shared volume, after the data (``enospc`` there is a full volume);
- ``snapshot.open.<split>``: every open of a shard of that split (``snapshot.open.test=kill``
  proves a search never reads test: its trials inherit the variable);
- ``hpo.after_trial``: the search driver, after it recorded a finished trial;
- ``ingest.unit``: an ingest worker (or ingest itself when ``ingest.workers`` is 1), before
  it reads a unit (``hang`` there: workers alive when the step is killed);
- ``validate.shard``: a validate worker (or validate itself at ``validate.workers: 1``),
  before it reads a shard;
- ``stream.piece``: the train loader, before it reads a piece (in a loader worker when
  ``train.loader_workers`` > 0);
- ``export.parity`` (takes ``corrupt``): the exported program's outputs, as the parity check
  reads them, drift by ``1e-2``, as a broken inference kernel or pass would make them; the
  parity check must fail the export;
- ``qat.after_finetune`` (takes ``corrupt``): the fine-tuned student's activation
  quantization scales shrink to 2 %, so its activations saturate (a calibration gone wrong);
  the int8 model is written and gated for real, and the gate must reject it.

``<point>@<step>`` arms a point only in that step's processes (``artifacts.write@train=kill``),
its pool workers included (``components.ml.data.snapshot.ordered_map`` tells them the step).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal

log = logging.getLogger(__name__)

ENV = "PADDLE_MLOPS_FAILPOINTS"
ACTIONS = ("kill", "term", "enospc", "corrupt", "hang")
_step = ""  # the step this process runs (components.kernel.step sets it)


def set_step(name: str) -> None:
    global _step
    _step = name


def current_step() -> str:
    """The step this process runs ("" outside one): what a spawned worker is told, so that
    ``<point>@<step>`` holds in it too."""
    return _step


def armed() -> dict[str, str]:
    """The armed points and their actions (a bad spec raises, naming the variable)."""
    spec = os.environ.get(ENV, "").strip()
    points: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        point, _, action = item.partition("=")
        if action not in ACTIONS:
            raise ValueError(f"{ENV}: '{item}': expected <point>=<{'|'.join(ACTIONS)}>")
        points[point] = action
    return points


def hit(point: str, detail: str = "") -> None:
    """Fail here if ``point`` is armed; a no-op otherwise."""
    if _act(point, detail):
        raise ValueError(
            f"{ENV}: {point}=corrupt: this point holds nothing to corrupt (the ones that do "
            "are listed in components/faults/failpoints.py)"
        )


def corrupts(point: str, detail: str = "") -> bool:
    """:func:`hit` at a point that holds data: True when it is armed with ``corrupt`` (the
    caller then corrupts that data, as the point's entry in this module's docstring says);
    the other actions act as at any point."""
    return _act(point, detail)


def _act(point: str, detail: str) -> bool:
    """Do what ``point`` is armed with; True for ``corrupt`` (the caller's to do)."""
    if ENV not in os.environ:
        return False
    points = armed()
    action = points.get(point) or points.get(f"{point}@{_step}")
    if action is None:
        return False
    log.warning("failpoint %s: %s %s", point, action, detail)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(OSError, ValueError):  # a closed stderr must not end it first
            handler.flush()
    if action == "corrupt":
        return True
    if action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), detail or point)
    while action == "hang":
        signal.pause()
    os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGTERM)
    if action == "term":
        signal.pause()  # the handler (or the default action) ends the process
    return False
