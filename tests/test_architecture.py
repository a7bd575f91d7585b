"""The shape of ``components/``: rooms, no import circle, steps that import no step, a kernel
that imports none of its adapters, and ``dvc.yaml`` deps that follow each module's imports
(each module its own unit), so a change reruns exactly the stages that run the changed code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from components.kernel.step import AFTER_DEPLOY
from tests.conftest import REPO, STAGES

PACKAGE = REPO / "components"
STEP_MODULES = {f"components.steps.{s}" for s in (*STAGES, *AFTER_DEPLOY)}
# the layers, lowest first: a module imports only from its own room and the layers below
# (rooms of one layer import none of each other); kernel.cli, the CLI adapter, is above the
# libraries that its commands run, which is why those commands live in ``commands``
LAYERS: tuple[tuple[str, ...], ...] = (
    ("faults",),
    ("core",),
    ("ml",),  # data, decisions, serving, training (ML_PARTS), none of them about one task
    ("tasks",),  # the task plug-ins, and what needs a task: scoring, the trained model
    ("kernel",),  # Step declarations and their adapters (CLI, DVC, KFP)
    ("tracking",),
    ("kube",),
    ("steps", "commands"),  # a step declaration; a command line of the libraries
)
LAYER = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}
# ml's parts by what they are about, lowest first: a part imports only itself and the parts below
# (decisions read the prediction log and snapshots; serving's infra validation and training's
# export and qat use the paired gates; export and qat run the serving runtimes)
ML_PARTS = ("data", "decisions", "serving", "training")
# each room and what it may import (besides itself): some of the layers below, never above
ROOMS = {
    "faults": set(),
    "core": {"faults"},
    "ml": {"core", "faults"},
    "tasks": {"core", "faults", "ml"},
    "kernel": {"core", "faults", "tasks"},
    "tracking": {"core", "faults", "ml", "tasks"},
    "kube": {"core", "faults", "ml", "tracking", "kernel"},
    "steps": {"core", "faults", "ml", "tasks", "kernel", "tracking", "kube"},
    "commands": {"core", "faults", "tasks", "kernel", "tracking", "kube"},
}
# library rooms: functions only; their command lines (``main()`` on ``run_cli``, argparse)
# are in ``commands``, so no library imports the CLI adapter
LIBRARIES = ("faults", "core", "ml", "tasks", "tracking", "kube")
CLI_ADAPTER = "components.kernel.cli"
TOP_LEVEL = {
    "components/__init__.py",
    "components/__main__.py",
    "components/doctor.py",
    "components/summary.py",  # make run's last lines
    "components/traffic.py",  # make traffic
}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package: its ``__init__.py``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


MODULES = modules()


def imports_of(name: str, *, deferred: bool = True) -> set[str]:
    """Project modules ``name`` imports (inside functions too unless ``deferred`` is False);
    ``from pkg import mod`` counts ``pkg.mod`` when that is a module, else ``pkg``."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    nodes = ast.walk(tree) if deferred else iter(tree.body)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            found |= subs or {node.module}
    return {m for m in found if m in MODULES and m != name}


def test_every_module_is_in_a_room():
    stray = [
        p.relative_to(REPO).as_posix()
        for p in MODULES.values()
        if p.relative_to(REPO).as_posix() not in TOP_LEVEL
        and p.relative_to(PACKAGE).parts[0] not in ROOMS
    ]
    assert not stray, f"modules outside components/<room>/: {stray} (rooms: {sorted(ROOMS)})"
    steps = {p.stem for p in (PACKAGE / "steps").glob("*.py")} - {"__init__"}
    assert steps == set(STAGES) | set(AFTER_DEPLOY)


