"""The hyperparameter search space: what ``hpo.space`` in ``params.yaml`` may say, how it is
checked against the merged params, sampled by Optuna, and handed to a trial or to Katib.

A space maps dotted keys of the merged params (``train.learning_rate``) to a spec:

- ``{type: float, low, high, step?, log?}`` and ``{type: int, low, high, step?, log?}``;
- ``{type: categorical, choices: [...]}`` (scalars or lists: ``[[120, 84], [256, 128]]``);
- any of them with ``when: {dotted.key: value}``: searched only when that key (searched
  before it, or a fixed param) has that value (e.g. a width only for one architecture).

A trial receives its sample as ``--set=dotted.key=value`` arguments (the value as YAML flow,
no spaces: Katib joins a trial's arguments unquoted into ``sh -c``). Katib has no
conditionals: its ``parameters`` list searches every key, and a conditional key's argument is
``--set-if=cond.key=value:dotted.key=${trialParameters.name}``, which the trial applies only
when the condition holds.

ML layer: no task, no step; the typed check of a sample (train's params model, the task's
options) is the caller's, on :func:`corner`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from components.core.artifacts import StepError
from components.core.config import from_dict, params_model
from components.core.overrides import (
    format_value,
    leaves,
    lookup,
    no_such_key,
    parse_value,
)

if TYPE_CHECKING:
    import optuna

# the sections a search may change; train.seed is the adoption's paired seed, never searched
SEARCHABLE = ("task", "train")
FORBIDDEN_KEYS = {"train.seed": "the seed is not a hyperparameter (adoption pairs seeds)"}
# characters a value may not hold: Katib runs a trial's arguments joined by spaces in sh -c
UNSAFE = re.compile(r"[\s'\"`$\\;&|<>(){}#!*?~]")
KATIB_LOG_INT_POINTS = 16  # an int on a log scale is a Katib discrete list of at most this many

Scalar = bool | int | float | str | None
Choice = Scalar | list[Scalar]
When = Annotated[dict[str, Scalar], Field(min_length=1, max_length=1)] | None


def _bounds(low: float, high: float, step: float | None, log: bool) -> None:
    if not low < high:
        raise ValueError(f"low must be < high, got low {low:g} high {high:g}")
    if log and low <= 0:
        raise ValueError(f"log: true needs low > 0, got {low:g}")
    if log and step is not None and step != 1:
        raise ValueError("log: true takes no step (Optuna samples a log scale without one)")
    if step is not None and step <= 0:
        raise ValueError(f"step must be > 0, got {step:g}")


@params_model
class FloatSpec:
    """A float in ``[low, high]``, on a grid of ``step`` or a log scale."""

    type: Literal["float"]
    low: float
    high: float
    step: float | None = None
    log: bool = False
    when: When = None

    @model_validator(mode="after")
    def _rules(self) -> FloatSpec:
        _bounds(self.low, self.high, self.step, self.log)
        return self


@params_model
class IntSpec:
    """An int in ``[low, high]`` (both included), every ``step`` or on a log scale."""

    type: Literal["int"]
    low: int
    high: int
    step: int | None = None
    log: bool = False
    when: When = None

    @model_validator(mode="after")
    def _rules(self) -> IntSpec:
        _bounds(self.low, self.high, self.step, self.log)
        return self


@params_model
class CategoricalSpec:
    """One of ``choices`` (scalars, or lists of scalars for a list-valued key)."""

    type: Literal["categorical"]
    choices: Annotated[list[Choice], Field(min_length=1)]
    when: When = None

    @model_validator(mode="after")
    def _rules(self) -> CategoricalSpec:
        texts = [format_value(c) for c in self.choices]
        if len(set(texts)) != len(texts):
            raise ValueError(f"choices repeat a value: {texts}")
        return self


Spec = FloatSpec | IntSpec | CategoricalSpec
SPEC_TYPES: dict[str, type[Spec]] = {
    "float": FloatSpec,
    "int": IntSpec,
    "categorical": CategoricalSpec,
}
Space = dict[str, Spec]


# --------------------------------------------------------------- values on a command line


# --------------------------------------------------------------------------- the space from params


def parse_space(raw: Any, *, source: str) -> Space:
    """The typed space of ``hpo.space`` (one error line naming the key and the rule)."""
    where = f"{source}: hpo.space"
    if not isinstance(raw, dict) or not raw:
        raise StepError(f"{where}: expected a mapping of dotted key -> spec")
    space: Space = {}
    for key, spec in raw.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind not in SPEC_TYPES:
            raise StepError(
                f"{where}: {key}: type must be one of {sorted(SPEC_TYPES)}, got {kind!r}"
            )
        space[str(key)] = from_dict(SPEC_TYPES[kind], spec, where=f"{where}: {key}")
    return space


def validate(space: Space, params: Mapping[str, Any], *, source: str) -> None:
    """Refuse, in one line, a space the merged ``params`` cannot take: an unknown key (with the
    closest one), a key outside ``task``/``train``, ``train.seed``, a ``distributed`` setting,
    a value unsafe on a command line, a condition on an unknown or later key or one that
    never holds."""
    known = dict(leaves(params))
    where = f"{source}: hpo.space"

    def must_exist(key: str, what: str) -> None:
        if key not in known:
            raise StepError(f"{where}: {what}: {no_such_key(key, list(known))}")

    for index, (key, spec) in enumerate(space.items()):
        must_exist(key, key)
        if key.split(".")[0] not in SEARCHABLE:
            raise StepError(f"{where}: {key}: only task.* and train.* keys can be searched")
        if key in FORBIDDEN_KEYS:
            raise StepError(f"{where}: {key}: {FORBIDDEN_KEYS[key]}")
        if "distributed" in key.split("."):
            raise StepError(f"{where}: {key}: distributed settings are not searched")
        for value in spec_values(spec):
            _check_safe(value, f"{where}: {key}")
        if spec.when is not None:
            _check_when(space, known, key, index, spec.when, where, must_exist)


def ends(spec: Spec) -> list[Any]:
    """The values at ``spec``'s ends: each choice, or low and high."""
    return list(spec.choices) if isinstance(spec, CategoricalSpec) else [spec.low, spec.high]


