"""Reading ``params.yaml`` into typed, validated step parameters.

Every tunable number lives in ``params.yaml`` keyed by step. Steps receive frozen dataclasses,
never the raw dict, and an unknown or mistyped key is reported with the file and dotted field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

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
    """Build dataclass ``cls`` from ``params[name]``, with readable errors naming ``source``
    (default: the file ``params`` was loaded from)."""
    source = source or params_source(params)
    if name not in params:
        raise StepError(f"{source}: missing section '{name}'")
    return from_dict(cls, params[name], where=f"{source}: {name}")


def from_dict(cls: type[T], data: Any, *, where: str) -> T:
    if not isinstance(data, dict):
        raise StepError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise StepError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        kwargs[key] = _coerce(hints[key], value, where=f"{where}.{key}")
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise StepError(f"{where}: missing required field(s) {missing}")
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if callable(check):
        try:
            check()
        except ValueError as exc:
            raise StepError(f"{where}: {exc}") from exc
    return obj


def _coerce(tp: Any, value: Any, *, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where=where)
            except StepError as exc:
                errors.append(str(exc))
        raise StepError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise StepError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where=where)  # type: ignore[arg-type]
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise StepError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(inner, v, where=f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise StepError(f"{where}: expected a mapping, got {value!r}")
        key_tp, value_tp = args if len(args) == 2 else (Any, Any)
        return {
            _coerce(key_tp, k, where=f"{where} key {k!r}"): _coerce(
                value_tp, v, where=f"{where}.{k}"
            )
            for k, v in value.items()
        }
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise StepError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        # KFP passes dict parameters through protobuf Struct, where every number is a float
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise StepError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise StepError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            hint = " (quote it in YAML)" if isinstance(value, int | float) else ""
            raise StepError(f"{where}: expected a string, got {value!r}{hint}")
        return value
    return value
