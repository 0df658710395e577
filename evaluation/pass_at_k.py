"""Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").

For a task with n samples of which c are correct, the probability that at least one of k samples
drawn without replacement is correct is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

The product form avoids the huge binomials (n = 200 overflows float64 in C(n, k) for moderate k).
Pure numpy; knows nothing about models or the sandbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def estimate_pass_at_k(num_samples: int | Sequence[int], num_correct: Sequence[int], k: int) -> np.ndarray:
    """Per-task pass@k. num_samples: an int for all tasks or one per task; shape (num_tasks,).

    Raises ValueError if some task has fewer than k samples (the estimator is undefined there),
    or if c > n or k < 1.
    """
    correct = np.asarray(num_correct, dtype=np.int64)
    samples = (
        np.full_like(correct, num_samples) if np.isscalar(num_samples) else np.asarray(num_samples, dtype=np.int64)
    )
    if samples.shape != correct.shape:
        raise ValueError(f"num_samples has shape {samples.shape}, num_correct {correct.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if (correct < 0).any() or (correct > samples).any():
        raise ValueError("need 0 <= num_correct <= num_samples for every task")
    if (samples < k).any():
        raise ValueError(f"pass@{k} needs at least {k} samples per task; the smallest task has {samples.min()}")

    def one(n: int, c: int) -> float:
        if n - c < k:  # every k-subset contains a correct sample
            return 1.0
        return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))

    return np.array([one(int(n), int(c)) for n, c in zip(samples, correct, strict=True)], dtype=np.float64)


def pass_at_k_table(
    num_samples: Sequence[int], num_correct: Sequence[int], ks: Iterable[int]
) -> dict[int, float | None]:
    """Mean pass@k over tasks for each k; None where some task has fewer than k samples."""
    out: dict[int, float | None] = {}
    for k in ks:
        if len(num_correct) == 0 or min(num_samples) < k:
            out[k] = None
        else:
            out[k] = float(estimate_pass_at_k(list(num_samples), num_correct, k).mean())
    return out
