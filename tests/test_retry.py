"""components.core.retry: the one retry policy, timed by a fake clock (no wall time)."""

from __future__ import annotations

import pytest

from components.core.retry import Backoff, Clock, poll, retry_call


class FakeClock:
    """A clock whose time moves only when a loop sleeps; records every wait."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(round(seconds, 6))
        self.now += seconds

    def clock(self) -> Clock:
        return Clock(monotonic=lambda: self.now, sleep=self.sleep)


def test_retry_call_backs_off_exponentially_up_to_max_and_raises_the_last_error():
    fake, calls = FakeClock(), []

    def flaky() -> str:
        calls.append(1)
        raise ConnectionError(f"attempt {len(calls)}")

    backoff = Backoff(first_s=0.5, max_s=2.0, attempts=5)
    with pytest.raises(ConnectionError, match="attempt 5"):
        retry_call(flaky, backoff, lambda e: isinstance(e, ConnectionError), clock=fake.clock())
    assert len(calls) == 5
    assert fake.waits == [0.5, 1.0, 2.0, 2.0]


def test_retry_call_returns_once_it_works_and_never_retries_other_errors():
    fake, calls, seen = FakeClock(), [], []

    def second_time() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise ConnectionError("down")
        return "up"

    backoff = Backoff(first_s=0.1, max_s=1.0, attempts=3)
    got = retry_call(
        second_time,
        backoff,
        lambda e: isinstance(e, ConnectionError),
        clock=fake.clock(),
        before_wait=lambda n, exc: seen.append((n, str(exc))),
    )
    assert got == "up" and fake.waits == [0.1] and seen == [(1, "down")]

    def broken() -> None:
        calls.append(1)
        raise ValueError("not retried")

    calls.clear()
    with pytest.raises(ValueError):
        retry_call(broken, backoff, lambda e: isinstance(e, ConnectionError), clock=fake.clock())
    assert len(calls) == 1


def test_poll_stops_at_the_deadline_with_the_last_wait_cut_to_it():
    fake, checks = FakeClock(), []
    backoff = Backoff(first_s=1.0, max_s=4.0, deadline_s=10.0)

    def never() -> bool:
        checks.append(fake.now)
        return False

    assert poll(never, backoff, clock=fake.clock()) is False
    assert fake.waits == [1.0, 2.0, 4.0, 3.0]  # 1 + 2 + 4 = 7: the last wait ends at 10 s
    assert checks[-1] == 1010.0 and len(checks) == 5


def test_poll_returns_the_first_true_answer_and_lets_errors_through():
    fake, answers = FakeClock(), iter([None, 0, "ready"])
    backoff = Backoff(first_s=0.1, max_s=0.1, factor=1, deadline_s=5.0)
    assert poll(lambda: next(answers), backoff, clock=fake.clock()) == "ready"
    assert fake.waits == [0.1, 0.1]

    def dies() -> bool:
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        poll(dies, backoff, clock=fake.clock())


def test_a_backoff_must_give_up():
    with pytest.raises(ValueError, match="must give up"):
        Backoff(first_s=1.0, max_s=1.0)
    with pytest.raises(ValueError):
        Backoff(first_s=2.0, max_s=1.0, attempts=3)
