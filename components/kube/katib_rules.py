"""The rules Katib's validating webhook applies to an ``Experiment`` (``kubeflow.org/v1beta1``)
beyond its schema, ported so ``components.kube.check`` refuses what a cluster would refuse.

Source: kubeflow/katib ``v0.19.0`` (commit 578e60f1), ``pkg/webhook/v1beta1/experiment/
validator/validator.go`` (``ValidateExperiment`` on a new object), the names of the default
``katib-config`` (``manifests/v1beta1/installs/katib-standalone/katib-config.yaml``) and the
constants of ``pkg/controller.v1beta1/consts`` and ``pkg/apis/controller/common/v1beta1``:

* ``metadata.name``: lowercase letters, digits and '-', starting with a letter, ending with a
  letter or digit, at most 40 characters (the webhook's regex is anchored at the start only;
  here the whole name must match: Katib names the trials ``<name>-<8 characters>``, and a
  trial's PaddleJob must be a DNS-1035 label);
* counts: ``maxTrialCount`` and ``parallelTrialCount`` > 0, ``maxFailedTrialCount`` >= 0, the
  failed and the parallel count at most ``maxTrialCount``;
* ``objective``: ``type`` minimize or maximize, an ``objectiveMetricName``, not repeated in
  ``additionalMetricNames`` (with an objective problem the webhook stops there: so do we);
* ``algorithm.algorithmName`` and ``earlyStopping.algorithmName``: among the suggestion and
  early-stopping services of the default katib-config; ``resumePolicy`` a known one;
* ``parameters`` (this check needs them: no ``nasConfig``): a known ``parameterType`` and
  ``distribution``; a ``feasibleSpace``; double and int with ``min`` and ``max`` and no ``list``,
  categorical and discrete with a ``list`` and no ``min``/``max``/``step``. Added here, where
  the webhook leaves it to the suggestion service at run time: ``min``/``max``/``step`` are
  numbers (integers for int), ``min`` is at most ``max``, a ``logUniform`` range is positive;
* ``trialTemplate``: ``primaryContainerName``, ``successCondition`` and ``failureCondition``,
  ``trialParameters`` with a name (no braces) and a reference, neither repeated, every
  reference a parameter's name (or a ``${trialSpec.<meta>}`` key), every trial parameter used
  as ``${trialParameters.<name>}`` in the template and every such placeholder declared; one of
  ``trialSpec``/``configMap``; the trialSpec with ``apiVersion`` and ``kind`` and without
  ``metadata.name``/``namespace``;
* ``metricsCollectorSpec``: a known collector kind; File and TensorFlowEvent with an absolute
  ``fileSystemPath``; every ``metricsFormat`` a regular expression with two parenthesised
  subexpressions (the first is the metric's name, the second its value).

:func:`trial_sample` substitutes a typed sample value for each placeholder of the trialSpec
(the parameter's ``min``, or its list's first value), which ``check`` then validates as a
manifest of its own: a PaddleJob against its vendored CRD and webhook, a Job against the
Kubernetes schema, both against the hardening policy.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

MAX_NAME = 40
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
OBJECTIVE_TYPES = ("minimize", "maximize")
# katib-config (v0.19.0 katib-standalone): runtime.suggestions and runtime.earlyStoppings
SUGGESTIONS = (
    "random",
    "tpe",
    "grid",
    "hyperband",
    "bayesianoptimization",
    "cmaes",
    "sobol",
    "multivariate-tpe",
    "enas",
    "darts",
    "pbt",
)
EARLY_STOPPINGS = ("medianstop",)
RESUME_POLICIES = ("", "Never", "LongRunning", "FromVolume")
PARAMETER_TYPES = ("int", "double", "categorical", "discrete", "unknown")
DISTRIBUTIONS = ("uniform", "logUniform", "normal", "logNormal", "unknown")
COLLECTOR_KINDS = ("StdOut", "File", "TensorFlowEvent", "PrometheusMetric", "Custom", "Push")
# consts.TrialTemplateParamReplaceFormat(Regex), TrialTemplateMetaReplaceFormatRegex, MetaKeys
PLACEHOLDER = "${{trialParameters.{}}}"
PLACEHOLDER_RE = re.compile(r"\$\{trialParameters\..+?\}")
META_RE = re.compile(r"\$\{trialSpec\.(.+?)\}")
META_INDEX_RE = re.compile(r"(.+)\[(.+)]")
META_KEYS = ("Name", "Namespace", "Kind", "APIVersion", "Annotations", "Labels")
_TWO_GROUPS = re.compile(r".*\(.*\).*\(.*\).*")


def _get(doc: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def _name_problems(doc: Mapping[str, Any]) -> list[str]:
    name = _get(doc, "metadata", "name")
    if isinstance(name, str) and (len(name) > MAX_NAME or not _NAME.fullmatch(name)):
        return [
            f"metadata.name: {name!r}: lowercase letters, digits and '-', starting with a letter "
            f"and ending with a letter or digit, at most {MAX_NAME} characters (Katib)"
        ]
    return []


def _count_problems(spec: Mapping[str, Any]) -> list[str]:
    problems = []
    counts = {
        k: spec.get(k) for k in ("maxTrialCount", "parallelTrialCount", "maxFailedTrialCount")
    }
    top = counts["maxTrialCount"]
    for key, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if key == "maxFailedTrialCount" and value < 0:
            problems.append(f"spec.{key}: {value} should not be less than 0")
        elif key != "maxFailedTrialCount" and value <= 0:
            problems.append(f"spec.{key}: {value} must be greater than 0")
        elif key != "maxTrialCount" and isinstance(top, int) and value > top:
            problems.append(f"spec.{key}: {value} should be at most spec.maxTrialCount ({top})")
    return problems


def _objective_problems(objective: Any) -> list[str]:
    if not isinstance(objective, Mapping):
        return ["spec.objective: must be specified"]
    problems = []
    if objective.get("type") not in OBJECTIVE_TYPES:
        problems.append(
            f"spec.objective.type: {objective.get('type')!r} must be one of {OBJECTIVE_TYPES}"
        )
    metric = objective.get("objectiveMetricName")
    if not metric:
        problems.append("spec.objective.objectiveMetricName: must be specified")
    elif metric in (objective.get("additionalMetricNames") or []):
        problems.append(
            f"spec.objective.additionalMetricNames: should not contain the objective {metric!r}"
        )
    return problems


def _algorithm_problems(spec: Mapping[str, Any]) -> list[str]:
    problems = []
    algorithm = spec.get("algorithm")
    if not isinstance(algorithm, Mapping):
        problems.append("spec.algorithm: must be specified")
    elif algorithm.get("algorithmName") not in SUGGESTIONS:
        problems.append(
            f"spec.algorithm.algorithmName: {algorithm.get('algorithmName')!r} is not a "
            f"suggestion service of the default katib-config {SUGGESTIONS}"
        )
    stopping = spec.get("earlyStopping")
    if isinstance(stopping, Mapping) and stopping.get("algorithmName") not in EARLY_STOPPINGS:
        problems.append(
            f"spec.earlyStopping.algorithmName: {stopping.get('algorithmName')!r} is not an "
            f"early-stopping service of the default katib-config {EARLY_STOPPINGS}"
        )
    if spec.get("resumePolicy", "") not in RESUME_POLICIES:
        problems.append(
            f"spec.resumePolicy: {spec['resumePolicy']!r} is not one of {RESUME_POLICIES[1:]}"
        )
    return problems


def _number(value: Any, integer: bool) -> float | None:
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        return None
    return float(number) if math.isfinite(number) else None


def _range_problems(space: Mapping[str, Any], ptype: str, where: str) -> list[str]:
    """Added to the webhook's: what the suggestion service would fail on at run time."""
    bounds = {}
    for key in ("min", "max", "step"):
        if space.get(key) not in (None, ""):
            bounds[key] = _number(space[key], ptype == "int")
            if bounds[key] is None:
                kind = "an integer" if ptype == "int" else "a finite number"
                return [f"{where}.feasibleSpace.{key}: {space[key]!r} is not {kind}"]
    low, high = bounds.get("min"), bounds.get("max")
    if low is not None and high is not None and low > high:
        return [f"{where}.feasibleSpace: min {space['min']} is greater than max {space['max']}"]
    if space.get("distribution") in ("logUniform", "logNormal") and low is not None and low <= 0:
        return [f"{where}.feasibleSpace.min: {space['min']} must be > 0 on a log scale"]
    if bounds.get("step") is not None and bounds["step"] <= 0:
        return [f"{where}.feasibleSpace.step: {space['step']} must be > 0"]
    return []


