"""The suite's own machinery (tests/suite.py): fixtures shared between xdist workers, and the
account of a run's CPU."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from types import SimpleNamespace

import pytest

from tests.suite import cpu_seconds, shared, summary_line


def test_a_shared_value_is_made_once_and_a_failure_is_told_to_the_others(tmp_path_factory):
    name = f"probe-{uuid.uuid4().hex}"
    calls = []

    def make(directory):
        calls.append(directory)
        (directory / "out.txt").write_text("made")
        return {"dir": directory, "n": 1}

    values = []
    # pytest makes the session's basetemp on first use, and not thread-safely (two threads
    # racing here got pytest-113 and pytest-114): made once before the threads, as a session's
    # first test does (workers of xdist are processes, each given its own basetemp)
    tmp_path_factory.getbasetemp()
    threads = [
        threading.Thread(target=lambda: values.append(shared(tmp_path_factory, name, make)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(values) == 3
    assert all(v == values[0] for v in values)
    assert (values[0]["dir"] / "out.txt").read_text() == "made"

    broken = f"broken-{uuid.uuid4().hex}"
    with pytest.raises(TypeError):  # a lock cannot be pickled: this fixture's own failure
        shared(tmp_path_factory, broken, lambda d: threading.Lock())
    with pytest.raises(pytest.fail.Exception, match=f"shared fixture {broken} failed"):
        shared(tmp_path_factory, broken, lambda d: 1)  # the next asker is told, not re-run


def test_a_tests_cpu_includes_the_processes_it_started_and_waited_for():
    """A child that burns 0.3 CPU-seconds (by its own clock, so on any host) is counted."""
    burn = "import time\nwhile time.process_time() < 0.3: pass"
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert cpu_seconds() - before >= 0.3


def test_the_last_line_names_counts_wall_cpu_and_the_slowest_test():
    def report(nodeid):
        return SimpleNamespace(nodeid=nodeid)

    stats = {"passed": [report("a"), report("b")], "failed": [report("c")], "skipped": []}
    seconds = {"a": 1.0, "b": 7.25, "c": 2.0}
    line = summary_line(stats, seconds, wall_s=12.4, cpu_s=20.6)
    assert line == "tests=3 passed=2 failed=1 skipped=0 wall_s=12 cpu_s=21 slowest=b:7.2"
