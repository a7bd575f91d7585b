"""KFP adapter: a lightweight Kubeflow Pipelines v2 component per step declaration.

The component's signature is generated from the declaration (its sections as ``dict``
parameters, its ports as typed artifacts); its body hands the arguments to :func:`kfp_main`,
which calls :meth:`~components.kernel.step.Step.call` as the CLI does.
"""

from __future__ import annotations

import csv
import linecache
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from components.core.artifacts import read_json
from components.faults import failpoints
from components.kernel.cli import setup_logging
from components.kernel.step import In, KfpType, Step, load


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
        f"    from components.kernel.kfp import kfp_main\n\n"
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
