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


# --------------------------------------------------------------------------- bounds as params


def test_a_bad_bound_in_params_is_one_line_naming_the_key(tmp_path):
    """``registry.lock_backoff`` / ``alias_backoff`` are :class:`BackoffParams`: a bound out of
    range is one error line naming the file and the dotted key."""
    from components.core.artifacts import StepError
    from components.core.config import load_params, section
    from components.tracking.registry import RegistryParams

    path = tmp_path / "params.yaml"
    path.write_text("registry:\n  lock_backoff: {first_s: 2.0, max_s: 1.0}\n")
    with pytest.raises(StepError) as info:
        section(load_params(path), "registry", RegistryParams)
    assert str(info.value) == (
        f"{path}: registry.lock_backoff: max_s must be >= first_s (2), got 1"
    )
    path.write_text("registry:\n  alias_backoff: {first_s: 0.05, max_s: 1.0, attempts: 0}\n")
    with pytest.raises(StepError) as info:
        section(load_params(path), "registry", RegistryParams)
    assert str(info.value) == f"{path}: registry.alias_backoff.attempts: must be >= 1, got 0"


def test_the_params_defaults_are_the_bounds_of_before():
    """What params.yaml says and the code's defaults: today's waits, unchanged."""
    from components.core.config import load_params, section
    from components.kube import cluster, podman
    from components.ml.serving import local_server, server
    from components.steps.deploy import DeployParams
    from components.steps.serving_image import ServingImageParams
    from components.tracking.registry import RegistryParams
    from tests.conftest import REPO

    params = load_params(REPO / "params.yaml")
    registry = section(params, "registry", RegistryParams)
    assert registry == RegistryParams()
    assert registry.lock_backoff.backoff(deadline_s=120.0) == Backoff(0.05, 1.0, deadline_s=120.0)
    assert registry.alias_backoff.backoff() == Backoff(0.05, 1.0, attempts=5)
    assert registry.health_backoff.backoff(deadline_s=9.0) == Backoff(0.5, 5.0, deadline_s=9.0)
    deploy = section(params, "deploy", DeployParams)
    assert (deploy.rollout_poll_s, deploy.podman_ready_poll_s) == (
        cluster.ROLLOUT_POLL_S,
        podman.READY_POLL_S,
    )
    assert (deploy.local_ready_poll_s, deploy.local_stop_poll_s) == (
        local_server.READY_POLL_S,
        local_server.STOP_POLL_S,
    )
    startup_poll_s = section(params, "serving_image", ServingImageParams).startup_poll_s
    assert startup_poll_s == server.READY_POLL_S


# --------------------------------------------------------------------------- the waits


class FakeDynamicClient:
    """The two calls ``wait_rollout`` makes of the Kubernetes dynamic client, answering each
    object's status from a script: its ``n``-th read returns ``script[n]`` (the last after)."""

    def __init__(self, scripts: dict[str, list[dict]]) -> None:
        self.scripts = scripts
        self.reads: list[str] = []
        self.resources = self

    def get(self, api: object = None, *, name: str = "", namespace: str = "", **kind: str):
        if not name:  # resources.get(api_version=..., kind=...): the API of a kind
            return kind["kind"]
        self.reads.append(name)
        script = self.scripts[name]
        status = script[min(self.reads.count(name) - 1, len(script) - 1)]
        obj = {"kind": api, "metadata": {"name": name, "generation": 1}, "spec": {"replicas": 1}}
        return type("Obj", (), {"to_dict": lambda _self: {**obj, "status": status}})()


NOT_ROLLED = {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 0}
ROLLED = {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 1, "replicas": 1}
READY = {"conditions": [{"type": "Ready", "status": "True"}]}


def _docs() -> list[dict]:
    meta = {"namespace": "ns"}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "name": "srv"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {**meta, "name": "svc"}},
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {**meta, "name": "isvc"},
        },
    ]


def test_wait_rollout_reads_each_object_every_poll_within_one_deadline():
    from components.kube.cluster import wait_rollout
    from components.steps.deploy import DeployParams

    fake = FakeClock()
    dyn = FakeDynamicClient({"srv": [NOT_ROLLED, NOT_ROLLED, ROLLED], "isvc": [{}, READY]})
    params = DeployParams(rollout_timeout_s=60.0, rollout_poll_s=3.0)
    wait_rollout(_docs(), params, clock=fake.clock(), dyn=dyn)
    assert dyn.reads == ["srv"] * 3 + ["isvc"] * 2  # the Service is not waited for
    assert fake.waits == [3.0, 3.0, 3.0]


