"""Bootstrap intervals over tasks against hand-computed cases."""

import numpy as np
import pytest

from evaluation.bootstrap import (
    bootstrap_interval,
    interval_from_indices,
    paired_bootstrap_interval,
    resample_indices,
)


def test_interval_from_given_resamples_by_hand():
    values = [0.0, 1.0, 1.0]
    indices = np.array([[0, 0, 0], [0, 1, 2], [1, 2, 2], [0, 0, 1]])
    # resample means: 0, 2/3, 1, 1/3 -> sorted 0, 1/3, 2/3, 1
    # 50% interval = quantiles 0.25 and 0.75 (linear): positions 0.75 and 2.25 of 0..3
    #   low  = 0 + 0.75 * (1/3 - 0)     = 0.25
    #   high = 2/3 + 0.25 * (1 - 2/3)   = 0.75
    low, high = interval_from_indices(values, indices, confidence=0.5)
    assert (low, high) == pytest.approx((0.25, 0.75))
    # 100% would be the extremes; 0.98 sits within 0.01 * 3 = 0.03 of them
    low, high = interval_from_indices(values, indices, confidence=0.98)
    assert (low, high) == pytest.approx((0.01, 0.99))


def test_two_tasks_fixed_seed():
    # Two tasks 0 and 1: a resample mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% quantiles of 10,000 resamples are 0 and 1.
    assert bootstrap_interval([0.0, 1.0], 10_000, 0.95, seed=0) == (0.0, 1.0)
    # 60%: quantiles 0.2 and 0.8; P(mean = 0) ~ 0.25 > 0.2 -> 0, P(mean <= 0.5) ~ 0.75 < 0.8 -> 1
    assert bootstrap_interval([0.0, 1.0], 10_000, 0.60, seed=0) == (0.0, 1.0)
    # 40%: quantiles 0.3 and 0.7 both lie in the mass at 0.5
    assert bootstrap_interval([0.0, 1.0], 10_000, 0.40, seed=0) == (0.5, 0.5)


def test_seeded_and_deterministic():
    values = [0.0, 0.2, 1.0, 1.0, 0.5]
    first = bootstrap_interval(values, 2000, seed=7)
    assert first == bootstrap_interval(values, 2000, seed=7)
    assert first == interval_from_indices(values, resample_indices(5, 2000, 7))
    assert first[0] <= np.mean(values) <= first[1]
    assert bootstrap_interval([0.4] * 6) == pytest.approx((0.4, 0.4))  # no spread, no width


def test_paired_interval_shrinks_when_models_agree():
    a = np.array([1.0] * 10 + [0.0] * 10)
    same = a.copy()
    agree_mostly = a.copy()
    agree_mostly[[0, 10]] = agree_mostly[[10, 0]]  # same mean, disagree on 2 of 20 tasks
    disagree = a[::-1].copy()  # same mean, disagree on all 20
    width = {}
    for name, b in (("same", same), ("mostly", agree_mostly), ("disagree", disagree)):
        low, high = paired_bootstrap_interval(a, b, 5000, seed=0)
        assert low <= 0.0 <= high  # equal means
        width[name] = high - low
    assert width["same"] == 0.0
    assert 0.0 < width["mostly"] < width["disagree"] / 2
    # resampling the two models independently ignores the pairing: as wide as total disagreement
    unpaired = np.subtract(
        *(np.asarray(x)[resample_indices(20, 5000, s)].mean(1) for x, s in ((a, 1), (agree_mostly, 2)))
    )
    assert width["mostly"] < (np.quantile(unpaired, 0.975) - np.quantile(unpaired, 0.025)) / 2


def test_paired_difference_by_hand():
    # differences (a - b) = [1, 0, 0]; with the hand resamples of the first test: means 1, 1/3, 0, 2/3
    indices = np.array([[0, 0, 0], [0, 1, 2], [1, 2, 2], [0, 0, 1]])
    assert interval_from_indices(np.array([1, 1, 0]) - np.array([0, 1, 0]), indices, 0.5) == pytest.approx((0.25, 0.75))
    with pytest.raises(ValueError, match="same tasks"):
        paired_bootstrap_interval([1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval([1.0], confidence=1.0)
