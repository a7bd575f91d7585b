"""Paired quality gates: is a candidate model worse than its reference on the *same* samples?

Both gates of the pipeline use this module: the QAT gate (int8 candidate vs its fp32 parent,
on the validation split) and the blessing (challenger vs champion, on the test split and on
the pinned holdout). A comparison of two point estimates on a small split fails on noise (one
flipped image is 3.7 points of a 27-sample class) and can equally pass a real regression, so
the gates look at the *paired* outcomes instead:

- ``worse``: samples the reference gets right and the candidate gets wrong;
- ``better``: samples the reference gets wrong and the candidate gets right.

Only these discordant pairs carry evidence. Under "no difference" each of them is equally
likely to go either way, so the one-sided exact McNemar test is a binomial tail:
``p = P(X >= worse)`` for ``X ~ Binomial(worse + better, 1/2)``.

A rule fails only with both a *material* change and *evidence* for it:

- overall: the accuracy drop exceeds ``max_drop`` points **and** McNemar's one-sided p-value
  is below ``alpha``;
- per class: the recall drop exceeds ``max_class_drop`` points **and** the class lost at
  least ``min_class_flips`` samples net (``worse - better`` within the class).

The defaults in ``params.yaml`` were chosen with ``tests/test_gates.py``, which simulates
paired predictions the size of the digits splits: with no true difference the gate passes
>= 99 % of the time, and with a true 3-point accuracy drop it fails >= 90 % of the time
(measured rates are in ``docs/gates.md``). This module needs only NumPy: no Paddle, no MLflow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from components.core.config import params_model

# the params-model field types of the paired gates' limits (register, qat, judge)
Alpha = Annotated[float, Field(gt=0, lt=1)]  # a one-sided level within (0, 1)
Points = Annotated[float, Field(ge=0)]  # a drop in points (percent)
Flips = Annotated[int, Field(ge=1)]  # samples lost (net) before a class limit counts


@params_model
class PairedLimits:
    """What counts as "worse". Drops are in points (percent); ``alpha`` is one-sided."""

    alpha: Alpha
    max_drop: Points
    max_class_drop: Points
    min_class_flips: Flips


def mcnemar_one_sided(worse: int, better: int) -> float:
    """Exact one-sided McNemar p-value: P(X >= worse), X ~ Binomial(worse + better, 1/2)."""
    n = worse + better
    if worse < 0 or better < 0:
        raise ValueError("discordant counts must be >= 0")
    if worse == 0:
        return 1.0
    # exact sum in integers, one division: no float underflow for realistic n
    tail = sum(math.comb(n, k) for k in range(worse, n + 1))
    return float(tail / 2**n)


def _counts(ref_ok: np.ndarray, cand_ok: np.ndarray) -> dict[str, Any]:
    n = int(ref_ok.size)
    worse = int(np.count_nonzero(ref_ok & ~cand_ok))
    better = int(np.count_nonzero(~ref_ok & cand_ok))
    ref_rate = float(ref_ok.mean()) if n else 0.0
    cand_rate = float(cand_ok.mean()) if n else 0.0
    return {
        "samples": n,
        "reference": ref_rate,
        "candidate": cand_rate,
        "drop_points": (ref_rate - cand_rate) * 100.0,
        "worse": worse,
        "better": better,
        "net_flips": worse - better,
        "p_value": mcnemar_one_sided(worse, better),
    }


def compare(
    labels: np.ndarray,
    reference: np.ndarray,
    candidate: np.ndarray,
    class_names: Sequence[str],
) -> dict[str, Any]:
    """Paired outcome counts of two models' predicted classes on the same labelled samples."""
    labels, reference, candidate = (
        np.asarray(a).reshape(-1) for a in (labels, reference, candidate)
    )
    if not labels.size == reference.size == candidate.size:
        raise ValueError(
            f"paired comparison needs one prediction per sample: {labels.size} labels, "
            f"{reference.size} reference and {candidate.size} candidate predictions"
        )
    ref_ok, cand_ok = reference == labels, candidate == labels
    per_class = {}
    for k, name in enumerate(class_names):
        mask = labels == k
        if mask.any():
            per_class[str(name)] = _counts(ref_ok[mask], cand_ok[mask])
    return {"overall": _counts(ref_ok, cand_ok), "per_class": per_class}


