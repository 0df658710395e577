"""The math of the combined objective, as pure tensor functions (no configs, no models).

    L = w_grpo * L_grpo + beta * L_kl + w_opd * L_opd + w_teacher(step) * L_teacher_sft + w_self(step) * L_self_sft

Shapes: P prompts, G samples per prompt, B = P * G sequences, T completion tokens, V vocabulary.
Functions return `(value, metrics)` where metrics are floats under namespaced keys.

Conventions pinned here (and tested in tests/unit/training/test_losses.py):
- Advantages (DeepSeekMath GRPO, arXiv:2402.03300): A = (r - mean_g) / (std_g + eps) with the
  Bessel-corrected std of the group (as TRL computes it) over the correctness reward only; the small
  format bonus is added centred but unscaled. `scale=False` gives the mean-only advantage of Dr. GRPO
  (arXiv:2503.20783). Unscorable samples (reward NaN) get A = 0 and are excluded from their group's
  mean/std; a group whose valid rewards are all equal (to 1e-6) gets A = 0 exactly.
- Ratio r_t = exp(logp_t - old_logp_t); surrogate -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
  (PPO; eps_high > eps_low is DAPO's clip-higher, arXiv:2503.14476).
- KL: its own term, beta x the token mean of the k3 estimator exp(ref - logp) - (ref - logp) - 1 >= 0
  (Schulman), bounded per token as verl's low_var_kl (log-ratio clamped to +-20, value to [-10, 10]); its value
  estimates KL(policy || ref), its expected gradient as a loss is that of KL(ref || policy). It is not part of
  the GRPO term, so `grpo_weight` does not scale it.
- On-policy distillation (OPD; Agarwal et al. arXiv:2306.13649, Qwen3 report arXiv:2505.09388): the teacher
  scores the student's own sample and each token gets the advantage a_t = teacher_logp_t - student_logp_t
  (a one-sample estimate of -KL(student || teacher) at that token, optionally clipped), trained with the same
  surrogate, mask and aggregation as GRPO. At ratio 1 (mu = 1) w_grpo * L_grpo + w_opd * L_opd has the
  gradient of one surrogate with the per-token advantage w_grpo * A_seq + w_opd * a_t.
- Aggregation (one function, four modes): token-mean (DAPO), seq-mean-token-mean (original GRPO),
  seq-mean-token-sum-norm (Dr. GRPO: token sums divided by a constant length), micro-token-mean (TRL's
  bnpo). The trainer normalizes the first three over the whole optimizer step (`step_denominator`).
"""

from __future__ import annotations

import typing

import torch

IGNORE_INDEX = -100
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "micro-token-mean")
# Modes whose normalizer covers the whole optimizer step (every micro-batch of every rank); the
# remaining one, micro-token-mean, normalizes each micro-batch on its own (TRL's "bnpo").
STEP_AGGREGATIONS = AGGREGATIONS[:3]


# Rewards are sums of floats (fraction 1/3, format bonus 0.05, ...): equal rewards can differ in the
# last bit, and a group of them must still count as having no spread.
ZERO_SPREAD_TOL = 1e-6


