"""Shared fixtures: a real ingested digits data set and a tiny trained model."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
import yaml

from components.core import children
from tests.suite import shared

if TYPE_CHECKING:
    from components.steps.promote import PromoteParams
    from components.steps.register import RegisterParams
    from components.steps.track import StepOutputs
    from components.tasks import Task

REPO = Path(__file__).resolve().parents[1]

# tiers, order, fixtures shared by the xdist workers, the run's one-line account
pytest_plugins = ["tests.suite"]

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GLOG_minloglevel", "2")


def _session_keys() -> None:
    """One signing key pair for the session (promote signs, fetch-model/deploy verify), as a
    cluster mounts a Secret and a ConfigMap; subprocesses inherit the environment."""
    import tempfile

    from components.tracking.signing import KEY_ENV, TRUST_ENV, generate

    if os.environ.get(KEY_ENV) or os.environ.get(TRUST_ENV):
        return
    root = Path(tempfile.mkdtemp(prefix="paddle-mlops-test-keys-"))
    private, public = generate(root / "signing")
    (root / "trusted").mkdir()
    shutil.copy(public, root / "trusted" / "signing.pub")
    os.environ[KEY_ENV] = str(private)
    os.environ[TRUST_ENV] = str(root / "trusted")


_session_keys()


@pytest.fixture(autouse=True)
def _root_log_handlers() -> Iterator[None]:
    """A CLI called in-process (``main([...])``) sets up logging with ``basicConfig(force=True,
    stream=sys.stderr)``: a root handler on this test's captured stderr, which pytest closes
    when the test ends. Left in place, every later test's root log record on that worker hits a
    closed file (a failpoint's flush raised ``ValueError`` on it). Such handlers (plain
    ``StreamHandler``s, never pytest's own) go when the test ends, and the root level is reset."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in before and type(handler) is logging.StreamHandler:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sklearn's real digits, ingested and split exactly as the pipeline does."""
    from components.steps.ingest import IngestParams, run
    from components.tasks import get_task

    def make(root: Path) -> Path:
        run(
            IngestParams(source="builtin:digits", kind="builtin"),
            get_task("digits"),
            root / "ingest",
        )
        return root / "ingest"

    return shared(tmp_path_factory, "digits", make)


@pytest.fixture(scope="session")
def digits_task():
    from components.tasks import get_task

    return get_task("digits", {"conv_channels": [6, 16], "augment_shift": 1})


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, digits_data: Path, digits_task) -> Path:
    """A small model trained for a few epochs (enough for parity and evaluation tests)."""
    from components.steps.train import TrainParams, run

    def make(root: Path) -> Path:
        run(
            TrainParams(epochs=4, batch_size=64),
            digits_task,
            digits_data,
            root / "train",
            checkpoint_dir=root / "ckpt",
        )
        return root / "train"

    return shared(tmp_path_factory, "trained", make)


@pytest.fixture(scope="session")
def exported(
    tmp_path_factory: pytest.TempPathFactory, trained: Path, digits_data: Path, digits_task
) -> Path:
    from components.steps.export import ExportParams, run

    def make(root: Path) -> Path:
        run(ExportParams(), digits_task, trained, digits_data, root / "export")
        return root / "export"

    return shared(tmp_path_factory, "exported", make)


@pytest.fixture(scope="session")
def qat_out(
    tmp_path_factory: pytest.TempPathFactory,
    trained: Path,
    exported: Path,
    digits_data: Path,
    digits_task,
):
    """The qat step on the small trained model and its export: (output dir, QatResult)."""
    from components.steps.qat import QatLatency, QatParams
    from components.steps.qat import run as qat_run

    def make(root: Path):
        params = QatParams(epochs=2, latency=QatLatency(warmup=1, repeats=3))
        result = qat_run(
            params,
            digits_task,
            trained,
            exported,
            digits_data,
            root / "qat",
            metrics_file=root / "m.json",
        )
        return root / "qat", result

    return shared(tmp_path_factory, "qat", make)


def _no_tuning():
    from components.ml.serving.tuning import TuneParams

    return TuneParams(budget_s=0)


NO_TUNING = _no_tuning()  # package without the serving-config search (test_tuning tests it)


def package_params(**model_config: object):
    """``params.yaml``'s ``package`` section, ``model_config`` fields replaced."""
    from components.core.config import load_params, section
    from components.steps.package import PackageParams

    params = section(load_params(REPO / "params.yaml"), "package", PackageParams)
    return dataclasses.replace(
        params,
        model_config=dataclasses.replace(params.model_config, **model_config),
        tune=NO_TUNING,
    )


def fp32_bundle(export_dir: Path, out: Path, **model_config: object) -> Path:
    """The package step's bundle of ``export_dir`` without int8 (a qat output that shipped
    none, as ``qat.allow_fp32_only`` leaves it), its model config ``params.yaml``'s with
    ``model_config`` replaced."""
    from components.core.artifacts import write_json
    from components.steps.package import run

    qat_dir = out.parent / f"{out.name}-qat"
    write_json(qat_dir / "gate.json", {"passed": False, "fp32_only": True, "reasons": ["test"]})
    return run(package_params(**model_config), export_dir, qat_dir, out)


def with_model_config(bundle: Path, out: Path, **model_config: object) -> Path:
    """A copy of ``bundle`` whose model_config.json is ``params.yaml``'s with ``model_config``
    replaced (what ``package`` writes for such params)."""
    from components.ml.serving import model_config as mc

    shutil.copytree(bundle, out)
    mc.write(out, package_params(**model_config).model_config)
    return out


@pytest.fixture(scope="session")
def exported_int8(tmp_path_factory: pytest.TempPathFactory, exported: Path, qat_out) -> Path:
    """The served bundle (the package step): fp32 PIR + legacy and the gated int8 model."""
    from components.steps.package import run

    return shared(
        tmp_path_factory,
        "package",
        lambda root: run(package_params(), exported, qat_out[0], root / "bundle"),
    )


def untrained_export(root: Path, task, data_dir: Path, seed: int) -> Path:
    """A model with random weights (``seed``), exported for real: other answers than the
    trained one, as a broken or a different training run would give."""
    import paddle

    from components.core.artifacts import write_json
    from components.steps.export import ExportParams
    from components.steps.export import run as export_run

    paddle.seed(seed)
    model = task.build_model(10)
    (root / "train").mkdir(parents=True)
    paddle.save(model.state_dict(), str(root / "train" / "model.pdparams"))
    write_json(root / "train" / "model_meta.json", {"num_classes": 10})
    export_run(ExportParams(), task, root / "train", data_dir, root / "export")
    return root / "export"


@contextlib.contextmanager
def mlflow_tracking(uri: str) -> Iterator[str]:
    """MLflow's global tracking URI set to ``uri`` for the fluent API (``start_run``,
    ``pyfunc.log_model``, the track step), then put back (the environment variable too)."""
    from components.tracking.registry import global_tracking_uri

    with global_tracking_uri(uri):
        yield uri


def track_register_promote(
    uri: str,
    outputs: StepOutputs,
    root: Path,
    task: Task,
    data: Path,
    *,
    all_params: dict,
    experiment: str,
    model_name: str,
    register: RegisterParams,
    promote: PromoteParams | None = None,
    infra: Path | None = None,
) -> SimpleNamespace:
    """The pipeline's real track, register and (``promote`` params given) promote steps on
    ``outputs`` (a :class:`~components.steps.track.StepOutputs`) against the MLflow server at
    ``uri``, as ``model_name``: track's run under ``root/track``, register's decision under
    ``root/register``, promote's under ``root/promote`` (its image: ``infra``, else
    ``outputs.infra``). ``registered`` and ``promoted`` (None without ``promote``) are the
    steps' results; ``version`` the registered version."""
    from components.steps.promote import run as promote_run
    from components.steps.register import run as register_run
    from components.steps.track import TrackParams
    from components.steps.track import run as track_run
    from components.tracking.registry import RegistryParams

    with mlflow_tracking(uri):
        track_run(TrackParams(experiment=experiment), all_params, root / "track", outputs)
    registered = register_run(
        register,
        task,
        root / "track",
        data,
        root / "register",
        registry_params=RegistryParams(model_name=model_name),
        tracking_uri=uri,
    )
    promoted = None
    if promote is not None:
        with mlflow_tracking(uri):
            promoted = promote_run(
                promote,
                root / "register",
                outputs.infra if infra is None else infra,
                root / "promote",
                registry_params=RegistryParams(model_name=model_name),
            )
    return SimpleNamespace(version=registered.version, registered=registered, promoted=promoted)


@pytest.fixture(scope="session")
def step_outputs(
    tmp_path_factory: pytest.TempPathFactory,
    digits_data: Path,
    digits_task,
    trained: Path,
    exported: Path,
    qat_out,
    exported_int8: Path,
):
    """Every port of the track step: the session fixtures' real step outputs, plus validate
    and evaluate run here; serving_image's infra.json is written as a machine without an
    image builder leaves it (test_registry does the same: no server image in this test)."""
    from components.core.artifacts import write_json, write_manifest
    from components.steps.evaluate import EvaluateParams, LatencyParams
    from components.steps.evaluate import run as evaluate_run
    from components.steps.track import StepOutputs
    from components.steps.validate import run as validate_run
    from components.tasks import get_task
    from components.tasks.image_data import ValidateParams

    def make(root: Path) -> StepOutputs:
        validate_run(ValidateParams(), get_task("digits"), digits_data, root / "validate")
        evaluate_run(
            EvaluateParams(latency=LatencyParams(batch_sizes=[1], warmup=1, repeats=2)),
            digits_task,
            exported_int8,
            digits_data,
            root / "evaluate",
            metrics_file=root / "metrics" / "evaluate.json",
            plots_file=root / "plots" / "confusion.csv",
        )
        infra = root / "serving_image"
        write_json(
            infra / "infra.json",
            {
                "image": "paddle-mlops/digits-server:0123456789ab",
                "image_id": None,
                "built": False,
                "builder_note": "no image builder (podman, docker) on PATH",
                "context_sha256": "0123456789ab" + "0" * 52,
                "infra_validated": True,
            },
        )
        write_manifest(
            infra, "serving_image", inputs={"model": exported_int8}, outputs={}, params={}
        )
        qat_dir, _ = qat_out
        return StepOutputs(
            data=digits_data,
            report=root / "validate",
            model=trained,
            exported=exported,
            int8=qat_dir,
            bundle=exported_int8,
            evaluation=root / "evaluate",
            infra=infra,
            train_metrics=trained / "metrics.json",
            qat_metrics=qat_dir.parent / "m.json",
            evaluate_metrics=root / "metrics" / "evaluate.json",
            train_plots=trained / "curves.csv",
            confusion=root / "plots" / "confusion.csv",
        )

    return shared(tmp_path_factory, "steps", make)


SERVER_BIN = REPO / "build" / "serving" / "paddle-mlops-server"
# the binary every step runs (components/ml/serving/server.py: server_binary), in this process and
# in the pipelines the tests start (dvc repro in clones, kfp.local's subprocess runner): this
# checkout's, built once, never a clone's own build
os.environ.setdefault("PADDLE_MLOPS_SERVER_BINARY", str(SERVER_BIN))


@pytest.fixture(scope="session")
def server_binary() -> Path:
    """The C++ server (``make serving`` builds it; built here if missing)."""
    from filelock import FileLock

    SERVER_BIN.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(SERVER_BIN.parent / ".build.lock")):  # one build, whichever worker
        if not SERVER_BIN.exists():
            from components.ml.serving.server import build_server

            build_server(REPO / "serving", SERVER_BIN.parent)
    return SERVER_BIN


