"""The shape of ``components/``: steps import only the library, never each other, and each
``dvc.yaml`` stage depends on every file its step imports (directly or not), so a change
to shared code reruns exactly the stages that use it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, STAGES

PACKAGE = REPO / "components"
STEP_MODULES = {f"components.{s}" for s in STAGES}


def module_file(name: str) -> Path | None:
    rel = Path(*name.split("."))
    for candidate in (REPO / rel.with_suffix(".py"), REPO / rel / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def direct_imports(name: str) -> set[str]:
    """``components.*`` modules a module imports anywhere (top level or inside functions)."""
    path = module_file(name)
    assert path is not None, name
    files = [path] if path.name != "__init__.py" else sorted(path.parent.glob("*.py"))
    found: set[str] = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("components")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "components":
                    found |= {f"components.{a.name}" for a in node.names}
                elif node.module.startswith("components."):
                    found.add(node.module)
    # a package's own modules are one unit (components.tasks.digits -> components.tasks)
    return {_unit(m) for m in found if module_file(_unit(m))} - {_unit(name)}


def _unit(name: str) -> str:
    return ".".join(name.split(".")[:2])


def closure(name: str) -> set[str]:
    seen, todo = {name}, [name]
    while todo:
        for dep in direct_imports(todo.pop()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def library_modules() -> list[str]:
    names = {f"components.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    names |= {f"components.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    return sorted(names - STEP_MODULES)


@pytest.mark.parametrize("step", sorted(STEP_MODULES))
def test_no_step_imports_another_step(step):
    others = direct_imports(step) & (STEP_MODULES - {step})
    assert not others, f"{step} imports step(s) {sorted(others)}: move shared code to the library"


@pytest.mark.parametrize("module", library_modules())
def test_the_library_imports_no_step(module):
    steps = closure(module) & STEP_MODULES
    assert not steps, f"library module {module} reaches step(s) {sorted(steps)}"


@pytest.mark.parametrize("step", sorted(STEP_MODULES))
def test_no_step_branches_on_a_task_or_a_data_format(step):
    """Steps ask the task (``Task.data`` and its hooks); no step compares a value with a
    task's or a data format's name, so adding a task changes no step."""
    from components.tasks import _REGISTRY, get_task

    names = set(_REGISTRY) | {type(get_task(t).data).name for t in ("digits", "sentiment")}
    tree = ast.parse(module_file(step).read_text(encoding="utf-8"))
    compared = {
        c.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        for c in [node.left, *node.comparators, *ast.walk(node)]
        if isinstance(c, ast.Constant) and isinstance(c.value, str)
    }
    assert not compared & names, f"{step} compares with {sorted(compared & names)}"


def test_dvc_stages_are_the_cli_steps_in_order():
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    assert tuple(dvc["stages"]) == tuple(STAGES)


@pytest.mark.parametrize("stage", STAGES)
def test_dvc_deps_cover_the_stage_import_closure(stage):
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    deps = [d if isinstance(d, str) else next(iter(d)) for d in dvc["stages"][stage]["deps"]]
    missing = []
    for module in sorted(closure(f"components.{stage}")):
        path = module_file(module)
        rel = (path.parent if path.name == "__init__.py" else path).relative_to(REPO).as_posix()
        if not any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in deps):
            missing.append(rel)
    assert not missing, f"dvc.yaml stage '{stage}' does not depend on {missing}"


def _params_classes() -> dict[str, type]:
    """Each params section and the dataclass that reads it (the steps' and shared ones)."""
    from components.kernel.step import all_steps

    out: dict[str, type] = {}
    for step in all_steps():
        if step.params is not None:
            out[step.name] = step.params
        out.update({section: cls for section, _, cls in step.shared})
    return out


# describe the data at the required ingest.source, so their default is "none declared"
SOURCE_DESCRIPTION = {"ingest.idx_files", "ingest.sha256"}


def test_dataclass_defaults_are_the_shipped_params():
    """One source of defaults: a field left out of params.yaml means what params.yaml says."""
    import dataclasses

    from components.core.config import load_params, section

    shipped = load_params(REPO / "params.yaml")
    mismatches = []
    for step, cls in _params_classes().items():
        if step not in shipped:
            continue
        loaded = section(shipped, step, cls)
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                continue  # required: params.yaml must give it
            if f"{step}.{f.name}" in SOURCE_DESCRIPTION:
                continue
            if default != getattr(loaded, f.name):
                mismatches.append(f"{step}.{f.name}: {default!r} != {getattr(loaded, f.name)!r}")
    assert not mismatches, mismatches