def _centered_and_std(values: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values, valid: (P, G). Centered values (0 where invalid) and the Bessel std (P, 1) over valid entries."""
    v = torch.where(valid, values, torch.zeros_like(values))
    count = valid.sum(dim=1, keepdim=True).clamp(min=1)  # (P, 1)
    mean = v.sum(dim=1, keepdim=True) / count
    centered = torch.where(valid, v - mean, torch.zeros_like(v))
    var = (centered**2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)  # Bessel
    return centered, var.sqrt()


def group_has_spread(rewards: torch.Tensor) -> torch.Tensor:
    """rewards: (P, G), NaN = unscorable. (P,) bool: the group has at least two valid rewards whose Bessel std
    reaches ZERO_SPREAD_TOL, i.e. `group_advantages` gives it a nonzero correctness part."""
    valid = ~torch.isnan(rewards)
    _, std = _centered_and_std(rewards, valid)
    return (std.squeeze(1) >= ZERO_SPREAD_TOL) & (valid.sum(dim=1) >= 2)


def group_advantages(
    rewards: torch.Tensor, scale: bool = True, eps: float = 1e-4, bonus: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict]:
    """rewards: (P, G) correctness rewards, NaN = unscorable; bonus: (P, G) weighted shaping rewards
    (the format bonus) or None. Returns advantages (P, G) and metrics.

    A = z-score of the correctness within its group (or the mean-only centering when scale=False)
        + the bonus centred within its group, never divided by a std.
    The bonus is kept out of the z-score on purpose: normalized, an all-fail group that differs only
    in format (bonus 0.1, 0.05, 0.1, 0) would get advantages of +-1, as strong as a pass/fail split.
    Unnormalized it moves the advantage by at most the bonus weight. With scale=False the sum is the
    plain centred total reward, as before. A group's correctness (or bonus) spread below
    ZERO_SPREAD_TOL counts as none: its part of the advantage is exactly 0.

    metrics: reward/mean, reward/std (of correctness + bonus over valid samples), frac_reward_zero_std
    (share of groups with no learning signal: no spread in either part, or fewer than two valid
    rewards), frac_format_only_spread (groups whose only spread is the bonus), frac_unscorable.
    """
    valid = ~torch.isnan(rewards)  # (P, G)
    too_few = valid.sum(dim=1) < 2  # (P,)
    centered, std = _centered_and_std(rewards, valid)
    flat = ~group_has_spread(rewards)  # (P,)
    advantages = centered / (std + eps) if scale else centered
    advantages = torch.where(valid & ~flat.unsqueeze(1), advantages, torch.zeros_like(advantages))
    total = rewards
    bonus_flat = torch.ones_like(flat)
    if bonus is not None:
        bonus_centered, bonus_std = _centered_and_std(bonus, valid)
        bonus_flat = (bonus_std.squeeze(1) < ZERO_SPREAD_TOL) | too_few
        advantages = advantages + torch.where(
            valid & ~bonus_flat.unsqueeze(1), bonus_centered, torch.zeros_like(bonus_centered)
        )
        total = rewards + bonus
    no_signal = flat & bonus_flat
    valid_rewards = total[valid]
    groups = max(rewards.shape[0], 1)
    metrics = {
        "reward/mean": float(valid_rewards.mean()) if valid_rewards.numel() else 0.0,
        "reward/std": float(valid_rewards.std()) if valid_rewards.numel() > 1 else 0.0,
        "frac_reward_zero_std": float(no_signal.float().sum()) / groups if no_signal.numel() else 0.0,
        "frac_format_only_spread": float((flat & ~bonus_flat).float().sum()) / groups if flat.numel() else 0.0,
        "frac_unscorable": float((~valid).float().mean()) if valid.numel() else 0.0,
    }
    return advantages, metrics


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, chunk_rows: int = 1, temperature: float = 1.0
) -> torch.Tensor:
    """log softmax(logits / temperature)[..., index] for logits (B, T, V) and index (B, T) -> (B, T), in float32.

    Processes `chunk_rows` sequences at a time, so the float32 temporaries are (chunk, T, V) rather
    than a full-batch (B, T, V) copy: the vocabulary (50-150k) makes that the largest tensor of a step.
    The temperature divides after the cast to float32: in bf16 the quotient would be rounded to 8
    mantissa bits, shifting every log-prob by up to ~0.4% of the logit.
    """
    out = []
    for start in range(0, logits.shape[0], chunk_rows):
        rows = logits[start : start + chunk_rows].float()  # (c, T, V)
        if temperature != 1.0:
            rows = rows / temperature
        picked = rows.gather(-1, index[start : start + chunk_rows].unsqueeze(-1)).squeeze(-1)  # (c, T)
        out.append(picked - torch.logsumexp(rows, dim=-1))
    return torch.cat(out, dim=0) if out else logits.new_zeros(index.shape, dtype=torch.float32)


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, dict]:
    """Per-token PPO loss (B, T) from logp/old_logp (B, T), advantages (B,) (one per sequence: GRPO) or
    (B, T) (one per token: OPD), mask (B, T) in {0, 1}.

    metrics: clip_ratio/low_mean (share of tokens where the lower clip was active, A < 0),
    clip_ratio/high_mean (upper clip active, A > 0), ratio/mean.
    """
    clip_high = clip_low if clip_high is None else clip_high
    ratio = torch.exp(logp - old_logp)  # (B, T)
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    m = mask.float()
    n = m.sum().clamp(min=1.0)
    low = ((ratio < 1.0 - clip_low) & (adv < 0)).float()
    high = ((ratio > 1.0 + clip_high) & (adv > 0)).float()
    metrics = {
        "clip_ratio/low_mean": float((low * m).sum() / n),
        "clip_ratio/high_mean": float((high * m).sum() / n),
        "ratio/mean": float((ratio.detach() * m).sum() / n),
    }
    return per_token, metrics


IMPORTANCE_LEVELS = ("token", "sequence", "off")


def truncated_importance_weights(
    old_logp: torch.Tensor,
    sampling_logp: torch.Tensor,
    mask: torch.Tensor,
    level: str = "token",
    cap: float = 3.0,
    tails: bool = False,
) -> tuple[torch.Tensor, dict]:
    """Truncated importance sampling for samples drawn by another sampler (vLLM) than the policy trained.

    old_logp: the trainer's log-probs of the sampled tokens under the policy that was meant to sample
    (B, T); sampling_logp: the sampler's own log-probs of the same tokens (B, T); mask (B, T).
    Weights (B, T), detached: 'token' min(exp(old - sampling), cap) per token; 'sequence' the
    sequence's whole ratio min(exp(sum_t (old - sampling)), cap) on each of its tokens (TRL's two
    modes, cap 3 as its default); 'off' all ones. They multiply the per-token surrogate, correcting
    the bias from kernel/precision mismatch and from a stale adapter (gen_update_steps > 1).

    metrics: rollout/logp_abs_diff (mean |old - sampling| over tokens), rollout/seq_ratio_mean (mean
    over sequences of exp(sum_t (old - sampling)), exponent capped at 20), rollout/is_weight_mean,
    rollout/is_truncated_frac (share of weights that hit the cap); with `tails`, rollout/is_weight_p01 and
    rollout/is_weight_p99 (the uncapped weights' 1st and 99th percentiles over tokens: how far off-policy the
    samples are, which a mean hides; asynchronous rollouts report them).
    """
    if level not in IMPORTANCE_LEVELS:
        raise ValueError(f"unknown importance sampling level {level!r}; valid: {', '.join(IMPORTANCE_LEVELS)}")
    m = mask.float()
    diff = ((old_logp - sampling_logp) * m).detach()  # (B, T) log ratio trainer / sampler
    seq_log_ratio = diff.sum(dim=1, keepdim=True)  # (B, 1)
    if level == "token":
        raw = torch.exp(diff)
    elif level == "sequence":
        raw = torch.exp(seq_log_ratio.clamp(max=20.0)).expand_as(diff)
    else:
        raw = torch.ones_like(diff)
    weights = raw.clamp(max=cap)
    n = m.sum().clamp(min=1.0)
    rows = (m.sum(dim=1) > 0).float()
    metrics = {
        "rollout/logp_abs_diff": float((diff.abs() * m).sum() / n),
        "rollout/seq_ratio_mean": float(
            (torch.exp(seq_log_ratio.squeeze(1).clamp(max=20.0)) * rows).sum() / rows.sum().clamp(min=1.0)
        ),
        "rollout/is_weight_mean": float((weights * m).sum() / n),
        "rollout/is_truncated_frac": float(((raw > cap).float() * m).sum() / n),
    }
    if tails:
        values = raw[m > 0].float()
        low, high = torch.quantile(values, torch.tensor([0.01, 0.99])).tolist() if values.numel() else [1.0, 1.0]
        metrics.update({"rollout/is_weight_p01": float(low), "rollout/is_weight_p99": float(high)})
    return weights * m, metrics


# verl's low_var_kl bounds: the log-ratio before exp(), and the per-token value. Unbounded, k3 at logp -25
# against a reference -1 is 2.6e10, and one such token would set the direction of a whole clipped step.
K3_LOG_RATIO_BOUND = 20.0
K3_VALUE_BOUND = 10.0


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 penalty exp(ref - logp) - (ref - logp) - 1, (B, T), in [0, K3_VALUE_BOUND].

    Its value, on tokens sampled from the policy, is an unbiased estimate of KL(policy || reference)
    (Schulman). Used as a loss (differentiated through logp, not through the sampling), its expected
    gradient is that of KL(reference || policy), the reverse direction: the two agree to second order
    near the reference, which is where the penalty keeps the policy. tests/unit/training/test_losses.py checks this.
    Bounded as verl's low_var_kl: the log-ratio is clamped to +-20 and the value to [-10, 10], so a token
    the policy has moved far from the reference adds at most 10 and a gradient of at most e^2.5 in size
    (none beyond the bound), instead of an exponential in the log-ratio.
    """
    delta = (ref_logp - logp).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    return (torch.exp(delta) - delta - 1.0).clamp(-K3_VALUE_BOUND, K3_VALUE_BOUND)


