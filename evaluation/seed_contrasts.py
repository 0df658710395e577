"""Contrasts between training arms run with several seeds, with intervals that include between-seed variance.

Data: for arm a, seed s and held-out problem i, a per-problem score x_asi (the sampled pass rate c/n, or the
unbiased pass@k from c of n), every run evaluated on the same problems in the same order.

- Run mean y_as = mean_i x_asi. For a contrast (a, b) the per-seed paired difference is
  d_s = mean_i (x_asi - x_bsi) = y_as - y_bs, and the estimate is Delta = mean_s d_s over the seeds both ran.
- Interval (`two_way_fit`, `contrast`): the additive model y_as = mu + alpha_a + beta_s + e_as on the run means,
  e_as independent with variance sigma^2 (seed noise, its interaction with the arm, and evaluation noise,
  together). The seed block beta_s absorbs what arms share within a seed (common random numbers: the same
  first rollouts and evaluation streams). sigma^2 is the residual mean square of the least-squares fit over
  every arm that enters it (pooled over arms), with df = N - rank (balanced: (A - 1)(S - 1)). Under the
  model Var(d_s) = 2 sigma^2, so Delta +- t_df * sqrt(2 sigma^2 / S_ab).
- Cross-check (`two_level_bootstrap`): resample seeds with replacement, then within each drawn seed resample
  problems with replacement, the same problems for both arms (paired); percentile interval of the mean.
  With 3 seeds the seed level has only 10 distinct draws: the bootstrap is coarse and tends to be narrower
  than the t interval; the t interval is the primary one.

Student's t quantile without scipy (`t_quantile`): the closed form of P(|T| <= t) for integer df
(Abramowitz & Stegun 26.7.3-4) inverted by bisection. Pure numpy; knows nothing of models or files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

Scores = Mapping[str, Mapping[int, np.ndarray]]  # arm -> seed -> per-problem scores, shape (T,)


def t_two_sided_cdf(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer `df` >= 1 (A&S 26.7.3 for odd df, 26.7.4 for even)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2 == 1:
        total, term = 0.0, c  # cos + (2/3) cos^3 + (2*4)/(3*5) cos^5 + ... up to cos^(df-2)
        for j in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c * c * (2 * j) / (2 * j + 1)
        return (2 / math.pi) * (theta + s * total) if df > 1 else 2 * theta / math.pi
    total, term = 0.0, 1.0  # 1 + (1/2) cos^2 + (1*3)/(2*4) cos^4 + ... up to cos^(df-2)
    for j in range(1, df // 2 + 1):
        total += term
        term *= c * c * (2 * j - 1) / (2 * j)
    return s * total


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """The t value with P(|T| <= t) = confidence (the two-sided interval's multiplier), integer df >= 1."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    low, high = 0.0, 1.0
    while t_two_sided_cdf(high, df) < confidence:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_two_sided_cdf(mid, df) < confidence else (low, mid)
    return (low + high) / 2


def run_means(scores: Scores) -> dict[str, dict[int, float]]:
    """y_as = mean over problems of each run."""
    return {arm: {seed: float(np.mean(x)) for seed, x in by_seed.items()} for arm, by_seed in scores.items()}


def two_way_fit(means: Mapping[str, Mapping[int, float]]) -> tuple[float, int]:
    """(sigma^2, df) of the additive model y_as = mu + alpha_a + beta_s + e over the cells present.

    Least squares on the design [1, arm dummies, seed dummies]; sigma^2 = residual sum of squares / (N - rank).
    Balanced A x S: df = (A - 1)(S - 1). Returns (nan, 0) when no degree of freedom is left.
    """
    cells = [(arm, seed, y) for arm, by_seed in means.items() for seed, y in by_seed.items()]
    if not cells:
        return math.nan, 0
    arms = sorted({c[0] for c in cells})
    seeds = sorted({c[1] for c in cells})
    design = np.zeros((len(cells), 1 + len(arms) + len(seeds)))
    for row, (arm, seed, _) in enumerate(cells):
        design[row, 0] = 1.0
        design[row, 1 + arms.index(arm)] = 1.0
        design[row, 1 + len(arms) + seeds.index(seed)] = 1.0
    y = np.array([c[2] for c in cells], dtype=np.float64)  # (N,)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    df = len(cells) - int(np.linalg.matrix_rank(design))
    if df <= 0:
        return math.nan, 0
    residual = y - design @ coef
    return float(residual @ residual / df), df


def two_level_bootstrap(
    differences: np.ndarray, num_resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of the mean of `differences` (shape (S, T): seed x problem, x_a - x_b) when seeds are
    resampled with replacement and then problems within each drawn seed (paired: one draw serves both arms)."""
    d = np.asarray(differences, dtype=np.float64)
    num_seeds, num_problems = d.shape
    rng = np.random.default_rng(seed)
    seed_idx = rng.integers(0, num_seeds, size=(num_resamples, num_seeds))  # (B, S)
    problem_idx = rng.integers(0, num_problems, size=(num_resamples, num_seeds, num_problems))  # (B, S, T)
    means = d[seed_idx[:, :, None], problem_idx].mean(axis=(1, 2))  # (B,)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def contrast(
    scores: Scores,
    a: str,
    b: str,
    sigma2: float,
    df: int,
    num_resamples: int = 10_000,
    bootstrap_seed: int = 0,
    confidence: float = 0.95,
) -> dict | None:
    """Delta = mean_s d_s for a - b over their shared seeds, with the two-way model's t interval (sigma2, df from
    `two_way_fit`) and the two-level bootstrap's. None when the two arms share no seed."""
    seeds = sorted(set(scores.get(a, {})) & set(scores.get(b, {})))
    if not seeds:
        return None
    diffs = np.stack([np.asarray(scores[a][s], float) - np.asarray(scores[b][s], float) for s in seeds])  # (S, T)
    per_seed = diffs.mean(axis=1)  # d_s, (S,)
    delta = float(per_seed.mean())
    se = math.sqrt(2 * sigma2 / len(seeds)) if df > 0 else math.nan
    half = t_quantile(df, confidence) * se if df > 0 else math.nan
    return {
        "delta": delta,
        "seeds": seeds,
        "per_seed": [float(v) for v in per_seed],
        "se": se if df > 0 else None,
        "df": df,
        "ci95_two_way": [delta - half, delta + half] if df > 0 else None,
        "ci95_bootstrap": list(two_level_bootstrap(diffs, num_resamples, bootstrap_seed, confidence)),
    }


def arm_summary(means: Mapping[int, float], confidence: float = 0.95) -> dict:
    """An arm's run means: mean, per-seed values, SD over seeds (ddof 1) and a t interval over seeds (df S - 1)."""
    seeds = sorted(means)
    values = np.array([means[s] for s in seeds], dtype=np.float64)
    sd = float(values.std(ddof=1)) if len(values) > 1 else None
    half = t_quantile(len(values) - 1, confidence) * sd / math.sqrt(len(values)) if sd is not None else None
    mean = float(values.mean())
    return {
        "mean": mean,
        "per_seed": {str(s): float(means[s]) for s in seeds},
        "seed_sd": sd,
        "ci95_over_seeds": [mean - half, mean + half] if half is not None else None,
    }


def per_problem(scores: Scores) -> dict[str, list[float]]:
    """Each arm's per-problem score averaged over its seeds, shape (T,) as a list."""
    return {arm: np.mean(np.stack(list(by_seed.values())), axis=0).tolist() for arm, by_seed in scores.items()}


def analyse(
    scores: Scores,
    contrasts: Sequence[tuple[str, str]],
    model_arms: Sequence[str],
    num_resamples: int = 10_000,
    bootstrap_seed: int = 0,
) -> dict:
    """Arms, contrasts and the pooled residual SD for one score. The two-way model is fitted on `model_arms`
    (the trained arms; the base, evaluation noise only, would understate sigma); its sigma serves every
    contrast, including those against an arm outside the fit (conservative for them)."""
    means = run_means(scores)
    sigma2, df = two_way_fit({a: means[a] for a in model_arms if a in means})
    return {
        "arms": {arm: arm_summary(m) for arm, m in means.items()},
        "residual_sd": math.sqrt(sigma2) if df > 0 else None,
        "df": df,
        "contrasts": {
            f"{a} - {b}": result
            for a, b in contrasts
            if (result := contrast(scores, a, b, sigma2, df, num_resamples, bootstrap_seed)) is not None
        },
        "per_problem": per_problem(scores),
    }
