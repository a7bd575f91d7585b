"""Judging a challenger on live traffic: promote, roll back, or wait for evidence.

Under a traffic policy (shadow or canary, ``serving/src/repository.h``) every request a
challenger answered was also answered by the champion, under one request id in the
prediction log: paired evidence. The verdict, in this order:

1. **Service levels, at once.** When the challenger answered ``slo_min_requests`` requests
   and its server-error rate exceeds ``max_error_rate`` or its p99 latency exceeds
   ``max_p99_latency_ms``: roll back, without waiting for statistics.
2. **With labels fed back** for ``min_labelled`` paired items: the blessing's own rules
   (``components.ml.decisions.gates``: one-sided exact McNemar on the paired outcomes and per-class
   recall, with ``register``'s limits): fail -> roll back, pass -> promote.
3. **Without labels**, with ``min_pairs`` paired items: top-1 agreement with the champion of
   at least ``min_agreement`` -> promote, else roll back.
4. Otherwise: wait.

Library layer: imported by steps, imports no step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from components.core.config import params_model
from components.ml.decisions.gates import PairedLimits, compare, decide


@params_model
class JudgeLimits:
    min_pairs: Annotated[int, Field(ge=1)]
    min_labelled: Annotated[int, Field(ge=1)]
    min_agreement: Annotated[float, Field(ge=0, le=1)]
    max_error_rate: Annotated[float, Field(ge=0, le=1)]
    max_p99_latency_ms: Annotated[float, Field(gt=0)]
    slo_min_requests: Annotated[int, Field(ge=1)]


@dataclass
class Evidence:
    """What the log holds on the trial: per paired item the two top-1 answers (and the label
    where fed back), and the challenger's own service record."""

    champion: list[int] = field(default_factory=list)
    challenger: list[int] = field(default_factory=list)
    labels: list[int | None] = field(default_factory=list)
    challenger_requests: int = 0
    challenger_errors: int = 0  # answers with a 5xx code
    challenger_latency_us: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Judgement:
    action: str  # promote | rollback | wait
    reasons: list[str]
    evidence: dict[str, Any]


def _breaches(ev: Evidence, limits: JudgeLimits, error_rate: float, p99: float) -> list[str]:
    """The challenger's service-level breaches: its error rate and its p99 latency."""
    n = ev.challenger_requests
    breaches = []
    if error_rate > limits.max_error_rate:
        breaches.append(
            f"error rate {error_rate:.3f} > judge.max_error_rate {limits.max_error_rate} "
            f"({ev.challenger_errors} of {n} answers failed)"
        )
    if p99 > limits.max_p99_latency_ms:
        breaches.append(
            f"p99 latency {p99:.1f} ms > judge.max_p99_latency_ms "
            f"{limits.max_p99_latency_ms} over {n} answers"
        )
    return breaches


def judge(
    ev: Evidence, limits: JudgeLimits, paired: PairedLimits, class_names: list[str]
) -> Judgement:
    """The verdict on ``ev`` (module doc)."""
    n = ev.challenger_requests
    error_rate = ev.challenger_errors / n if n else 0.0
    p99 = (
        float(np.percentile(ev.challenger_latency_us, 99)) / 1000
        if ev.challenger_latency_us
        else 0.0
    )
    summary: dict[str, Any] = {
        "challenger_requests": n,
        "challenger_error_rate": error_rate,
        "challenger_p99_ms": p99,
        "pairs": len(ev.champion),
    }
    if n >= limits.slo_min_requests:
        breaches = _breaches(ev, limits, error_rate, p99)
        if breaches:
            return Judgement(
                "rollback", [f"service level breached: {b}" for b in breaches], summary
            )
    champ, chall = np.asarray(ev.champion, np.int64), np.asarray(ev.challenger, np.int64)
    agreement = float((champ == chall).mean()) if len(champ) else 0.0
    summary["agreement"] = agreement
    have = np.asarray([y is not None for y in ev.labels], bool)
    summary["labelled_pairs"] = int(have.sum())
    if have.sum() >= limits.min_labelled:
        labels = np.asarray([y for y in ev.labels if y is not None], np.int64)
        comparison = compare(labels, champ[have], chall[have], class_names)
        verdict = decide(
            comparison,
            paired,
            what="the challenger on live traffic",
            reference="the champion on the same requests",
            params_prefix="register",
            drop_param="max_regression",
            class_drop_param="max_class_regression",
        )
        summary["comparison"] = comparison
        summary["rules"] = verdict.rules
        if not verdict.passed:
            return Judgement("rollback", verdict.failures, summary)
        o = comparison["overall"]
        return Judgement(
            "promote",
            [
                f"paired gates passed on {o['samples']} labelled live requests: accuracy "
                f"{o['reference']:.4f} -> {o['candidate']:.4f} ({o['worse']} worse, "
                f"{o['better']} better, McNemar p={o['p_value']:.3g})"
            ],
            summary,
        )
    if len(champ) >= limits.min_pairs:
        line = (
            f"top-1 agreement with the champion {agreement:.4f} on {len(champ)} paired "
            f"requests (judge.min_agreement {limits.min_agreement}; no labels yet)"
        )
        return Judgement(
            "promote" if agreement >= limits.min_agreement else "rollback", [line], summary
        )
    return Judgement(
        "wait",
        [
            f"{len(champ)} paired requests ({int(have.sum())} labelled): fewer than "
            f"judge.min_pairs {limits.min_pairs} / judge.min_labelled {limits.min_labelled}"
        ],
        summary,
    )
