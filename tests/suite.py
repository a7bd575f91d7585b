"""How the suite runs: tiers, order, fixtures shared between pytest-xdist workers, and the
one-line account ``make test`` ends with. Loaded by ``tests/conftest.py`` (``pytest_plugins``).

Tiers (markers, set here per module from what its tests use, so no test can forget its own;
a module's tests may build on each other, so a tier never splits a module):

- ``containers``: a test needs the images (the ``images`` fixture, or the ``containers``
  marker on a test that asks for them later with ``request.getfixturevalue``, to do its
  image-free part while a cold build runs): podman, the component and server images; such a
  test's timeout is ``CONTAINER_TIMEOUT_S`` (the first one may wait for a cold image build
  that another worker runs);
- ``pipeline``: runs whole pipelines or trains models (the modules in ``PIPELINE_MODULES``, or
  a test that uses a fixture in ``PIPELINE_FIXTURES``);
- ``unit``: everything else: ``make test-quick`` runs this tier alone.

Order: modules run longest first (a module's tests stay on one worker: ``--dist loadscope``),
by the per-module seconds of the last run on this machine (``build/test-durations.json``,
written at the end of every whole run), else of ``tests/durations.json`` (committed, measured
on a 2-vCPU host). The order changes only when tests start, never what they assert.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
COMMITTED_DURATIONS = REPO / "tests" / "durations.json"
LAST_DURATIONS = REPO / "build" / "test-durations.json"
SUMMARY_FILE = REPO / "build" / "test-summary.txt"
CONTAINER_TIMEOUT_S = 3600

# modules whose tests run pipelines (dvc repro, kfp.local, a task's steps end to end) or train
PIPELINE_MODULES = {
    "test_closed_loop",
    "test_distributed",
    "test_faults",
    "test_gan",
    "test_holdout",
    "test_hpo_step",
    "test_hpo_tracking",
    "test_no_orphans",
    "test_pipeline_dvc",
    "test_pipeline_image_folder",
    "test_pipeline_kfp",
    "test_segmentation",
    "test_sentiment",
    "test_train",
    "test_train_bounds",
}
# fixtures that train, export, quantize or package a model (conftest.py)
PIPELINE_FIXTURES = {"trained", "exported", "qat_out", "exported_int8", "step_outputs"}

# modules whose tests use no module-scoped fixture and do not build on each other: each test
# is its own unit of work, spread over the workers, instead of the whole module on one worker
# (test_bad_inputs: 40 CLI subprocesses, the unit tier's longest module)
PER_TEST_MODULES = {"test_bad_inputs"}

T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unit: no pipeline, no image (make test-quick)")
    config.addinivalue_line("markers", "pipeline: runs pipelines or trains models")
    config.addinivalue_line("markers", "containers: needs the podman images")
    config._suite_t0 = time.monotonic()  # type: ignore[attr-defined]


# process-global state a test module may change and a later module on the same worker would
# inherit: MLflow's tracking URI (``mlflow.set_tracking_uri`` also exports it to the
# environment, so every subprocess a later test starts would write to that store)
LEAKY_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


def _mlflow_uri() -> object:
    utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
    return getattr(utils, "_tracking_uri", None)


@pytest.fixture(scope="module", autouse=True)
def no_leaked_tracking_uri(request: pytest.FixtureRequest):
    """A module that leaves another tracking URI behind fails (at its last test's teardown),
    and the URI is put back, whichever worker and order ran it: a leak is found on every
    run, not on the run where a registry test happens to follow it."""
    before_env = {k: os.environ.get(k) for k in LEAKY_ENV}
    before_uri = _mlflow_uri()
    yield
    leaked = [k for k, v in before_env.items() if os.environ.get(k) != v]
    for key, value in before_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if _mlflow_uri() != before_uri:
        sys.modules["mlflow.tracking._tracking_service.utils"]._tracking_uri = before_uri
        leaked.append("mlflow's global tracking URI")
    if leaked:
        pytest.fail(
            f"{request.module.__name__} left {', '.join(leaked)} changed: restore it "
            "(monkeypatch.setenv, components.tracking.registry.global_tracking_uri)"
        )


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest -p no:xdist still runs
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope``, with each test of a module in ``PER_TEST_MODULES`` a scope of its
    own (the other modules: one scope each, so their module fixtures start once)."""
    if config.getoption("dist", None) != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if Path(nodeid.split("::", 1)[0]).stem in PER_TEST_MODULES:
                return nodeid
            return super()._split_scope(nodeid)

    return Scheduling(config, log)


def _module(item: pytest.Item) -> str:
    return Path(str(item.fspath)).stem


def tier(items: list[pytest.Item]) -> str:
    """A module's tier, the heaviest of its tests' (a module's tests may depend on the ones
    before them, e.g. a registry built up test by test, so a tier never splits a module)."""
    names = set().union(*(set(getattr(i, "fixturenames", ())) for i in items))
    # a test that asks for the images later (request.getfixturevalue) says so with the marker
    if "images" in names or any(i.get_closest_marker("containers") for i in items):
        return "containers"
    if _module(items[0]) in PIPELINE_MODULES or names & PIPELINE_FIXTURES:
        return "pipeline"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(_module(item), []).append(item)
    for module_items in modules.values():
        marker = getattr(pytest.mark, tier(module_items))
        for item in module_items:
            # the images fixture, or the marker of a test that asks for them later
            needs_images = "images" in getattr(item, "fixturenames", ()) or bool(
                item.get_closest_marker("containers")
            )
            item.add_marker(marker)
            # may wait for the image build another worker runs (cold: ~15 min on 2 cores)
            if needs_images and not item.get_closest_marker("timeout"):
                item.add_marker(pytest.mark.timeout(CONTAINER_TIMEOUT_S))
    seconds = module_seconds()
    # longest module first; a stable sort keeps each module's own order
    order = {m: i for i, m in enumerate(modules)}
    items.sort(key=lambda i: (-seconds.get(_module(i), 0.0), order[_module(i)]))


def module_seconds() -> dict[str, float]:
    """Seconds per test module: this machine's last whole run, else the committed table."""
    for path in (LAST_DURATIONS, COMMITTED_DURATIONS):
        try:
            return {k: float(v) for k, v in json.loads(path.read_text())["modules"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return {}


# ------------------------------------------------------------------ shared between workers


def shared_root(factory: pytest.TempPathFactory) -> Path:
    """The run's temporary root that every xdist worker sees (a worker's own basetemp is
    ``<root>/popen-gwN``); without xdist, the session's basetemp."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """``make(directory)`` once per pytest run, whichever worker asks first; the others wait
    for it and get the same value (read-only outputs: tests copy what they change). The value
    crosses processes as a pickle: paths, dicts, numbers (an unpicklable one is this fixture's
    failure, recorded like any other). A failure is recorded, so the other workers fail at once
    with its message instead of re-running it."""
    root = shared_root(factory) / "shared"
    root.mkdir(exist_ok=True)
    target, done, failed = root / name, root / f"{name}.pickle", root / f"{name}.failed"
    with FileLock(str(root / f"{name}.lock")):
        if done.exists():
            return pickle.loads(done.read_bytes())
        if failed.exists():
            pytest.fail(f"shared fixture {name} failed in another worker: {failed.read_text()}")
        if target.exists():  # a worker killed half-way
            shutil.rmtree(target)
        target.mkdir()
        try:
            value = make(target)
            blob = pickle.dumps(value)
        except BaseException as exc:
            failed.write_text(f"{type(exc).__name__}: {exc}"[:4000])
            raise
        tmp = done.with_suffix(".tmp")
        tmp.write_bytes(blob)
        tmp.replace(done)
        return value


# ------------------------------------------------------------------ the account of a run


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of every child process it has waited
    for, their own waited-for children included: the subprocesses, servers and ``dvc repro``
    runs a test starts and stops. Not counted: what runs inside a podman container (its
    processes are children of conmon, not of the test), and a grandchild whose parent exited
    without waiting for it (init reaps it)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_CPU_MARK = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    item.stash[_CPU_MARK] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Each phase's report carries the CPU seconds spent since the previous phase ended (a
    user property, so it reaches the xdist controller with the report)."""
    outcome = yield
    now = cpu_seconds()
    report = outcome.get_result()
    report.user_properties.append(("cpu_s", round(now - item.stash.get(_CPU_MARK, now), 3)))
    item.stash[_CPU_MARK] = now


class Account:
    """Per-test seconds and CPU seconds (setup + call + teardown) and outcomes, kept by the
    controller."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        # nodeid -> [worker, first phase's start, last phase's stop] (epoch seconds): the
        # run's timeline, to find its critical path
        self.spans: dict[str, list[Any]] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        # xdist sends the (name, value) tuples as lists
        cpu = sum(float(v) for k, v in report.user_properties if k == "cpu_s")
        self.cpu[report.nodeid] = self.cpu.get(report.nodeid, 0.0) + cpu
        node = getattr(report, "node", None)  # xdist: the worker that ran it
        worker = getattr(getattr(node, "gateway", None), "id", "main")
        span = self.spans.setdefault(report.nodeid, [worker, report.start, report.stop])
        span[1], span[2] = min(span[1], report.start), max(span[2], report.stop)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if not _is_worker(session.config):
        session.config._suite_account = Account()  # type: ignore[attr-defined]
        session.config.pluginmanager.register(session.config._suite_account, "suite-account")


def summary_line(
    stats: dict[str, list[Any]], seconds: dict[str, float], wall_s: float, cpu_s: float
) -> str:
    """``tests=<n> passed=<n> failed=<n> skipped=<n> wall_s=<n> cpu_s=<n>
    slowest=<nodeid>:<s>`` (errors count as failed; xfailed as skipped, xpassed as passed;
    ``cpu_s``: the tests' CPU seconds, :func:`cpu_seconds`)."""

    def count(*keys: str) -> int:
        # one test may report several phases (a failed teardown after a pass): count tests
        return len({r.nodeid for k in keys for r in stats.get(k, []) if hasattr(r, "nodeid")})

    failed = count("failed", "error")
    passed = count("passed", "xpassed")
    skipped = count("skipped", "xfailed")
    slowest = max(seconds.items(), key=lambda kv: kv[1], default=("-", 0.0))
    return (
        f"tests={len(seconds)} passed={passed} failed={failed} skipped={skipped} "
        f"wall_s={wall_s:.0f} cpu_s={cpu_s:.0f} slowest={slowest[0]}:{slowest[1]:.1f}"
    )


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After pytest's own last line: the account, on the terminal and in
    ``build/test-summary.txt``; a whole run's per-module seconds for the next run's order."""
    account = getattr(config, "_suite_account", None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if account is None or reporter is None or not account.seconds:
        return
    wall_s = time.monotonic() - config._suite_t0  # type: ignore[attr-defined]
    line = summary_line(reporter.stats, account.seconds, wall_s, sum(account.cpu.values()))
    SUMMARY_FILE.parent.mkdir(exist_ok=True)
    SUMMARY_FILE.write_text(line + "\n")
    modules: dict[str, float] = {}
    for nodeid, s in account.seconds.items():
        module = Path(nodeid.split("::", 1)[0]).stem
        modules[module] = round(modules.get(module, 0.0) + s, 1)
    # only a whole run (no -k/-m/paths) says how long each module takes
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    if whole and not config.option.keyword and not config.option.markexpr:
        tests = {k: round(v, 2) for k, v in sorted(account.seconds.items(), key=lambda kv: -kv[1])}
        cpu = {k: round(v, 2) for k, v in sorted(account.cpu.items(), key=lambda kv: -kv[1])}
        t0 = min((v[1] for v in account.spans.values()), default=0.0)
        spans = {
            k: [w, round(a - t0, 1), round(b - t0, 1)] for k, (w, a, b) in account.spans.items()
        }
        LAST_DURATIONS.write_text(
            json.dumps({"modules": modules, "tests": tests, "cpu": cpu, "spans": spans}, indent=1)
        )
    reporter.write_line(line)
