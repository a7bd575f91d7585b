"""One declaration per pipeline step, and everything that follows from it.

A step module ends with ``STEP = Step(...)``: its name, the ``params.yaml`` sections it reads,
its input and output ports, its ``Params`` type and its ``run`` function. From that one
declaration come, with no per-step glue:

- the CLI: ``paddle-mlops <step>``, ``python -m components <step>`` and
  ``python -m components.<step>`` (:meth:`Step.main`);
- the Kubeflow Pipelines component (:func:`kfp_component`): it receives only the step's own
  sections, so its cache key changes only when they (or its inputs) do;
- the ``dvc.yaml`` stage (:func:`dvc_stage`; ``python -m components dvc-yaml`` writes them and
  ``tests/test_steps.py`` checks the committed file): deps are the step's input ports, the
  files its module imports (its import closure) and its extra files; params are its sections;
  outs, metrics and plots are its output ports.

No step knows which of these runs it: every one of them ends in :meth:`Step.call`.
"""

from __future__ import annotations

import argparse
import ast
import csv
import importlib
import inspect
import linecache
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from components.artifacts import StepError, read_json, sweep_dead_temporaries

REPO = Path(__file__).resolve().parents[1]
log = logging.getLogger(__name__)

# the pipeline, in order; each name is a module components.<name> that defines STEP
STEPS = (
    "ingest",
    "validate",
    "train",
    "export",
    "qat",
    "package",
    "evaluate",
    "serving_image",
    "track",
    "register",
    "promote",
    "deploy",
)

KfpType = Literal["Dataset", "Model", "Artifact", "Metrics", "ClassificationMetrics", "HTML"]


@dataclass(frozen=True)
class In:
    """An input: a path another step (``source`` = ``"step.port"``) or the user provides."""

    name: str  # CLI flag --<name> and KFP parameter name
    path: str  # the default path: what dvc.yaml passes, relative to the repository
    arg: str  # the keyword of ``run`` it binds to
    source: str | None = None
    kfp: KfpType = "Artifact"
    files: tuple[str, ...] = ()  # dvc.yaml deps: only these files under ``path``
    order_only: bool = False  # a gate the step waits for but does not read: not passed to run
    help: str = ""


@dataclass(frozen=True)
class Out:
    """An output the step writes atomically: a directory, or a file (metrics, plots)."""

    name: str
    path: str
    arg: str
    kfp: KfpType = "Artifact"
    # figures: a directory of images for `dvc plots show`, kept in git like metrics and plots
    # snapshot: cached like outs, but not removed before the stage runs, so the step can reuse
    # what it wrote last time (ingest links the shards of unchanged inputs)
    dvc: Literal["outs", "metrics", "plots", "figures", "persist", "snapshot", "uncached"] = "outs"
    derived_from: tuple[str, str] | None = None  # KFP only: a copy of (output, relative file)
    help: str = ""

    @property
    def is_file(self) -> bool:
        return self.dvc in ("metrics", "plots")


@dataclass(frozen=True)
class Value:
    """A string the orchestrator hands over at run time (e.g. an image digest)."""

    name: str
    arg: str
    default: str = ""
    help: str = ""


# inputs several steps read: the ingested data set and the served bundle
DATA = In("data", "outputs/ingest", "data_dir", source="ingest.data", help="ingested data set")
BUNDLE = In("bundle", "outputs/package", "model_dir", source="package.bundle", help="served bundle")


