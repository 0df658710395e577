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


def test_the_sizing_script_reads_a_phase4_baseline_file(tmp_path):
    import sys

    from evaluation.evaluate import EvalSample, write_samples
    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import power_from_samples

    def row(model, task, idx, passed):
        return EvalSample(
            task, "mbpp", "basic", idx, "", 1, "stop", "", None, False, False, False, passed, "x", 0, 1, 0.0, None,
            model=model,
        )  # fmt: skip

    passes = {("trained", "a"): 2, ("trained", "b"): 0, ("trained", "c"): 4, ("baseline", "c"): 2}
    rows = [
        row(model, task, i, i < passes.get((model, task), 0))
        for model in ("trained", "baseline")
        for task in ("a", "b", "c")
        for i in range(4)
    ]
    path = tmp_path / "eval_samples.jsonl"
    write_samples(path, rows)
    design = power_from_samples.main([str(path), "--output", str(tmp_path / "power.json")])
    assert design == paired_design([2, 0, 4], [0, 0, 2], 4, 0.03) | {
        "a_pass_rate": 0.5,
        "b_pass_rate": 2 / 12,
        "files": [str(path)],
    }
    write_samples(tmp_path / "short.jsonl", rows[:3])
    with pytest.raises(SystemExit, match="trained and baseline"):
        power_from_samples.main([str(tmp_path / "short.jsonl")])
