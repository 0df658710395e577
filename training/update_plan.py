"""Planning an update: everything the optimizer steps on one rollout batch need, before any backward.

`plan_update` runs once per rollout batch: group advantages (correctness z-scored or centred, the
shaping bonus centred only), dynamic filtering of zero-spread groups, the split into
`gradient_accumulation_steps` micro-batches (sample k goes to micro-batch k mod slots, so every
micro-batch mixes groups), the padded tensors, and the no-grad log-probs the passes compare against
(reference: the adapter disabled; old: only when mu > 1, otherwise the current ones detached).
`plan_step` runs once per optimizer step: the teacher-SFT batch of each slot and the step-wide
normalizer of every loss term (one all-reduced vector of counts), so that every token (or sequence)
of the step weighs the same wherever it fell. The trainer then *applies* the plan: one backward pass
per row chunk and loss term, then the optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from config import GRPOConfig
from training.batching import chunked_completion_logprobs, dropout_disabled, pad_rollout_batch, sft_tokens
from training.losses import (
    STEP_AGGREGATIONS,
    aggregation_denominator,
    aggregation_units,
    combine_losses,
    group_advantages,
    step_denominator,
)
from training.rewards import ScoredSample


@dataclass
class UpdatePlan:
    """What the mu optimizer steps on one rollout batch share."""

    samples: list[ScoredSample]  # every sample of the rollout batch, group by group (P x G)
    micro_batches: list[list[int]]  # indices into `samples` kept for each non-empty micro-batch, in slot order
    batches: list[dict[str, torch.Tensor]]  # `pad_rollout_batch` of each micro-batch, on the device
    advantages: torch.Tensor  # (P x G,) one per sample, group by group
    advantage_metrics: dict
    ref_logps: list[torch.Tensor]  # (B, T) per micro-batch; empty when kl_coef == 0
    old_logps: list[torch.Tensor]  # (B, T) per micro-batch; empty when mu == 1 (old = current, detached)
    self_batch: dict[str, torch.Tensor] | None  # every self-SFT example of the step, one `collate_sft` batch
    num_self_examples: int
    # on-policy distillation: the teacher's log-prob of each completion token (B, T) per micro-batch; empty when off
    teacher_logps: list[torch.Tensor] = field(default_factory=list)


@dataclass
class StepPlan:
    """One optimizer step's SFT slots and step-wide normalizers (all counts summed over ranks)."""

    teacher_batches: list[dict[str, torch.Tensor] | None]  # one per slot (None: nothing supervised)
    grpo_tokens: float
    teacher_tokens: float
    self_tokens: float
    denominators: list[float]  # the GRPO loss normalizer of each micro-batch
    grpo_scale: float  # 1, or for micro-token-mean 1 / micro-batches (the micro-batch means averaged)
    metric_tokens: float  # the step's GRPO tokens over all ranks / ranks: what chunk metric means are weighted by


def rollout_advantages(groups: list[list[ScoredSample]], scale: bool) -> tuple[torch.Tensor, dict]:
    """(P, G) advantages of scored groups: correctness normalized within the group (NaN = unscorable),
    plus the shaping part of the reward (weighted format bonus + weighted user rewards) centred, not z-scored."""
    correctness = torch.tensor(
        [
            [s.reward.correctness if s.reward.correctness is not None else float("nan") for s in group]
            for group in groups
        ],
        dtype=torch.float32,
    )  # (P, G)
    bonus = torch.tensor([[s.reward.bonus for s in group] for group in groups], dtype=torch.float32)  # (P, G)
    return group_advantages(correctness, scale=scale, bonus=bonus)