@dataclass(frozen=True)
class Step:
    name: str
    doc: str
    params: type | None  # the frozen dataclass of section ``name`` (None: the step has none)
    sections: tuple[str, ...]  # params.yaml sections it reads (its own + e.g. "task")
    run: Callable[..., Any]
    inputs: tuple[In, ...] = ()
    outputs: tuple[Out, ...] = ()
    values: tuple[Value, ...] = ()
    # other sections the step reads typed: (section, run keyword, dataclass)
    shared: tuple[tuple[str, str, type], ...] = ()
    result: str | None = None  # attribute of run's return value that the KFP component returns
    result_type: type = str
    extra_deps: tuple[str, ...] = ()  # more dvc.yaml deps (sources outside components/)
    # the dataclass of section ``name`` comes from the task (its data format's, say)
    params_of_task: Callable[[Any], type] | None = None

    # ------------------------------------------------------------------ the one call

    def call(
        self,
        sections: Mapping[str, Any],
        paths: Mapping[str, str | Path],
        values: Mapping[str, str] | None = None,
    ) -> Any:
        """Run the step on ``sections`` (params mapping) with ``paths`` keyed by port name."""
        from components.cli import task_from_params
        from components.config import params_source, section

        accepted = inspect.signature(self.run).parameters
        kwargs: dict[str, Any] = {}
        source = params_source(sections)
        if self.params is not None:  # the step's own section first: its errors come first
            kwargs["params"] = section(dict(sections), self.name, self.params, source=source)
        task = task_from_params(sections) if "task" in self.sections else None
        if self.params_of_task is not None and task is not None:
            # the section's type is the task's (its data format's ingest/validate params)
            kwargs["params"] = section(
                dict(sections), self.name, self.params_of_task(task), source=source
            )
        for name, arg, cls in self.shared:
            kwargs[arg] = section(dict(sections), name, cls, source=params_source(sections))
        if task is not None and "task" in accepted:
            kwargs["task"] = task
        extras = {
            "task_params": lambda: dict(sections.get("task") or {}),
            "all_params": lambda: sections,
            "params_file": lambda: params_source(sections),
        }
        kwargs.update({k: make() for k, make in extras.items() if k in accepted})
        for port in (*self.inputs, *self.outputs):
            if isinstance(port, In) and port.order_only or getattr(port, "derived_from", None):
                continue
            kwargs[port.arg] = Path(paths[port.name])
        for value in self.values:
            kwargs[value.arg] = (values or {}).get(value.name, value.default)
        return self.run(**kwargs)

    # ------------------------------------------------------------------ CLI

    def cli_inputs(self) -> list[In]:
        return [p for p in self.inputs if not p.order_only]

    def cli_outputs(self) -> list[Out]:
        return [p for p in self.outputs if p.derived_from is None]

    def argv(self, params_file: str | Path, paths: Mapping[str, str | Path]) -> list[str]:
        """The CLI arguments (after ``python -m components``) that run this step on
        ``params_file`` with ``paths`` keyed by ``run``'s keyword (a missing one: default)."""
        argv = [self.name, "--params", str(params_file)]
        for port in (*self.cli_inputs(), *self.cli_outputs()):
            if paths.get(port.arg) is not None:
                argv += [f"--{flag(port.name)}", str(paths[port.arg])]
        return argv

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog=f"python -m components.{self.name}",
            description=self.doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument(
            "--params", default="params.yaml", help="params file (default: %(default)s)"
        )
        for port in (*self.cli_inputs(), *self.cli_outputs()):
            kind = "input" if isinstance(port, In) else "output"
            parser.add_argument(
                f"--{flag(port.name)}",
                dest=port.name,
                default=port.path,
                help=f"{port.help or port.name} ({kind}; default: %(default)s)",
            )
        for value in self.values:
            parser.add_argument(
                f"--{flag(value.name)}", dest=value.name, default=value.default, help=value.help
            )
        return parser

    def main(self, argv: Sequence[str] | None = None) -> int:
        """The CLI: parse flags, check the output paths, load params, :meth:`call`."""
        from components.cli import output_dir, run_cli

        args = self.parser().parse_args(argv)

        def _go() -> None:
            from components import failpoints
            from components.config import load_params

            failpoints.set_step(self.name)
            parents = set()
            for port in self.cli_outputs():
                target = Path(getattr(args, port.name))
                output_dir(target.parent if port.is_file else target, f"--{flag(port.name)}")
                parents.add(target.parent)
            for gone in (g for parent in parents for g in sweep_dead_temporaries(parent)):
                log.warning("removed %s, left by a writer that was killed", gone)
            paths = {
                p.name: getattr(args, p.name) for p in (*self.cli_inputs(), *self.cli_outputs())
            }
            values = {v.name: getattr(args, v.name) for v in self.values}
            self.call(load_params(args.params), paths, values)

        return run_cli(_go)


def flag(name: str) -> str:
    return name.replace("_", "-")


