"""Dotted-key overrides of the merged params: ``--set=train.learning_rate=0.003`` on a step's
command line, and a search's params overlay.

A value is YAML flow text (``1.0e-05``, ``[120,84]``, ``null``) with no spaces, so a trial
command stays one shell word per argument (Katib joins a trial's arguments into ``sh -c``).
``--set-if=cond.key=value:dotted.key=value`` sets its key only when ``cond.key`` has that
value once every ``--set`` is applied (a conditional search key: Katib has no conditionals).
Only keys the params already have can be set: a typo is one error line naming the closest key.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from components.core.artifacts import StepError
from components.core.config import Params, params_source

log = logging.getLogger(__name__)


def format_value(value: Any) -> str:
    """``value`` as the YAML flow text ``--set`` reads back (``1.0e-05``, ``[120,84]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        text = repr(value)
        # YAML 1.1 (PyYAML) reads a float only with a dot: 1e-05 would be the string "1e-05"
        if "e" in text and "." not in text:
            text = text.replace("e", ".0e", 1)
        return text
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    raise ValueError(f"{value!r} cannot be a --set value")


def parse_value(text: str) -> Any:
    """The value of ``--set``'s text (YAML, as the trial command reads it)."""
    return yaml.safe_load(text)


def set_args(sample: Mapping[str, Any]) -> list[str]:
    """``--set=dotted.key=value`` for each key of ``sample``, in its order."""
    return [f"--set={key}={format_value(value)}" for key, value in sample.items()]


def parse_set(arg: str) -> tuple[str, Any]:
    """The (dotted key, value) of one ``--set=key=value`` argument (or its ``key=value``)."""
    body = arg.removeprefix("--set=")
    key, sep, text = body.partition("=")
    if not sep or not key:
        raise StepError(f"--set {arg}: expected dotted.key=value")
    return key, parse_value(text)


def parse_set_if(arg: str) -> tuple[tuple[str, Any], tuple[str, Any]]:
    """((condition key, value), (dotted key, value)) of one ``--set-if=c=v:key=value``."""
    body = arg.removeprefix("--set-if=")
    cond, sep, assign = body.partition(":")
    if not sep:
        raise StepError(f"--set-if {arg}: expected cond.key=value:dotted.key=value")
    return parse_set(cond), parse_set(assign)


def leaves(params: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every (dotted key, value) of ``params`` whose value is not a mapping."""
    for key, value in params.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from leaves(value, f"{dotted}.")
        else:
            yield dotted, value


def nodes(params: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every (dotted key, value) of ``params``: its leaves and its mappings."""
    for key, value in params.items():
        dotted = f"{prefix}{key}"
        yield dotted, value
        if isinstance(value, Mapping):
            yield from nodes(value, f"{dotted}.")


def lookup(params: Mapping[str, Any], dotted: str) -> Any:
    """The value at ``dotted`` in ``params`` (KeyError: no such key)."""
    node: Any = params
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def no_such_key(key: str, known: Sequence[str]) -> str:
    """``no such key`` with the closest known key, if one is close."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return "no such key" + (f" (did you mean {close[0]}?)" if close else "")


def apply(params: Mapping[str, Any], sample: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``params`` with each dotted key of ``sample`` set."""
    out = _copy(params)
    for dotted, value in sample.items():
        *parents, last = dotted.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def same(a: Any, b: Any) -> bool:
    """Whether two values are equal as ``--set`` texts (``1`` and ``1.0`` are not)."""
    return format_value(a) == format_value(b)


def override(
    params: Mapping[str, Any],
    sets: Mapping[str, Any],
    set_ifs: Sequence[tuple[tuple[str, Any], tuple[str, Any]]] = (),
    *,
    what: str = "--set",
) -> Params:
    """``params`` (their source kept) with ``sets`` applied, then each conditional of
    ``set_ifs`` whose condition holds; an unknown key is one error line naming ``what``."""
    known = [k for k, _ in nodes(params)]
    source = params_source(params)  # type: ignore[arg-type]
    for key in (*sets, *(k for _, (k, _v) in set_ifs), *(c for (c, _v), _ in set_ifs)):
        if key not in known:
            raise StepError(f"{what} {key}: {no_such_key(key, known)} in {source}")
    merged = apply(params, sets)
    held = {k: v for (cond, want), (k, v) in set_ifs if same(lookup(merged, cond), want)}
    out = Params(apply(merged, held))
    out.source = source
    return out


def blame(message: str, origins: Mapping[str, str]) -> str:
    """``message`` (a params error line) naming what set each overridden key it names."""
    hits = [f"{key} was set by {what}" for key, what in origins.items() if key in message]
    return f"{message} ({'; '.join(hits)})" if hits else message


# a search's output directory (components/steps/hpo.py): what train applies, and the decision
# (why, the evidence) beside it; train depends on the overlay only, so a decision that sets
# nothing leaves it byte for byte as it was
OVERLAY, DECISION = "overlay.yaml", "decision.yaml"


def read_outcome(file: Path, missing: str) -> dict[str, Any]:
    """A search's overlay or decision file: a YAML mapping whose ``adopted`` is true or false;
    else one error line naming the file (``missing``: where it should have come from)."""
    try:
        doc = yaml.safe_load(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StepError(f"{file}: missing ({missing})") from None
    except yaml.YAMLError as exc:
        raise StepError(f"{file}: not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("adopted"), bool):
        raise StepError(f"{file}: adopted: expected true or false")
    return doc


def read_overlay(path: str | Path | None) -> dict[str, Any]:
    """The dotted keys a search's overlay under directory ``path`` sets: its ``params`` when
    ``adopted``, else none (no directory: none either, logged). A malformed overlay is one
    error line naming the file and the field."""
    if path is None or str(path) == "":
        return {}
    directory = Path(path)
    if not directory.exists():
        log.info("no params overlay at %s: the params as they are", directory)
        return {}
    file = directory / OVERLAY
    doc = read_outcome(file, "a search's output directory holds one")
    sets = doc.get("params") or {}
    if not isinstance(sets, dict) or not all(isinstance(k, str) for k in sets):
        raise StepError(f"{file}: params: expected a mapping of dotted key -> value")
    if not doc["adopted"]:
        log.info("params overlay %s sets nothing (%s beside it says why)", file, DECISION)
        return {}
    log.info(
        "params overlay %s (study %s, trial %s): %s",
        file,
        doc.get("study"),
        doc.get("trial"),
        " ".join(f"{k}={format_value(v)}" for k, v in sets.items()),
    )
    return sets
