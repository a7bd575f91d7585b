"""The training pipeline as a Kubeflow Pipelines v2 DAG over the same step declarations.

This module is the DAG only. Every step's component is generated from its ``STEP``
declaration (``components.kernel.kfp.kfp_component``): it receives only the params sections the step
reads (so its cache key changes only when they or its inputs do) and calls the same function
as the CLI and ``dvc repro``. The wiring follows each input port's ``source``. The same DAG
compiles for a cluster (``base_image`` = the component image) and runs on this machine
through ``kfp.local`` (see ``run_local``).

    python -m pipelines.training compile --out pipelines/compiled/training.yaml
    python -m pipelines.training local --params params.yaml      # kfp.local, this machine

Where training runs is chosen when the pipeline is compiled, from the params file it is
compiled with (``compile --params``, default ``params.yaml``; read like ``resources``):
``train.distributed.backend: paddlejob`` puts the PaddleJob launcher
(``pipelines/paddlejob/``) in the train task's place. It has the train task's inputs and
outputs, so every later step is wired to it unchanged; it mounts the shared volume
(``paddlejob.pvc`` at ``paddlejob.mount_path``, also read at compile time) and the pipeline
gains the parameter ``paddlejob`` (``pipeline_params`` passes that section only then). Any
other backend keeps the train task, which trains in its own pod (``nproc`` ranks there). At
run time the launcher refuses a run whose params say another backend or volume than the
pipeline was compiled with. Not a run-time ``dsl.If``: the PVC mount, the task's image and
environment are compile-time properties of a task, and the choice stays visible in the DAG.

Ingest is a map over the source's units followed by a reduce (``components.steps.ingest``): the
plan task names ``ingest.workers`` unit groups, a ``dsl.ParallelFor`` ingests each group in
its own pod (its shards and a part file), and the ``ingest-op`` task reduces the collected
parts into the snapshot every later step reads, so a large ingest spreads over the nodes.
Validate does the same over the snapshot's shards (``validate.workers`` shard groups, then the
``validate-op`` reduce that runs the Great Expectations suites).
"""

import argparse
import contextlib
import inspect
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kfp import compiler, dsl

from components.core.config import Params, params_source, section
from components.kernel.params_schema import Resources
from components.kernel.step import AFTER_DEPLOY, load
from pipelines import paddlejob as pj
from pipelines.training_cluster import typed_resources
from pipelines.training_dag import GPU_IMAGE as GPU_IMAGE  # re-exported
from pipelines.training_dag import IMAGE, STEPS, TrainingDag, ops

REPO = Path(__file__).resolve().parents[1]

# steps that run as a map (a ParallelFor over groups) and a reduce task in the step's place
FANOUT_STEPS = ("ingest", "validate")
# the pipeline's parameters: one per params.yaml section that some step reads
SECTIONS = tuple(dict.fromkeys(s for step in STEPS.values() for s in step.sections))
# the sections only the steps after deploy read (monitor, judge): params.yaml holds them, this
# pipeline does not take them
AFTER_DEPLOY_SECTIONS = frozenset(
    s for name in AFTER_DEPLOY for s in load(name).sections if s not in SECTIONS
)


def load_resources(params_file: str | Path = REPO / "params.yaml") -> Resources:
    return typed_resources(_load(params_file))


def _load(params_file: str | Path) -> Params:
    import yaml

    params = Params(yaml.safe_load(Path(params_file).read_text()) or {})
    params.source = str(params_file)
    return params


TRAIN_BACKENDS = ("step", "paddlejob")


def train_backend(params: dict[str, Any]) -> str:
    """Where the train task trains: ``paddlejob`` when ``train.distributed.backend`` says so
    (a Kubeflow PaddleJob, started by the launcher task), else ``step`` (in the task's pod).
    The ``train`` section is read typed, as the train step reads it."""
    train = section(params, "train", load("train").params)
    return "paddlejob" if train.distributed.backend == "paddlejob" else "step"


def shared_volume(params: dict[str, Any], backend: str) -> pj.PaddleJobParams:
    """The ``paddlejob`` section, typed (optional: its defaults when absent), for a pipeline
    compiled for ``backend`` ``paddlejob``; another backend's pipeline does not read it."""
    if backend != "paddlejob":
        return pj.PaddleJobParams()
    return pj.typed(params.get("paddlejob"), params_source(params))


def local_ingest_source(params: dict[str, Any]) -> Path | None:
    """``ingest.source`` when it is a path on this machine (None: a built-in source or a
    URI), read typed by the task's ingest params: a pipeline's tasks do not run in this
    directory, so the callers rewrite it."""
    from components.tasks import task_from_params

    ingest = section(params, "ingest", task_from_params(params).data.ingest_params)
    if ingest.kind == "builtin" or "://" in ingest.source:
        return None
    return Path(ingest.source)


