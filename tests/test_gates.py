"""The paired gates (QAT gate and blessing): exact test, rules, and measured error rates.

No Paddle here: the calibration simulates paired predictions the size of the digits splits
(10 classes x 27 samples) and runs them through the same ``components.ml.decisions.gates`` code with
the limits that ``params.yaml`` ships, so a change of defaults that breaks either error rate
fails this test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from scipy.stats import binomtest

from components.ml.decisions.gates import PairedLimits, compare, decide, mcnemar_one_sided
from tests.conftest import REPO

NAMES = [str(i) for i in range(10)]
LABELS = np.repeat(np.arange(10), 27)  # the digits val/test splits: 269-270 samples, ~27/class
SEEN_FLIP_RATE = 1 / 269  # one test image flipped by the int8 fine-tune on AMD EPYC (issue 9)
SIMULATIONS = 2000


def _decide(comparison, limits):
    return decide(
        comparison,
        limits,
        what="candidate",
        reference="reference",
        params_prefix="p",
        drop_param="max_drop",
        class_drop_param="max_class_drop",
    )


def shipped_limits() -> dict[str, PairedLimits]:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    q, r = params["qat"], params["register"]
    return {
        "qat": PairedLimits(
            q["alpha"], q["max_accuracy_drop"], q["max_class_drop"], q["min_class_flips"]
        ),
        "register": PairedLimits(
            r["alpha"], r["max_regression"], r["max_class_regression"], r["min_class_flips"]
        ),
    }


def simulate(rng: np.random.Generator, flip_rate: float, true_drop: float, accuracy: float = 0.99):
    """Paired predictions of a reference and a candidate model on LABELS.

    Per sample: the candidate flips a correct answer to wrong with probability
    ``flip_rate / 2 + true_drop`` and a wrong one to correct with ``flip_rate / 2``; both are
    wrong with ``1 - accuracy - flip_rate / 2``. With ``true_drop = 0`` both models have the
    same true accuracy and differ only by random flips.
    """
    u = rng.random(LABELS.size)
    p_worse, p_better = flip_rate / 2 + true_drop, flip_rate / 2
    p_both_wrong = 1 - accuracy - flip_rate / 2
    worse = u < p_worse
    better = (u >= p_worse) & (u < p_worse + p_better)
    both = (u >= p_worse + p_better) & (u < p_worse + p_better + p_both_wrong)
    wrong = (LABELS + 1) % 10
    reference = np.where(better | both, wrong, LABELS)
    candidate = np.where(worse | both, wrong, LABELS)
    return reference, candidate


def failure_rate(limits: PairedLimits, flip_rate: float, true_drop: float, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    fails = sum(
        not _decide(compare(LABELS, *simulate(rng, flip_rate, true_drop), NAMES), limits).passed
        for _ in range(SIMULATIONS)
    )
    return fails / SIMULATIONS


# --------------------------------------------------------------------------- the exact test


@pytest.mark.parametrize("worse,better", [(0, 0), (0, 5), (1, 0), (5, 0), (3, 3), (7, 1), (40, 25)])
def test_mcnemar_is_the_exact_one_sided_binomial_tail(worse, better):
    expected = 1.0
    if worse + better:
        expected = binomtest(worse, worse + better, 0.5, alternative="greater").pvalue
    assert math.isclose(mcnemar_one_sided(worse, better), expected, rel_tol=1e-12)


def test_compare_counts_discordant_pairs_overall_and_per_class():
    labels = np.array([0, 0, 0, 1, 1, 1])
    reference = np.array([0, 0, 1, 1, 1, 0])  # right on 0,1,3,4
    candidate = np.array([0, 1, 0, 1, 0, 0])  # right on 0,2,3
    c = compare(labels, reference, candidate, ["a", "b"])
    o = c["overall"]
    assert (o["worse"], o["better"], o["samples"]) == (2, 1, 6)
    assert math.isclose(o["drop_points"], (4 / 6 - 3 / 6) * 100)
    assert (c["per_class"]["a"]["worse"], c["per_class"]["a"]["better"]) == (1, 1)
    assert (c["per_class"]["b"]["worse"], c["per_class"]["b"]["better"]) == (1, 0)
    with pytest.raises(ValueError, match="one prediction per sample"):
        compare(labels, reference[:5], candidate, ["a", "b"])


# --------------------------------------------------------------------------- the rules


def test_one_flipped_image_is_noise_not_a_regression():
    """The AMD EPYC case: one of 27 images of class '2' flipped (3.7 points of recall)."""
    limits = shipped_limits()["qat"]
    reference = LABELS.copy()
    candidate = LABELS.copy()
    candidate[np.flatnonzero(LABELS == 2)[0]] = 7
    verdict = _decide(compare(LABELS, reference, candidate, NAMES), limits)
    assert verdict.passed, verdict.failures
    rule = next(r for r in verdict.rules if r["scope"] == "2")
    assert rule["drop_points"] > limits.max_class_drop and rule["net_flips"] == 1
    assert rule["why"].startswith("passed: beyond the limit but without flips")


def test_a_class_that_loses_several_images_fails_and_says_why():
    limits = shipped_limits()["qat"]
    candidate = LABELS.copy()
    candidate[np.flatnonzero(LABELS == 4)[: limits.min_class_flips]] = 9
    verdict = _decide(compare(LABELS, LABELS, candidate, NAMES), limits)
    assert not verdict.passed
    text = "\n".join(verdict.failures)
    assert f"class '4' recall fell {limits.min_class_flips / 27 * 100:.2f} points" in text
    assert f"{limits.min_class_flips} of 27 samples lost net" in text
    assert f"p.min_class_flips {limits.min_class_flips}" in text


def test_a_significant_drop_fails_with_counts_and_p_value():
    limits = shipped_limits()["qat"]
    rng = np.random.default_rng(3)
    candidate = LABELS.copy()
    # 10 images of 10 different classes flip to wrong: 1 per class, below every class rule
    for k in range(10):
        candidate[rng.choice(np.flatnonzero(LABELS == k))] = (k + 1) % 10
    verdict = _decide(compare(LABELS, LABELS, candidate, NAMES), limits)
    assert not verdict.passed
    assert len(verdict.failures) == 1
    assert "10 got worse, 0 got better, one-sided McNemar p=0.000977" in verdict.failures[0]
    assert verdict.rules[0]["failed"] and verdict.rules[0]["p_value"] == 2.0**-10


def test_a_large_drop_without_evidence_passes():
    """Two of 20 samples lost is 10 points, but p = 0.25: not evidence of a regression."""
    limits = shipped_limits()["qat"]
    labels = np.arange(20) % 10
    candidate = labels.copy()
    candidate[:2] = (labels[:2] + 1) % 10
    verdict = _decide(compare(labels, labels, candidate, NAMES), limits)
    assert verdict.passed
    assert (
        verdict.rules[0]["why"]
        == "passed: beyond the limit but without significance (within noise)"
    )


@pytest.mark.parametrize(
    "bad", [{"alpha": 0.0}, {"alpha": 1.0}, {"min_class_flips": 0}, {"max_drop": -1}]
)
def test_limits_are_checked(bad):
    values = {"alpha": 0.1, "max_drop": 0.5, "max_class_drop": 2.0, "min_class_flips": 3} | bad
    with pytest.raises(ValueError):
        PairedLimits(**values).check("")


# --------------------------------------------------------------------------- calibration


@pytest.mark.parametrize("gate", ["qat", "register"])
def test_shipped_defaults_have_the_promised_error_rates(gate, record_property):
    """No true difference: pass >= 99 %. A true 3-point accuracy drop: fail >= 90 %."""
    limits = shipped_limits()[gate]
    false_fail = failure_rate(limits, SEEN_FLIP_RATE, 0.0)
    power = failure_rate(limits, SEEN_FLIP_RATE, 0.03)
    record_property("false_fail", false_fail)
    record_property("power", power)
    assert 1 - false_fail >= 0.99, f"{gate}: passes only {1 - false_fail:.3f} with no difference"
    assert power >= 0.90, f"{gate}: catches a 3-point drop only {power:.3f} of the time"


def test_top1_mismatches_ignore_near_ties_only():
    from components.ml.decisions.gates import top1_mismatches

    reference = np.array([[1.0, 0.99995, 0.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.5]])
    near_tie = np.array([[0.99995, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.5]])
    assert top1_mismatches(near_tie, reference, atol=1e-4, rtol=1e-3) == 0
    flipped = np.array([[1.0, 0.99995, 0.0], [0.0, 2.0, 0.0], [0.0, 1.0, 0.5]])
    assert top1_mismatches(flipped, reference, atol=1e-4, rtol=1e-3) == 1
    assert top1_mismatches(reference, reference, atol=0.0, rtol=0.0) == 0
