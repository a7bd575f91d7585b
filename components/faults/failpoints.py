"""Named failpoints: places where the fault-injection tests make a step die for real.

``PADDLE_MLOPS_FAILPOINTS=<point>=<action>[,<point>=<action>...]`` arms them; unset (the
normal case) :func:`hit` returns at once. Actions:

- ``kill``: the process sends itself SIGKILL, as a preempted node or the OOM killer would
  (nothing is flushed, no handler runs);
- ``term``: SIGTERM, as Kubernetes sends before it deletes a pod;
- ``enospc``: an ``OSError(ENOSPC)`` as a full disk raises, from where the point is.

The points in the code: ``train.mid_epoch`` (after the first batch of the second epoch),
``track.mid_upload`` (between two nested runs' artifact uploads), ``register.after_version``
(a version exists, the challenger alias is not set yet), ``promote.locked`` (the promotion
lock is held, the champion alias not moved yet), ``artifacts.write`` (every atomic write,
before its rename). ``<point>@<step>`` arms a point only in that step's process
(``artifacts.write@train=kill``).
"""

from __future__ import annotations

import errno
import logging
import os
import signal

log = logging.getLogger(__name__)

ENV = "PADDLE_MLOPS_FAILPOINTS"
ACTIONS = ("kill", "term", "enospc")
_step = ""  # the step this process runs (components.kernel.step sets it)


def set_step(name: str) -> None:
    global _step
    _step = name


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
    if ENV not in os.environ:
        return
    points = armed()
    action = points.get(point) or points.get(f"{point}@{_step}")
    if action is None:
        return
    log.warning("failpoint %s: %s %s", point, action, detail)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), detail or point)
    os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGTERM)
    if action == "term":
        signal.pause()  # the handler (or the default action) ends the process