def _parameter_problems(spec: Mapping[str, Any]) -> list[str]:
    parameters = spec.get("parameters") or []
    if not parameters:
        if spec.get("nasConfig"):
            return ["spec.nasConfig: not supported here (neural architecture search)"]
        return ["spec.parameters: must be specified"]
    problems = []
    for i, param in enumerate(parameters):
        where = f"spec.parameters[{_get(param, 'name') or i}]"
        ptype = _get(param, "parameterType") or ""
        space = _get(param, "feasibleSpace") or {}
        if ptype and ptype not in PARAMETER_TYPES:
            problems.append(f"{where}.parameterType: {ptype!r} is not one of {PARAMETER_TYPES}")
        if space.get("distribution") and space["distribution"] not in DISTRIBUTIONS:
            problems.append(
                f"{where}.feasibleSpace.distribution: {space['distribution']!r} is not one of "
                f"{DISTRIBUTIONS}"
            )
        if not any(space.get(k) for k in ("min", "max", "step", "list", "distribution")):
            problems.append(f"{where}.feasibleSpace: must be specified")
        elif ptype in ("int", "double"):
            if space.get("list"):
                problems.append(f"{where}.feasibleSpace.list: not supported for {ptype}")
            if not space.get("min") or not space.get("max"):
                problems.append(f"{where}.feasibleSpace: min and max are required for {ptype}")
            else:
                problems += _range_problems(space, ptype, where)
        elif ptype in ("categorical", "discrete"):
            if any(space.get(k) for k in ("min", "max", "step")):
                problems.append(
                    f"{where}.feasibleSpace: min, max and step not supported for {ptype}"
                )
            if not space.get("list"):
                problems.append(f"{where}.feasibleSpace.list: required for {ptype}")
    return problems