def test_no_import_circle():
    """No cycle in the graph of every project import, those inside functions included: no
    import is deferred to dodge a circle, and moving any of them to the top is safe."""
    graph = {name: imports_of(name) for name in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    assert not cycles, f"import circles: {cycles}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.count(".") >= 2))
def test_rooms_import_only_the_rooms_below(name):
    own = name.split(".")[1]
    if own not in ROOMS:
        pytest.skip("top-level module")
    bad = {m for m in imports_of(name) if m.count(".") >= 1 and m.split(".")[1] not in ROOMS[own]}
    bad = {m for m in bad if m.split(".")[1] != own}
    assert not bad, f"{name} ({own}) imports {sorted(bad)}; {own} may import {sorted(ROOMS[own])}"


def test_every_room_is_in_one_layer_and_may_import_only_layers_below():
    """The layer order is the rule: no room may import a room of its own layer or above."""
    assert set(LAYER) == set(ROOMS), (sorted(set(LAYER) ^ set(ROOMS)), "LAYERS vs ROOMS")
    assert sum(map(len, LAYERS)) == len(LAYER), "a room in two layers"
    upward = {
        room: sorted(r for r in allowed if LAYER[r] >= LAYER[room])
        for room, allowed in ROOMS.items()
        if any(LAYER[r] >= LAYER[room] for r in allowed)
    }
    assert not upward, f"rooms allowed to import their own layer or above: {upward}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.count(".") >= 2))
def test_no_module_imports_from_a_layer_above_its_own(name):
    own = name.split(".")[1]
    if own not in LAYER:
        pytest.skip("top-level module")
    above = {
        m
        for m in imports_of(name)
        if m.count(".") >= 1
        and m.split(".")[1] != own
        and LAYER.get(m.split(".")[1], -1) >= LAYER[own]
    }
    assert not above, f"{name} (layer {own}) imports from its layer or above: {sorted(above)}"


def test_every_ml_module_is_in_one_part():
    loose = [n for n in MODULES if n.startswith("components.ml.") and n.count(".") == 2]
    assert set(loose) == {f"components.ml.{p}" for p in ML_PARTS}, (
        f"modules of components/ml/ outside its parts {ML_PARTS}: "
        f"{sorted(set(loose) - {f'components.ml.{p}' for p in ML_PARTS})}"
    )


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("components.ml.")))
def test_ml_parts_import_only_their_own_part_and_the_parts_below(name):
    own = name.split(".")[2]
    above = {
        m
        for m in imports_of(name)
        if m.startswith("components.ml.")
        and m.split(".")[2] != own
        and ML_PARTS.index(m.split(".")[2]) > ML_PARTS.index(own)
    }
    assert not above, f"{name} (ml part {own}) imports a part above it: {sorted(above)}"


