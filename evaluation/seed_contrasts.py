"""Contrasts between training arms run with several seeds, with intervals that include between-seed variance.

Data: for arm a, seed s and held-out problem i, a per-problem score x_asi (the sampled pass rate c/n, or the
unbiased pass@k from c of n), every run evaluated on the same problems in the same order.

- Run mean y_as = mean_i x_asi. For a contrast (a, b) the per-seed paired difference is
  d_s = mean_i (x_asi - x_bsi) = y_as - y_bs, and the estimate is Delta = mean_s d_s over the seeds both ran.
- Primary interval (`paired_t`): the per-contrast paired t over seeds, Delta +- t_{S-1} * sd(d_s) / sqrt(S).
  It needs no assumption about any other arm: one unstable arm cannot widen a contrast it is not in.
  Conditional on these problems (the same ones in every run).
- Task term (`task_term`): for a claim over problems like these, the per-problem SD of the seed-averaged
  difference over sqrt(T) is added to the seed SE (seed + task SE, Satterthwaite df); reported beside.
- Secondary (`two_way_fit`, `contrast`): the additive model y_as = mu + alpha_a + beta_s + e_as on the run
  means, e_as independent with one variance sigma^2 pooled over every arm in the fit (df = N - rank; balanced
  (A - 1)(S - 1)); Delta +- t_df * sqrt(2 sigma^2 / S_ab). The equal-variance assumption is checked by the
  ratio of the largest to the smallest seed SD among the fitted arms (`seed_sd_ratio`): one heteroscedastic
  arm sets sigma for every contrast, so a large ratio says to read the paired t instead.
- Secondary (`two_level_bootstrap`): the design is crossed (every seed runs the same problems), so one
  replicate draws S seeds with replacement and one set of T problems with replacement *shared by all drawn
  seeds* (the task effect common to the seeds stays common); percentile interval of the mean. With 3 seeds
  the seed level has only 10 distinct draws and under-states the seed variance: the paired t is primary.

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


def crossed_bootstrap_means(differences: np.ndarray, num_resamples: int = 10_000, seed: int = 0) -> np.ndarray:
    """The bootstrap distribution of the mean of `differences` (shape (S, T): seed x problem, x_a - x_b) on a
    crossed design: per replicate S seeds drawn with replacement and one draw of T problems shared by them
    (paired: one draw serves both arms). Shape (B,)."""
    d = np.asarray(differences, dtype=np.float64)
    num_seeds, num_problems = d.shape
    rng = np.random.default_rng(seed)
    seed_idx = rng.integers(0, num_seeds, size=(num_resamples, num_seeds))  # (B, S)
    problem_idx = rng.integers(0, num_problems, size=(num_resamples, num_problems))  # (B, T), shared by the seeds
    return d[seed_idx[:, :, None], problem_idx[:, None, :]].mean(axis=(1, 2))  # (B,)


def two_level_bootstrap(
    differences: np.ndarray, num_resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of `crossed_bootstrap_means` (seeds and problems resampled, problems crossed with
    seeds)."""
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(crossed_bootstrap_means(differences, num_resamples, seed), [tail, 1.0 - tail])
    return float(low), float(high)


def paired_t(per_seed: Sequence[float], confidence: float = 0.95) -> dict:
    """The paired t interval over seeds of per-seed differences d_s: mean +- t_{S-1} sd / sqrt(S) (None with
    one seed)."""
    d = np.asarray(per_seed, dtype=np.float64)  # (S,)
    delta = float(d.mean())
    if len(d) < 2:
        return {"delta": delta, "sd": None, "se": None, "df": 0, "ci95": None}
    sd = float(d.std(ddof=1))
    se = sd / math.sqrt(len(d))
    half = t_quantile(len(d) - 1, confidence) * se
    return {"delta": delta, "sd": sd, "se": se, "df": len(d) - 1, "ci95": [delta - half, delta + half]}