def _is_meta_key(reference: str) -> bool:
    match = META_RE.search(reference)
    if not match:
        return False
    key = match.group(1)
    sub = META_INDEX_RE.fullmatch(key)
    return key in META_KEYS or (sub is not None and sub.group(1) in META_KEYS)


def _trial_parameter_problems(template: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    names = {_get(p, "name") for p in spec.get("parameters") or []}
    text = json.dumps(template.get("trialSpec"))
    where = "spec.trialTemplate.trialParameters"
    problems, seen_names, seen_refs = [], set(), set()
    for i, param in enumerate(template.get("trialParameters") or []):
        name, ref = _get(param, "name"), _get(param, "reference")
        if not name or not ref or "{" in name or "}" in name:
            problems.append(f"{where}[{i}]: name and reference required, no '{{' or '}}' in name")
            continue
        if name in seen_names or ref in seen_refs:
            problems.append(f"{where}[{name}]: name or reference {ref!r} repeated")
            continue
        seen_names.add(name)
        seen_refs.add(ref)
        if names and not _is_meta_key(ref) and ref not in names:
            problems.append(f"{where}[{name}].reference: {ref!r} is not in spec.parameters")
        if PLACEHOLDER.format(name) not in text:
            problems.append(
                f"{where}[{name}]: unused: {PLACEHOLDER.format(name)} is not in the trialSpec"
            )
        text = text.replace(PLACEHOLDER.format(name), "test-value")
    undeclared = sorted(set(PLACEHOLDER_RE.findall(text)))
    if undeclared:
        problems.append(
            f"spec.trialTemplate.trialSpec: {', '.join(undeclared)} not declared in "
            "spec.trialTemplate.trialParameters"
        )
    return problems


def _template_problems(spec: Mapping[str, Any]) -> list[str]:
    template = spec.get("trialTemplate")
    where = "spec.trialTemplate"
    if not isinstance(template, Mapping):
        return [f"{where}: must be specified"]
    problems = []
    if not template.get("primaryContainerName"):
        problems.append(f"{where}.primaryContainerName: must be specified")
    if not template.get("successCondition") or not template.get("failureCondition"):
        problems.append(f"{where}: successCondition and failureCondition must be specified")
    if template.get("trialParameters") is None:
        return problems + [f"{where}.trialParameters: must be specified"]
    trial, config_map = template.get("trialSpec"), template.get("configMap")
    if (trial is None) == (config_map is None):
        return problems + [f"{where}: exactly one of trialSpec and configMap must be specified"]
    if config_map is not None:
        if not all(config_map.get(k) for k in ("configMapName", "configMapNamespace")) or not (
            config_map.get("templatePath")
        ):
            problems.append(
                f"{where}.configMap: configMapName, configMapNamespace and templatePath required"
            )
        return problems
    problems += _trial_parameter_problems(template, spec)
    if _get(trial, "metadata", "name") or _get(trial, "metadata", "namespace"):
        problems.append(f"{where}.trialSpec: metadata.name and metadata.namespace must be omitted")
    if not _get(trial, "apiVersion") or not _get(trial, "kind"):
        problems.append(f"{where}.trialSpec: apiVersion and kind must be specified")
    return problems


def _collector_problems(spec: Mapping[str, Any]) -> list[str]:
    collector = spec.get("metricsCollectorSpec") or {}
    where = "spec.metricsCollectorSpec"
    kind = _get(collector, "collector", "kind") or "StdOut"  # the defaulter's
    path = _get(collector, "source", "fileSystemPath") or {}
    problems = []
    if kind not in COLLECTOR_KINDS:
        problems.append(f"{where}.collector.kind: {kind!r} is not one of {COLLECTOR_KINDS}")
    elif kind in ("File", "TensorFlowEvent"):
        wanted = "File" if kind == "File" else "Directory"
        if path.get("kind") != wanted or not str(path.get("path") or "").startswith("/"):
            problems.append(
                f"{where}.source.fileSystemPath: an absolute path of kind {wanted} is required "
                f"by the {kind} collector"
            )
    for fmt in _get(collector, "source", "filter", "metricsFormat") or []:
        try:
            re.compile(fmt)
        except re.error as exc:
            problems.append(f"{where}.source.filter.metricsFormat: {fmt!r}: invalid: {exc}")
            continue
        if not _TWO_GROUPS.match(fmt):
            problems.append(
                f"{where}.source.filter.metricsFormat: {fmt!r}: two top subexpressions are "
                "required (the metric's name, then its value)"
            )
    return problems


def experiment_problems(doc: Mapping[str, Any]) -> list[str]:
    """The webhook's findings on an Experiment (module docstring), each ``field: problem``."""
    spec = doc.get("spec") if isinstance(doc.get("spec"), Mapping) else {}
    problems = _name_problems(doc) + _count_problems(spec)
    objective = _objective_problems(spec.get("objective"))
    if objective:
        return problems + objective
    return (
        problems
        + _algorithm_problems(spec)
        + _template_problems(spec)
        + _parameter_problems(spec)
        + _collector_problems(spec)
    )


def sample_value(param: Mapping[str, Any]) -> Any:
    """A typed value a suggestion could assign ``param``: its ``min``, or its list's first."""
    space = param.get("feasibleSpace") or {}
    if space.get("list"):
        return space["list"][0]
    number = _number(space.get("min"), param.get("parameterType") == "int")
    if number is None:
        return space.get("min")
    return int(number) if param.get("parameterType") == "int" else number


def _substitute(node: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(node, Mapping):
        return {k: _substitute(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, values) for v in node]
    if isinstance(node, str):
        if node in values:  # the whole value: the typed sample
            return values[node]
        for placeholder, value in values.items():
            node = node.replace(placeholder, str(value))
    return node


def trial_sample(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Experiment's trialSpec as one trial would get it: every ``${trialParameters.x}``
    replaced by a typed sample of its parameter, named ``<experiment>-trial000`` (Katib names
    a trial ``<experiment>-<8 characters>``); None without a trialSpec."""
    template = _get(doc, "spec", "trialTemplate") or {}
    trial = template.get("trialSpec") if isinstance(template, Mapping) else None
    if not isinstance(trial, Mapping):
        return None
    params = {_get(p, "name"): p for p in _get(doc, "spec", "parameters") or []}
    values = {}
    for tp in template.get("trialParameters") or []:
        param = params.get(_get(tp, "reference"))
        if isinstance(param, Mapping) and _get(tp, "name"):
            values[PLACEHOLDER.format(tp["name"])] = sample_value(param)
    sample = _substitute(trial, values)
    meta = sample.setdefault("metadata", {}) if isinstance(sample, dict) else {}
    if isinstance(meta, dict):
        meta["name"] = f"{_get(doc, 'metadata', 'name') or 'experiment'}-trial000"
    return sample