@pytest.mark.parametrize(
    "name", sorted(n for n in MODULES if n.count(".") >= 2 and n.split(".")[1] in LIBRARIES)
)
def test_no_library_module_is_a_command_line(name):
    """A library module neither imports the CLI adapter nor parses arguments: its command
    line (a ``main()``) is a module of ``components/commands/``."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    mains = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert CLI_ADAPTER not in imports_of(name), f"{name} imports {CLI_ADAPTER}"
    assert not mains, f"{name} defines main(): move its command line to components/commands/"


def test_every_command_is_a_commands_module_or_a_top_level_tool():
    """``paddle-mlops COMMAND`` runs a module of ``commands``, of the kernel (its own
    adapters: dvc-yaml, plots) or a top-level tool; no library module."""
    from components.kernel.cli import COMMANDS

    stray = {
        name: module
        for name, (module, _) in COMMANDS.items()
        if not module.startswith(("components.commands.", "components.kernel."))
        and MODULES[module].relative_to(REPO).as_posix() not in TOP_LEVEL
    }
    assert not stray, f"commands whose main() lives in a library: {stray}"


@pytest.mark.parametrize("step", sorted(STEP_MODULES))
def test_no_step_imports_another_step(step):
    others = imports_of(step) & (STEP_MODULES - {step})
    assert not others, f"{step} imports step(s) {sorted(others)}: move shared code to the library"


def test_the_kernel_imports_none_of_its_adapters():
    adapters = {"components.kernel.cli", "components.kernel.dvc", "components.kernel.kfp"}
    reached, todo = set(), ["components.kernel.step"]
    while todo:
        for dep in imports_of(todo.pop()):
            if dep not in reached:
                reached.add(dep)
                todo.append(dep)
    assert not reached & adapters, f"components.kernel.step reaches {sorted(reached & adapters)}"


@pytest.mark.parametrize("step", sorted(STEP_MODULES))
def test_no_step_branches_on_a_task_or_a_data_format(step):
    """Steps ask the task (``Task.data`` and its hooks); no step compares a value with a
    task's or a data format's name, so adding a task changes no step."""
    from components.tasks import available_tasks, get_task

    names = set(available_tasks()) | {type(get_task(t).data).name for t in ("digits", "sentiment")}
    tree = ast.parse(MODULES[step].read_text(encoding="utf-8"))
    compared = {
        c.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        for c in [node.left, *node.comparators, *ast.walk(node)]
        if isinstance(c, ast.Constant) and isinstance(c.value, str)
    }
    assert not compared & names, f"{step} compares with {sorted(compared & names)}"


def closure(*names: str) -> set[str]:
    """The modules importing ``names`` runs: importing a.b.c runs a/__init__.py and
    a/b/__init__.py first."""

    def with_packages(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & MODULES.keys()

    seen = set().union(*(with_packages(n) for n in names))
    todo = list(seen)
    while todo:
        for dep in imports_of(todo.pop()):
            for d in with_packages(dep) - seen:
                seen.add(d)
                todo.append(d)
    return seen


def test_dvc_stages_are_the_cli_steps_in_order():
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    assert tuple(dvc["stages"]) == tuple(STAGES)


def _pipelines() -> list[tuple[str, str]]:
    """(dvc.yaml, task module) of every committed pipeline."""
    from components.core.config import load_params
    from components.tasks import task_module

    out = []
    for dvc_yaml in [REPO / "dvc.yaml", *sorted((REPO / "tasks").glob("*/dvc.yaml"))]:
        params = dvc_yaml.parent / "params.yaml"
        name = load_params(params)["task"]["name"]
        out.append((dvc_yaml.relative_to(REPO).as_posix(), task_module(name)))
    return out


@pytest.mark.parametrize("pipeline,task", _pipelines())
def test_dvc_deps_are_exactly_the_code_each_stage_runs(pipeline, task):
    """Each stage depends on its step module's import closure, each module its own unit (with
    its data directory), plus its own task's module (no other task's): editing a module reruns
    only what runs it."""
    stages = yaml.safe_load((REPO / pipeline).read_text())["stages"]
    for stage, spec in stages.items():
        deps = {d if isinstance(d, str) else next(iter(d)) for d in spec["deps"]}
        code = {d for d in deps if d.startswith("components/")}
        roots = [f"components.steps.{stage}"] + (
            [task] if any(s == "task" or "task" in s for s in _sections(spec)) else []
        )
        files = [MODULES[m] for m in closure(*roots)]
        expected = {f.relative_to(REPO).as_posix() for f in files} | {
            data.relative_to(REPO).as_posix()  # a module's data directory (kube/crds/)
            for data in (f.with_suffix("") for f in files if f.name != "__init__.py")
            if data.is_dir() and not (data / "__init__.py").exists()
        }
        assert code == expected, (
            f"{pipeline} stage {stage}: missing {sorted(expected - code)}, "
            f"extra {sorted(code - expected)}"
        )


def _sections(spec: dict) -> list[str]:
    out = []
    for entry in spec.get("params", []):
        out += [entry] if isinstance(entry, str) else [k for v in entry.values() for k in v]
    return out


def test_a_task_module_is_a_dep_of_its_own_pipelines_only():
    """components/tasks/sentiment.py is in the sentiment pipeline's deps and in no other; the
    GAN's module in the GAN's only; digits' in digits' only, and the digits network's (LeNet,
    which the GAN's judge is) in both."""
    owners: dict[str, set[str]] = {}
    for pipeline, _ in _pipelines():
        stages = yaml.safe_load((REPO / pipeline).read_text())["stages"]
        for spec in stages.values():
            for dep in spec["deps"]:
                if isinstance(dep, str) and dep.startswith("components/tasks/"):
                    owners.setdefault(dep, set()).add(pipeline)
    assert owners["components/tasks/sentiment.py"] == {"tasks/sentiment/dvc.yaml"}
    assert owners["components/tasks/gan.py"] == {"tasks/digits_gan/dvc.yaml"}
    assert owners["components/tasks/digits.py"] == {"dvc.yaml"}
    assert owners["components/tasks/digits_net.py"] == {"dvc.yaml", "tasks/digits_gan/dvc.yaml"}
    assert "components/tasks/image_folder.py" not in owners