def spec_values(spec: Spec) -> list[Any]:
    """The values ``spec`` writes: its ends and its step."""
    step = getattr(spec, "step", None)
    return ends(spec) + ([] if step is None else [step])


def _check_safe(value: Any, where: str) -> None:
    text = format_value(value)
    if UNSAFE.search(text):
        raise StepError(f"{where}: {text!r}: no spaces or shell characters in a value")
    if parse_value(text) != value and not isinstance(value, float):
        raise StepError(f"{where}: {text!r}: reads back as {parse_value(text)!r}, not {value!r}")


def _check_when(
    space: Space,
    known: Mapping[str, Any],
    key: str,
    index: int,
    when: Mapping[str, Any],
    where: str,
    must_exist: Any,
) -> None:
    ((cond, value),) = when.items()
    must_exist(cond, f"{key}: when: {cond}")
    _check_safe(value, f"{where}: {key}: when: {cond}")
    order = list(space)
    if cond in space and order.index(cond) > index:
        raise StepError(f"{where}: {key}: when: {cond} must be listed before {key}")
    spec = space.get(cond)
    if spec is None:
        possible = [known[cond]]
    elif isinstance(spec, CategoricalSpec):
        possible = list(spec.choices)
    else:
        possible = [value] if contains(spec, value) else []
    if value not in possible:
        raise StepError(
            f"{where}: {key}: when: {cond}: {format_value(value)} never holds "
            f"(it is {', '.join(format_value(v) for v in possible) or 'out of range'})"
        )


def corner(space: Space) -> dict[str, Any]:
    """A sample with every key at its low end or first choice (for the caller's typed check)."""
    return {k: s.choices[0] if isinstance(s, CategoricalSpec) else s.low for k, s in space.items()}


def contains(spec: Spec, value: Any) -> bool:
    """Whether ``value`` is one of the values ``spec`` can sample."""
    if isinstance(spec, CategoricalSpec):
        return any(format_value(value) == format_value(c) for c in spec.choices)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(spec, IntSpec) and not isinstance(value, int):
        return False
    if not spec.low <= value <= spec.high:
        return False
    if spec.step is None:
        return True
    steps = (value - spec.low) / spec.step
    return math.isclose(steps, round(steps), abs_tol=1e-9)


# --------------------------------------------------------------------------- Optuna


