"""training.sampler_guard: the run stops on sampler log-probs that cannot be the policy's."""

from __future__ import annotations

import math

import pytest

from training.sampler_guard import SamplerMismatchError, check_logp_gap, check_sampler_logprobs, nonfinite_count


def test_nonfinite_count_counts_nan_and_infinities_and_skips_samplers_without_log_probs():
    assert nonfinite_count([[-0.5, float("nan")], None, [float("-inf"), -1.0, float("inf")]]) == (3, 5)
    assert nonfinite_count([None, None]) == (0, 0)


def test_a_nan_log_prob_stops_the_run_in_one_line_naming_the_count_and_step():
    check_sampler_logprobs([[-0.1, -2.0], None], step=0)  # finite: nothing
    with pytest.raises(SamplerMismatchError) as stopped:
        check_sampler_logprobs([[-0.1, float("nan")], [-1.0]], step=4)
    message = str(stopped.value)
    assert "1 of 3 sampled tokens at step 5" in message and "\n" not in message


@pytest.mark.parametrize(
    ("gap", "bound", "stops"),
    [
        (0.0, 1.0, False),
        (0.2, 1.0, False),  # one stale step
        (4.49, 1.0, True),  # garbage k rows (the partial fused layer, measured on the CPU engine)
        (4.49, 0.0, False),  # 0: the bound is off
        (math.nan, 0.0, True),  # non-finite stops even with the bound off
        (math.inf, 1.0, True),
    ],
)
def test_the_step_gap_stops_above_the_bound_or_when_not_finite(gap, bound, stops):
    metrics = {"rollout/logp_abs_diff": gap, "loss/total": 0.1}
    if not stops:
        check_logp_gap(metrics, bound, step=0)
        return
    with pytest.raises(SamplerMismatchError, match="rollout/logp_abs_diff") as stopped:
        check_logp_gap(metrics, bound, step=0)
    assert "\n" not in str(stopped.value)


def test_a_step_without_sampler_log_probs_is_not_checked():
    check_logp_gap({"loss/total": 0.1}, 1.0, step=0)