def split_micro_batches(advantages: torch.Tensor, num_slots: int, dynamic_filtering: bool) -> list[list[int]]:
    """Flat sample indices of each non-empty micro-batch: sample k goes to slot k mod `num_slots`;
    with `dynamic_filtering`, groups whose advantages are all zero are left out."""
    num_groups, group_size = advantages.shape
    keep = list(range(num_groups * group_size))
    if dynamic_filtering:
        zero = {i for i in range(num_groups) if float(advantages[i].abs().sum()) == 0.0}
        keep = [k for k in keep if k // group_size not in zero]
    micro = [keep[i::num_slots] for i in range(num_slots)]
    return [m for m in micro if m]


def plan_update(
    groups: list[list[ScoredSample]],
    policy: Any,
    pad_id: int,
    device: Any,
    grpo: GRPOConfig,
    num_slots: int,
    forward_chunk_size: int,
    self_batch: dict | None,
    num_self_examples: int,
    teacher_logps: Sequence[Sequence[float]] | None = None,
) -> UpdatePlan:
    """Advantages, filtering, micro-batches and the no-grad log-probs of one rollout batch (see the module
    docstring). `policy` is the unwrapped peft model (its adapter is disabled for the reference).

    `teacher_logps` (on-policy distillation): per sample, group by group, the teacher's log-prob of each of its
    completion tokens; padded like the completions into one (B, T) tensor per micro-batch. With them, dynamic
    filtering is off: a group without reward spread still carries the teacher's per-token signal."""
    advantages, adv_metrics = rollout_advantages(groups, grpo.scale_rewards)
    samples = [s for group in groups for s in group]
    micro = split_micro_batches(advantages, num_slots, grpo.dynamic_filtering and teacher_logps is None)
    batches = [
        {k: v.to(device) for k, v in pad_rollout_batch([samples[k].completion for k in m], pad_id).items()}
        for m in micro
    ]
    teacher = []
    if teacher_logps is not None:
        if len(teacher_logps) != len(samples):
            raise ValueError(f"{len(teacher_logps)} teacher log-prob rows for {len(samples)} samples")
        for m, batch in zip(micro, batches, strict=True):
            rows = torch.zeros(batch["completion_ids"].shape, dtype=torch.float32)  # (B, T), 0 on padding
            for row, k in enumerate(m):
                values = list(teacher_logps[k])
                if len(values) != len(samples[k].completion.token_ids):
                    raise ValueError(
                        f"sample {k}: {len(values)} teacher log-probs for {len(samples[k].completion.token_ids)} tokens"
                    )
                rows[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
            teacher.append(rows.to(device))
    ref_logps, old_logps = [], []
    with torch.no_grad(), dropout_disabled(policy):
        for batch in batches:
            if grpo.kl_coef > 0:
                with policy.disable_adapter():  # the frozen base model is the reference
                    ref_logps.append(chunked_completion_logprobs(policy, batch, forward_chunk_size, grpo.temperature))
            if grpo.num_iterations > 1:
                old_logps.append(chunked_completion_logprobs(policy, batch, forward_chunk_size, grpo.temperature))
    return UpdatePlan(
        samples,
        micro,
        batches,
        advantages.reshape(-1),
        adv_metrics,
        ref_logps,
        old_logps,
        self_batch,
        num_self_examples,
        teacher,
    )


def plan_step(
    plan: UpdatePlan,
    teacher_batches: list[dict | None],
    use_self_sft: bool,
    grpo: GRPOConfig,
    world: int,
    global_sums: Callable[[list[float]], list[float]],
) -> StepPlan:
    """One optimizer step's normalizers: one per term for the whole step, summed over micro-batches and
    ranks with one all-reduce (`global_sums`), so every token (or sequence) of the step weighs the same.
    Only micro-token-mean divides each micro-batch by its own `aggregation_denominator`."""
    mode = grpo.loss_aggregation
    teacher_batches = [b if b is not None and sft_tokens(b) > 0 else None for b in teacher_batches]
    masks = [b["completion_mask"] for b in plan.batches]
    grpo_units = sum(aggregation_units(m, mode) for m in masks) if mode in STEP_AGGREGATIONS else 0.0
    grpo_tokens, grpo_units, teacher_tokens, self_tokens = global_sums(
        [
            sum(float(m.sum()) for m in masks),
            grpo_units,
            sum(sft_tokens(b) for b in teacher_batches if b is not None),
            sft_tokens(plan.self_batch) if plan.self_batch is not None and use_self_sft else 0.0,
        ]
    )
    if mode in STEP_AGGREGATIONS:
        denominators = [step_denominator(grpo_units, mode, grpo.max_new_tokens, world)] * len(masks)
        grpo_scale = 1.0
    else:  # micro-token-mean: each micro-batch its own token mean, micro-batches averaged
        denominators = [aggregation_denominator(m, mode) for m in masks]
        grpo_scale = 1.0 / max(len(masks), 1)
    return StepPlan(
        teacher_batches,
        grpo_tokens,
        teacher_tokens,
        self_tokens,
        denominators,
        grpo_scale,
        max(grpo_tokens, 1.0) / world,
    )


def step_loss_metrics(
    sums: dict[str, float],
    present: dict[str, bool],
    grpo_weight: float,
    w_teacher: float,
    w_self: float,
    opd_weight: float = 0.0,
) -> dict:
    """Per-step loss metrics from the passes' sums. Every pass already divided by the step's global
    normalizer, so the sums are this rank's shares: averaged over ranks they are the step's values. A
    term that has data on some rank is reported by every rank (0 where it had none), so that the
    average is right; `loss/total` is the objective actually optimized. The OPD term counts when
    `present` says so (it shares GRPO's tokens)."""
    names = ("grpo", "teacher_sft", "self_sft", "opd")
    out = {k: v for k, v in sums.items() if not k.startswith(tuple(f"loss/{name}" for name in names))}
    terms = {name: torch.tensor(sums.get(f"loss/{name}", 0.0)) if present.get(name) else None for name in names}
    if all(v is None for v in terms.values()):
        return out
    _, combined = combine_losses(
        terms["grpo"], terms["teacher_sft"], terms["self_sft"], grpo_weight, w_teacher, w_self, terms["opd"], opd_weight
    )
    return {**out, **combined}