def load(name: str) -> Step:
    """The declaration of step ``name`` (imports its module)."""
    if name not in STEPS:
        raise StepError(f"unknown step {name!r}: one of {', '.join(STEPS)}")
    step = importlib.import_module(f"components.{name}").STEP
    assert isinstance(step, Step) and step.name == name, name
    return step


def all_steps() -> list[Step]:
    return [load(name) for name in STEPS]


def sections() -> tuple[str, ...]:
    """Every params.yaml section some step reads, in pipeline order."""
    return tuple(dict.fromkeys(s for step in all_steps() for s in step.sections))


# ---------------------------------------------------------------------------- KFP


def kfp_source(step: Step) -> str:
    """Source of the lightweight KFP component function of ``step``.

    Its signature is generated from the declaration (KFP reads the annotations); its body
    hands the arguments to :func:`kfp_main`, which calls :meth:`Step.call` like the CLI does.
    """
    params = [f"{s}: dict" for s in step.sections]
    params += [f"{p.name}: Input[{source_type(p)}]" for p in step.inputs]
    params += [f"{p.name}: Output[{p.kfp}]" for p in step.outputs]
    params += [f"{v.name}: str = {v.default!r}" for v in step.values]
    returns = f" -> {step.result_type.__name__}" if step.result else ""
    signature = ",\n    ".join(params)
    return (
        f"def {step.name}_op(\n    {signature},\n){returns}:\n"
        f"    from components.step import kfp_main\n\n"
        f"    return kfp_main({step.name!r}, locals())\n"
    )


def source_type(port: In) -> str:
    """The KFP artifact type of an input: its producer's (so KFP's type check holds)."""
    if port.source is None:
        return port.kfp
    producer, output = port.source.split(".")
    return next(p.kfp for p in load(producer).outputs if p.name == output)


def kfp_function(step: Step) -> Callable[..., Any]:
    """:func:`kfp_source` as a function whose source ``inspect`` can read (KFP embeds it)."""
    from kfp import dsl

    source = kfp_source(step)
    filename = f"<paddle-mlops step {step.name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"Input": dsl.Input, "Output": dsl.Output}
    namespace.update({t: getattr(dsl, t) for t in KfpType.__args__})  # type: ignore[attr-defined]
    code = compile(source, filename, "exec", dont_inherit=True)  # no postponed annotations
    exec(code, namespace)  # noqa: S102 - our own generated source
    fn = namespace[f"{step.name}_op"]
    fn.__doc__ = (step.doc or "").strip().splitlines()[0] if step.doc else None
    return fn


def kfp_component(step: Step, base_image: str) -> Any:
    from kfp import dsl

    return dsl.component(base_image=base_image, install_kfp_package=False)(kfp_function(step))


def kfp_main(name: str, args: Mapping[str, Any]) -> Any:
    """Body of every generated KFP component: :meth:`Step.call` on the artifacts' paths, then
    the outputs KFP shows (metrics, confusion matrix, HTML) from the files the step wrote."""
    from components import failpoints
    from components.cli import setup_logging

    setup_logging()
    failpoints.set_step(name)  # as Step.main does: a failpoint may name the step
    step = load(name)
    params = {s: args[s] for s in step.sections}
    paths = {p.name: args[p.name].path for p in (*step.inputs, *step.outputs)}
    result = step.call(params, paths, {v.name: args[v.name] for v in step.values})
    for port in step.outputs:
        artifact = args[port.name]
        if port.derived_from is not None:
            origin, rel = port.derived_from
            shutil.copy(Path(args[origin].path) / rel, artifact.path)
        elif port.kfp == "Metrics":
            for key, value in numeric(read_json(artifact.path)).items():
                artifact.log_metric(key, value)
        elif port.kfp == "ClassificationMetrics":
            labels, matrix = confusion_from_csv(Path(artifact.path))
            artifact.log_confusion_matrix(labels, matrix)
    if step.result is None:
        return None
    for attr in step.result.split("."):
        result = getattr(result, attr)
    return step.result_type(result)


