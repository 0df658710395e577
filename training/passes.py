"""The backward passes of one optimizer step, and the order they run in.

An optimizer step is a list of passes (`PassRunner.passes`): per micro-batch slot, the rollout terms (GRPO,
KL, OPD: one forward, the terms whose weight is nonzero) on each row chunk of its rollout micro-batch, then
that slot's teacher-SFT batch; then the self-SFT batch. A term with weight 0 costs nothing: no rollout pass
at all when GRPO, KL and OPD are all off. Each
pass is one forward + backward whose loss is divided by the step's normalizer for its term (planned in
`training.update_plan`), so summed over the passes the gradient is the unchunked objective's while only
one chunk's activations are alive at a time. A pass returns its share of the step's loss metrics.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from config import GRPOConfig
from training.batching import completion_logprobs, dropout_disabled, row_chunks, sft_tokens, slice_rollout_batch
from training.losses import grpo_loss, kl_loss, masked_sft_nll, opd_loss, truncated_importance_weights
from training.shared_prompt import SharedPromptForward
from training.update_plan import StepPlan, UpdatePlan

Pass = Callable[[], dict[str, float]]


@dataclass(frozen=True, kw_only=True)
class PassRunner:
    """Runs passes on the (accelerate-prepared) `model`: `accelerator.backward` for every loss."""

    model: Any
    accelerator: Any
    grpo: GRPOConfig
    grpo_weight: float  # dual_source.grpo_weight
    chunk_size: int  # training.forward_chunk_size: sequences per forward
    pad_token_id: int
    opd_weight: float = 0.0  # dual_source.opd_weight: 0 leaves the GRPO pass exactly as without the term
    opd_advantage_clip: float = 0.0  # dual_source.opd_advantage_clip
    opd_max_ratio: float = 0.0  # dual_source.opd_max_ratio (applies beside GRPO only)
    shared_prompt: bool = False  # training.shared_prompt_forward: each group's prompt forwarded once per slot

    @property
    def rollout_terms(self) -> bool:
        """Whether any term trains on the rollouts' tokens (GRPO, KL or OPD has a nonzero weight)."""
        return self.grpo_weight > 0 or self.grpo.kl_coef > 0 or self.opd_weight > 0

    @property
    def async_rollouts(self) -> bool:
        """Whether rollouts may be stale (`grpo.async_rollouts` with max_staleness > 0): the importance weights'
        tails are then reported."""
        return self.grpo.async_rollouts and self.grpo.max_staleness > 0

    def grpo_pass(
        self,
        batch: dict,
        rows: list[int],
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        advantages: torch.Tensor,
        scale: float,
        denominator: float,
        metric_tokens: float,
        teacher_logp: torch.Tensor | None = None,
        shared: SharedPromptForward | None = None,
    ) -> dict[str, float]:
        """Forward + backward of the rollout terms for `rows` of one micro-batch: GRPO (grpo_weight > 0), the KL
        penalty (kl_coef > 0, with `ref_logp`) and, with `teacher_logp` and opd_weight > 0, on-policy
        distillation, all on the same forward: same tokens, same normalizer, each with its own weight.

        The loss is divided by `denominator` (the step's, or for micro-token-mean the micro-batch's), so
        the chunks' losses and gradients sum to the step's objective (times `scale`). Returned values
        are sums: the scaled loss, and chunk metric means times the chunk's share of `metric_tokens`,
        so that summing the passes and averaging over ranks gives the step's token means. With `shared`,
        the rows are forwarded against their groups' prompt caches (`training.shared_prompt`).
        """
        grpo = self.grpo
        part, width = slice_rollout_batch(batch, rows)
        index = torch.tensor(rows, device=part["input_ids"].device)
        with dropout_disabled(self.model):  # forward and backward: see `dropout_disabled`
            if shared is not None:
                logp = shared.logprobs(rows, grpo.temperature)
            else:
                logp = completion_logprobs(self.model, part, grpo.temperature)
            old = old_logp[index, :width] if old_logp is not None else logp.detach()
            ref = ref_logp[index, :width] if ref_logp is not None else None
            weights: torch.Tensor | None = None
            is_metrics: dict[str, float] = {}
            if "sampling_logps" in part and grpo.importance_sampling != "off":  # sampled elsewhere, trained here
                weights, is_metrics = truncated_importance_weights(
                    old,
                    part["sampling_logps"],
                    part["completion_mask"],
                    grpo.importance_sampling,
                    grpo.importance_sampling_cap,
                    tails=self.async_rollouts,
                )
            mask = part["completion_mask"]
            aggregation: dict[str, Any] = {
                "aggregation": grpo.loss_aggregation,
                "norm_length": grpo.max_new_tokens,
                "denominator": denominator,
            }
            # GRPO's and OPD's surrogates: one clip range, one normalizer, one importance weight
            surrogate: dict[str, Any] = {
                "clip_low": grpo.clip_range,
                "clip_high": grpo.clip_range_high if grpo.clip_range_high >= 0 else None,
                "token_weights": weights,
                **aggregation,
            }
            terms: list[torch.Tensor] = []
            metrics: dict[str, float] = {}
            if self.grpo_weight > 0:
                loss, grpo_metrics = grpo_loss(logp, old, advantages[index], mask, **surrogate)
                metrics.update(grpo_metrics)
                terms.append(self.grpo_weight * loss)
            if grpo.kl_coef > 0:
                if ref is None:
                    raise ValueError("grpo.kl_coef > 0 needs reference log-probs")
                kl, kl_metrics = kl_loss(logp, ref, mask, **aggregation)
                metrics.update(kl_metrics)
                terms.append(grpo.kl_coef * kl)
            if teacher_logp is not None and self.opd_weight > 0:
                # the weighted OPD credit of a sample <= opd_max_ratio x its weighted GRPO credit (beside GRPO only)
                bounded = self.opd_max_ratio > 0 and self.grpo_weight > 0
                opd, opd_metrics = opd_loss(
                    logp,
                    old,
                    teacher_logp[index, :width],
                    mask,
                    advantage_clip=self.opd_advantage_clip,
                    grpo_advantages=advantages[index] if bounded else None,
                    max_ratio=self.opd_max_ratio * self.grpo_weight / self.opd_weight if bounded else 0.0,
                    **surrogate,
                )
                metrics.update(opd_metrics)
                terms.append(self.opd_weight * opd)
            metrics.update(is_metrics)
            if terms:
                self.accelerator.backward(scale * sum(terms))
            if shared is not None:  # the last chunk of a group backpropagates its prompt forward
                shared.release(rows)
        share = float(part["completion_mask"].sum()) / metric_tokens
        losses = ("loss/grpo", "loss/kl", "loss/opd")
        sums = {key: value * share for key, value in metrics.items() if key not in losses}
        sums.update({key: metrics[key] * scale for key in losses if key in metrics})
        return sums

    def sft_pass(self, batch: dict, weight: float, name: str, denominator: float) -> dict[str, float]:
        """Forward + backward of one SFT batch (teacher or self) in row chunks; returns its share of the loss.

        The NLL is summed over supervised tokens and divided by `denominator`: for teacher-SFT the term's
        supervised tokens of the whole step over all ranks, divided by the number of ranks, so the batches of
        a step add up to one token-mean; for self-SFT groups x mean example length (`plan_step`), so each
        example weighs as one group of the step.
        """
        device = self.accelerator.device
        if sft_tokens(batch) == 0:  # no rows, or nothing supervised
            return {}
        total = 0.0
        for rows in row_chunks(batch["input_ids"].shape[0], self.chunk_size):
            ids, attention, labels = (batch[k][rows].to(device) for k in ("input_ids", "attention_mask", "labels"))
            width = int(attention.sum(dim=1).max())  # right-padded: cut the shared padding
            out = self.model(input_ids=ids[:, :width], attention_mask=attention[:, :width])
            loss, _ = masked_sft_nll(out.logits, labels[:, :width], denominator)
            self.accelerator.backward(weight * loss)
            total += float(loss.detach())
        return {f"loss/{name}": total}

    def sampler_agreement(self, plan: UpdatePlan) -> dict[str, float]:
        """The importance-sampling diagnostics (`rollout/logp_abs_diff`, ...) of a step that is not taken, from
        no-grad forwards: the sampler/trainer gap is still reported (a stale adapter shows whether or not the
        step trains), token-weighted over this rank's rollout tokens like the passes' metrics."""
        grpo = self.grpo
        sums: dict[str, float] = {}
        total = sum(float(b["completion_mask"].sum()) for b in plan.batches if "sampling_logps" in b)
        if grpo.importance_sampling == "off" or total == 0:
            return sums
        with torch.no_grad(), dropout_disabled(self.model):
            for slot, batch in enumerate(plan.batches):
                if "sampling_logps" not in batch:
                    continue
                for rows in row_chunks(batch["input_ids"].shape[0], self.chunk_size):
                    part, width = slice_rollout_batch(batch, rows)
                    index = torch.tensor(rows, device=part["input_ids"].device)
                    old = (
                        plan.old_logps[slot][index, :width]
                        if plan.old_logps
                        else completion_logprobs(self.model, part, grpo.temperature)
                    )
                    _, metrics = truncated_importance_weights(
                        old,
                        part["sampling_logps"],
                        part["completion_mask"],
                        grpo.importance_sampling,
                        grpo.importance_sampling_cap,
                        tails=self.async_rollouts,
                    )
                    share = float(part["completion_mask"].sum()) / total
                    for key, value in metrics.items():
                        sums[key] = sums.get(key, 0.0) + value * share
        return sums

    def synchronizing_pass(self) -> None:
        """A zero-weighted one-token forward/backward outside `no_sync`: DDP all-reduces the gradients
        accumulated by the real passes. Every rank runs exactly one, however many real passes it
        had (a rank whose groups were all filtered out, or whose SFT batch was empty, has fewer or
        none), so no rank waits for a collective the others never start."""
        token = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self.accelerator.device)
        out = self.model(input_ids=token, attention_mask=torch.ones_like(token))
        self.accelerator.backward(out.logits.sum() * 0.0)

    def passes(self, plan: UpdatePlan, step: StepPlan, slots: int, w_teacher: float, w_self: float) -> list[Pass]:
        """Every backward pass of one optimizer step, in order: per micro-batch slot its GRPO row chunks and
        its teacher-SFT batch (a slot whose GRPO samples were all filtered out still has one), then self-SFT."""
        world = self.accelerator.num_processes
        passes: list[Pass] = []
        for slot in range(slots):  # `plan.batches` never has more entries than slots
            if slot < len(plan.batches) and self.rollout_terms:
                old = plan.old_logps[slot] if plan.old_logps else None
                ref = plan.ref_logps[slot] if plan.ref_logps else None
                teacher = plan.teacher_logps[slot] if plan.teacher_logps else None
                advantages = plan.advantages[plan.micro_batches[slot]].to(self.accelerator.device)
                chunks = row_chunks(len(plan.micro_batches[slot]), self.chunk_size)
                shared = SharedPromptForward(self.model, plan.batches[slot], chunks) if self.shared_prompt else None
                for rows in chunks:
                    passes.append(
                        functools.partial(
                            self.grpo_pass,
                            plan.batches[slot],
                            rows,
                            old,
                            ref,
                            advantages,
                            step.grpo_scale,
                            step.denominators[slot],
                            step.metric_tokens,
                            teacher,
                            shared,
                        )
                    )
            traces = step.teacher_batches[slot] if slot < len(step.teacher_batches) else None
            if traces is not None:
                passes.append(
                    functools.partial(self.sft_pass, traces, w_teacher, "teacher_sft", step.teacher_tokens / world)
                )
        if plan.self_batch is not None and w_self > 0:
            passes.append(functools.partial(self.sft_pass, plan.self_batch, w_self, "self_sft", step.self_denominator))
        return passes
