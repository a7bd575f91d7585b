"""One retry policy for every retry and poll loop: :class:`Backoff` says how long to wait
between attempts and when to give up; :func:`retry_call` retries a call that raises,
:func:`poll` repeats a check until it answers. Both run on tenacity.

- **Waits.** ``first_s``, then ``factor`` times the previous wait, never more than ``max_s``
  (``factor=1``: a fixed interval).
- **Giving up.** After ``attempts`` attempts, or once ``deadline_s`` has passed since the first
  attempt, whichever comes first. The last wait before the deadline is shortened so the last
  attempt falls on the deadline, never after it.
- **Time is injected.** Every loop measures and waits through a :class:`Clock` (default: the
  real one), so a test passes a fake clock and counts attempts and waits, never wall time.
- **Bounds are params.** :class:`BackoffParams` is the ``params.yaml`` shape of a backoff
  (``first_s``, ``max_s``, ``factor``, ``attempts``, ``deadline_s``); its :meth:`~BackoffParams.
  backoff` gives the :class:`Backoff`.

Core layer (imports only ``components.core.config``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import tenacity
from pydantic import Field, model_validator

from components.core.config import params_model

T = TypeVar("T")


@dataclass(frozen=True)
class Clock:
    """Where a loop reads the time and how it waits (``time.monotonic``, ``time.sleep``)."""

    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


SYSTEM_CLOCK = Clock()


@dataclass(frozen=True)
class Backoff:
    """How a loop waits between attempts and when it gives up (module docstring)."""

    first_s: float  # the first wait
    max_s: float  # no wait is longer
    factor: float = 2.0  # each wait is this times the previous one (1: a fixed interval)
    attempts: int | None = None  # give up after this many attempts (None: no limit)
    deadline_s: float | None = None  # ... or this long after the first one (None: none)

    def __post_init__(self) -> None:
        if self.attempts is None and self.deadline_s is None:
            raise ValueError("a backoff needs attempts or deadline_s: it must give up")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError("attempts must be >= 1")
        if self.first_s < 0 or self.max_s < self.first_s or self.factor < 1:
            raise ValueError("need 0 <= first_s <= max_s and factor >= 1")

    def wait_s(self, attempt: int) -> float:
        """The wait after attempt ``attempt`` (1-based) failed, before any deadline cut."""
        return min(self.first_s * self.factor ** (attempt - 1), self.max_s)

    def _retrying(self, clock: Clock, **kwargs: Any) -> tenacity.Retrying:
        start = clock.monotonic()
        end = None if self.deadline_s is None else start + self.deadline_s

        def stop(state: tenacity.RetryCallState) -> bool:
            if self.attempts is not None and state.attempt_number >= self.attempts:
                return True
            return end is not None and clock.monotonic() >= end

        def wait(state: tenacity.RetryCallState) -> float:
            pause = self.wait_s(state.attempt_number)
            return pause if end is None else max(0.0, min(pause, end - clock.monotonic()))

        return tenacity.Retrying(sleep=clock.sleep, stop=stop, wait=wait, **kwargs)


def retry_call(
    call: Callable[[], T],
    backoff: Backoff,
    retry_on: Callable[[BaseException], bool],
    *,
    clock: Clock = SYSTEM_CLOCK,
    before_wait: Callable[[int, BaseException], None] | None = None,
) -> T:
    """``call()``'s answer; an exception ``retry_on`` accepts is retried under ``backoff``
    (``before_wait(attempt, exc)`` runs before each wait), the last one raised when it gives
    up. Any other exception is raised at once."""

    def _before_sleep(state: tenacity.RetryCallState) -> None:
        if before_wait is not None and state.outcome is not None:
            exc = state.outcome.exception()
            if exc is not None:
                before_wait(state.attempt_number, exc)

    retrying = backoff._retrying(
        clock,
        retry=tenacity.retry_if_exception(retry_on),
        before_sleep=_before_sleep,
        reraise=True,
    )
    return retrying(call)


def poll(
    check: Callable[[], T],
    backoff: Backoff,
    *,
    clock: Clock = SYSTEM_CLOCK,
    before_wait: Callable[[int], None] | None = None,
) -> T:
    """Call ``check`` until it answers something true, and return that answer; when
    ``backoff`` gives up, its last (false) answer, for the caller's own error. An exception
    ``check`` raises ends the loop at once. ``before_wait(attempt)`` runs before each wait."""

    def _before_sleep(state: tenacity.RetryCallState) -> None:
        if before_wait is not None:
            before_wait(state.attempt_number)

    retrying = backoff._retrying(
        clock,
        retry=tenacity.retry_if_result(lambda answer: not answer),
        before_sleep=_before_sleep,
        retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
    )
    return retrying(check)


@params_model
class BackoffParams:
    """A :class:`Backoff` as params (``params.yaml``): the same fields and rules, each a
    range; a bound the caller owns elsewhere (a ``*_timeout_s`` key) is passed to
    :meth:`backoff` instead."""

    first_s: Annotated[float, Field(ge=0)]  # the first wait
    max_s: Annotated[float, Field(ge=0)]  # no wait is longer (>= first_s)
    factor: Annotated[float, Field(ge=1)] = 2.0  # each wait this times the previous (1: fixed)
    attempts: Annotated[int, Field(ge=1)] | None = None  # give up after this many (null: none)
    deadline_s: Annotated[float, Field(gt=0)] | None = None  # ... or this long after the first

    @model_validator(mode="after")
    def _rules(self) -> BackoffParams:
        if self.max_s < self.first_s:
            raise ValueError(f"max_s must be >= first_s ({self.first_s:g}), got {self.max_s:g}")
        return self

    def backoff(self, *, attempts: int | None = None, deadline_s: float | None = None) -> Backoff:
        """The :class:`Backoff` of these bounds; ``attempts`` / ``deadline_s`` given here
        replace the params' own (a step's ``*_timeout_s``, a call's attempt count)."""
        return Backoff(
            first_s=self.first_s,
            max_s=self.max_s,
            factor=self.factor,
            attempts=self.attempts if attempts is None else attempts,
            deadline_s=self.deadline_s if deadline_s is None else deadline_s,
        )


def every(interval_s: float, deadline_s: float) -> Backoff:
    """A fixed interval ``interval_s`` until ``deadline_s``: how a ready/rollout wait polls
    (its interval a ``*_poll_s`` key of the step's params)."""
    return Backoff(first_s=interval_s, max_s=interval_s, factor=1, deadline_s=deadline_s)