def task_term(differences: np.ndarray, confidence: float = 0.95) -> dict | None:
    """Seed + task SE of the mean difference (shape (S, T)): the seed SE of the paired t and the per-problem SD of
    the seed-averaged difference over sqrt(T) (it also holds evaluation noise: conservative), combined with a
    Satterthwaite df rounded down. None without two seeds and two problems."""
    d = np.asarray(differences, dtype=np.float64)
    num_seeds, num_problems = d.shape
    if num_seeds < 2 or num_problems < 2:
        return None
    seed_var = float(d.mean(axis=1).var(ddof=1)) / num_seeds  # SE^2 over seeds
    task_var = float(d.mean(axis=0).var(ddof=1)) / num_problems  # SE^2 over problems
    total = seed_var + task_var
    delta = float(d.mean())
    if total == 0.0:
        return {"task_se": 0.0, "se": 0.0, "df": num_seeds - 1, "ci95": [delta, delta]}
    df_float = total**2 / (seed_var**2 / (num_seeds - 1) + task_var**2 / (num_problems - 1))
    df = max(1, int(df_float))
    half = t_quantile(df, confidence) * math.sqrt(total)
    return {"task_se": math.sqrt(task_var), "se": math.sqrt(total), "df": df, "ci95": [delta - half, delta + half]}


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
    """Delta = mean_s d_s for a - b over their shared seeds: the paired t interval (`ci95`, primary), the task term
    beside it, and the secondary ones: the two-way model's t interval (sigma2, df from `two_way_fit`) and the
    crossed bootstrap's. None when the two arms share no seed."""
    seeds = sorted(set(scores.get(a, {})) & set(scores.get(b, {})))
    if not seeds:
        return None
    diffs = np.stack([np.asarray(scores[a][s], float) - np.asarray(scores[b][s], float) for s in seeds])  # (S, T)
    per_seed = diffs.mean(axis=1)  # d_s, (S,)
    primary = paired_t(per_seed.tolist(), confidence)
    delta = primary["delta"]
    se = math.sqrt(2 * sigma2 / len(seeds)) if df > 0 else math.nan
    half = t_quantile(df, confidence) * se if df > 0 else math.nan
    return {
        "delta": delta,
        "seeds": seeds,
        "per_seed": [float(v) for v in per_seed],
        "ci95": primary["ci95"],
        "paired_sd": primary["sd"],
        "paired_df": primary["df"],
        "task_term": task_term(diffs, confidence),
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


def seed_sd_ratio(means: Mapping[str, Mapping[int, float]]) -> float | None:
    """Largest over smallest seed SD among the arms with >= 2 seeds: the two-way model's equal-variance check
    (inf when the smallest is 0; None with fewer than two such arms)."""
    sds = [float(np.std(list(m.values()), ddof=1)) for m in means.values() if len(m) >= 2]
    if len(sds) < 2:
        return None
    return max(sds) / min(sds) if min(sds) > 0 else math.inf


def analyse(
    scores: Scores,
    contrasts: Sequence[tuple[str, str]],
    model_arms: Sequence[str],
    num_resamples: int = 10_000,
    bootstrap_seed: int = 0,
) -> dict:
    """Arms and contrasts for one score. Each contrast's primary interval is its own paired t over seeds. The
    secondary two-way model is fitted on `model_arms` (the trained arms; the base, evaluation noise only, would
    understate sigma), with its equal-variance check (`seed_sd_ratio`); its sigma serves every contrast."""
    means = run_means(scores)
    fitted = {a: means[a] for a in model_arms if a in means}
    sigma2, df = two_way_fit(fitted)
    return {
        "arms": {arm: arm_summary(m) for arm, m in means.items()},
        "residual_sd": math.sqrt(sigma2) if df > 0 else None,
        "df": df,
        "seed_sd_ratio": seed_sd_ratio(fitted),
        "contrasts": {
            f"{a} - {b}": result
            for a, b in contrasts
            if (result := contrast(scores, a, b, sigma2, df, num_resamples, bootstrap_seed)) is not None
        },
        "per_problem": per_problem(scores),
    }
