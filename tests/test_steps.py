"""One declaration per step: the CLI, the KFP component and the dvc.yaml stage all follow
from ``STEP`` in the step's module, read the same params sections and produce the same outputs.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from components.core.config import load_params
from components.kernel.cli import step_parser
from components.kernel.dvc import dvc_stage, task_pipelines
from components.kernel.kfp import kfp_main
from components.kernel.step import AFTER_DEPLOY, STEPS, Step, all_steps, flag, load
from pipelines.training import FANOUT_STEPS
from tests.conftest import REPO, run_module

DECLARED = {s.name: s for s in all_steps()}
AFTER = {name: load(name) for name in AFTER_DEPLOY}  # CLI and KFP only, no dvc.yaml stage


def test_dvc_yaml_is_generated_from_the_declarations():
    committed = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    generated = {name: dvc_stage(step) for name, step in DECLARED.items()}
    assert list(committed) == list(STEPS)
    assert committed == generated, "run `paddle-mlops dvc-yaml` and commit dvc.yaml"


@pytest.mark.parametrize("params_file", task_pipelines())
def test_each_task_pipeline_is_generated_from_the_same_declarations(params_file):
    """tasks/<task>/dvc.yaml: the same stages, run from the repository root with the task's
    params file, writing under outputs/<task>/ (so `dvc repro` of dvc.yaml never runs it)."""
    task = params_file.split("/")[1]
    doc = yaml.safe_load((REPO / "tasks" / task / "dvc.yaml").read_text())
    generated = {name: dvc_stage(step, params_file) for name, step in DECLARED.items()}
    assert doc["stages"] == generated, "run `paddle-mlops dvc-yaml` and commit it"
    for stage in doc["stages"].values():
        assert stage["wdir"] == "../.."
        assert f"--params tasks/{task}/params.yaml" in stage["cmd"]
        for out in stage.get("outs", []):
            path = out if isinstance(out, str) else next(iter(out))
            roots = ("outputs", "checkpoints", "plots")  # plots: the uncached plot files
            assert path.startswith(tuple(f"{root}/{task}/" for root in roots)), path


@pytest.mark.parametrize("name", STEPS)
def test_cli_and_dvc_stage_bind_the_same_ports(name):
    step = DECLARED[name]
    stage = dvc_stage(step)
    # the stage's command, parsed by the step's own CLI, gives each port its declared path
    argv = shlex.split(stage["cmd"])
    assert argv[:4] == ["python3", "-m", "components", name]  # components/__main__.py
    args = step_parser(step).parse_args(argv[4:])
    assert args.params == "params.yaml"
    for port in (*step.cli_inputs(), *step.cli_outputs()):
        assert getattr(args, port.name) == port.path, port.name
    # what the stage declares as outputs is exactly what the step writes
    outs = [
        next(iter(o)) if isinstance(o, dict) else o
        for k in ("outs", "metrics", "plots")
        for o in stage.get(k, [])
    ]
    assert sorted(outs) == sorted(p.path for p in step.cli_outputs())
    assert [next(iter(o)) for o in stage.get("metrics", [])] == [
        p.path for p in step.outputs if p.dvc == "metrics"
    ]
    # plot files are drawn by the top-level `plots:` only (each once), never by the stage
    assert "plots" not in stage
    top = json.dumps(yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"])
    for port in step.outputs:
        if port.dvc in ("plots", "figures"):
            assert {port.path: {"cache": False}} in stage["outs"], port.name
            assert f'"{port.path}' in top, f"{port.path}: no top-level plot draws it"
    assert stage.get("params", []) == list(step.sections)
    for port in step.inputs:
        wanted = [f"{port.path}/{f}" for f in port.files] or [port.path]
        assert set(wanted) <= set(stage["deps"]), port.name


@pytest.mark.parametrize("name", STEPS)
def test_inputs_are_the_outputs_of_earlier_steps_at_the_same_path(name):
    """So dvc.yaml's graph (paths) and the KFP DAG (sources) are the same graph."""
    step = DECLARED[name]
    for port in step.inputs:
        producer, output = port.source.split(".")
        assert STEPS.index(producer) < STEPS.index(name), port.source
        out = next(o for o in DECLARED[producer].outputs if o.name == output)
        assert out.path == port.path, (
            f"{name}.{port.name} reads {port.path}, {port.source} is {out.path}"
        )


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    from pipelines.training import compile_pipeline

    out = compile_pipeline(tmp_path_factory.mktemp("kfp") / "training.yaml")
    return next(yaml.safe_load_all(out.read_text()))


@pytest.mark.parametrize("name", STEPS)
def test_kfp_component_has_the_declared_sections_and_ports(compiled, name):
    step = DECLARED[name]
    component = compiled["components"][f"comp-{name.replace('_', '-')}-op"]
    inputs = component["inputDefinitions"]
    assert set(inputs.get("parameters", {})) == {*step.sections, *(v.name for v in step.values)}
    # ingest and validate run as map + reduce in the DAG: the reduce task is the step's, with
    # the collected map parts as one more input
    fanned = {"parts"} if name in FANOUT_STEPS else set()
    assert set(inputs.get("artifacts", {})) == {p.name for p in step.inputs} | fanned
    outputs = component.get("outputDefinitions", {})
    assert set(outputs.get("artifacts", {})) == {p.name for p in step.outputs}
    assert set(outputs.get("parameters", {})) == ({"Output"} if step.result else set())


def test_every_params_section_is_read_by_a_step_and_every_step_section_exists():
    shipped = yaml.safe_load((REPO / "params.yaml").read_text())
    read = {s for step in (*DECLARED.values(), *AFTER.values()) for s in step.sections}
    assert read | {"resources", "paddlejob"} == set(shipped)  # resources: the KFP compiler's
    for step in (*DECLARED.values(), *AFTER.values()):
        if step.params is not None:
            assert step.name in step.sections
        for section, _, _ in step.shared:
            assert section in step.sections


@pytest.mark.parametrize("name", (*STEPS, *AFTER_DEPLOY))
def test_paddle_mlops_step_help(name):
    proc = run_module("components", name, "--help", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"usage: paddle-mlops {name}" in proc.stdout
    step = DECLARED.get(name) or AFTER[name]
    for port in (*step.cli_inputs(), *step.cli_outputs()):
        assert f"--{flag(port.name)}" in proc.stdout


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def test_cli_and_kfp_component_produce_the_same_outputs(tmp_path, exported, qat_out):
    """The package step through its CLI and through the body of its KFP component (without
    the serving-config search: its measurements differ run to run; test_tuning tests it)."""
    step: Step = load("package")
    params = load_params(REPO / "params.yaml")
    params["package"]["tune"]["budget_s"] = 0
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    proc = run_module(
        "components",
        "package",
        "--params",
        str(params_file),
        "--exported",
        str(exported),
        "--int8",
        str(qat_out[0]),
        "--bundle",
        str(tmp_path / "cli"),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    artifacts = {
        "exported": SimpleNamespace(path=str(exported)),
        "int8": SimpleNamespace(path=str(qat_out[0])),
        "bundle": SimpleNamespace(path=str(tmp_path / "kfp")),
        # the pipeline passes each section the step reads as a dict parameter
        **{s: params[s] for s in step.sections},
    }
    assert kfp_main(step.name, artifacts) is None
    cli, kfp = _tree(tmp_path / "cli"), _tree(tmp_path / "kfp")
    assert cli and cli == kfp
    assert "int8/openvino/model.xml" in cli and "legacy/model.pdmodel" in cli
    assert "model_config.json" in cli
