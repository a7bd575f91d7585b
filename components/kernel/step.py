"""The step kernel: one declaration per pipeline step.

A step module in :mod:`components.steps` ends with ``STEP = Step(...)``: its name, the
``params.yaml`` sections it reads, its input and output ports, its ``Params`` type and its
``run`` function. Everything else follows from that declaration through the adapters, which
import this module (never the reverse):

- :mod:`components.kernel.cli`: ``paddle-mlops <step>`` / ``python -m components <step>``;
- :mod:`components.kernel.kfp`: the Kubeflow Pipelines component (it receives only the
  step's own sections, so its cache key changes only when they, or its inputs, do);
- :mod:`components.kernel.dvc`: the ``dvc.yaml`` stage (deps: input ports and the files the
  step's module imports; params: the keys of its sections; outs: its output ports).

No step knows which of these runs it: every one of them ends in :meth:`Step.call`.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from components.core import overrides
from components.core.artifacts import StepError, step_clock
from components.core.config import params_source, section
from components.tasks import task_from_params

REPO = Path(__file__).resolve().parents[2]
log = logging.getLogger(__name__)

# the pipeline, in order; each name is a module components.steps.<name> that defines STEP
STEPS = (
    "ingest",
    "validate",
    "hpo",
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
# steps that run after deploy, on live traffic, outside the training DAG (no dvc.yaml stage:
# their input grows by the second, and an alarm of theirs starts the DAG): CLI and KFP
# component (pipelines/monitoring.py) only
AFTER_DEPLOY = ("monitor", "judge", "harvest")

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
    # a search's output directory: its overlay.yaml's adopted dotted keys are set in the
    # params before they are typed (components.core.overrides); not passed to run
    params_overlay: bool = False
    help: str = ""

    @property
    def passed(self) -> bool:
        """Whether ``run`` gets this input as a keyword."""
        return not (self.order_only or self.params_overlay)


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
# a gate: the step runs only on data that passed validation (it waits for, does not read, it)
VALIDATED = In(
    "validation",
    "outputs/validate",
    "",
    source="validate.report",
    files=("summary.json",),
    order_only=True,
)


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
        sets: Mapping[str, Any] | None = None,
        set_ifs: Sequence[tuple[tuple[str, Any], tuple[str, Any]]] = (),
    ) -> Any:
        """Run the step on ``sections`` (params mapping) with ``paths`` keyed by port name;
        a params-overlay input's adopted keys are set first, then ``sets`` and ``set_ifs``
        (``--set``/``--set-if``): the command line wins."""
        origins: dict[str, str] = {}  # an overridden key -> what set it, for the error line
        for port in self.inputs:
            if port.params_overlay and (found := overrides.read_overlay(paths.get(port.name))):
                file = Path(paths[port.name]) / overrides.OVERLAY
                sections = overrides.override(sections, found, what=f"{file}: params:")
                origins |= dict.fromkeys(found, str(file))
        if sets or set_ifs:
            sections = overrides.override(sections, sets or {}, set_ifs)
            origins |= dict.fromkeys(sets or {}, "--set") | {
                k: "--set-if" for _, (k, _v) in set_ifs
            }
        accepted = inspect.signature(self.run).parameters
        try:
            kwargs, task = self._typed(sections)
        except StepError as exc:
            raise StepError(overrides.blame(str(exc), origins)) from None
        if task is not None and "task" in accepted:
            kwargs["task"] = task
        extras = {
            "task_params": lambda: dict(sections.get("task") or {}),
            "all_params": lambda: sections,
            "params_file": lambda: params_source(sections),
        }
        kwargs.update({k: make() for k, make in extras.items() if k in accepted})
        for port in (*self.inputs, *self.outputs):
            if isinstance(port, In) and not port.passed or getattr(port, "derived_from", None):
                continue
            kwargs[port.arg] = Path(paths[port.name])
        for value in self.values:
            kwargs[value.arg] = (values or {}).get(value.name, value.default)
        with step_clock():  # the manifests it writes say when its work started
            return self.run(**kwargs)

    def _typed(self, sections: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
        """The typed params keywords of ``run`` and the task (one error line on a bad value)."""
        kwargs: dict[str, Any] = {}
        source = params_source(sections)  # type: ignore[arg-type]
        if self.params is not None:  # the step's own section first: its errors come first
            kwargs["params"] = section(dict(sections), self.name, self.params, source=source)
        task = task_from_params(sections) if "task" in self.sections else None
        if self.params_of_task is not None and task is not None:
            # the section's type is the task's (its data format's ingest/validate params)
            kwargs["params"] = section(
                dict(sections), self.name, self.params_of_task(task), source=source
            )
        for name, arg, cls in self.shared:
            kwargs[arg] = section(dict(sections), name, cls, source=source)
        return kwargs, task

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


def flag(name: str) -> str:
    return name.replace("_", "-")


def load(name: str) -> Step:
    """The declaration of step ``name`` (imports its module)."""
    if name not in (*STEPS, *AFTER_DEPLOY):
        raise StepError(f"unknown step {name!r}: one of {', '.join((*STEPS, *AFTER_DEPLOY))}")
    step = importlib.import_module(f"components.steps.{name}").STEP
    assert isinstance(step, Step) and step.name == name, name
    return step


def all_steps() -> list[Step]:
    return [load(name) for name in STEPS]


def sections() -> tuple[str, ...]:
    """Every params.yaml section some step reads, in pipeline order."""
    return tuple(dict.fromkeys(s for step in all_steps() for s in step.sections))
