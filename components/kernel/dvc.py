"""DVC adapter: the ``dvc.yaml`` stages of a pipeline, generated from the step declarations.

A pipeline is named by its params file: ``params.yaml`` (``dvc.yaml`` at the repository
root), or any other params file, an overlay on ``params.yaml`` (``extends:``), with its
``dvc.yaml`` written beside it: ``tasks/sentiment/params.yaml`` -> ``tasks/sentiment/dvc.yaml``,
``examples/segmentation/params.yaml`` -> ``examples/segmentation/dvc.yaml``. Such a pipeline's
stages run from the repository root (``wdir``) and write under ``outputs/<pipeline>/`` etc.,
where ``<pipeline>`` is the name of the params file's directory.

A stage's deps are its input ports, its extra deps, and the repository files its code runs:
the import closure of its step module, each module its own unit, plus, for a step that reads
``task``, the closure of the pipeline's task module (and of no other task). Its params are
the keys it reads in each file of the overlay chain. So editing one module reruns the stages
that run it, and editing one task reruns only that task's pipelines.

``paddle-mlops dvc-yaml`` rewrites ``dvc.yaml`` and every ``tasks/<name>/dvc.yaml``;
``paddle-mlops dvc-yaml --params P`` writes the pipeline of ``P``. ``tests/test_steps.py``
fails when a committed file and the declarations disagree.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from components.core.artifacts import StepError, write_text
from components.core.config import REPLACE, load_params, overlay_chain
from components.kernel.cli import run_cli
from components.kernel.step import REPO, Step, all_steps, flag
from components.tasks import task_module

log = logging.getLogger(__name__)

DEFAULT_PARAMS = "params.yaml"
TASKS_DIR = "tasks"  # tasks/<name>/params.yaml + dvc.yaml: the pipelines of built-in tasks
_PER_PIPELINE_ROOTS = ("outputs", "metrics", "plots", "checkpoints")


# ---------------------------------------------------------------------------- code deps


def import_closure(*modules: str, follow: Sequence[str] = ()) -> list[str]:
    """Repository files that importing ``modules`` runs, directly or not: each module's own
    file and the ``__init__.py`` of every package above it. Every module is its own unit (a
    package's other modules count only when something imports them); imports inside
    functions count too. A module's data directory, a directory of the module's name beside
    it that is not a package (``kube/crds.py`` and ``kube/crds/``), counts with the module.
    Only files inside the repository are returned (a task installed from elsewhere is not a
    DVC dependency); the imports of the modules of the top-level packages in ``follow`` are
    followed wherever those are installed (a task plugin's: the repository modules it imports
    are dependencies even when the plugin itself is not)."""
    seen: set[Path] = set()
    todo = list(modules)
    done: set[str] = set()
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        for file in _module_files(name, outside=name.split(".")[0] in follow):
            if file in seen:
                continue
            seen.add(file)
            data = file.with_suffix("")
            if file.name != "__init__.py" and data.is_dir() and not (data / "__init__.py").exists():
                seen.add(data)
            todo.extend(_imports(file, _package_of(name, file)))
    return sorted(
        p.relative_to(REPO).as_posix()
        for p in seen
        if p.is_relative_to(REPO) and ".venv" not in p.relative_to(REPO).parts
    )


@functools.cache
def _top_dir(top: str, outside: bool = False) -> Path | None:
    """Directory holding top-level package ``top`` if its code lives in this repository (or,
    with ``outside``, wherever it is installed)."""
    if (REPO / top / "__init__.py").exists():
        return REPO
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: imports nothing
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    where = Path(next(iter(spec.submodule_search_locations))).resolve().parent
    ours = where.is_relative_to(REPO) and ".venv" not in where.parts
    return where if ours or outside else None


def _module_files(name: str, outside: bool = False) -> list[Path]:
    """The files importing ``name`` runs that belong to the repository (none: not ours), or
    with ``outside`` wherever its package is installed."""
    parts = name.split(".")
    root = _top_dir(parts[0], outside)
    if root is None:
        return []
    files = []
    for i in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:i])
        if (base / "__init__.py").exists():
            files.append(base / "__init__.py")
        elif base.with_suffix(".py").exists() and i == len(parts):
            files.append(base.with_suffix(".py"))
        else:
            break  # ``from pkg import name``: name is not a module
    return files


def _package_of(name: str, file: Path) -> str:
    return name if file.name == "__init__.py" else name.rpartition(".")[0]


def _imports(file: Path, package: str) -> tuple[str, ...]:
    stat = file.stat()  # a file changed since it was parsed is parsed again
    return _parsed_imports(file, package, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parsed_imports(file: Path, package: str, _mtime_ns: int, _size: int) -> tuple[str, ...]:
    """The modules ``file`` imports (parsed once: every step's closure shares most files)."""
    found = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.append(base)
            found += [f"{base}.{a.name}" for a in node.names if a.name != "*"]
    return tuple(found)


# ---------------------------------------------------------------------------- pipelines


def pipeline_name(params_file: str) -> str | None:
    """``None`` for the default pipeline, else the name of the params file's directory."""
    path = Path(params_file)
    return None if path.as_posix() == DEFAULT_PARAMS else path.parent.name


def pipeline_path(path: str, params_file: str) -> str:
    """Where ``path`` (a port's default, e.g. ``outputs/train``) lives in the pipeline of
    ``params_file`` (``outputs/<pipeline>/train``); the default pipeline keeps it."""
    name = pipeline_name(params_file)
    head, _, rest = path.partition("/")
    if name is None or head not in _PER_PIPELINE_ROOTS or not rest:
        return path
    return f"{head}/{name}/{rest}"


def dvc_cmd(step: Step, params_file: str = DEFAULT_PARAMS) -> str:
    """The stage command. ``python3``: there wherever Python is (Debian has no bare ``python``
    outside a venv); one without the project's dependencies (``.venv/bin/dvc repro`` with the
    venv not activated) hands over to the repository's ``.venv`` (``components/__main__.py``)."""
    ports = (*step.cli_inputs(), *step.cli_outputs())
    flags = " ".join(f"--{flag(p.name)} {pipeline_path(p.path, params_file)}" for p in ports)
    return f"python3 -m components {step.name} --params {params_file} {flags}".strip()


def _task_name(params: dict[str, Any]) -> str | None:
    task = params.get("task")
    return str(task.get("name")) if isinstance(task, dict) and task.get("name") else None


def code_deps(step: Step, params: dict[str, Any]) -> list[str]:
    """The repository files ``step`` runs in a pipeline with ``params``: its module's import
    closure, and its pipeline's task module's when it reads ``task``."""
    modules = [f"components.steps.{step.name}"]
    task = _task_name(params) if "task" in step.sections else None
    if task is not None:
        module = task_module(task)
        if module is None:
            raise StepError(f"task.name '{task}': no such task (built-in or entry point)")
        modules.append(module)
        # a plugin's package is followed wherever it is installed: its imports of ours count
        return import_closure(*modules, follow=(module.split(".")[0],))
    return import_closure(*modules)


class PipelineParams:
    """A pipeline's params, merged, and each file of its overlay chain (base first) as read:
    what every stage of the pipeline is generated from, read once for all of them."""

    def __init__(self, params_file: str) -> None:
        self.params = load_params(REPO / params_file)
        self.chain = [
            (file, yaml.safe_load(file.read_text(encoding="utf-8")) or {})
            for file in overlay_chain(REPO / params_file)
        ]


def _params_entries(step: Step, params_file: str, loaded: PipelineParams) -> list[Any]:
    """DVC ``params`` of ``step``: its sections in each file of the overlay chain that sets
    them (the default pipeline: the section names, DVC's default file)."""
    if params_file == DEFAULT_PARAMS:
        return list(step.sections)
    entries: list[Any] = []
    replaced: set[str] = set()  # sections a later file replaces whole: the base's is unread
    for file, data in reversed(loaded.chain):
        keys = [s for s in step.sections if s in data and s not in replaced]
        if keys:
            entries.insert(0, {file.relative_to(REPO).as_posix(): keys})
        replaced |= set(data.get(REPLACE) or [])
    return entries


def _local_sources(step: Step, params: dict[str, Any]) -> list[str]:
    """The local files or directories a pipeline's params name as a source in the sections
    ``step`` reads (``ingest.source``, say); builtin: and URL sources have none."""
    out = []
    for section in step.sections:
        value = params.get(section)
        source = value.get("source") if isinstance(value, dict) and section != "task" else None
        if isinstance(source, str) and source and ":" not in source.split("/")[0]:
            out.append(source)
    return out


def dvc_stage(
    step: Step, params_file: str = DEFAULT_PARAMS, loaded: PipelineParams | None = None
) -> dict[str, Any]:
    """The ``dvc.yaml`` stage of ``step`` in the pipeline of ``params_file`` (a path relative
    to the repository root); ``loaded``: that pipeline's params, when already read."""
    loaded = loaded or PipelineParams(params_file)
    params = loaded.params
    deps: list[str] = []
    for port in step.inputs:
        path = pipeline_path(port.path, params_file)
        deps += [f"{path}/{f}" for f in port.files] if port.files else [path]
    # extra deps are the default pipeline's files (data/raw: the digits); another pipeline
    # depends on the local sources its own params name instead
    default = params_file == DEFAULT_PARAMS
    deps += list(step.extra_deps) if default else _local_sources(step, params)
    deps += code_deps(step, params)
    stage: dict[str, Any] = {"cmd": dvc_cmd(step, params_file)}
    if not default:
        stage["wdir"] = os.path.relpath(REPO, (REPO / params_file).parent)
    stage["deps"] = list(dict.fromkeys(deps))
    if step.sections:
        stage["params"] = _params_entries(step, params_file, loaded)
    for port in step.cli_outputs():
        # plot files are plain (uncached) outs: the dvc.yaml's top-level `plots:` draws each
        # once, with its title and template (a stage-level plot was drawn a second time)
        key = "metrics" if port.dvc == "metrics" else "outs"
        path = pipeline_path(port.path, params_file)
        entry: Any = path
        if port.dvc in ("metrics", "plots", "figures", "uncached"):
            entry = {path: {"cache": False}}
        elif port.dvc == "persist":
            entry = {path: {"persist": True, "cache": False}}
        elif port.dvc == "snapshot":
            entry = {path: {"persist": True}}
        stage.setdefault(key, []).append(entry)
    return stage


DVC_HEADER = """\
# Generated by `paddle-mlops dvc-yaml` from the STEP declarations in components/steps/
# (tests/test_steps.py fails when this file and the declarations disagree). Each stage calls
# the step function that the KFP DAG and the tests call; deps are its inputs and the files its
# code imports (its task's module included), params the keys it reads: changing one module or
# one setting reruns only the stages that use it and what follows.
"""

# a pipeline whose dvc.yaml has this line keeps its own plots (a generator's curves are not a
# classifier's); without it, it takes the default pipeline's
_OWN_PLOTS_MARK = "# plots: this task's own"


def _moved_plots(plots: list[Any], params_file: str) -> list[Any]:
    """The default pipeline's plot definitions with their files moved to the pipeline of
    ``params_file``. Only plots of files git tracks (``plots/``) are kept: ``dvc plots show``
    reads every pipeline's, and an image under ``outputs/`` exists only where it ran."""
    name = pipeline_name(params_file)
    up = os.path.relpath(REPO, (REPO / params_file).parent)
    kept = [p for p in plots if not (isinstance(p, str) and p.startswith("outputs/"))]
    text = json.dumps(kept)
    for root in _PER_PIPELINE_ROOTS:
        text = text.replace(f'"{root}/', f'"{up}/{root}/{name}/')
    return json.loads(text)


def dvc_yaml_path(params_file: str) -> Path:
    return REPO / Path(params_file).parent / "dvc.yaml"


def write_dvc_yaml(params_file: str = DEFAULT_PARAMS) -> Path:
    """Rewrite the stages of the pipeline of ``params_file`` from the declarations (plots
    written by hand are kept; another pipeline takes the default pipeline's plots)."""
    path = dvc_yaml_path(params_file)
    current_text = path.read_text(encoding="utf-8") if path.exists() else ""
    current = yaml.safe_load(current_text) if current_text else {}
    loaded = PipelineParams(params_file)
    doc: dict[str, Any] = {
        "stages": {s.name: dvc_stage(s, params_file, loaded) for s in all_steps()}
    }
    default = params_file == DEFAULT_PARAMS
    if current and current.get("plots") and (default or _OWN_PLOTS_MARK in current_text):
        doc["plots"] = current["plots"]  # written by hand for this pipeline: kept
    elif not default:
        main = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
        if main.get("plots"):
            doc["plots"] = _moved_plots(main["plots"], params_file)
    header = DVC_HEADER
    if _OWN_PLOTS_MARK in current_text:
        header += _OWN_PLOTS_MARK + " (kept by `paddle-mlops dvc-yaml`)\n"
    if not default:
        where = Path(params_file).parent.as_posix()
        header += f"# The pipeline of {params_file}: `dvc repro {where}/dvc.yaml`.\n"
    write_text(path, header + yaml.safe_dump(doc, sort_keys=False, width=1000))
    return path


def task_pipelines() -> list[str]:
    """The params files of the built-in tasks' own pipelines (``tasks/<name>/params.yaml``)."""
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / TASKS_DIR).glob("*/params.yaml"))


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops dvc-yaml [--params P]``: rewrite ``dvc.yaml`` and every
    ``tasks/<name>/dvc.yaml``, or only the pipeline of params file ``P``."""
    parser = argparse.ArgumentParser(prog="paddle-mlops dvc-yaml", description=main.__doc__)
    parser.add_argument(
        "--params",
        action="append",
        help="a pipeline's params file (relative to the repository root; repeatable)",
    )
    args = parser.parse_args(argv)

    def _go() -> None:
        for params_file in args.params or [DEFAULT_PARAMS, *task_pipelines()]:
            rel = Path(params_file).resolve()
            if not rel.is_relative_to(REPO):
                raise StepError(f"--params {params_file}: not inside the repository {REPO}")
            log.info("wrote %s", write_dvc_yaml(rel.relative_to(REPO).as_posix()))

    return run_cli(_go)
