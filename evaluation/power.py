"""How large a paired evaluation must be: problems x samples for a paired interval of a given half-width.

Two models A and B answer the same T problems, m samples each. Per problem i, a_i and b_i are their
sampled pass rates and d_i = a_i - b_i; the paired estimate of the gain is mean(d) and its 95% interval
is about mean(d) +- z * sd(d) / sqrt(T) (the paired bootstrap of `evaluation.bootstrap` gives nearly
the same width once T is in the tens).

sd(d)^2 has two parts, and only one shrinks with more samples per problem:
- within: the sampling noise of a_i and b_i themselves. An unbiased estimate of Var(a_i) = p(1-p)/m is
  a_i(1 - a_i)/(m - 1); W = mean over problems of the sum of both models' terms, at m samples.
- between: how much the true per-problem gain varies over problems, B = sd(d)^2 - W (W capped at sd(d)^2).

At m' samples per problem the variance per problem is B + W * m / m', so the number of problems for a
half-width h is T(m') = (z / h)^2 * (B + W * m / m'). When B dominates, more samples do not help and
only more problems do; when W dominates, samples are as good as problems. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def paired_design(
    a_counts: Sequence[int],
    b_counts: Sequence[int],
    samples: int,
    half_width: float = 0.03,
    sample_options: Sequence[int] = (1, 2, 4, 8, 16),
    z: float = Z95,
) -> dict:
    """The measured spread of per-problem differences and the problems needed for `half_width`.

    a_counts, b_counts: shape (T,), passing samples of each problem out of `samples` for models A and B
    (aligned by problem). Returns sd of d, its within/between parts, the half-width this T gives, and
    for each m' in `sample_options` the problems needed (and problems x m' per model, the samples to draw).
    """
    if len(a_counts) != len(b_counts) or len(a_counts) < 2:
        raise ValueError(f"need the same >= 2 problems for both models, got {len(a_counts)} and {len(b_counts)}")
    if samples < 2:
        raise ValueError("the within-problem variance needs at least 2 samples per problem")
    if not half_width > 0:
        raise ValueError(f"half_width must be > 0, got {half_width}")
    a = np.asarray(a_counts, dtype=np.float64) / samples  # (T,)
    b = np.asarray(b_counts, dtype=np.float64) / samples  # (T,)
    if (a < 0).any() or (a > 1).any() or (b < 0).any() or (b > 1).any():
        raise ValueError(f"counts must lie in [0, {samples}]")
    d = a - b  # (T,)
    variance = float(d.var(ddof=1))
    within = float((a * (1 - a) / (samples - 1) + b * (1 - b) / (samples - 1)).mean())
    # the two parts add up to what was measured: at m' = m the formula gives sd(d)^2 back (a within estimate
    # above the measured variance, noise of the estimate itself, is capped at it)
    within = min(within, variance)
    between = variance - within
    num = len(d)
    needed = {}
    for m in sample_options:
        per_problem = between + within * samples / m
        problems = math.ceil((z / half_width) ** 2 * per_problem)
        needed[str(m)] = {"problems": problems, "samples_per_model": problems * m}
    return {
        "problems": num,
        "samples_per_problem": samples,
        "mean_difference": float(d.mean()),
        "sd_difference": math.sqrt(variance),
        "within_variance": within,
        "between_variance": between,
        "half_width_now": z * math.sqrt(variance / num),
        "target_half_width": half_width,
        "needed": needed,
    }


def pass_counts(outcomes: Iterable[tuple[str, bool]], task_ids: Sequence[str]) -> list[int]:
    """Passing samples per task, in `task_ids` order, from (task_id, passed) pairs (phase 4's sample rows)."""
    counts = dict.fromkeys(task_ids, 0)
    for task_id, passed in outcomes:
        if task_id in counts and passed:
            counts[task_id] += 1
    return [counts[t] for t in task_ids]
