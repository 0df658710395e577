"""Schedules over optimizer steps, as pure functions: the learning-rate multiplier and the SFT terms' weights.

Both are functions of the step alone, so a resumed run recomputes them from its step count.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def scheduled_weight(step: int, initial: float, final: float, decay_steps: int, kind: str = "constant") -> float:
    """A loss weight at `step`: constant, or a linear/cosine decay from initial to final over decay_steps."""
    if kind == "constant" or decay_steps <= 0:
        if kind not in SCHEDULES:
            raise ValueError(f"unknown schedule {kind!r}; valid: {', '.join(SCHEDULES)}")
        return initial
    progress = min(max(step / decay_steps, 0.0), 1.0)
    if kind == "linear":
        return initial + (final - initial) * progress
    if kind == "cosine":
        return final + (initial - final) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {kind!r}; valid: {', '.join(SCHEDULES)}")


def lr_factor(
    step: int, warmup_steps: int, total_steps: int, kind: str = "cosine", *, min_lr_rate: float = 0.0
) -> float:
    """The learning-rate multiplier at optimizer step `step` (0-based): a linear warmup over `warmup_steps`
    ((step + 1) / warmup_steps), then constant, or a linear/cosine decay over the remaining steps that ends at
    `min_lr_rate`: min_lr_rate + (1 - min_lr_rate) * decay, TRL's cosine_with_min_lr formula (0: decay to 0)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    decay = 1.0 - progress if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_rate + (1.0 - min_lr_rate) * decay
