"""The grid over a search space (the bench's exhaustive baseline) and its cache key."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from components.core import overrides
from components.core.config import params_sha256
from components.ml.training import search_space
from components.ml.training.search_space import CategoricalSpec, IntSpec, Space, Spec

REPO = Path(__file__).resolve().parents[2]


def cardinality(spec: Spec) -> float:
    """How many values ``spec`` can take (``inf``: a continuous float)."""
    if isinstance(spec, CategoricalSpec):
        return len(spec.choices)
    if spec.step is None:
        return spec.high - spec.low + 1 if isinstance(spec, IntSpec) else math.inf
    return math.floor((spec.high - spec.low) / spec.step + 1e-9) + 1


def grid_counts(space: Space, target: int) -> dict[str, int]:
    """Points per key: one each, then one more for the key with the fewest points (ties: the
    most values, then space order) while the product stays <= ``target``."""
    counts = dict.fromkeys(space, 1)
    while True:
        size = math.prod(counts.values())
        fits = [
            k
            for k, s in space.items()
            if counts[k] < cardinality(s) and size // counts[k] * (counts[k] + 1) <= target
        ]
        if not fits:
            return counts
        order = list(space)
        key = min(fits, key=lambda k: (counts[k], -cardinality(space[k]), order.index(k)))
        counts[key] += 1


def points(spec: Spec, n: int, current: Any = None) -> list[Any]:
    """``n`` values of ``spec`` spread over it, ends included (one: ``current`` when ``spec``
    can sample it, else the middle)."""
    if n == 1 and current is not None and search_space.contains(spec, current):
        return [current]
    if isinstance(spec, CategoricalSpec):
        picks = np.unique(np.round(np.linspace(0, len(spec.choices) - 1, n)).astype(int))
        if n == 1:
            picks = [len(spec.choices) // 2]
        return [spec.choices[int(i)] for i in picks]
    low, high = float(spec.low), float(spec.high)
    if n == 1:
        raw = [math.sqrt(low * high) if spec.log else (low + high) / 2]
    else:
        raw = list(np.geomspace(low, high, n) if spec.log else np.linspace(low, high, n))
    if spec.step is not None:
        raw = [spec.low + round((x - low) / spec.step) * spec.step for x in raw]
    if isinstance(spec, IntSpec):
        values: list[Any] = [int(round(x)) for x in raw]
    else:
        values = [float(f"{x:.6g}") for x in raw]
    return list(dict.fromkeys(values))  # rounding may merge neighbours


def grid(space: Space, target: int, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every config of the discretised space, in space order; a conditional key only where its
    condition holds (its count stays in the product: ``target`` is an upper bound)."""
    counts = grid_counts(space, target)
    current = search_space.current(space, params)
    configs: list[dict[str, Any]] = [{}]
    for key, spec in space.items():
        values = points(spec, counts[key], current.get(key))
        grown: list[dict[str, Any]] = []
        for config in configs:
            if search_space.active(spec, config, params):
                grown.extend({**config, key: value} for value in values)
            else:
                grown.append(config)
        configs = grown
    return configs


def code_sha256(root: Path = REPO / "components") -> str:
    """The sha256 of every source file under ``root`` (paths and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"{path.relative_to(root)}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def grid_key(code: str, params: Mapping[str, Any], data: str, configs: list, epochs: int) -> str:
    """The grid cache's key: the code, the task and train params, the data, the configs."""
    train = {k: v for k, v in (params.get("train") or {}).items() if k != "epochs"}
    return params_sha256(
        {
            "code": code,
            "params": {"task": params.get("task"), "train": train},
            "data": data,
            "configs": [{k: overrides.format_value(v) for k, v in c.items()} for c in configs],
            "epochs": epochs,
        }
    )[:16]
