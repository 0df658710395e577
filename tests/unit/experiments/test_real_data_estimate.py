"""How long the real-data experiment has left on 2 CPU cores (experiments/real_data/design.py), against hand-computed
values at the design's rates: evaluation 664 tasks x 4 samples x 2.0 s = 5,312 s; the pre-pass 3 budget tries x 90
validation tasks x 8 x 2.0 s + the 374 training tasks x 8 x 2.0 s at the chosen budget = 4,320 + 5,984 = 10,304 s; a
pool re-selection 374 x 8 x 2.0 s = 5,984 s; SFT 47 x 15 s = 705 s."""

from __future__ import annotations

import pytest

from experiments.real_data import design as real
from experiments.teacher_guidance.run import plan_runs


@pytest.mark.parametrize(
    ("arm", "sft_done", "seconds"),
    [
        ("base", False, 5312),
        ("tsft", False, 5312 + 705),
        ("grpo", False, 5312 + 79 * 41),
        ("sft_grpo", True, 5312 + 705 * 0 + 5984 + 32 * 41),  # E made its SFT stage
        ("sft_grpo", False, 5312 + 705 + 5984 + 32 * 41),
        ("format", False, 5312 + 705 + 5984 + 32 * 41),
        ("guided", False, 5312 + 79 * 84),
    ],
)
def test_one_runs_hours(arm: str, sft_done: bool, seconds: float) -> None:
    assert real.run_hours(arm, sft_done=sft_done) == pytest.approx(seconds / 3600)


def test_the_remainder_counts_the_runs_not_landed_and_the_pre_pass_until_it_is_stored() -> None:
    required = plan_runs([1, 2, 3], ["grpo", "sft_grpo", "format"])
    per_seed = 5312 + (5312 + 79 * 41) + 2 * (5312 + 705 + 5984 + 32 * 41)
    assert real.remaining_hours(set(), required, prepass_done=False) == pytest.approx((10304 + 3 * per_seed) / 3600)
    assert real.remaining_hours(set(), required, prepass_done=False) == pytest.approx(36.6, abs=0.05)  # the docstring
    done = {("base", 1), ("grpo", 1), ("sft_grpo", 1), ("format", 1), ("base", 2)}
    left = real.remaining_hours(done, required, prepass_done=True)
    assert left == pytest.approx((per_seed - 5312 + per_seed) / 3600)
    # every arm: B follows E in each seed and reuses its SFT stage
    everything = plan_runs([1, 2, 3], list(real.DEFAULT_ARMS))
    per_seed_all = per_seed + (5312 + 705) - 705 + (5312 + 79 * 84)
    assert real.remaining_hours(set(), everything, prepass_done=False) == pytest.approx(
        (10304 + 3 * per_seed_all) / 3600
    )
    assert real.remaining_hours(set(), everything, prepass_done=False) == pytest.approx(51.0, abs=0.05)