@dataclass(frozen=True)
class Verdict:
    """The decision on one comparison: ``failures`` are readable lines; ``rules`` is the record."""

    passed: bool
    failures: list[str]
    rules: list[dict[str, Any]]


def decide(
    comparison: dict[str, Any],
    limits: PairedLimits,
    *,
    what: str,
    reference: str,
    params_prefix: str,
    drop_param: str,
    class_drop_param: str,
) -> Verdict:
    """Apply ``limits`` to a :func:`compare` result.

    ``what`` names the comparison in messages ("openvino int8 on val"), ``reference`` the model
    compared against ("its fp32 parent"), and the ``*_param`` names are the params.yaml keys a
    user would change, so a message says which setting decided.
    """
    o = comparison["overall"]
    significant = o["p_value"] < limits.alpha
    material = o["drop_points"] > limits.max_drop
    rules: list[dict[str, Any]] = [
        {
            "rule": "accuracy",
            "scope": "overall",
            "drop_points": o["drop_points"],
            "limit_points": limits.max_drop,
            "worse": o["worse"],
            "better": o["better"],
            "p_value": o["p_value"],
            "alpha": limits.alpha,
            "failed": bool(material and significant),
            "why": _why(material, significant),
        }
    ]
    failures = []
    if material and significant:
        failures.append(
            f"{what}: accuracy {o['candidate']:.4f} is {o['drop_points']:.2f} points below "
            f"{reference} ({o['reference']:.4f}) on {o['samples']} paired samples: "
            f"{o['worse']} got worse, {o['better']} got better, one-sided McNemar "
            f"p={o['p_value']:.3g} < {params_prefix}.alpha {limits.alpha} "
            f"({params_prefix}.{drop_param} {limits.max_drop})"
        )
    for name, c in comparison["per_class"].items():
        material = c["drop_points"] > limits.max_class_drop
        evidenced = c["net_flips"] >= limits.min_class_flips
        failed = bool(material and evidenced)
        if c["drop_points"] > 0 or failed:
            rules.append(
                {
                    "rule": "class_recall",
                    "scope": name,
                    "drop_points": c["drop_points"],
                    "limit_points": limits.max_class_drop,
                    "worse": c["worse"],
                    "better": c["better"],
                    "net_flips": c["net_flips"],
                    "min_flips": limits.min_class_flips,
                    "p_value": c["p_value"],
                    "failed": failed,
                    "why": _why(material, evidenced, evidence="flips"),
                }
            )
        if failed:
            failures.append(
                f"{what}: class '{name}' recall fell {c['drop_points']:.2f} points "
                f"({c['reference']:.4f} -> {c['candidate']:.4f}) vs {reference}: "
                f"{c['net_flips']} of {c['samples']} samples lost net ({c['worse']} worse, "
                f"{c['better']} better; {params_prefix}.{class_drop_param} "
                f"{limits.max_class_drop}, {params_prefix}.min_class_flips "
                f"{limits.min_class_flips})"
            )
    return Verdict(passed=not failures, failures=failures, rules=rules)


def _why(material: bool, evidenced: bool, *, evidence: str = "significance") -> str:
    if material and evidenced:
        return "failed: beyond the limit, with evidence"
    if material:
        return f"passed: beyond the limit but without {evidence} (within noise)"
    return "passed: within the limit"


def top1_mismatches(got: np.ndarray, reference: np.ndarray, atol: float, rtol: float) -> int:
    """Samples whose top-1 class differs although the reference separates the two classes by
    more than the numerical tolerance allows.

    Two runtimes (or one runtime on two CPUs) that agree within ``atol + rtol * |reference|``
    can still pick different classes where the reference's two best logits are closer than
    that; such near-ties are numerics, not a broken model, so they do not count.
    """
    got, reference = np.asarray(got), np.asarray(reference)
    g, r = got.argmax(axis=1), reference.argmax(axis=1)
    idx = np.flatnonzero(g != r)
    if idx.size == 0:
        return 0
    top = reference[idx, r[idx]]
    margin = top - reference[idx, g[idx]]
    tolerance = 2.0 * (atol + rtol * np.abs(top))
    return int(np.count_nonzero(margin > tolerance))
