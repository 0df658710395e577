"""Dynamic sampling's merge of a batch's rounds, against values worked out by hand."""

import pytest

from training.rollout_batches import merge_round_metrics


def test_the_rounds_of_a_batch_merge_by_time_by_tokens_and_by_samples_in_first_seen_order():
    rounds = [
        ({"time/rollout_s": 2.0, "tokens_per_s": 10.0, "pass_rate": 0.5}, 4),
        ({"time/rollout_s": 1.0, "tokens_per_s": 40.0, "pass_rate": 0.0, "curriculum/skipped": 1.0}, 4),
    ]
    merged = merge_round_metrics(rounds)
    assert list(merged) == ["time/rollout_s", "tokens_per_s", "pass_rate", "curriculum/skipped"]
    assert merged["time/rollout_s"] == 3.0  # times add up
    assert merged["tokens_per_s"] == pytest.approx((10.0 * 2 + 40.0 * 1) / 3)  # total tokens over total time: 20
    assert merged["pass_rate"] == pytest.approx((0.5 * 4 + 0.0 * 4) / 8)  # weighted by samples: 0.25
    assert merged["curriculum/skipped"] == 1.0  # in one round only: that round's samples weigh it
