"""Child processes that die with their parent (Linux ``PR_SET_PDEATHSIG``).

A step that is SIGKILLed runs no handler, so it cannot stop what it started. A child that
asked the kernel for a signal at its parent's death is stopped by the kernel instead: no
orphan keeps running under PID 1 (a trial of a killed search, a rank of a killed train step,
a loader worker of a killed rank). The signal follows the *thread* that started the child:
start children from a thread that outlives them (one that waits for them).

    subprocess.Popen(cmd, preexec_fn=die_with_parent)   # prctl loaded before the fork
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import signal
from typing import Any

PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Any:
    """libc's ``prctl`` (Linux), or None elsewhere."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def load() -> None:
    """Load libc's ``prctl`` now, in the parent: a ``preexec_fn`` runs between fork and exec,
    where loading a library (and taking its locks) is not safe in a threaded process."""
    _prctl()


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent (the thread that forked it)
    dies. A no-op where ``prctl`` does not exist."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


load()  # at import, in the parent: every preexec_fn that calls die_with_parent finds it loaded
