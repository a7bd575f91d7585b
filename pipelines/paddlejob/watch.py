"""Watching a running job: its status conditions, its pods' logs and the pods that will
not run, until it ends or the launcher's deadlines pass (see the package's docstring, 6.).

The launcher's time is a :class:`components.core.retry.Clock` (re-exported here as
``Clock``/``SYSTEM_CLOCK``): every deadline (``timeout_s``, ``api_outage_s``,
``unschedulable_timeout_s``, ``delete_timeout_s``, the log budgets) is read from its
``monotonic`` and every wait between polls is its ``sleep``. (A request's own timeout,
``api_timeout_s``, is the socket's.)"""

import calendar
import logging
import math
import re
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from components.core.artifacts import StepError
from components.core.retry import SYSTEM_CLOCK, Backoff, Clock, poll
from pipelines.paddlejob.api import ApiError, Kube, api_message, request_errors
from pipelines.paddlejob.spec import KIND, PaddleJobParams

log = logging.getLogger(__package__)  # "pipelines.paddlejob": one logger, as before the split

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


class JobLeftRunning(StepError):
    """The launcher stops without deleting its job (its status could not be read)."""


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
        except request_errors() as exc:
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
            except request_errors() as exc:
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


class _Outage:
    """The failed status reads in a row: retried for ``paddlejob.api_outage_s``, then
    :class:`JobLeftRunning`."""

    def __init__(self, kube: Kube, name: str, limit_s: float, clock: Clock) -> None:
        self.kube, self.name, self.limit_s, self.clock = kube, name, limit_s, clock
        self.since: float | None = None  # the clock's time of the first failed read in a row

    def failed(self, exc: ApiError) -> None:
        """A read failed: raise ``exc`` unless it is retryable and the outage still short."""
        if not exc.retryable:
            raise exc
        now = self.clock.monotonic()
        if self.since is None:
            self.since = now
        if now - self.since >= self.limit_s:
            raise JobLeftRunning(
                f"{KIND} {self.kube.ns}/{self.name}: its status could not be read for "
                f"{now - self.since:.0f} s (paddlejob.api_outage_s "
                f"{self.limit_s:g}): {exc}. The job was left running: a retry of "
                "this task reattaches to it (or: kubectl delete paddlejob -n "
                f"{self.kube.ns} {self.name})"
            ) from exc
        log.warning("%s; retrying", exc)


def _log_new_conditions(
    name: str, obj: Mapping[str, Any], seen: set[tuple[Any, ...]]
) -> dict[str, Any] | None:
    """Log each condition of ``obj`` not in ``seen`` (then added); the last of them."""
    last = None
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
    return last


def wait(
    kube: Kube,
    name: str,
    params: PaddleJobParams,
    logs: PodLogs,
    pods: PodStates,
    clock: Clock = SYSTEM_CLOCK,
) -> dict[str, Any]:
    """Poll the job every ``paddlejob.poll_interval_s`` until it succeeds (returned), fails,
    cannot run or ``paddlejob.timeout_s`` has passed (raised). Failed status reads are
    retried for ``paddlejob.api_outage_s``; then :class:`JobLeftRunning`."""
    seen: set[tuple[Any, ...]] = set()
    last: dict[str, Any] = {}  # the last new condition
    outage = _Outage(kube, name, params.api_outage_s, clock)

    def _step() -> dict[str, Any] | None:
        """One status read: the job when it succeeded, None while it runs; raises else."""
        try:
            obj = kube.get(name)
        except ApiError as exc:
            outage.failed(exc)
            return None
        outage.since = None
        if obj is None:
            raise StepError(
                f"{KIND} {kube.ns}/{name} disappeared while the launcher waited for it "
                "(deleted by someone else, or by its TTL)"
            )
        newest = _log_new_conditions(name, obj, seen)
        if newest is not None:
            last.clear()
            last.update(newest)
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
        return None

    every = params.poll_interval_s
    backoff = Backoff(first_s=every, max_s=every, factor=1, deadline_s=params.timeout_s)
    done = poll(_step, backoff, clock=clock)
    if done:
        return done
    state = f"{last.get('type')}: {last.get('message', '')}" if last else "none yet"
    raise StepError(
        f"{KIND} {kube.ns}/{name} did not finish within {params.timeout_s:g} s "
        f"(paddlejob.timeout_s); last condition: {state}{logs.excerpt()}"
    )
