"""Reading ``params.yaml`` into typed, validated step parameters.

Every tunable number lives in ``params.yaml`` keyed by step. Steps receive params models
(frozen pydantic dataclasses, :func:`params_model`), never the raw dict; an unknown or
mistyped key, or a value out of range, is one error line naming the file and dotted field.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ConfigDict, GetCoreSchemaHandler, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import CoreSchema, core_schema

from components.core.artifacts import StepError

T = TypeVar("T")

DEFAULT_PARAMS = Path("params.yaml")


class Params(dict[str, Any]):
    """The params mapping plus ``source``, the file it was read from.

    Error messages name ``source`` (what ``--params`` gave), never a hard-coded
    ``params.yaml``; a plain dict (e.g. from a KFP parameter) counts as ``params.yaml``.
    """

    source: str = str(DEFAULT_PARAMS)


# yaml.safe_dump(load_params(...)) keeps working: a Params dumps as the mapping it is
yaml.SafeDumper.add_representer(Params, yaml.representer.SafeRepresenter.represent_dict)


def params_source(params: dict[str, Any]) -> str:
    """The file ``params`` was read from (``params.yaml`` for a plain mapping)."""
    return str(getattr(params, "source", DEFAULT_PARAMS))


EXTENDS = "extends"  # an overlay's key: the params file it changes (relative to the overlay)
REPLACE = "replace"  # an overlay's key: dotted mappings it replaces whole instead of merging


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise StepError(f"{path}: params file not found") from exc
    except IsADirectoryError as exc:
        raise StepError(f"{path}: is a directory, --params must name a YAML file") from exc
    except UnicodeDecodeError as exc:
        raise StepError(f"{path}: params file is not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise StepError(f"{path}: cannot read params file ({exc.strerror or exc})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = " ".join(str(exc).split())
        raise StepError(f"{path}: not valid YAML: {first}") from exc
    if not isinstance(data, dict):
        raise StepError(f"{path}: top level must be a mapping of step name -> params")
    return data


def overlay_chain(path: str | Path) -> list[Path]:
    """``path`` and the params files it extends, base first (``[params.yaml, overlay]``)."""
    chain = [Path(path)]
    while True:
        data = _read_yaml_mapping(chain[0])
        base = data.get(EXTENDS)
        if base is None:
            return chain
        if not isinstance(base, str) or not base:
            raise StepError(f"{chain[0]}: {EXTENDS}: expected the path of a params file")
        parent = Path(os.path.normpath(chain[0].parent / base))
        if parent in chain:
            raise StepError(f"{chain[0]}: {EXTENDS}: {base} extends it again (a cycle)")
        chain.insert(0, parent)


def merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``overlay`` on ``base``: mappings merge key by key, any other value replaces."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    """The params of ``path``. A file with ``extends: <file>`` is an overlay on that file: a
    task pipeline's params hold only what differs from the repository's params.yaml. Its
    mappings merge key by key into the base's; the dotted keys listed under ``replace:`` (a
    task's own ``task.options``, a data format's ``ingest``) replace the base's whole."""
    data: dict[str, Any] = {}
    for file in overlay_chain(path):
        layer = _read_yaml_mapping(file)
        layer.pop(EXTENDS, None)
        replace = layer.pop(REPLACE, None) or []
        if not isinstance(replace, list) or not all(isinstance(k, str) for k in replace):
            raise StepError(f"{file}: {REPLACE}: expected a list of dotted keys (task.options)")
        for dotted in replace:  # e.g. another task's options: none of the base's keys apply
            *parents, last = dotted.split(".")
            node = data
            for key in parents:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(last, None)
        data = merge(data, layer)
    params = Params(data)
    params.source = str(path)
    return params


def params_sha256(params: dict[str, Any]) -> str:
    """Stable hash of a params mapping (key order does not matter)."""
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()