def test_mlflow_code_is_a_dep_of_the_stages_that_talk_to_mlflow_only():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    users = {
        name
        for name, spec in stages.items()
        if any(isinstance(d, str) and d.startswith("components/tracking/") for d in spec["deps"])
    }
    assert users == {"track", "register", "promote", "deploy"}, users


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
# what describes the default task (its files, its search space), not a default of the step
SOURCE_DESCRIPTION = {"ingest.idx_files", "ingest.sha256", "hpo.space"}


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


def _stale_by_file(repo: Path, files: list[str]) -> dict[str, set[str]]:
    """``dvc status`` (the real CLI) of every pipeline in ``repo`` after ``files`` were edited:
    file -> the stages (``pipeline:stage``) that report it as a changed dependency."""
    import json

    from tests.conftest import sh

    for rel in files:
        with (repo / rel).open("a", encoding="utf-8") as fh:
            fh.write("\n# edited\n")
    out: dict[str, set[str]] = {f: set() for f in files}
    for pipeline, _ in _pipelines():
        status = json.loads(sh(repo, "dvc", "status", "--json", pipeline).stdout or "{}")
        for stage, changes in status.items():
            name = stage.rpartition(":")[2]
            for change in changes:
                if not isinstance(change, dict):
                    continue
                for path in change.get("changed deps", {}):
                    if path in out:
                        out[path].add(f"{pipeline}:{name}")
    return out


def test_dvc_reruns_only_the_stages_that_run_an_edited_module(tmp_path):
    """The real DVC CLI on a clone: editing one task's module marks stale only the stages of
    the pipelines of that task that read ``task``; editing an MLflow-only module only the
    stages that talk to MLflow; no pipeline depends on a task it does not run."""
    from tests.conftest import clone_repo

    repo = clone_repo(tmp_path / "repo")
    tasks = sorted(p.relative_to(REPO).as_posix() for p in (PACKAGE / "tasks").glob("*.py"))
    mlflow_only = ["components/tracking/registry.py", "components/tracking/model.py"]
    commands = [  # no stage runs them
        "components/tracking/auth.py",
        "components/kernel/dvc.py",
        *sorted(p.relative_to(REPO).as_posix() for p in (PACKAGE / "commands").glob("*.py")),
    ]
    stale = _stale_by_file(repo, [*tasks, *mlflow_only, *commands])

    reads_task: dict[str, set[str]] = {}
    for pipeline, _ in _pipelines():
        stages = yaml.safe_load((REPO / pipeline).read_text())["stages"]
        reads_task[pipeline] = {s for s, spec in stages.items() if "task" in _sections(spec)}
    expected_pipelines = {
        "components/tasks/sentiment.py": {"tasks/sentiment/dvc.yaml"},
        "components/tasks/gan.py": {"tasks/digits_gan/dvc.yaml"},
        "components/tasks/digits.py": {"dvc.yaml"},
        "components/tasks/digits_net.py": {"dvc.yaml", "tasks/digits_gan/dvc.yaml"},
        "components/tasks/image_folder.py": set(),
    }
    for module, pipelines in expected_pipelines.items():
        wanted = {f"{p}:{s}" for p in pipelines for s in reads_task[p]}
        assert stale[module] == wanted, f"editing {module} reran {sorted(stale[module])}"
    # a data format's module: only the pipelines whose task stores that kind of data
    text = {p.partition(":")[0] for p in stale["components/tasks/text_data.py"]}
    assert text == {"tasks/sentiment/dvc.yaml"}, text
    for module in mlflow_only:
        stages = {e.partition(":")[2] for e in stale[module]}
        assert stages and stages <= {"track", "register", "promote", "deploy"}, (module, stages)
    for module in commands:
        assert not stale[module], f"editing {module} reran {sorted(stale[module])}"