def test_wait_rollout_gives_up_at_the_one_deadline_of_all_objects():
    from components.core.artifacts import StepError
    from components.kube.cluster import wait_rollout
    from components.steps.deploy import DeployParams

    fake = FakeClock()
    dyn = FakeDynamicClient({"srv": [NOT_ROLLED, ROLLED], "isvc": [{}]})
    params = DeployParams(rollout_timeout_s=10.0)  # read every 2 s (rollout_poll_s)
    with pytest.raises(StepError, match=r"InferenceService/isvc did not become ready within 10 s"):
        wait_rollout(_docs(), params, clock=fake.clock(), dyn=dyn)
    # srv took 2 s of the 10; isvc gets the 8 left: read at 2, 4, 6, 8 and 10 s
    assert fake.waits == [2.0, 2.0, 2.0, 2.0, 2.0]
    assert dyn.reads == ["srv", "srv"] + ["isvc"] * 5


class ScriptedControl:
    """The ``ready`` of a :class:`components.core.deploy_target.ServerControl`: the answers
    of a container's health endpoint, in order (the last one after)."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers, self.asked = answers, 0

    def ready(self, url: str, timeout_s: float) -> bool:
        self.asked += 1
        return self.answers[min(self.asked, len(self.answers)) - 1]


def test_podman_ready_wait_asks_every_poll_and_gives_up_at_the_deadline():
    """No container runs: ``podman inspect`` of a name that does not exist says nothing, so
    only the health answers decide."""
    from components.kube.podman import _wait_ready

    fake, control = FakeClock(), ScriptedControl([False, False, True])
    name = "paddle-mlops-test-retry-no-such-container"
    url = "http://127.0.0.1:9"
    assert _wait_ready(control, url, 10.0, name, clock=fake.clock(), poll_s=0.25)
    assert control.asked == 3 and fake.waits == [0.25, 0.25]

    fake, control = FakeClock(), ScriptedControl([False])
    assert not _wait_ready(control, url, 2.0, name, clock=fake.clock())  # every 0.5 s
    assert control.asked == 5 and fake.waits == [0.5] * 4


SLEEPER = "import time; time.sleep(120)"  # a server that never answers
DEAF = (  # ... and ignores SIGTERM (says so once it does)
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('deaf', flush=True); time.sleep(120)"
)


def test_local_server_start_polls_every_interval_and_gives_up_at_the_deadline(tmp_path):
    import sys
    from pathlib import Path

    from components.core.artifacts import StepError
    from components.core.ports import free_port
    from components.ml.serving import local_server

    fake = FakeClock()
    with pytest.raises(StepError, match=r"v3 not ready in 1 s"):
        local_server.start(
            Path(sys.executable), ["-c", SLEEPER],
            state_dir=tmp_path, port=free_port(), model="m", version=3, model_dir="unused",
            model_control=False, timeout_s=1.0, clock=fake.clock(), poll_s=0.25,
        )  # fmt: skip
    assert fake.waits == [0.25] * 4  # asked at 0, 0.25, 0.5, 0.75 and 1 s
    assert not (tmp_path / local_server.STATE_FILE).exists()


def test_local_server_stop_waits_then_kills_a_server_deaf_to_sigterm(tmp_path, caplog):
    import subprocess
    import sys
    from dataclasses import asdict

    from components.core.artifacts import write_json
    from components.ml.serving import local_server

    proc = subprocess.Popen([sys.executable, "-c", DEAF], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "deaf\n"
        server = local_server.LocalServer(
            proc.pid, 1, "m", 3, "unused", sys.executable, "", [sys.executable], False
        )
        write_json(tmp_path / local_server.STATE_FILE, asdict(server))
        fake = FakeClock()

        def sleep(seconds: float) -> None:
            fake.sleep(seconds)
            if len(fake.waits) > 4:  # after the SIGKILL the kernel ends it: wait for that
                proc.wait(timeout=60)

        clock = Clock(monotonic=lambda: fake.now, sleep=sleep)
        with caplog.at_level("WARNING", logger="components.ml.serving.local_server"):
            stopped = local_server.stop(tmp_path, 1.0, clock=clock, poll_s=0.25)
        assert stopped == server
        # SIGTERM: asked at 0, 0.25, ..., 1 s; then SIGKILL, gone at once or after one wait
        assert fake.waits[:4] == [0.25] * 4 and len(fake.waits) in (4, 5)
        assert f"pid {proc.pid} did not stop within 1 s: killed" in caplog.text
        assert not (tmp_path / local_server.STATE_FILE).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