def section(params: dict[str, Any], name: str, cls: type[T], *, source: str | None = None) -> T:
    """Build params model ``cls`` from ``params[name]``, with readable errors naming ``source``
    (default: the file ``params`` was loaded from)."""
    source = source or params_source(params)
    if name not in params:
        raise StepError(f"{source}: missing section '{name}'")
    return from_dict(cls, params[name], where=f"{source}: {name}")


def from_dict(cls: type[T], data: Any, *, where: str) -> T:
    """Validate ``data`` as the params model ``cls`` (a :func:`params_model`); a bad value
    is one :class:`StepError` line naming ``where`` and the dotted field."""
    if not isinstance(data, dict):
        raise StepError(f"{where}: expected a mapping, got {type(data).__name__}")
    try:
        built = _validator(cls).validate_python(data)
    except ValidationError as exc:
        raise StepError(describe(exc, cls, where)) from None
    check = getattr(built, "check", None)  # a plug-in's plain dataclass: its own rules
    if callable(check) and not hasattr(cls, "__pydantic_validator__"):
        try:
            check()
        except ValueError as exc:
            raise StepError(f"{where}: {exc}") from None
    return built


def _validator(cls: type) -> Any:
    """The pydantic validator of ``cls``: a :func:`params_model`'s own, or, for a task
    plug-in's plain frozen dataclass, one with the same rules (strict, unknown fields
    refused) around it, so plug-ins written before the params models still load."""
    own = getattr(cls, "__pydantic_validator__", None)
    if own is not None:
        return own
    if not dataclasses.is_dataclass(cls):
        raise StepError(f"{cls.__qualname__}: a params class must be a dataclass (@params_model)")
    return _plain_adapter(cls)


@functools.cache
def _plain_adapter(cls: type) -> TypeAdapter:
    _adopt(cls)
    return TypeAdapter(cls)


def _adopt(cls: type) -> None:
    """What :func:`params_model` sets, set on a plain dataclass and the plain dataclasses
    of its fields (pydantic reads both attributes on a stdlib dataclass)."""
    if hasattr(cls, "__pydantic_validator__") or "__pydantic_config__" in vars(cls):
        return
    cls.__pydantic_config__ = PARAMS_CONFIG  # type: ignore[attr-defined]
    cls.__get_pydantic_core_schema__ = classmethod(_core_schema)  # type: ignore[attr-defined]
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # unresolvable names: pydantic says which, in one line
        hints = {}
    for hint in hints.values():
        for kind in (hint, *typing.get_args(hint)):
            if isinstance(kind, type) and dataclasses.is_dataclass(kind):
                _adopt(kind)


# --------------------------------------------------------------------------- the models

PARAMS_CONFIG = ConfigDict(extra="forbid", strict=True)