def test_committed_dvc_locks_and_metrics_match_the_committed_files(tmp_path):
    """A fresh clone's ``dvc status`` (the real CLI) finds every committed lock true: no
    locked dependency that is a committed file (code, params) differs from it, no command
    changed, and no committed metric or plot differs from what its stage recorded. Only what
    a clone cannot have is missing: the stages' outputs and the data not pulled."""
    import json
    import subprocess

    from tests.conftest import clone_repo, sh

    tracked = set(
        subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
    )
    repo = clone_repo(tmp_path / "repo")
    problems = []
    for pipeline, _ in _pipelines():
        if pipeline.replace("dvc.yaml", "dvc.lock") not in tracked:
            continue  # not committed: nothing to be stale
        wdir = Path(pipeline).parent
        status = json.loads(sh(repo, "dvc", "status", "--json", pipeline).stdout or "{}")
        for stage, changes in status.items():
            for change in changes:
                if not isinstance(change, dict):
                    problems.append(f"{pipeline} {stage}: {change}")
                    continue
                for kind, entries in change.items():
                    if kind not in ("changed deps", "changed outs"):
                        problems.append(f"{pipeline} {stage}: {kind}")
                        continue
                    for path, state in entries.items():
                        rel = (wdir / path).as_posix() if not path.startswith("/") else path
                        committed = rel in tracked or any(
                            t.startswith(rel.rstrip("/") + "/") for t in tracked
                        )
                        if committed or state not in ("deleted", "not in cache"):
                            problems.append(f"{pipeline} {stage}: {kind} {path}: {state}")
    assert not problems, "stale dvc.lock / metrics (make run TASK=...):\n" + "\n".join(
        sorted(set(problems))[:40]
    )


def test_every_name_imported_from_the_project_exists():
    """``from components.x import y`` / ``from tests.x import y`` anywhere in the project,
    function-level imports included, names a module or name that exists: a rename cannot leave
    an import behind that only a slow test (in a tier ``make test-quick`` skips) would reach."""
    import importlib

    roots = ("components", "pipelines", "tests")
    missing = []
    for path in sorted(p for root in roots for p in (REPO / root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            if node.module.split(".")[0] not in roots:
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if alias.name == "*" or hasattr(module, alias.name):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ModuleNotFoundError:
                    missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {alias.name}")
    assert missing == []


@pytest.mark.parametrize(
    "name",
    sorted(
        n
        for n, p in MODULES.items()
        if any(
            isinstance(s, ast.Assign) and any(getattr(t, "id", None) == "REPO" for t in s.targets)
            for s in ast.parse(p.read_text(encoding="utf-8")).body
        )
    ),
)
def test_every_repo_constant_is_the_checkout(name):
    """A module that finds the checkout from its own path (``Path(__file__).parents[n]``) still
    finds it after a move: the server's sources and build dir hang off it."""
    import importlib

    assert importlib.import_module(name).REPO == REPO