def active(spec: Spec, sample: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    """Whether ``spec``'s condition holds on what is sampled so far, else on ``params``."""
    if spec.when is None:
        return True
    ((cond, value),) = spec.when.items()
    current = sample[cond] if cond in sample else lookup(params, cond)
    return format_value(current) == format_value(value)


def encode(spec: Spec, value: Any) -> Any:
    """``value`` as Optuna stores it (a list choice as its text: Optuna's choices are scalars)."""
    return format_value(value) if isinstance(value, list | tuple) else value


def decode(space: Space, stored: Mapping[str, Any]) -> dict[str, Any]:
    """A sample from Optuna's stored params (list choices back from their text), space order."""
    out: dict[str, Any] = {}
    for key, spec in space.items():
        if key not in stored:
            continue
        value = stored[key]
        if isinstance(spec, CategoricalSpec):
            value = next(c for c in spec.choices if encode(spec, c) == value)
        out[key] = value
    return out


def suggest(
    trial: optuna.trial.BaseTrial, space: Space, params: Mapping[str, Any]
) -> dict[str, Any]:
    """Optuna's define-by-run sample of ``space``, in its order: a conditional key only when
    its condition holds (on the sample so far, else on ``params``)."""
    sample: dict[str, Any] = {}
    for key, spec in space.items():
        if not active(spec, sample, params):
            continue
        if isinstance(spec, CategoricalSpec):
            stored = trial.suggest_categorical(key, [encode(spec, c) for c in spec.choices])
            sample[key] = decode({key: spec}, {key: stored})[key]
        elif isinstance(spec, FloatSpec):
            sample[key] = trial.suggest_float(
                key, spec.low, spec.high, step=spec.step, log=spec.log
            )
        else:
            sample[key] = trial.suggest_int(
                key, spec.low, spec.high, step=spec.step or 1, log=spec.log
            )
    return sample


# --------------------------------------------------------------------------- Katib


def katib_name(key: str) -> str:
    """The Katib parameter (and trialParameter) name of a dotted key (``train-learning_rate``)."""
    return key.replace(".", "-")


def katib_keys(space: Space) -> dict[str, str]:
    """Each Katib parameter name -> the dotted key its value sets (a trial template's keys)."""
    return {katib_name(k): k for k in space}


def katib_parameters(space: Space) -> list[dict[str, Any]]:
    """Katib's ``spec.parameters``: every key (conditionals flattened: Katib has none), values as
    strings; an int on a log scale is a ``discrete`` list (Katib's hyperopt would sample floats)."""
    return [{"name": katib_name(k), **_katib_type(s)} for k, s in space.items()]


def _katib_type(spec: Spec) -> dict[str, Any]:
    if isinstance(spec, CategoricalSpec):
        choices = [format_value(c) for c in spec.choices]
        return {"parameterType": "categorical", "feasibleSpace": {"list": choices}}
    if isinstance(spec, IntSpec) and spec.log:
        count = min(spec.high - spec.low + 1, KATIB_LOG_INT_POINTS)
        points = np.unique(np.round(np.geomspace(spec.low, spec.high, count)).astype(int))
        return {"parameterType": "discrete", "feasibleSpace": {"list": [str(p) for p in points]}}
    space: dict[str, Any] = {"min": format_value(spec.low), "max": format_value(spec.high)}
    if spec.step is not None:
        space["step"] = format_value(spec.step)
    if isinstance(spec, FloatSpec):
        space["distribution"] = "logUniform" if spec.log else "uniform"
        return {"parameterType": "double", "feasibleSpace": space}
    return {"parameterType": "int", "feasibleSpace": space}


def katib_trial_parameters(space: Space) -> list[dict[str, str]]:
    """The trial template's ``trialParameters``: one per Katib parameter, named as it."""
    return [{"name": katib_name(k), "reference": katib_name(k), "description": k} for k in space]


def katib_args(space: Space) -> list[str]:
    """The trial command's arguments that take Katib's sample: ``--set=key=${trialParameters.n}``,
    and ``--set-if=cond=value:key=${trialParameters.n}`` for a conditional key."""
    args = []
    for key, spec in space.items():
        assign = f"{key}=${{trialParameters.{katib_name(key)}}}"
        if spec.when is None:
            args.append(f"--set={assign}")
        else:
            ((cond, value),) = spec.when.items()
            args.append(f"--set-if={cond}={format_value(value)}:{assign}")
    return args


def in_space(space: Space, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``values`` (e.g. the current params) that ``space`` can sample, encoded as
    Optuna stores them: trial 0 re-runs the current params."""
    return {
        k: encode(s, values[k]) for k, s in space.items() if k in values and contains(s, values[k])
    }


def current(space: Space, params: Mapping[str, Any]) -> dict[str, Any]:
    """The current value of each key of ``space`` whose condition holds on ``params``."""
    out: dict[str, Any] = {}
    for key, spec in space.items():
        if active(spec, out, params):
            out[key] = lookup(params, key)
    return out
