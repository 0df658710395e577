"""Planning an update: everything the optimizer steps on one rollout batch need, before any backward.

`plan_update` runs once per rollout batch: group advantages (correctness z-scored or centred, the
shaping bonus centred only), dynamic filtering of zero-spread groups, the truncation mask (completions cut
at the token budget leave the loss, not their group's statistics, with `grpo.mask_truncated_completions`),
the split into
`gradient_accumulation_steps` micro-batches (sample k goes to micro-batch k mod slots, so every
micro-batch mixes groups), the padded tensors, and the no-grad log-probs the passes compare against
(reference: the adapter disabled, only when the KL term is on; old: only when mu > 1, otherwise the current
ones detached; neither when no term trains on the rollouts). `plan_step` runs once per optimizer step: the
teacher-SFT batch of each slot, the step-wide normalizer of every loss term (one all-reduced vector of
counts), so that every token (or sequence) of the step weighs the same wherever it fell, and whether the
step has any signal beyond the shaping bonus (a step without is not taken: Adam would scale the bonus, or
the KL alone, to a full-size update). Self-SFT's normalizer makes each example weigh as one group of the
step: the term scales with the share of groups that succeeded. The trainer then *applies* the plan: one backward pass
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
    group_has_spread,
    step_denominator,
)
from training.rewards import ScoredSample
from training.shared_prompt import shared_chunked_completion_logprobs


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
    num_groups: int = 0  # groups of the rollout batch on this process (self-SFT's budget: one share per group)
    spread_groups: int = 0  # groups with correctness spread: the GRPO signal that is not shaping
    bonus_signal_groups: int = 0  # groups whose only spread is a user reward function's (counts as signal)


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
    self_denominator: float = 1.0  # self-SFT: step tokens x groups / examples (all ranks) / ranks
    has_signal: bool = True  # False: only the shaping bonus (or the KL alone) would move the weights


def correctness_rewards(groups: Sequence[Sequence[ScoredSample]]) -> torch.Tensor:
    """(P, G) correctness rewards of scored groups, NaN where unscorable."""
    return torch.tensor(
        [
            [s.reward.correctness if s.reward.correctness is not None else float("nan") for s in group]
            for group in groups
        ],
        dtype=torch.float32,
    ).reshape(len(groups), -1)


def unguided_correctness(groups: Sequence[Sequence[ScoredSample]]) -> torch.Tensor:
    """(P, G) correctness rewards with NaN where a sample is unscorable or guided: what a task's own pass-rate
    estimate (the curriculum's) may count."""
    return torch.tensor(
        [
            [
                float("nan")
                if s.reward.correctness is None or s.completion.teacher_prefix_tokens
                else s.reward.correctness
                for s in group
            ]
            for group in groups
        ],
        dtype=torch.float32,
    ).reshape(len(groups), -1)


def rollout_advantages(groups: list[list[ScoredSample]], scale: bool) -> tuple[torch.Tensor, dict]:
    """(P, G) advantages of scored groups: correctness normalized within the group (NaN = unscorable),
    plus the shaping part of the reward (weighted format bonus + weighted user rewards) centred, not z-scored."""
    if not groups:  # no rollouts this step (nothing in the objective uses them)
        return torch.zeros(0, 0), {}
    correctness = correctness_rewards(groups)  # (P, G)
    bonus = torch.tensor([[s.reward.bonus for s in group] for group in groups], dtype=torch.float32)  # (P, G)
    return group_advantages(correctness, scale=scale, bonus=bonus)


def user_reward_spread(groups: Sequence[Sequence[ScoredSample]]) -> int:
    """Groups whose user reward functions' values differ (a signal the user asked for, unlike the format bonus)."""
    count = 0
    for group in groups:
        for name in group[0].reward.user if group else ():
            values = [v for s in group if (v := s.reward.user.get(name)) is not None]
            if len(values) >= 2 and max(values) - min(values) > 1e-6:
                count += 1
                break
    return count


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


@dataclass
class RolloutForwards:
    """A rollout batch's padded micro-batches and their no-grad log-probs, computed from the completions alone
    (no reward needed) while the sandbox scores them; `layout` names which completion sits in which slot."""

    layout: list[list[int]]  # id() of each micro-batch's completions, in slot order
    batches: list[dict[str, torch.Tensor]]
    ref_logps: list[torch.Tensor]
    old_logps: list[torch.Tensor]


def layout_of(completions: Sequence[Any], micro: list[list[int]]) -> list[list[int]]:
    return [[id(completions[k]) for k in m] for m in micro]


def micro_batch_tensors(
    completions: Sequence[Any], micro: list[list[int]], pad_id: int, device: Any, grpo: GRPOConfig
) -> list[dict[str, torch.Tensor]]:
    """`pad_rollout_batch` of each micro-batch on the device; with `grpo.mask_truncated_completions` a completion cut
    at the budget leaves the loss (its mask is zero), not its group's statistics."""
    batches = []
    for m in micro:
        batch = pad_rollout_batch([completions[k] for k in m], pad_id)
        if grpo.mask_truncated_completions:
            cut = torch.tensor([completions[k].finish_reason == "length" for k in m])  # (B,)
            batch["completion_mask"] = batch["completion_mask"] * (~cut).unsqueeze(1).to(batch["completion_mask"].dtype)
        batches.append({k: v.to(device) for k, v in batch.items()})
    return batches


def no_grad_logprobs(
    policy: Any, batches: list[dict[str, torch.Tensor]], grpo: GRPOConfig, forward_chunk_size: int, shared_prompt: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(reference log-probs, old log-probs), (B, T) per micro-batch: the reference with the adapter disabled, only
    when the KL term is on; the old ones only when mu > 1 (otherwise the passes use the current ones, detached)."""
    ref_logps: list[torch.Tensor] = []
    old_logps: list[torch.Tensor] = []
    logprobs = shared_chunked_completion_logprobs if shared_prompt else chunked_completion_logprobs
    with torch.no_grad(), dropout_disabled(policy):
        for batch in batches:
            if grpo.kl_coef > 0:
                with policy.disable_adapter():  # the frozen base model is the reference
                    ref_logps.append(logprobs(policy, batch, forward_chunk_size, grpo.temperature))
            if grpo.num_iterations > 1:
                old_logps.append(logprobs(policy, batch, forward_chunk_size, grpo.temperature))
    return ref_logps, old_logps


def rollout_forwards(
    completions: Sequence[Any],
    policy: Any,
    *,
    pad_id: int,
    device: Any,
    grpo: GRPOConfig,
    num_slots: int,
    forward_chunk_size: int,
    shared_prompt: bool = False,
) -> RolloutForwards:
    """The plan's micro-batches and no-grad log-probs for a rollout batch whose groups all stay (no dynamic filtering):
    sample k in slot k mod `num_slots`, as `split_micro_batches` puts them. Needs only the token ids, so it runs on
    the accelerator while the sandbox scores the same completions."""
    micro = [m for m in (list(range(len(completions)))[i::num_slots] for i in range(num_slots)) if m]
    batches = micro_batch_tensors(completions, micro, pad_id, device, grpo)
    ref_logps, old_logps = no_grad_logprobs(policy, batches, grpo, forward_chunk_size, shared_prompt)
    return RolloutForwards(layout_of(completions, micro), batches, ref_logps, old_logps)


def plan_update(
    groups: list[list[ScoredSample]],
    policy: Any,
    *,
    pad_id: int,
    device: Any,
    grpo: GRPOConfig,
    num_slots: int,
    forward_chunk_size: int,
    self_batch: dict | None,
    num_self_examples: int,
    teacher_logps: Sequence[Sequence[float]] | None = None,
    shared_prompt: bool = False,
    rollout_terms: bool = True,
    forwards: RolloutForwards | None = None,
) -> UpdatePlan:
    """Advantages, filtering, micro-batches and the no-grad log-probs of one rollout batch (see the module
    docstring). `policy` is the unwrapped peft model (its adapter is disabled for the reference).

    `teacher_logps` (on-policy distillation): per sample, group by group, the teacher's log-prob of each of its
    completion tokens; padded like the completions into one (B, T) tensor per micro-batch. With them, dynamic
    filtering is off: a group without reward spread still carries the teacher's per-token signal.
    `shared_prompt`: the no-grad forwards read each group's prompt once (`training.shared_prompt_forward`).

    `rollout_terms` False (GRPO, KL and OPD all off): no batches and no log-prob forwards; the groups still
    give the advantage metrics and self-SFT's budget.

    `forwards`: the batches and no-grad log-probs `rollout_forwards` computed while the sandbox scored; used when
    their micro-batches are the plan's (same completions in the same slots), otherwise computed here."""
    advantages, adv_metrics = rollout_advantages(groups, grpo.scale_rewards)
    samples = [s for group in groups for s in group]
    micro = (
        split_micro_batches(advantages, num_slots, grpo.dynamic_filtering and teacher_logps is None)
        if rollout_terms
        else []
    )
    completions = [s.completion for s in samples]
    if forwards is not None and forwards.layout == layout_of(completions, micro):  # computed while scoring
        batches, ref_logps, old_logps = forwards.batches, forwards.ref_logps, forwards.old_logps
    else:
        batches = micro_batch_tensors(completions, micro, pad_id, device, grpo)
        ref_logps, old_logps = no_grad_logprobs(policy, batches, grpo, forward_chunk_size, shared_prompt)
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
    spread = int(group_has_spread(correctness_rewards(groups)).sum()) if groups else 0
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
        num_groups=len(groups),
        spread_groups=spread,
        bonus_signal_groups=user_reward_spread(groups),
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
    Only micro-token-mean divides each micro-batch by its own `aggregation_denominator`. Self-SFT divides
    its NLL sum by groups x mean example length (all ranks): each example weighs as one group.

    `has_signal`: some group has correctness spread (or user-reward spread), or an SFT term or OPD has data.
    A step whose GRPO part is only the format bonus and KL, with nothing else, is not taken (Adam is invariant
    to the gradient's scale, so a 0.1-weighted bonus would move the weights as much as a pass/fail signal)."""
    mode = grpo.loss_aggregation
    teacher_batches = [b if b is not None and sft_tokens(b) > 0 else None for b in teacher_batches]
    masks = [b["completion_mask"] for b in plan.batches]
    grpo_units = sum(aggregation_units(m, mode) for m in masks) if mode in STEP_AGGREGATIONS else 0.0
    using_self = plan.self_batch is not None and use_self_sft
    grpo_tokens, grpo_units, teacher_tokens, self_tokens, self_examples, groups, signal_groups = global_sums(
        [
            sum(float(m.sum()) for m in masks),
            grpo_units,
            sum(sft_tokens(b) for b in teacher_batches if b is not None),
            sft_tokens(plan.self_batch) if using_self and plan.self_batch is not None else 0.0,
            float(plan.num_self_examples) if using_self else 0.0,
            float(plan.num_groups),
            float(plan.spread_groups + plan.bonus_signal_groups) if masks else 0.0,
        ]
    )
    if mode in STEP_AGGREGATIONS:
        denominators = [step_denominator(grpo_units, mode, grpo.max_new_tokens, world)] * len(masks)
        grpo_scale = 1.0
    else:  # micro-token-mean: each micro-batch its own token mean, micro-batches averaged
        denominators = [aggregation_denominator(m, mode) for m in masks]
        grpo_scale = 1.0 / max(len(masks), 1)
    # each self-SFT example weighs 1 / groups of the term: sum NLL / (groups x mean example length)
    self_denominator = max(self_tokens, 1.0) * max(groups, 1.0) / max(self_examples, 1.0) / world
    opd_tokens = grpo_tokens if plan.teacher_logps else 0.0
    return StepPlan(
        teacher_batches,
        grpo_tokens,
        teacher_tokens,
        self_tokens,
        denominators,
        grpo_scale,
        max(grpo_tokens, 1.0) / world,
        self_denominator=self_denominator,
        has_signal=signal_groups > 0 or teacher_tokens > 0 or self_tokens > 0 or opd_tokens > 0,
    )


def step_loss_metrics(
    sums: dict[str, float],
    present: dict[str, bool],
    grpo_weight: float,
    w_teacher: float,
    w_self: float,
    opd_weight: float = 0.0,
    kl_coef: float = 0.0,
) -> dict:
    """Per-step loss metrics from the passes' sums. Every pass already divided by the step's global
    normalizer, so the sums are this rank's shares: averaged over ranks they are the step's values. A
    term that has data on some rank is reported by every rank (0 where it had none), so that the
    average is right; `loss/total` is the objective actually optimized. The OPD term counts when
    `present` says so (it shares GRPO's tokens)."""
    names = ("grpo", "teacher_sft", "self_sft", "opd", "kl")
    out = {k: v for k, v in sums.items() if not k.startswith(tuple(f"loss/{name}" for name in names))}
    terms = {name: torch.tensor(sums.get(f"loss/{name}", 0.0)) if present.get(name) else None for name in names}
    if all(v is None for v in terms.values()):
        return out
    _, combined = combine_losses(
        terms["grpo"],
        terms["teacher_sft"],
        terms["self_sft"],
        grpo_weight=grpo_weight,
        teacher_weight=w_teacher,
        self_weight=w_self,
        opd=terms["opd"],
        opd_weight=opd_weight,
        kl=terms["kl"],
        kl_coef=kl_coef,
    )
    return {**out, **combined}
