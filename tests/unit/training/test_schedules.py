"""The schedules against values worked out by hand."""

import pytest

from training.schedules import lr_factor, scheduled_weight


def test_weight_schedules():
    assert scheduled_weight(5, 0.3, 0.0, 10, "constant") == 0.3
    assert scheduled_weight(5, 0.3, 0.0, 10, "linear") == pytest.approx(0.15)
    assert scheduled_weight(5, 0.3, 0.0, 10, "cosine") == pytest.approx(0.15)  # cos(pi/2) = 0: the midpoint
    assert scheduled_weight(0, 0.3, 0.1, 10, "cosine") == pytest.approx(0.3)
    assert scheduled_weight(20, 0.3, 0.1, 10, "linear") == pytest.approx(0.1)  # held at the final value
    with pytest.raises(ValueError, match="valid: constant, linear, cosine"):
        scheduled_weight(1, 1, 0, 5, "exp")


def test_lr_factor_warms_up_then_decays_by_hand():
    # warmup 2 of 6 steps: (step + 1) / 2 for steps 0, 1; then progress (step - 2) / 4 over steps 2..6
    assert [lr_factor(s, 2, 6, "linear") for s in range(7)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert [lr_factor(s, 2, 6, "constant") for s in range(7)] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    cosine = [lr_factor(s, 0, 4, "cosine") for s in range(5)]  # 0.5 * (1 + cos(pi * s / 4))
    assert cosine == pytest.approx([1.0, 0.5 + 0.5 * 2**-0.5, 0.5, 0.5 - 0.5 * 2**-0.5, 0.0])
    assert lr_factor(9, 0, 4, "linear") == 0.0  # past the end: stays at 0
    # min_lr_rate r: the decay ends at r instead of 0, factor = r + (1 - r) * decay (TRL's cosine_with_min_lr)
    floored = [lr_factor(s, 0, 4, "cosine", min_lr_rate=0.2) for s in range(5)]
    assert floored == pytest.approx(
        [1.0, 0.2 + 0.8 * (0.5 + 0.5 * 2**-0.5), 0.6, 0.2 + 0.8 * (0.5 - 0.5 * 2**-0.5), 0.2]
    )
    assert [lr_factor(s, 0, 4, "linear", min_lr_rate=0.2) for s in range(5)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])
    assert lr_factor(0, 2, 6, "linear", min_lr_rate=0.2) == 0.5  # the warmup still starts from 0