def numeric(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers in a (nested) metrics mapping as ``a.b`` keys; booleans count 0/1."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            out.update(numeric(value, f"{prefix}{key}."))
        elif isinstance(value, bool | int | float):
            out[f"{prefix}{key}"] = float(value)
    return out


def confusion_from_csv(path: Path) -> tuple[list[str], list[list[int]]]:
    """``actual,predicted`` rows (DVC's confusion plot) as labels and a count matrix."""
    with path.open(newline="", encoding="utf-8") as fh:
        rows = [(r["actual"], r["predicted"]) for r in csv.DictReader(fh)]
    labels = sorted({x for row in rows for x in row}, key=_natural)
    index = {label: i for i, label in enumerate(labels)}
    matrix = [[0] * len(labels) for _ in labels]
    for actual, predicted in rows:
        matrix[index[actual]][index[predicted]] += 1
    return labels, matrix


def _natural(label: str) -> tuple[int, Any]:
    return (0, int(label)) if label.isdigit() else (1, label)


# ---------------------------------------------------------------------------- DVC


def import_closure(module: str) -> list[str]:
    """Repository files (``components/...``) that ``module`` imports, directly or not,
    including its own; a package counts as its directory."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        unit = ".".join(name.split(".")[:2])
        if unit in seen:
            continue
        path = _module_path(unit)
        if path is None:
            continue
        seen[unit] = path
        files = [path] if path.is_file() else sorted(path.glob("*.py"))
        for file in files:
            todo.extend(_imports(file))
    return sorted(p.relative_to(REPO).as_posix() for p in seen.values())


def _module_path(unit: str) -> Path | None:
    rel = Path(*unit.split("."))
    if (REPO / rel).is_dir() and (REPO / rel / "__init__.py").exists():
        return REPO / rel
    candidate = (REPO / rel).with_suffix(".py")
    return candidate if candidate.exists() else None


def _imports(file: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("components.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "components":
                found += [f"components.{a.name}" for a in node.names]
            elif node.module.startswith("components."):
                found.append(node.module)
    return found


TASKS_DIR = "tasks"  # tasks/<name>/params.yaml + dvc.yaml: the pipeline of another task
_PER_TASK_ROOTS = ("outputs", "metrics", "plots", "checkpoints")


def task_path(path: str, task: str | None) -> str:
    """Where ``path`` (a port's default, e.g. ``outputs/train``) lives in the pipeline of
    ``task`` (``outputs/<task>/train``); the default pipeline (``task`` None) keeps it."""
    head, _, rest = path.partition("/")
    if task is None or head not in _PER_TASK_ROOTS or not rest:
        return path
    return f"{head}/{task}/{rest}"


def task_params_file(task: str | None) -> str:
    return "params.yaml" if task is None else f"{TASKS_DIR}/{task}/params.yaml"


def dvc_cmd(step: Step, task: str | None = None) -> str:
    ports = (*step.cli_inputs(), *step.cli_outputs())
    flags = " ".join(f"--{flag(p.name)} {task_path(p.path, task)}" for p in ports)
    params = task_params_file(task)
    return f"python -m components {step.name} --params {params} {flags}".strip()


def dvc_stage(step: Step, task: str | None = None) -> dict[str, Any]:
    """The ``dvc.yaml`` stage of ``step``: in the default pipeline (``dvc.yaml``, reading
    ``params.yaml``), or in ``tasks/<task>/dvc.yaml`` (run from the repository root, reading
    ``tasks/<task>/params.yaml``, writing under ``outputs/<task>/`` etc.)."""
    deps: list[str] = []
    for port in step.inputs:
        path = task_path(port.path, task)
        deps += [f"{path}/{f}" for f in port.files] if port.files else [path]
    # extra deps are the default pipeline's files (data/raw: the digits); a task's pipeline
    # depends on the local source its own params name instead
    extra = list(step.extra_deps) if task is None else _local_sources(step, task)
    deps += [*extra, *import_closure(f"components.{step.name}")]
    stage: dict[str, Any] = {"cmd": dvc_cmd(step, task)}
    if task is not None:
        stage["wdir"] = "../.."
    stage["deps"] = list(dict.fromkeys(deps))
    if step.sections:
        sections = list(step.sections)
        stage["params"] = sections if task is None else [{task_params_file(task): sections}]
    for port in step.cli_outputs():
        key = {"metrics": "metrics", "plots": "plots", "figures": "plots"}.get(port.dvc, "outs")
        path = task_path(port.path, task)
        entry: Any = path
        if port.dvc in ("metrics", "plots", "figures", "uncached"):
            entry = {path: {"cache": False}}
        elif port.dvc == "persist":
            entry = {path: {"persist": True, "cache": False}}
        elif port.dvc == "snapshot":
            entry = {path: {"persist": True}}
        stage.setdefault(key, []).append(entry)
    return stage


def _local_sources(step: Step, task: str) -> list[str]:
    """The local files or directories ``tasks/<task>/params.yaml`` names as a source in the
    sections ``step`` reads (``ingest.source``, say); builtin: and URL sources have none."""
    import yaml

    path = REPO / task_params_file(task)
    params = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else {}
    out = []
    for section in step.sections:
        source = (params.get(section) or {}).get("source") if section != "task" else None
        if isinstance(source, str) and source and ":" not in source.split("/")[0]:
            out.append(source)
    return out


DVC_HEADER = """\
# Generated by `python -m components dvc-yaml` from the STEP declarations in components/
# (tests/test_steps.py fails when this file and the declarations disagree). Each stage calls
# the step function that the KFP DAG and the tests call; deps are its inputs and the files its
# module imports, params the sections it reads: changing one step's code or params reruns
# only that stage and what follows.
"""


# a task pipeline whose dvc.yaml has this line keeps its own plots (a generator's curves are
# not a classifier's); without it, it takes the default pipeline's
_TASK_PLOTS_MARK = "# plots: this task's own"


def _task_plots(plots: list[Any], task: str) -> list[Any]:
    """The default pipeline's plot definitions with their files moved to ``task``'s. Only
    plots of files git tracks (``plots/``) are kept: ``dvc plots show`` reads every
    pipeline's, and an image under ``outputs/`` exists only where that pipeline ran."""
    import json

    kept = [p for p in plots if not (isinstance(p, str) and p.startswith("outputs/"))]
    text = json.dumps(kept)
    for root in _PER_TASK_ROOTS:
        text = text.replace(f'"{root}/', f'"../../{root}/{task}/')
    return json.loads(text)


def write_dvc_yaml(path: Path = REPO / "dvc.yaml", task: str | None = None) -> Path:
    """Rewrite the stages of ``path`` from the declarations (top-level plots are kept; a
    task's pipeline takes the default pipeline's plots)."""
    import yaml

    current_text = path.read_text(encoding="utf-8") if path.exists() else ""
    current = yaml.safe_load(current_text) if current_text else {}
    doc: dict[str, Any] = {"stages": {s.name: dvc_stage(s, task) for s in all_steps()}}
    if current and current.get("plots") and (task is None or _TASK_PLOTS_MARK in current_text):
        doc["plots"] = current["plots"]  # written by hand for this pipeline: kept
    elif task is not None:
        default = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
        if default.get("plots"):
            doc["plots"] = _task_plots(default["plots"], task)
    header = DVC_HEADER
    if _TASK_PLOTS_MARK in current_text:
        header += _TASK_PLOTS_MARK + " (kept by `python -m components dvc-yaml`)\n"
    if task is not None:
        header += (
            f"# The pipeline of task '{task}': `dvc repro {TASKS_DIR}/{task}/dvc.yaml` "
            "(make run TASK=" + task + ").\n"
        )
    text = header + yaml.safe_dump(doc, sort_keys=False, width=1000)
    from components.artifacts import write_text

    write_text(path, text)
    return path


def task_pipelines() -> list[str]:
    """The tasks with a pipeline of their own (``tasks/<name>/params.yaml``)."""
    return sorted(p.parent.name for p in (REPO / TASKS_DIR).glob("*/params.yaml"))


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops dvc-yaml``: rewrite the stages of ``dvc.yaml`` (and of every
    ``tasks/<name>/dvc.yaml``) from the declarations."""
    import logging

    from components.cli import run_cli

    parser = argparse.ArgumentParser(prog="paddle-mlops dvc-yaml", description=main.__doc__)
    parser.add_argument("--out", default=str(REPO / "dvc.yaml"))
    args = parser.parse_args(argv)

    def _go() -> None:
        logger = logging.getLogger(__name__)
        logger.info("wrote %s", write_dvc_yaml(Path(args.out)))
        for task in task_pipelines():
            out = REPO / TASKS_DIR / task / "dvc.yaml"
            logger.info("wrote %s", write_dvc_yaml(out, task))

    return run_cli(_go)