def pipeline_sections(backend: str) -> tuple[str, ...]:
    """The pipeline's dict parameters: the steps' sections, + ``paddlejob`` for the launcher."""
    return (*SECTIONS, "paddlejob") if backend == "paddlejob" else SECTIONS


RETRY = {"num_retries": 3, "backoff_duration": "30s", "backoff_factor": 2.0}


def retry_policy(backoff_s: float | None = None) -> dict[str, Any]:
    """:data:`RETRY`, with a first backoff of ``backoff_s`` seconds when given."""
    return RETRY if backoff_s is None else {**RETRY, "backoff_duration": f"{backoff_s:g}s"}


def _pipeline_function(names: Sequence[str], dag: Callable[[dict[str, Any]], None]) -> Any:
    """A function whose parameters KFP reads as the pipeline's (one ``dict`` per params.yaml
    section in ``names``, then ``build_in_cluster`` and ``retrain_reason``: why this run
    retrains, set by ``python -m pipelines.schedule trigger`` from a monitor's alarm); it calls
    ``dag`` with them by name."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature(
        [inspect.Parameter(n, kind, annotation=dict) for n in names]
        + [inspect.Parameter("build_in_cluster", kind, annotation=bool, default=False)]
        + [inspect.Parameter("retrain_reason", kind, annotation=str, default="")]
    )

    def training_pipeline(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        dag(dict(bound.arguments))

    training_pipeline.__signature__ = signature  # type: ignore[attr-defined]
    return training_pipeline


class _CallerNameOnly:
    """``inspect`` as kfp's ``pipeline_task`` module sees it while a pipeline is built: its
    ``stack()`` holds the two frames kfp reads (the caller's name, for an error message)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1) -> list[tuple[Any, ...]]:
        frames = [sys._getframe(1), sys._getframe(2)]  # the setter's check, the setter
        return [(f, f.f_code.co_filename, f.f_lineno, f.f_code.co_name, None, None) for f in frames]


@contextlib.contextmanager
def _cheap_setter_checks() -> Iterator[None]:
    """kfp's PipelineTask setters (``set_cpu_limit``, ``set_env_variable``, ``set_retry`` ...)
    each call ``inspect.stack()`` only to name themselves in an error. That walks the whole
    stack and, for every frame without a source file (``python -m``'s ``<frozen runpy>``, an
    import's ``<frozen importlib>``), scans all of ``sys.modules``: with Paddle loaded (4,400
    modules) about 1.7 s of CPU per pipeline built under ``python -m`` (measured, AMD EPYC).
    While a pipeline is built, kfp's module gets an ``inspect`` whose ``stack()`` returns those
    two frames alone; anything else in kfp keeps the real module."""
    from kfp.dsl import pipeline_task

    if getattr(pipeline_task, "inspect", None) is not inspect:  # another kfp: leave it be
        yield
        return
    pipeline_task.inspect = _CallerNameOnly()  # type: ignore[assignment]
    try:
        yield
    finally:
        pipeline_task.inspect = inspect  # type: ignore[attr-defined]


def make_pipeline(
    gpus: int = 0,
    accelerator_type: str = "nvidia.com/gpu",
    resources: Resources | None = None,
    image: str = IMAGE,
    backend: str | None = None,
    paddlejob: pj.PaddleJobParams | None = None,
    params_file: str | Path = REPO / "params.yaml",
    retry: Mapping[str, Any] | None = None,
) -> Any:
    """The pipeline in ``image``; ``gpus`` > 0 runs train and qat in the GPU image with that
    many accelerators; ``resources`` (default: ``params.yaml: resources``) sizes every task;
    ``retry`` is the retry policy of the tasks that talk to the network (:data:`RETRY`).
    ``backend`` (default: :func:`train_backend` of ``params_file``) ``paddlejob`` puts the
    PaddleJob launcher where the train task is, mounting the shared volume of ``paddlejob``
    (default: ``params_file``'s section) at its ``mount_path``."""
    retry = RETRY if retry is None else retry
    compile_params = _load(params_file) if None in (resources, backend, paddlejob) else Params()
    if resources is None:
        resources = typed_resources(compile_params)
    backend = train_backend(compile_params) if backend is None else backend
    if backend not in TRAIN_BACKENDS:
        raise ValueError(f"train backend {backend!r}: one of {TRAIN_BACKENDS}")
    if paddlejob is None:
        paddlejob = shared_volume(compile_params, backend)
    dag = TrainingDag(
        gpus, accelerator_type, resources, image, backend, paddlejob, retry, ops(image)
    )
    on = " (train: a Kubeflow PaddleJob)" if backend == "paddlejob" else ""
    with _cheap_setter_checks():
        return dsl.pipeline(
            name="paddle-mlops-training",
            description=" → ".join(STEPS) + " (promote, deploy: blessed models only)" + on,
        )(_pipeline_function(pipeline_sections(backend), dag))


def compile_pipeline(
    out: str | Path,
    gpus: int = 0,
    accelerator_type: str = "nvidia.com/gpu",
    image: str = IMAGE,
    params_file: str | Path = REPO / "params.yaml",
    backend: str | None = None,
) -> Path:
    """Compile the pipeline; resources, the train backend and the PaddleJob volume come from
    ``params_file`` (``backend`` overrides its ``train.distributed.backend``)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pipeline = make_pipeline(
        gpus, accelerator_type, image=image, backend=backend, params_file=params_file
    )
    compiler.Compiler().compile(pipeline, str(out))
    return out


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def pipeline_params(params: dict[str, Any], backend: str | None = None) -> dict[str, Any]:
    """params.yaml as the pipeline's arguments: one dict per section, nulls dropped (the
    step's default applies). ``paddlejob`` is an argument of a pipeline compiled for that
    backend (``backend``, default: :func:`train_backend` of ``params``), else not passed."""
    backend = train_backend(params) if backend is None else backend
    # resources: compile time; paddlejob: the launcher's, when compiled in
    unknown = sorted(
        set(params) - set(SECTIONS) - AFTER_DEPLOY_SECTIONS - {"resources", "paddlejob"}
    )
    if unknown:
        raise ValueError(f"params sections {unknown} are not parameters of the pipeline")
    return {s: _drop_nulls(params.get(s) or {}) for s in pipeline_sections(backend)}


def run_local(
    params: dict[str, Any],
    pipeline_root: str | Path,
    *,
    cache: bool = True,
    retry_backoff_s: float | None = None,
) -> Any:
    """The whole DAG on this machine: kfp.local, a subprocess per component, this venv.

    ``cache`` (default on, as on a KFP backend): a task whose inputs are those of an earlier
    successful task under the same ``pipeline_root`` reuses its outputs (the tasks marked
    uncached always run). ``retry_backoff_s`` replaces the first retry backoff (30 s)."""
    from kfp import local

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(pipeline_root),
        enable_caching=cache,
    )
    backend = train_backend(params)
    pipeline = make_pipeline(
        backend=backend,
        paddlejob=shared_volume(params, backend),
        retry=retry_policy(retry_backoff_s),
    )
    return pipeline(**pipeline_params(params, backend))


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    from components.core.config import load_params

    parser = argparse.ArgumentParser(
        prog="python -m pipelines.training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_compile = sub.add_parser("compile")
    p_compile.add_argument("--out", default="pipelines/compiled/training.yaml")
    p_compile.add_argument("--gpus", type=int, default=0, help="accelerators for train and qat")
    p_compile.add_argument("--accelerator-type", default="nvidia.com/gpu")
    p_compile.add_argument(
        "--params",
        default=str(REPO / "params.yaml"),
        help="read at compile time: resources, train.distributed.backend (paddlejob: the "
        "PaddleJob launcher trains) and the paddlejob volume",
    )
    p_compile.add_argument(
        "--image",
        default=IMAGE,
        help="the component image every CPU task runs in; pin it by digest "
        "(REPO@sha256:...): deploy renders it as the fetch-model image",
    )
    p_local = sub.add_parser("local")
    p_local.add_argument("--params", default="params.yaml")
    p_local.add_argument("--pipeline-root", default="outputs/kfp-local")
    p_local.add_argument(
        "--no-cache",
        action="store_true",
        help="run every task (default: reuse the outputs of a task run before with the same "
        "inputs under --pipeline-root, as a KFP backend does)",
    )
    p_local.add_argument(
        "--retry-backoff-s",
        type=float,
        default=None,
        help="first backoff of the network tasks' retries (default: 30)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, force=True)
    if args.command == "compile":
        out = compile_pipeline(
            args.out, args.gpus, args.accelerator_type, args.image, params_file=args.params
        )
        logging.info("compiled %s", out)
    else:
        params = load_params(args.params)
        source = local_ingest_source(params)
        if source is not None:
            params["ingest"]["source"] = str(source.resolve())  # subprocess cwd differs
        run_local(
            json.loads(json.dumps(params)),
            Path(args.pipeline_root).resolve(),
            cache=not args.no_cache,
            retry_backoff_s=args.retry_backoff_s,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
