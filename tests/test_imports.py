"""A step that never runs a model never imports paddle.

``import paddle`` costs about 1.4 s of CPU (measured: AMD EPYC, 2 vCPU, 2026-12-06): every
``dvc repro`` pays it once per stage that loads it, and a suite runs hundreds of stages. So a
task's options, data format and objective (what ingest, validate, hpo, register and track read)
live apart from its network (``components/tasks/digits_net.py``) and paddle is imported where a
model is built, trained, exported or preprocessed. These tests run the steps in an interpreter
whose import of paddle fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

# an interpreter in which paddle is found (``find_spec``: the CLI's dependency check passes) but
# importing it, or anything under it, raises
NO_PADDLE = """
import importlib.machinery, sys
class NoPaddle:
    def find_spec(self, name, path=None, target=None):
        if name == "paddle" or name.startswith("paddle."):
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        raise ImportError(f"paddle imported ({module.__name__})")
sys.meta_path.insert(0, NoPaddle())
"""
# in it, the rest of argv runs as ``python -m components ...`` would
BLOCKED = (
    NO_PADDLE
    + """
import runpy
sys.argv = ["components", *sys.argv[1:]]
runpy.run_module("components", run_name="__main__", alter_sys=True)
"""
)

PROBE = (
    NO_PADDLE
    + """
import components.steps.ingest, components.steps.validate, components.steps.hpo
import components.steps.register, components.steps.track, components.steps.promote
import components.steps.deploy, components.steps.package
from components.tasks import get_task
for name in ("digits", "image_folder"):
    task = get_task(name)
    assert task.data is not None and task.objective().score
    assert task.input_specs()
print("ok")
"""
)


# the digits scikit-learn ships, so the test needs no data/raw
BUILTIN = (
    "--set",
    "ingest.source=builtin:digits",
    "--set",
    "ingest.kind=builtin",
    "--set",
    "ingest.sha256={}",
)


def _python(code: str, *argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=cwd, capture_output=True, text=True
    )


def test_the_blocker_blocks_paddle():
    """Positive control: the network module does import paddle, and the probe says so."""
    proc = _python(PROBE.replace('print("ok")', "import components.tasks.digits_net"))
    assert proc.returncode != 0 and "paddle imported (paddle)" in proc.stderr


def test_steps_and_tasks_without_a_model_import_no_paddle():
    proc = _python(PROBE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


def test_ingest_validate_and_a_switched_off_search_run_without_paddle(tmp_path: Path):
    """The real CLI steps on the real digits, in that interpreter: each exits 0."""
    out = tmp_path / "outputs"
    params = str(REPO / "params.yaml")
    for argv in (
        ["ingest", "--params", params, "--data", str(out / "ingest")],
        [
            "validate",
            "--params",
            params,
            "--data",
            str(out / "ingest"),
            "--report",
            str(out / "validate"),
        ],
        [
            "hpo",
            "--params",
            params,
            "--data",
            str(out / "ingest"),
            "--out",
            str(out / "hpo"),
            "--study",
            str(out / "study"),
            "--metrics",
            str(out / "hpo.json"),
        ],
    ):
        proc = _python(BLOCKED, *argv, *BUILTIN)
        assert proc.returncode == 0, f"{argv[0]}: {proc.stderr[-2000:]}"
        assert "paddle imported" not in proc.stderr


def test_importing_kfp_builds_no_uri_grammar():
    """jsonschema (imported by kfp, great_expectations and the serving config) builds a Lark
    grammar at import when rfc3987-syntax is installed: 1.2 CPU s in every step that imports
    it. `make install` removes it; kfp and jsonschema still import and validate."""
    proc = _python(
        "import sys, kfp, jsonschema\n"
        "jsonschema.validate({'a': 1}, {'properties': {'a': {'type': 'integer'}}})\n"
        "print(sorted(m for m in sys.modules if m.startswith(('rfc3987', 'lark'))))"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
