"""Drift and live-accuracy checks of a window of served traffic against a reference.

The reference is the champion on its training snapshot's held-out split (samples the model
did not train on, so under no shift they are exchangeable with live traffic); the window is
the newest logged requests (``components.ml.data.prediction_log``). Every check is a standard
two-sample test from scipy:

- **input drift**, per input feature the task defines (:meth:`Task.monitor_features`: for
  images their intensity and shape statistics): two-sample Kolmogorov-Smirnov;
- **prediction drift**: the class prior (top-1 counts) by the chi-square test of a 2 x C
  contingency table, and the top-1 confidence by Kolmogorov-Smirnov;
- **live accuracy**, where labels were fed back: one-sided Fisher exact test on the 2 x 2
  table of correct/wrong answers (reference vs window), plus a practical margin (an alarm
  needs the observed drop to reach ``max_accuracy_drop``), like the blessing gates.

A window alarms when any check's p-value is below ``alpha / m`` (Bonferroni over the ``m``
checks that had enough data): the false-alarm rate per window is at most ``alpha`` whatever
the dependence between the checks. A window in which no check had enough data has no verdict:
its status is ``insufficient`` ("not enough data: N items, M needed"), never a quiet one.
Measured rates: ``tests/test_monitor.py``, docs/monitoring.md.

Library layer: imported by steps, imports no step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from components.core.config import params_model
from components.ml.data.features import image_features, softmax_top1

__all__ = [
    "ALARM",
    "INSUFFICIENT",
    "OK",
    "Check",
    "MonitorLimits",
    "Sample",
    "Verdict",
    "compare",
    "image_features",
    "softmax_top1",
]


# why a pipeline run retrains: set by the monitor when its alarm starts the pipeline; track
# records it on the run (tag retrain_reason), and register copies it onto the new version
RETRAIN_REASON_ENV = "PADDLE_MLOPS_RETRAIN_REASON"


@params_model
class MonitorLimits:
    # family-wise false-alarm rate per window
    alpha: Annotated[float, Field(gt=0, lt=1)]
    # a check runs when the window side has at least this many samples
    min_samples: Annotated[int, Field(ge=2)]
    # a live-accuracy alarm needs at least this observed drop
    max_accuracy_drop: Annotated[float, Field(ge=0, le=1)]


@dataclass
class Sample:
    """One side of the comparison: per-item predictions, the features of the items whose
    inputs were logged, and whether each labelled item was answered correctly."""

    top1: np.ndarray  # int, one per item
    confidence: np.ndarray  # float, one per item
    features: dict[str, np.ndarray] = field(default_factory=dict)  # per sampled item
    correct: np.ndarray | None = None  # bool, one per labelled item


@dataclass(frozen=True)
class Check:
    name: str  # e.g. "input:mean", "prediction:class_prior", "accuracy"
    kind: str  # input_drift | prediction_drift | accuracy
    test: str
    statistic: float | None
    p_value: float | None
    threshold: float | None  # alpha / m
    n_reference: int
    n_window: int
    alarm: bool
    skipped: str | None = None  # why the check did not run
    detail: dict[str, Any] = field(default_factory=dict)


# a verdict's status: the checks ran and one alarmed, ran and none did, or none could run
ALARM, OK, INSUFFICIENT = "alarm", "ok", "insufficient"


@dataclass(frozen=True)
class Verdict:
    alarm: bool
    checks: list[Check]
    reasons: list[str]  # the alarmed checks, readable
    status: str = OK  # ALARM | OK | INSUFFICIENT
    not_enough: str | None = None  # INSUFFICIENT: "not enough data: N items, M needed"

    @property
    def skipped(self) -> list[Check]:
        return [c for c in self.checks if c.skipped is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "alarm": self.alarm,
            "not_enough": self.not_enough,
            "reasons": self.reasons,
            "checks": [asdict(c) for c in self.checks],
        }


# one check's outcome: (name, kind, test, statistic, p, n_ref, n_win, skipped, detail)
_Result = tuple[str, str, str, float | None, float | None, int, int, str | None, dict]


def compare(reference: Sample, window: Sample, limits: MonitorLimits, num_classes: int) -> Verdict:
    """Every check of ``window`` against ``reference``; see the module doc."""
    planned: list[tuple[str, str, str, Any]] = []
    for name in sorted(set(reference.features) & set(window.features)):
        planned.append((f"input:{name}", "input_drift", "ks_2samp", name))
    planned.append(("prediction:class_prior", "prediction_drift", "chi2_contingency", None))
    planned.append(("prediction:confidence", "prediction_drift", "ks_2samp", None))
    planned.append(("accuracy", "accuracy", "fisher_exact_one_sided", None))

    results: list[_Result] = []
    for name, kind, test, feature in planned:
        ref, win = _compared(name, kind, feature, reference, window)
        n_ref, n_win = len(ref), len(win)
        if n_win < limits.min_samples or n_ref < limits.min_samples:
            why = (
                f"{n_win} window / {n_ref} reference samples, fewer than "
                f"monitor.min_samples={limits.min_samples}"
            )
            results.append((name, kind, test, None, None, n_ref, n_win, why, {}))
            continue
        statistic, p, detail = _test(test, ref, win, num_classes)
        results.append((name, kind, test, statistic, p, n_ref, n_win, None, detail))
    return _verdict(results, reference, window, limits)


def _compared(
    name: str, kind: str, feature: Any, reference: Sample, window: Sample
) -> tuple[np.ndarray, np.ndarray]:
    """The reference's and the window's values one check compares."""
    if kind == "input_drift":
        return reference.features[feature], window.features[feature]
    if name == "accuracy":
        ref = reference.correct if reference.correct is not None else np.zeros(0, bool)
        win = window.correct if window.correct is not None else np.zeros(0, bool)
        return ref, win
    if name == "prediction:class_prior":
        return reference.top1, window.top1
    return reference.confidence, window.confidence


def _test(
    test: str, ref: np.ndarray, win: np.ndarray, num_classes: int
) -> tuple[float, float, dict[str, Any]]:
    """(statistic, p-value, detail) of one two-sample test."""
    from scipy import stats  # here: track imports this module for RETRAIN_REASON_ENV only

    n_ref, n_win = len(ref), len(win)
    if test == "ks_2samp":
        res = stats.ks_2samp(ref, win)
        detail = {
            "reference_median": float(np.median(ref)),
            "window_median": float(np.median(win)),
        }
        return float(res.statistic), float(res.pvalue), detail
    if test == "chi2_contingency":
        table = np.vstack(
            [np.bincount(ref, minlength=num_classes), np.bincount(win, minlength=num_classes)]
        )
        table = table[:, table.sum(0) > 0]
        if table.shape[1] < 2:
            statistic, p = 0.0, 1.0
        else:
            res = stats.chi2_contingency(table)
            statistic, p = float(res.statistic), float(res.pvalue)
        detail = {
            "reference_prior": (np.bincount(ref, minlength=num_classes) / n_ref).round(4).tolist(),
            "window_prior": (np.bincount(win, minlength=num_classes) / n_win).round(4).tolist(),
        }
        return statistic, p, detail
    # accuracy: is the reference's accuracy greater than the window's?
    table = [
        [int(ref.sum()), int(n_ref - ref.sum())],
        [int(win.sum()), int(n_win - win.sum())],
    ]
    res = stats.fisher_exact(table, alternative="greater")
    drop = float(ref.mean() - win.mean())
    detail = {
        "reference_accuracy": float(ref.mean()),
        "window_accuracy": float(win.mean()),
        "drop": drop,
    }
    return float(res.statistic), float(res.pvalue), detail


def _verdict(
    results: list[_Result], reference: Sample, window: Sample, limits: MonitorLimits
) -> Verdict:
    """The checks (Bonferroni over those that ran), the alarm and its reasons."""
    ran = [r for r in results if r[7] is None]
    threshold = limits.alpha / len(ran) if ran else None
    checks: list[Check] = []
    reasons: list[str] = []
    for name, kind, test, statistic, p, n_ref, n_win, skipped, detail in results:
        alarm = skipped is None and threshold is not None and p is not None and p < threshold
        if alarm and name == "accuracy" and detail["drop"] < limits.max_accuracy_drop:
            alarm = False
            detail["below_margin"] = True
        checks.append(
            Check(
                name,
                kind,
                test,
                statistic,
                p,
                threshold if skipped is None else None,
                n_ref,
                n_win,
                alarm,
                skipped,
                detail,
            )
        )
        if alarm:
            reasons.append(_reason(name, test, p, threshold, detail))
    if not ran:  # no check could run: no verdict, and never a quiet one
        n_win, n_ref = len(window.top1), len(reference.top1)
        need = limits.min_samples
        not_enough = (
            f"not enough data: {n_win} items, {need} needed"
            if n_win < need
            else f"not enough data: the reference has {n_ref} samples, {need} needed"
        )
        return Verdict(False, checks, [], INSUFFICIENT, not_enough)
    return Verdict(bool(reasons), checks, reasons, ALARM if reasons else OK)


def _reason(name: str, test: str, p: float, threshold: float, detail: dict[str, Any]) -> str:
    what = f"{name} ({test} p={p:.2g} < {threshold:.2g}"
    if name == "accuracy":
        what += f"; accuracy {detail['reference_accuracy']:.3f} -> {detail['window_accuracy']:.3f}"
    elif "reference_median" in detail:
        what += f"; median {detail['reference_median']:.3g} -> {detail['window_median']:.3g}"
    return what + ")"