# What a (B, T) mask adds to a step's normalizer, per aggregation mode: its tokens (token modes), its rows that
# have tokens (seq-mean-token-mean) or all its rows (seq-mean-token-sum-norm, whose divisor is rows x a length)
_UNITS: dict[str, typing.Callable[[torch.Tensor], float]] = {
    "token-mean": lambda m: float(m.sum()),
    "micro-token-mean": lambda m: float(m.sum()),
    "seq-mean-token-mean": lambda m: float((m.sum(dim=1) > 0).sum()),
    "seq-mean-token-sum-norm": lambda m: float(m.shape[0]),
}


def _check_mode(mode: str) -> None:
    if mode not in _UNITS:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")


def aggregation_units(mask: torch.Tensor, mode: str = "token-mean") -> float:
    """What a (B, T) mask adds to a step's normalizer (see `_UNITS`). Not clamped: summed over micro-batches and
    ranks first, then turned into a divisor by `step_denominator`."""
    _check_mode(mode)
    return _UNITS[mode](mask.float())


def aggregation_denominator(mask: torch.Tensor, mode: str = "token-mean", norm_length: int | None = None) -> float:
    """The divisor `aggregate_loss` uses for a (B, T) mask alone: the number of tokens (token-mean), of rows
    that have tokens (seq-mean-token-mean), or B * norm_length (seq-mean-token-sum-norm; norm_length defaults
    to T); at least 1. It is `step_denominator` of a step that is this one mask on one rank.

    Computing it once for a whole micro-batch and passing it to `aggregate_loss` for each chunk of
    rows makes the chunk losses sum to the whole-batch loss: the same gradient with a smaller
    activation peak.
    """
    length = norm_length if norm_length is not None else mask.shape[1]
    return step_denominator(aggregation_units(mask, mode), mode, length)