def _int_from_float(value: Any) -> Any:
    # KFP passes dict parameters through protobuf Struct, where every number is a float
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _lenient_ints(schema: Any, root: bool = True) -> Any:
    """``schema`` with every strict int accepting a whole float (3.0 -> 3); nested models
    are left to their own hook."""
    if isinstance(schema, list):
        return [_lenient_ints(s, root=False) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") == "dataclass" and not root:
        return schema
    if schema.get("type") == "int":
        return core_schema.no_info_before_validator_function(_int_from_float, schema)
    return {k: _lenient_ints(v, root=False) for k, v in schema.items()}


def _core_schema(cls: type, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    schema = handler(source)
    node: Any = schema  # the dataclass itself, below its model validators
    while node.get("type", "").startswith("function-") and "schema" in node:
        node = node["schema"]
    if node.get("type") == "dataclass":
        # strict fields (no "3" for 3, no 1 for true), yet the model itself from a mapping
        node["strict"] = False
        node["schema"] = _lenient_ints(node["schema"], root=False)
    return schema


def params_model(cls: type[T]) -> type[T]:
    """A params section (or part of one) as a frozen pydantic dataclass: strict types,
    unknown fields refused, ranges as ``Annotated[..., Field(ge=...)]`` constraints and
    cross-field rules as ``@model_validator(mode="after")``. Still a dataclass:
    ``dataclasses.fields/asdict/replace`` work (``replace`` validates again)."""
    cls.__get_pydantic_core_schema__ = classmethod(_core_schema)  # type: ignore[attr-defined]
    return pydantic_dataclass(frozen=True, config=PARAMS_CONFIG)(cls)  # type: ignore[return-value]


# --------------------------------------------------------------------------- errors

_TYPE_RULES = {
    "float_type": "expected a number, got {input!r}",
    "float_parsing": "expected a number, got {input!r}",
    "int_type": "expected an integer, got {input!r}",
    "int_parsing": "expected an integer, got {input!r}",
    "int_from_float": "expected an integer, got {input!r}",
    "bool_type": "expected true/false, got {input!r}",
    "bool_parsing": "expected true/false, got {input!r}",
    "list_type": "expected a list, got {input!r}",
    "tuple_type": "expected a list, got {input!r}",
    "dict_type": "expected a mapping, got {input!r}",
    "greater_than": "must be > {gt}, got {input!r}",
    "greater_than_equal": "must be >= {ge}, got {input!r}",
    "less_than": "must be < {lt}, got {input!r}",
    "less_than_equal": "must be <= {le}, got {input!r}",
    "too_short": "must have at least {min_length} item(s), got {input!r}",
    "too_long": "must have at most {max_length} item(s), got {input!r}",
    "string_too_short": "must have at least {min_length} character(s), got {input!r}",
    "string_pattern_mismatch": "must match {pattern}, got {input!r}",
    "multiple_of": "must be a multiple of {multiple_of}, got {input!r}",
}
_UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden")
_MISSING = ("missing", "missing_argument")


def _dotted(loc: tuple[Any, ...]) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in loc if k != "[key]")


def _model_at(cls: Any, loc: tuple[Any, ...]) -> Any:
    """The params model at ``loc`` below ``cls`` (None: not a model)."""
    tp = cls
    for key in loc:
        if not dataclasses.is_dataclass(tp) or not isinstance(key, str):
            return None
        tp = typing.get_type_hints(tp)[key]
        while typing.get_origin(tp) in (list, dict, typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = args[-1] if args else None
    return tp if dataclasses.is_dataclass(tp) else None


def rule_of(error: Any) -> str:
    """The rule a pydantic error broke, in the words of the params errors."""
    kind, value, ctx = error["type"], error["input"], dict(error.get("ctx") or {})
    # a bound of a float field: 0 rather than 0.0
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in ctx.items()}

    if kind == "string_type":
        hint = " (quote it in YAML)" if isinstance(value, int | float) else ""
        return f"expected a string, got {value!r}{hint}"
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace(" or ", ", ")
        return f"{value!r} is not one of [{expected}]"
    if kind in ("dataclass_type", "model_type"):
        return f"expected a mapping, got {type(value).__name__}"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    if kind in _TYPE_RULES:
        return _TYPE_RULES[kind].format(input=value, **ctx)
    return str(error["msg"])


def describe(exc: ValidationError, cls: Any, where: str) -> str:
    """One line for a failed validation of ``cls`` at ``where`` (``file: section``): unknown
    fields first (with the closest allowed name), then the first bad value, then missing
    fields. Never pydantic's multi-line report."""
    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] in _UNKNOWN]
    if unknown:
        parent = unknown[0]["loc"][:-1]
        names = sorted(str(e["loc"][-1]) for e in unknown if e["loc"][:-1] == parent)
        model = _model_at(cls, parent)
        allowed = sorted(f.name for f in dataclasses.fields(model)) if model else []
        close = difflib.get_close_matches(names[0], allowed, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else f"allowed: {allowed}"
        return f"{where}{_dotted(parent)}: unknown field(s) {names}; {hint}"
    bad = [e for e in errors if e["type"] not in _MISSING]
    if bad:
        return f"{where}{_dotted(bad[0]['loc'])}: {rule_of(bad[0])}"
    parent = errors[0]["loc"][:-1]
    names = [str(e["loc"][-1]) for e in errors if e["loc"][:-1] == parent]
    return f"{where}{_dotted(parent)}: missing required field(s) {names}"