def run_module(
    module: str, *args: str, cwd: Path = REPO, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` like dvc.yaml does."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def copy_repo(dest: Path) -> Path:
    """Copy the tracked project files (what a fresh clone has) into ``dest``."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for rel in files:
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def pip_install_target(project: Path, site: Path) -> Path:
    """Install the package at ``project`` with pip into directory ``site`` (no network, no
    deps, no build isolation), as a user installs a task package; ``site`` goes on
    PYTHONPATH."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--target", str(site), str(project)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return site


def clone_repo(dest: Path) -> Path:
    """A fresh git repository holding the project's files, as a user's clone would."""
    copy_repo(dest)
    sh(dest, "git", "init", "-q")
    sh(dest, "git", "add", "-A")
    sh(dest, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "clone")
    return dest


BIN = str(Path(sys.executable).parent)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_and_expect_no_survivors(proc: subprocess.Popen, tree: list[int]) -> None:
    """SIGKILL ``proc`` (a step: none of its handlers runs); every process of ``tree`` (its
    descendants, taken just before) must be gone within 5 s (50 polls 0.1 s apart)."""
    proc.kill()
    assert proc.wait() == -9
    for _ in range(50):
        if not any(alive(p) for p in tree):
            break
        time.sleep(0.1)
    assert not [p for p in tree if alive(p)], [cmdline(p) for p in tree if alive(p)]


def reap(proc: subprocess.Popen, tree: list[int]) -> None:
    """Kill ``proc`` and what is left of ``tree`` (a failed kill test's leftovers)."""
    proc.kill()
    proc.wait()
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def sh(
    repo: Path, *cmd: str, check: bool = True, path: Sequence[str | Path] = ()
) -> subprocess.CompletedProcess[str]:
    """Run a command in ``repo`` with this venv first on PATH (``python`` in dvc.yaml) and
    ``repo``, then ``path`` (an installed plugin's directory), on PYTHONPATH."""
    pythonpath = os.pathsep.join(map(str, (repo, *path)))
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"], "PYTHONPATH": pythonpath}
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        env.pop(var, None)  # in-process tests may have set them; dvc runs use the defaults
    proc = subprocess.run(list(cmd), cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# serving_image's p50 budget in tests of a pipeline's wiring: the suite's own load (parallel
# workers on 2 cores) must not decide them; the budget rule is tested in test_serving_image
WIRING_LATENCY_BUDGET = {"latency_budget_ms_p50": 10_000.0}

# the digits pipeline made tiny for tests of the wiring (not of the accuracy): set_params(**)
TINY_DIGITS: dict[str, dict] = {
    "task": {"options": {"conv_channels": [6, 16]}},
    # the serving-config search is tested in test_tuning and in test_pipeline_dvc
    "package": {"tune": {"budget_s": 0}},
    "train": {"epochs": 3},
    # a 3-epoch model is not worth gating tightly; the gate itself is tested in test_qat
    "qat": {
        "epochs": 1,
        "max_accuracy_drop": 5.0,
        "max_class_drop": 30.0,
        "latency": {"warmup": 1, "repeats": 3},
    },
    "evaluate": {"latency": {"warmup": 1, "repeats": 3}},
    "register": {"min_accuracy": 0.5},
    "serving_image": WIRING_LATENCY_BUDGET,
    # no server is left behind by a test's pipeline, nor two on one port: the local target
    # (params.yaml's default) is tested with a free port in tests/test_pipeline_dvc.py
    "deploy": {"target": "none"},
}


def set_params(repo: Path, *, params_file: str = "params.yaml", **updates: dict) -> None:
    """Deep-merge ``updates`` into the sections of the repo's ``params_file`` (an overlay
    keeps its ``extends``: the updates land in it, on top of its base)."""
    path = repo / params_file
    params = yaml.safe_load(path.read_text())
    for section, values in updates.items():
        params[section] = _merge(params.get(section) or {}, values)  # an overlay may lack it
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def _merge(base: dict, new: dict) -> dict:
    out = dict(base)
    for k, v in new.items():
        out[k] = _merge(base.get(k, {}), v) if isinstance(v, dict) and v else v
    return out


from components.kernel.step import STEPS as STAGES  # noqa: E402  (dvc.yaml order)

# the steps whose MLflow runs nest under the pipeline run: every stage up to promote but track
# (its run is the pipeline run); deploy runs after the pipeline run ended
STEP_RUNS = tuple(s for s in STAGES[: STAGES.index("promote") + 1] if s != "track")


def ran(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The stages a ``dvc repro`` ran, in dvc.yaml order."""
    text = proc.stdout + proc.stderr
    return [s for s in STAGES if f"Running stage '{s}'" in text]


CONTAINERS_CONF = REPO / "containers" / "containers.conf"
HAVE_PODMAN = shutil.which("podman") is not None and shutil.which("mmdebstrap") is not None
NO_PODMAN = "podman/mmdebstrap not installed (make container-deps); .ci/run installs them"


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """``make images`` (an unchanged tree rebuilds nothing): refs, sizes, build times."""
    if not HAVE_PODMAN:
        pytest.skip(NO_PODMAN)

    def make(root: Path) -> dict[str, dict]:
        # once per run, whichever worker needs them first (the others run other tests)
        proc = subprocess.run(
            [sys.executable, str(REPO / "containers" / "images.py"), "build"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads((REPO / "build" / "images.json").read_text())

    return shared(tmp_path_factory, "images", make)


HAVE_REGISTRY = shutil.which("docker-registry") is not None


@contextlib.contextmanager
def run_oci_registry(root: Path, auth: dict | None = None) -> Iterator[str]:
    """A real OCI registry (Debian's docker-registry) on 127.0.0.1, plain HTTP, declared
    insecure to podman through its own registries.conf; ``auth`` is the registry's own
    ``auth`` config (htpasswd, token). Yields ``host:port``."""
    if not HAVE_PODMAN:
        pytest.skip(NO_PODMAN)
    if not HAVE_REGISTRY:
        pytest.skip("docker-registry not installed (.ci/run installs it)")
    from pipelines.containers import free_port

    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
        "http": {"addr": f"127.0.0.1:{port}"},
        **({"auth": auth} if auth else {}),
    }
    (root / "config.yml").write_text(yaml.safe_dump(config))
    host = f"127.0.0.1:{port}"
    (root / "registries.conf").write_text(f'[[registry]]\nlocation = "{host}"\ninsecure = true\n')
    log_file = open(root / "registry.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(  # noqa: PLW1509 - preexec_fn: only prctl
        ["docker-registry", "serve", str(root / "config.yml")],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=children.die_with_parent,  # a killed test run leaves no registry behind
    )
    saved = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    os.environ["CONTAINERS_REGISTRIES_CONF"] = str(root / "registries.conf")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}/v2/", timeout=2):
                    break
            except urllib.error.HTTPError:  # 401: up, and asking for credentials
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((root / "registry.log").read_text()[-2000:]) from None
                time.sleep(0.2)
        yield host
    finally:
        if saved is None:
            os.environ.pop("CONTAINERS_REGISTRIES_CONF", None)
        else:
            os.environ["CONTAINERS_REGISTRIES_CONF"] = saved
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log_file.close()


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An anonymous local OCI registry for the module (:func:`run_oci_registry`)."""
    with run_oci_registry(tmp_path_factory.mktemp("oci-registry")) as host:
        yield host


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A real ``mlflow server`` on 127.0.0.1 for the module (registry and artifacts), and the
    process's tracking URI pointed at it (modules with a server of another kind override
    this name)."""
    from pipelines.containers import mlflow_server

    root = tmp_path_factory.mktemp("mlflow")
    with mlflow_server(root) as uri, mlflow_tracking(uri):
        yield SimpleNamespace(uri=uri, artifacts=root / "mlartifacts")