def step_denominator(units: float, mode: str = "token-mean", norm_length: int | None = None, world: int = 1) -> float:
    """The divisor of every GRPO chunk loss of one optimizer step, from the step's `units` summed over
    all micro-batches and all `world` ranks (`aggregation_units`).

    Each rank divides by units / world because DDP then averages the ranks' gradients: the step's
    gradient is that of sum(all losses) / units, one global token-mean (DAPO) or sequence mean,
    however the samples fell into micro-batches and ranks. (seq-mean-token-sum-norm: units x norm_length.)
    """
    total = max(units, 1.0) * (norm_length if mode == "seq-mean-token-sum-norm" and norm_length else 1)
    return total / world


def aggregate_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    norm_length: int | None = None,
    denominator: float | None = None,
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar over the masked tokens.

    token-mean:               sum(l * m) / sum(m)               every token weighs the same (DAPO)
    micro-token-mean:         the same per micro-batch (the trainer then averages micro-batches: TRL's bnpo)
    seq-mean-token-mean:      mean_b [sum_t(l * m) / sum_t(m)]  every sequence weighs the same (GRPO)
    seq-mean-token-sum-norm:  mean_b [sum_t(l * m)] / norm_length   a constant divisor, no length bias (Dr. GRPO)
    Rows without any token contribute nothing (never NaN). `denominator` (from
    `aggregation_denominator` of the enclosing batch) replaces this batch's own divisor, so that the
    losses of row chunks add up to the loss of the batch they were cut from.
    """
    _check_mode(mode)
    m = mask.to(per_token.dtype)
    sums = (per_token * m).sum(dim=1)  # (B,)
    if mode == "seq-mean-token-mean":
        lengths = m.sum(dim=1)
        sums = torch.where(lengths > 0, sums / lengths.clamp(min=1.0), sums)  # empty rows: 0, still in the graph
    if denominator is None:
        denominator = aggregation_denominator(mask, mode, norm_length)
    return sums.sum() / denominator


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    aggregation: str = "token-mean",
    norm_length: int | None = None,
    denominator: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """The GRPO policy-gradient term for one mini-batch: the clipped surrogate, aggregated once.

    logp/old_logp/mask: (B, T); advantages: (B,) one per sequence, or (B, T) one per token (`opd_loss`).
    mask: 1 on the tokens trained on (the policy's), 0 on padding and environment-inserted tokens.
    `denominator`: see `aggregate_loss` (for a chunk of a larger batch; metrics stay chunk means).
    `token_weights` (B, T): importance weights multiplying the surrogate, see `truncated_importance_weights`.
    The KL penalty is its own term (`kl_loss`), weighted by beta alone.
    """
    # Masked-out positions (padding, environment tokens) take the current log-probs as old: ratio 1 there, so a
    # token the policy finds very unlikely cannot overflow exp() into inf * 0 = NaN. Where the mask is 1
    # nothing changes.
    old_logp = torch.where(mask.bool(), old_logp, logp.detach())
    per_token, metrics = clipped_surrogate(logp, old_logp, advantages, mask, clip_low, clip_high)
    if token_weights is not None:
        per_token = per_token * token_weights
    loss = aggregate_loss(per_token, mask, aggregation, norm_length, denominator)
    metrics["loss/grpo"] = float(loss.detach())
    return loss, metrics


def kl_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: str = "token-mean",
    norm_length: int | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict]:
    """The KL penalty term for one mini-batch: the bounded k3 estimate (`k3_kl`) per token, aggregated like
    the GRPO term (same tokens, same normalizer) and not importance-weighted (TRL's placement).

    logp/ref_logp/mask: (B, T). metrics: kl (the chunk's token mean), loss/kl.
    """
    keep = mask.bool()
    ref_logp = torch.where(keep, ref_logp, logp.detach())  # KL 0 off the mask: no exp() overflow there
    kl = k3_kl(logp, ref_logp)
    m = keep.float()
    loss = aggregate_loss(kl, mask, aggregation, norm_length, denominator)
    return loss, {"kl": float((kl.detach() * m).sum() / m.sum().clamp(min=1.0)), "loss/kl": float(loss.detach())}


def opd_token_advantages(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor, clip: float = 0.0
) -> tuple[torch.Tensor, dict]:
    """The reverse-KL advantage of on-policy distillation, per token.

    student_logp: (B, T) the sampling policy's log-prob of each sampled token; teacher_logp: (B, T) the
    teacher's log-prob of the same token given the same prefix; mask (B, T) in {0, 1} (0: padding, prompt,
    environment tokens). Returns (advantages (B, T), metrics), detached:

        a_t = teacher_logp_t - student_logp_t, clamped to [-clip, clip] when clip > 0, 0 where mask == 0

    Positive where the teacher finds the student's token likelier than the student did (pushed up),
    negative where the teacher finds it unlikely (pushed down); its expectation over the student's samples
    is -KL(student || teacher) per token, so the surrogate with it minimizes the reverse KL, mode-seeking
    (a token the teacher rules out, logp -inf or vLLM's -9999, is what `clip` bounds).

    metrics: opd/kl (mean of student - teacher over masked tokens: the per-token reverse-KL estimate, before
    the clip), opd/advantage_mean (after the clip), opd/clipped_frac (share of tokens the clip changed),
    opd/advantage_p01 and opd/advantage_p99 (the tails before the clip, which a mean hides).
    """
    keep = mask.bool()
    raw = (teacher_logp - student_logp).detach()  # (B, T)
    clipped = raw.clamp(-clip, clip) if clip > 0 else raw
    advantages = torch.where(keep, clipped, torch.zeros_like(clipped))
    m = keep.float()
    n = m.sum().clamp(min=1.0)
    values = raw[keep].float()  # (N,) the masked tokens' raw advantages
    tails = torch.quantile(values, torch.tensor([0.01, 0.99])).tolist() if values.numel() else [0.0, 0.0]
    metrics = {
        "opd/kl": float((-raw * m).sum() / n),
        "opd/advantage_mean": float((advantages * m).sum() / n),
        "opd/clipped_frac": float(((clipped != raw).float() * m).sum() / n),
        "opd/advantage_p01": float(tails[0]),
        "opd/advantage_p99": float(tails[1]),
    }
    return advantages, metrics


def bound_opd_advantages(
    opd_advantages: torch.Tensor, grpo_advantages: torch.Tensor, mask: torch.Tensor, max_ratio: float
) -> tuple[torch.Tensor, dict]:
    """Scale each sample's OPD token advantages down so that their summed magnitude is at most `max_ratio` times
    the sample's summed GRPO advantage magnitude: the teacher's credit can refine the outcome reward's verdict on
    a sample but never outweigh it (a failing sample whose template the teacher likes is still pushed down).

    opd_advantages: (B, T); grpo_advantages: (B,) one per sample, or (B, T); mask: (B, T) in {0, 1}.
    budget_i = max_ratio * sum_t |A_it| m_it, total_i = sum_t |a_it| m_it, a_it *= min(1, budget_i / total_i).
    A sample with GRPO advantage 0 (every sample of an all-fail or all-pass group) gets no OPD credit.
    Returns (bounded advantages (B, T), metrics: opd/bounded_frac, the share of samples scaled down).
    """
    m = mask.float()
    grpo = grpo_advantages.float()
    grpo = grpo if grpo.dim() == 2 else grpo[:, None].expand_as(m)  # (B, T)
    budget = max_ratio * (grpo.abs() * m).sum(dim=1)  # (B,)
    total = (opd_advantages.abs() * m).sum(dim=1)  # (B,)
    over = total > budget
    factor = torch.where(over, budget / total.clamp(min=1e-12), torch.ones_like(total))  # (B,)
    rows = (m.sum(dim=1) > 0).float()
    metrics = {"opd/bounded_frac": float((over.float() * rows).sum() / rows.sum().clamp(min=1.0))}
    return opd_advantages * factor[:, None], metrics


def opd_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    advantage_clip: float = 0.0,
    grpo_advantages: torch.Tensor | None = None,
    max_ratio: float = 0.0,
    **surrogate: typing.Any,
) -> tuple[torch.Tensor, dict]:
    """The on-policy distillation term for one mini-batch: GRPO's clipped surrogate (`grpo_loss`, whose keyword
    arguments `surrogate` passes on: clip range, aggregation, `denominator`, `token_weights`) with the per-token
    advantage of `opd_token_advantages` (taken against `old_logp`, the policy that sampled), so that the two terms
    share one normalizer and one importance weight (the same tokens came from the same sampler).

    With `max_ratio` > 0 and `grpo_advantages` ((B,) or (B, T)), each sample's advantages are bounded against its
    GRPO advantage (`bound_opd_advantages`; `max_ratio` is then in the units of the weighted terms' ratio).

    logp/old_logp/teacher_logp/mask: (B, T). metrics: those of `opd_token_advantages` and loss/opd.
    """
    old_logp = torch.where(mask.bool(), old_logp, logp.detach())  # as in grpo_loss: no exp() overflow off the mask
    advantages, metrics = opd_token_advantages(old_logp, teacher_logp, mask, advantage_clip)
    if max_ratio > 0 and grpo_advantages is not None:
        advantages, bound_metrics = bound_opd_advantages(advantages, grpo_advantages, mask, max_ratio)
        metrics.update(bound_metrics)
    loss, _ = grpo_loss(logp, old_logp, advantages, mask, **surrogate)
    metrics["loss/opd"] = float(loss.detach())
    return loss, metrics


def masked_sft_nll(
    logits: torch.Tensor, labels: torch.Tensor, num_tokens: float | None = None
) -> tuple[torch.Tensor, dict]:
    """Causal-LM negative log-likelihood. logits (B, L, V) for input ids (B, L); labels (B, L) with
    IGNORE_INDEX on prompt and padding. Position i's logits predict label i + 1 (the usual shift).

    Returns the mean NLL over supervised tokens (0, still differentiable, when there are none).
    `num_tokens` divides instead of this batch's own count: the supervised tokens of the batch this
    one is a chunk of, so that chunk losses add up to the batch loss.
    """
    shifted_logits = logits[:, :-1]  # (B, L-1, V)
    targets = labels[:, 1:]  # (B, L-1)
    supervised = targets != IGNORE_INDEX
    n = int(supervised.sum())
    if n == 0:
        return logits.sum() * 0.0, {"sft/tokens": 0.0}
    logp = selective_log_softmax(shifted_logits, targets.clamp(min=0))  # (B, L-1)
    loss = -(logp * supervised).sum() / (num_tokens if num_tokens is not None else n)
    return loss, {"sft/tokens": float(n)}


def combine_losses(
    grpo: torch.Tensor | None,
    teacher_sft: torch.Tensor | None,
    self_sft: torch.Tensor | None,
    *,
    grpo_weight: float,
    teacher_weight: float,
    self_weight: float,
    opd: torch.Tensor | None = None,
    opd_weight: float = 0.0,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict]:
    """w_grpo * L_grpo + beta * L_kl + w_opd * L_opd + w_teacher * L_teacher + w_self * L_self; a missing term
    (None) counts as 0. The OPD and KL terms' weights and losses are reported only when present (a run without
    them logs what it always did)."""
    terms = [
        (grpo, grpo_weight, "grpo"),
        (teacher_sft, teacher_weight, "teacher_sft"),
        (self_sft, self_weight, "self_sft"),
    ]
    if opd is not None:
        terms.append((opd, opd_weight, "opd"))
    if kl is not None:
        terms.append((kl, kl_coef, "kl"))
    present = [(t, w) for t, w, _ in terms if t is not None and w != 0]
    if not present:
        raise ValueError("combine_losses needs at least one loss term with a nonzero weight")
    total = typing.cast(torch.Tensor, sum(w * t for t, w in present))  # present is not empty: a tensor, not 0
    metrics = {f"weight/{name}": w for _, w, name in terms}
    metrics.update({f"loss/{name}": float(t.detach()) for t, _, name in terms if t is not None})
    metrics["loss/total"] = float(total.detach())
    return total, metrics
