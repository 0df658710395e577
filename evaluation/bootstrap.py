"""Bootstrap confidence intervals over tasks: for a pass@k and for the difference of two models.

The unit of resampling is the task. A benchmark's tasks are a sample from the problems it stands
for, and that sample is the largest source of uncertainty in a pass@k (164 HumanEval problems,
14 fixture tasks): an interval over tasks says how much the number would move on another draw
of tasks of the same kind. Each task enters with its own pass@k estimate from its n samples, so
the sampling noise within a task is carried along in the spread of those estimates.

- `bootstrap_interval(values)`: resample tasks with replacement B times, take the mean of each
  resample, and report the (1 - confidence)/2 and (1 + confidence)/2 quantiles of those means
  (the percentile bootstrap).
- `paired_bootstrap_interval(a, b)`: the same for mean(a - b), where a[i] and b[i] are two models
  on the same task i and every resample takes the *same* tasks for both. When two models agree
  on most tasks their differences are mostly 0 and the interval is narrow; resampling them
  independently would ignore that and give a much wider interval for the same data.

Pure numpy; knows nothing about models, the sandbox or file formats. Deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95


def resample_indices(num_tasks: int, num_resamples: int, seed: int) -> np.ndarray:
    """Task indices of B bootstrap resamples, drawn with replacement; shape (num_resamples, num_tasks)."""
    if num_tasks < 1 or num_resamples < 1:
        raise ValueError(f"need at least one task and one resample, got {num_tasks} tasks, {num_resamples} resamples")
    return np.random.default_rng(seed).integers(0, num_tasks, size=(num_resamples, num_tasks))


def interval_from_indices(
    values: Sequence[float], indices: np.ndarray, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, float]:
    """Percentile interval of the resample means of `values` (shape (T,)) for given indices (shape (B, T)).

    Quantiles use numpy's default linear interpolation between order statistics.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    data = np.asarray(values, dtype=np.float64)  # (T,)
    means = data[indices].mean(axis=1)  # (B,)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def bootstrap_interval(
    values: Sequence[float],
    num_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """95% (by default) percentile-bootstrap interval of mean(values) over tasks; values: shape (T,)."""
    return interval_from_indices(values, resample_indices(len(values), num_resamples, seed), confidence)


def paired_bootstrap_interval(
    a: Sequence[float],
    b: Sequence[float],
    num_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """Interval of mean(a - b) with the same tasks resampled for both; a, b: shape (T,), aligned by task."""
    if len(a) != len(b):
        raise ValueError(f"a paired interval needs the same tasks for both models: {len(a)} vs {len(b)} values")
    differences = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)  # (T,)
    return bootstrap_interval(differences, num_resamples, confidence, seed)  # type: ignore[arg-type]  # (T,) array
