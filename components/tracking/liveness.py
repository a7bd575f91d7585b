"""Who holds a run or a lock, and whether that process is still alive.

A process that is SIGKILLed (a preempted node, an OOM kill) cannot close its MLflow run or
release the promotion lock. Whatever it leaves carries :func:`owner_tags`; the next process
asks :func:`dead_owner` and cleans up. On the same host a pid that is gone, or that now
belongs to a process started at another time, is proof of death; on another host the only
evidence is age, so ``stale_after_s`` decides.

Library layer: imports nothing from the steps.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

HOST_TAG = "owner.host"
PID_TAG = "owner.pid"
START_TAG = "owner.start"  # the process's start time in clock ticks since boot (pid reuse)
FAILURE_TAG = "failure_reason"  # on an MLflow run that died: why (whoever found out)
# the orchestrator's id of the pipeline run an MLflow run records (KFP: the run's job id)
PIPELINE_RUN_TAG = "pipeline_run_id"


def _start_ticks(pid: int) -> str:
    """Field 22 of ``/proc/<pid>/stat`` (start time since boot), or "" where there is no
    procfs or no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return ""
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def owner_tags() -> dict[str, str]:
    """Tags naming this process: host, pid and the pid's start time."""
    pid = os.getpid()
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(pid), START_TAG: _start_ticks(pid)}


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    return not start or _start_ticks(pid) in ("", start)


def dead_owner(tags: Mapping[str, str], started_at_s: float, stale_after_s: float) -> str | None:
    """Why the owner named by ``tags`` is dead, or None while it may be alive.

    ``started_at_s`` is when the run or lock was created (epoch seconds)."""
    host, pid = tags.get(HOST_TAG, ""), tags.get(PID_TAG, "")
    if host == socket.gethostname() and pid.isdigit():
        if _alive(int(pid), tags.get(START_TAG, "")):
            return None
        return f"its process {pid} on {host} is gone (killed or crashed)"
    age = time.time() - started_at_s
    if age > stale_after_s:
        where = f"process {pid} on {host}" if host else "an unknown process"
        return f"started {age:.0f} s ago by {where}, over the {stale_after_s:.0f} s limit"
    return None


def mark_failed(client: Any, run: Any, status: str, reason: str) -> bool:
    """End MLflow run ``run`` (an ``mlflow.entities.Run``) ``status`` (FAILED or KILLED) with
    :data:`FAILURE_TAG` = ``reason``, unless it already ended failed and said why itself.
    True when it was marked."""
    if run.info.status in ("FAILED", "KILLED") and run.data.tags.get(FAILURE_TAG):
        return False
    client.set_tag(run.info.run_id, FAILURE_TAG, reason[:500])
    client.set_terminated(run.info.run_id, status)
    logging.getLogger(__name__).warning(
        "MLflow run %s (%s) marked %s: %s", run.info.run_id, run.info.run_name, status, reason
    )
    return True
