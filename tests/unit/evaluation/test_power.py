"""evaluation.power: the spread of paired per-problem differences and the size it implies, by hand."""

from __future__ import annotations

import math

import pytest

from evaluation.power import Z95, paired_design, pass_counts


def test_paired_design_against_hand_computed_values():
    # a = [.5, 0, 1], b = [0, 0, .5]: d = [.5, 0, .5], mean 1/3, sample variance 1/12
    # within: a(1-a)/3 + b(1-b)/3 = [1/12, 0, 1/12], mean 1/18; between = 1/12 - 1/18 = 1/36
    design = paired_design([2, 0, 4], [0, 0, 2], samples=4, half_width=0.03, sample_options=(1, 4, 8))
    assert design["mean_difference"] == pytest.approx(1 / 3)
    assert design["sd_difference"] == pytest.approx(math.sqrt(1 / 12))
    assert design["within_variance"] == pytest.approx(1 / 18)
    assert design["between_variance"] == pytest.approx(1 / 36)
    assert design["half_width_now"] == pytest.approx(Z95 * math.sqrt(1 / 12 / 3))
    scale = (Z95 / 0.03) ** 2
    assert design["needed"]["4"]["problems"] == math.ceil(scale * (1 / 36 + 1 / 18))  # m' = m: sd(d)^2 itself
    assert design["needed"]["1"]["problems"] == math.ceil(scale * (1 / 36 + 4 / 18))  # 4x the within part
    assert design["needed"]["8"]["problems"] == math.ceil(scale * (1 / 36 + 1 / 36))
    assert design["needed"]["8"]["samples_per_model"] == 8 * design["needed"]["8"]["problems"]


def test_identical_models_need_no_problems_and_bad_input_is_refused():
    same = paired_design([1, 2, 3], [1, 2, 3], samples=4)
    assert same["sd_difference"] == 0 and same["needed"]["4"]["problems"] == 0
    with pytest.raises(ValueError, match="same >= 2 problems"):
        paired_design([1], [1], 4)
    with pytest.raises(ValueError, match="at least 2 samples"):
        paired_design([1, 0], [0, 1], 1)
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        paired_design([5, 0], [0, 1], 4)


def test_pass_counts_follow_the_task_order():
    pairs = [("b", True), ("a", False), ("b", True), ("a", True), ("z", True)]
    assert pass_counts(pairs, ["a", "b", "c"]) == [1, 2, 0]
