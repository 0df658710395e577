"""The seeded ablation's statistics (evaluation/seed_contrasts.py) against numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.seed_contrasts import (
    analyse,
    arm_summary,
    contrast,
    t_quantile,
    t_two_sided_cdf,
    two_level_bootstrap,
    two_way_fit,
)


@pytest.mark.parametrize(
    ("df", "table"),  # two-sided 95% points of Student's t, from any printed table
    [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (8, 2.306), (12, 2.179), (16, 2.120), (30, 2.042)],
)
def test_t_quantile_matches_the_printed_table(df, table):
    assert t_quantile(df) == pytest.approx(table, abs=5e-4)


def test_t_cdf_closed_forms_for_one_and_two_degrees_of_freedom():
    # df 1 is Cauchy: P(|T| <= 1) = 2 atan(1) / pi = 0.5; df 2: P(|T| <= t) = t / sqrt(2 + t^2)
    assert t_two_sided_cdf(1.0, 1) == pytest.approx(0.5)
    assert t_two_sided_cdf(3.0, 2) == pytest.approx(3 / math.sqrt(11))
    assert t_quantile(1, 0.5) == pytest.approx(1.0)


def toy():
    """2 arms x 3 seeds, one problem each, so the run means are the values themselves."""
    a = {1: np.array([0.3]), 2: np.array([0.5]), 3: np.array([0.4])}
    b = {1: np.array([0.2]), 2: np.array([0.3]), 3: np.array([0.4])}
    return {"a": a, "b": b}


def test_two_way_model_on_a_two_by_three_toy_by_hand():
    # d_s = 0.1, 0.2, 0.0 -> Delta = 0.1. Residuals of y = mu + arm + seed with 2 arms are +-(d_s - mean d)/2:
    # SS_res = 2 * ((0)^2 + (0.05)^2 + (0.05)^2) = 0.01 on df (2 - 1)(3 - 1) = 2, sigma^2 = 0.005.
    # SE(Delta) = sqrt(2 * 0.005 / 3) = 0.057735; t_2 = 4.302653; half-width 0.248414.
    sigma2, df = two_way_fit({"a": {1: 0.3, 2: 0.5, 3: 0.4}, "b": {1: 0.2, 2: 0.3, 3: 0.4}})
    assert df == 2
    assert sigma2 == pytest.approx(0.005)
    c = contrast(toy(), "a", "b", sigma2, df, num_resamples=2000, bootstrap_seed=1)
    assert c["delta"] == pytest.approx(0.1)
    assert c["per_seed"] == pytest.approx([0.1, 0.2, 0.0])
    assert c["se"] == pytest.approx(math.sqrt(0.01 / 3))
    assert c["ci95_two_way"] == pytest.approx([0.1 - 0.248414, 0.1 + 0.248414], abs=1e-5)
    # with 2 arms the two-way interval is the paired t interval over seeds: sd(d) = 0.1, 0.1 / sqrt(3) * t_2
    assert c["ci95_two_way"][1] - 0.1 == pytest.approx(0.1 / math.sqrt(3) * t_quantile(2))


def test_least_squares_fit_equals_the_balanced_formula():
    # balanced A x S: SS_res = sum (y - row mean - column mean + grand mean)^2 on (A - 1)(S - 1) df
    y = np.random.default_rng(3).normal(size=(5, 3))
    resid = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    sigma2, df = two_way_fit({f"arm{a}": {s: float(y[a, s]) for s in range(3)} for a in range(5)})
    assert df == 8
    assert sigma2 == pytest.approx(float((resid**2).sum()) / 8)


def test_an_unbalanced_fit_counts_its_degrees_of_freedom():
    # 2 arms x 3 seeds + 1 arm with seeds 1, 2: N = 8 cells, rank 1 + 2 + 2 = 5 -> df 3
    means = {"a": {1: 0.1, 2: 0.2, 3: 0.3}, "b": {1: 0.2, 2: 0.2, 3: 0.1}, "c": {1: 0.0, 2: 0.4}}
    assert two_way_fit(means)[1] == 3


def test_no_interval_without_degrees_of_freedom():
    sigma2, df = two_way_fit({"a": {1: 0.3}, "b": {1: 0.1}})
    assert df == 0 and math.isnan(sigma2)
    c = contrast({"a": {1: np.array([0.3])}, "b": {1: np.array([0.1])}}, "a", "b", sigma2, df, num_resamples=100)
    assert c["delta"] == pytest.approx(0.2) and c["ci95_two_way"] is None and c["se"] is None


def test_arms_without_a_shared_seed_have_no_contrast():
    assert contrast({"a": {1: np.zeros(2)}, "b": {2: np.zeros(2)}}, "a", "b", 0.1, 2) is None


def test_two_level_bootstrap_is_reproducible_and_covers_the_truth_in_an_easy_case():
    rng = np.random.default_rng(0)
    d = 0.1 + rng.normal(0, 0.02, size=(5, 1)) + rng.normal(0, 0.2, size=(5, 60))  # seed x problem
    first = two_level_bootstrap(d, 4000, seed=7)
    assert first == two_level_bootstrap(d, 4000, seed=7)
    assert first[0] < 0.1 < first[1]
    assert first[1] - first[0] < 0.2


def test_two_level_bootstrap_of_constant_differences_is_a_point():
    assert two_level_bootstrap(np.full((3, 4), 0.25), 500) == pytest.approx((0.25, 0.25))


def test_arm_summary_by_hand():
    # values 0.3, 0.5, 0.4: mean 0.4, sd 0.1, half-width t_2 * 0.1 / sqrt(3)
    s = arm_summary({1: 0.3, 2: 0.5, 3: 0.4})
    assert s["mean"] == pytest.approx(0.4) and s["seed_sd"] == pytest.approx(0.1)
    assert s["ci95_over_seeds"][1] == pytest.approx(0.4 + t_quantile(2) * 0.1 / math.sqrt(3))
    assert arm_summary({1: 0.2})["seed_sd"] is None


def test_analyse_pools_sigma_over_the_model_arms_only():
    scores = {**toy(), "base": {1: np.array([0.0]), 2: np.array([0.0]), 3: np.array([0.9])}}
    out = analyse(scores, [("a", "b"), ("a", "base")], ["a", "b"], num_resamples=200)
    assert out["df"] == 2 and out["residual_sd"] == pytest.approx(math.sqrt(0.005))
    # the base contrast uses the trained arms' sigma: the same half-width as a - b
    ab, abase = out["contrasts"]["a - b"], out["contrasts"]["a - base"]
    assert abase["delta"] == pytest.approx(0.1)
    assert abase["ci95_two_way"][1] - abase["delta"] == pytest.approx(ab["ci95_two_way"][1] - ab["delta"])
    assert out["per_problem"]["a"] == pytest.approx([0.4])


def test_the_two_level_bootstrap_resamples_tasks_crossed_with_seeds():
    # identical seeds, varying tasks: the seed level adds nothing, so the interval must be the task-level
    # bootstrap's (a nested draw per seed divides the task variance by the number of seeds)
    row = np.random.default_rng(5).normal(0.05, 0.2, size=35)
    d = np.tile(row, (3, 1))  # (S, T)
    rng = np.random.default_rng(9)
    task_means = row[rng.integers(0, 35, size=(4000, 35))].mean(axis=1)
    task_width = float(np.diff(np.quantile(task_means, [0.025, 0.975]))[0])
    low, high = two_level_bootstrap(d, 4000, seed=2)
    assert high - low == pytest.approx(task_width, rel=0.1)


def test_the_crossed_bootstrap_by_hand_on_a_toy():
    # 2 seeds x 2 tasks, d = [[0, 1], [2, 3]]; one replicate draws seeds (s_a, s_b) and tasks (t_a, t_b) shared by
    # both seeds: mean = (d[s_a, t_a] + d[s_a, t_b] + d[s_b, t_a] + d[s_b, t_b]) / 4 = mean_s(2 s) + mean_t(t)
    # (d = 2 s + t). Seed part in {0, 1, 2} w.p. 1/4, 1/2, 1/4; task part in {0, 0.5, 1} likewise. The mean's
    # support is {0, .5, ..., 3}; a nested draw (per-seed task draws) would also reach the quarter points.
    d = np.array([[0.0, 1.0], [2.0, 3.0]])
    from evaluation.seed_contrasts import crossed_bootstrap_means

    means = crossed_bootstrap_means(d, 20_000, seed=0)
    assert set(np.unique(means)) <= {0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0}
    # P(mean = 0) = P(seed part 0) P(task part 0) = 1/4 * 1/4
    assert float(np.mean(means == 0.0)) == pytest.approx(1 / 16, abs=0.01)
    assert float(means.mean()) == pytest.approx(1.5, abs=0.01)


def test_the_crossed_bootstrap_covers_a_simulated_crossed_design():
    # 3 seeds x 35 tasks, d_si = u_i + b_s + e_si with task effects u (SD 0.13, drawn anew for each experiment),
    # seed effects b (SD 0.01), evaluation noise e (SD 0.06); the target is the mean over tasks, 0. A 95% interval
    # must cover it about 95% of the time; a nested draw (tasks per seed) covers ~0.8 here.
    rng = np.random.default_rng(11)
    covered, reps = 0, 300
    for r in range(reps):
        d = rng.normal(0, 0.13, size=(1, 35)) + rng.normal(0, 0.01, size=(3, 1)) + rng.normal(0, 0.06, size=(3, 35))
        low, high = two_level_bootstrap(d, 400, seed=r)
        covered += low <= 0.0 <= high
    assert 0.89 <= covered / reps <= 0.99


def test_the_paired_t_interval_by_hand():
    from evaluation.seed_contrasts import paired_t

    # d_s = 0.1, 0.2, 0.0: mean 0.1, sd 0.1, se 0.1 / sqrt(3) = 0.057735, t_2 = 4.302653 -> half 0.248414
    out = paired_t([0.1, 0.2, 0.0])
    assert out["delta"] == pytest.approx(0.1) and out["df"] == 2
    assert out["sd"] == pytest.approx(0.1) and out["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert out["ci95"] == pytest.approx([0.1 - 0.248414, 0.1 + 0.248414], abs=1e-5)
    assert paired_t([0.3])["ci95"] is None  # one seed: no interval


def test_one_unstable_arm_does_not_widen_a_contrast_between_two_other_arms():
    # arms a, b stable (seed SD ~0.01), arm c 10x that; the primary interval of a - b must not depend on c
    rng = np.random.default_rng(4)
    seeds = range(1, 5)

    def arm(mean, sd):
        return {s: np.full(10, mean + rng.normal(0, sd)) for s in seeds}

    scores = {"a": arm(0.4, 0.01), "b": arm(0.3, 0.01)}
    without = analyse(scores, [("a", "b")], ["a", "b"], num_resamples=200)["contrasts"]["a - b"]
    scores["c"] = arm(0.3, 0.1)
    with_c = analyse(scores, [("a", "b")], ["a", "b", "c"], num_resamples=200)
    inner = with_c["contrasts"]["a - b"]

    def width(c):
        return c["ci95"][1] - c["ci95"][0]

    assert width(inner) <= 1.5 * width(without)
    # the pooled two-way model, secondary, shows the inflation and reports why: the seed-SD ratio
    assert with_c["seed_sd_ratio"] > 5


def test_the_task_term_by_hand():
    from evaluation.seed_contrasts import task_term

    # d = [[0.1, 0.3], [0.3, 0.5]]: seed means 0.2, 0.4 -> SE^2 0.02 / 2 = 0.01; problem means 0.2, 0.4 -> 0.01;
    # total 0.02, Satterthwaite df 0.02^2 / (0.01^2 / 1 + 0.01^2 / 1) = 2; half = t_2 * sqrt(0.02)
    out = task_term(np.array([[0.1, 0.3], [0.3, 0.5]]))
    assert out["task_se"] == pytest.approx(0.1) and out["se"] == pytest.approx(math.sqrt(0.02)) and out["df"] == 2
    assert out["ci95"] == pytest.approx([0.3 - t_quantile(2) * math.sqrt(0.02), 0.3 + t_quantile(2) * math.sqrt(0.02)])
