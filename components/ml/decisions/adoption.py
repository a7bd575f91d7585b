"""Adopting a search's winner: only on a gain that is material and evidenced, like the paired
gates of :mod:`components.ml.decisions.gates`.

The current params and the winner are trained once per seed ``S = train.seed + i`` (``i < k``)
and scored on val. Pairing by seed cancels the seed-to-seed noise both share; the evidence is
the paired differences ``d_s = sign * (winner_s - current_s)`` (``sign`` -1 when lower is
better). The winner is adopted iff

- (a) every ``d_s > 0`` (never worse on any seed), and
- (b) the one-sided paired-t lower bound ``mean(d) - t(1 - alpha, k - 1) * sd(d) / sqrt(k)``
  exceeds ``min_gain`` (``sd = 0`` with every ``d > 0``: the bound is the mean).

(a) alone with k = 3 is a sign test at p = 0.125 (too weak); (b) alone can pass with one seed
worse; together, with k = 3 and alpha = 0.05 (t = 2.920), the gain must be consistent and
larger than ~1.7 paired standard deviations. A winner that is the current params (trial 0) is
not adopted and runs no seeds. The t quantile is scipy's (a scikit-learn dependency, used by
the monitor's drift test too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from components.core.config import params_model


@params_model
class AdoptParams:
    """``hpo.adopt``: seeds per side, the one-sided level, the least gain worth adopting."""

    seeds: Annotated[int, Field(ge=2)] = 3  # a paired sd needs two seeds
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05
    min_gain: Annotated[float, Field(ge=0)] = 0.0  # in the objective's units


@dataclass(frozen=True)
class Adoption:
    """The decision and its evidence; ``reason`` is the one line the step prints."""

    adopted: bool
    reason: str
    seeds: tuple[int, ...] = ()
    current: tuple[float, ...] = ()
    winner: tuple[float, ...] = ()
    diffs: tuple[float, ...] = ()
    mean: float | None = None
    lower_bound: float | None = None
    rule: str = ""

    def evidence(self) -> dict[str, Any]:
        """The overlay's ``evidence`` mapping."""
        return {
            "seeds": list(self.seeds),
            "current": list(self.current),
            "winner": list(self.winner),
            "diffs": list(self.diffs),
            "mean": self.mean,
            "lower_bound": self.lower_bound,
            "rule": self.rule,
        }


def t_quantile(level: float, dof: int) -> float:
    """The ``level`` quantile of Student's t with ``dof`` degrees of freedom."""
    from scipy import stats  # here: importing scipy.stats costs ~0.3 s

    return float(stats.t.ppf(level, dof))


def baseline_won(trial: int | str, metric: str) -> Adoption:
    """The best trial is the current params: nothing to adopt, no seeds run."""
    return Adoption(
        adopted=False,
        reason=f"hpo: kept current params: the best trial {trial} is the current params ({metric})",
        rule="winner is the current params",
    )


def decide(
    current: Sequence[float],
    winner: Sequence[float],
    *,
    seeds: Sequence[int],
    higher_is_better: bool,
    limits: AdoptParams,
    metric: str,
    trial: int | str,
) -> Adoption:
    """The paired-seed rule (module docstring) on the val scores of the current params and the
    winner (``trial``), one per seed of ``seeds``, same order."""
    k = len(seeds)
    if not (len(current) == len(winner) == k) or k < 2:
        raise ValueError(f"need >= 2 paired scores, got {len(current)}, {len(winner)}, {k}")
    if not all(math.isfinite(v) for v in (*current, *winner)):
        raise ValueError(f"scores must be finite: current {current}, winner {winner}")
    sign = 1.0 if higher_is_better else -1.0
    d = sign * (np.asarray(winner, dtype=float) - np.asarray(current, dtype=float))
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    t = t_quantile(1 - limits.alpha, k - 1)
    bound = mean - t * sd / math.sqrt(k)
    rule = (
        f"every d > 0 and mean(d) - t({1 - limits.alpha:g}, {k - 1}) * sd(d) / sqrt({k}) "
        f"> {limits.min_gain:g} (t = {t:.3f})"
    )
    worse = [s for s, v in zip(seeds, d, strict=True) if v <= 0]
    adopted = not worse and bound > limits.min_gain
    gain = f"{metric} {mean:+.3g} mean, lower bound {bound:.3g}"  # d: + is better
    if adopted:
        reason = f"hpo: adopted trial {trial}: {gain} > {limits.min_gain:g} ({k} seeds)"
    elif worse:
        seeds_text = ", ".join(str(s) for s in worse)
        reason = (
            f"hpo: kept current params: winner trial {trial} not better on seed(s) {seeds_text} "
            f"({gain}, {k} seeds)"
        )
    else:
        reason = (
            f"hpo: kept current params: winner trial {trial} {gain} <= {limits.min_gain:g} "
            f"({k} seeds)"
        )
    return Adoption(
        adopted=adopted,
        reason=reason,
        seeds=tuple(int(s) for s in seeds),
        current=tuple(float(v) for v in current),
        winner=tuple(float(v) for v in winner),
        diffs=tuple(float(v) for v in d),
        mean=mean,
        lower_bound=bound,
        rule=rule,
    )
