"""Rollout samples as padded tensors, and the log-probs of their completions.

A rollout sample is a `rollouts.completion.RolloutCompletion`: `prompt_ids` and `token_ids` (the
completion), optionally the sampler's own `logprobs` (vLLM and kv backends, one per completion token)
and an `action_mask` over the completion (1 = sampled by the policy, 0 = inserted by the environment:
a tool's `<result>` block, a feedback turn; None = all ones). The batch's `completion_mask` is that
action mask: it is the one mask every loss term, count and normalizer uses, so environment tokens are
read by the model (they are context for later policy tokens) but never trained on and never counted.
Batches are left-padded prompts followed by right-padded completions, with explicit position ids that
count real tokens only (as generation does with left padding), so a row's log-probs do not depend on
which other rows share its batch. Slicing a batch into row chunks trims the padding none of the chosen
rows needs; chunked forwards are how the trainer keeps only one chunk's activations alive.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rollouts.completion import RolloutCompletion
from training.losses import IGNORE_INDEX, selective_log_softmax


def pad_rollout_batch(samples: Sequence[RolloutCompletion], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad prompts to a common width P and right-pad completions to T.

    Returns input_ids, attention_mask, position_ids (B, P + T), completion_ids and
    completion_mask (B, T): the action mask (policy tokens 1, environment tokens and padding 0).
    Position ids count real tokens only, as generation does with left padding.
    """
    width = max(len(s.prompt_ids) for s in samples)
    length = max(max(len(s.token_ids) for s in samples), 1)
    rows, masks, comp, comp_mask = [], [], [], []
    for s in samples:  # the record checked that action_mask and logprobs have one entry per token
        p, c, action = list(s.prompt_ids), list(s.token_ids), s.action_mask
        rows.append([pad_id] * (width - len(p)) + p + c + [pad_id] * (length - len(c)))
        masks.append([0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (length - len(c)))
        comp.append(c + [pad_id] * (length - len(c)))
        comp_mask.append((list(action) if action is not None else [1] * len(c)) + [0] * (length - len(c)))
    attention = torch.tensor(masks)
    batch = {
        "input_ids": torch.tensor(rows),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "completion_ids": torch.tensor(comp),
        "completion_mask": torch.tensor(comp_mask),
    }
    sampled = [s.logprobs for s in samples]
    if all(logprobs is not None for logprobs in sampled):  # the sampler's own log-probs (vLLM, kv backends)
        batch["sampling_logps"] = torch.tensor(
            [list(lp or ()) + [0.0] * (length - len(lp or ())) for lp in sampled], dtype=torch.float32
        )
    return batch


AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16}
BF16_CPU_FEATURES = ("avx512_bf16", "amx_bf16")  # x86 instructions that do bfloat16 arithmetic in hardware


def resolve_autocast(setting: str, device_type: str, cpu_features: Mapping[str, Any]) -> str:
    """training.autocast with `auto` made concrete: bfloat16 on a CPU whose instructions do bfloat16 in hardware
    (`cpu_features`: torch.cpu.get_capabilities()), off elsewhere. Elsewhere the emulated bfloat16 matmul is slower
    than float32 on a CPU, and a CUDA student takes its precision from student.torch_dtype."""
    if setting != "auto":
        return setting
    if device_type == "cpu" and any(cpu_features.get(feature) for feature in BF16_CPU_FEATURES):
        return "bfloat16"
    return "off"


def cpu_features() -> dict[str, Any]:
    """This CPU's instruction-set features as torch reports them ({} where this torch build cannot say)."""
    try:
        return dict(torch.cpu.get_capabilities())
    except (AttributeError, RuntimeError):
        return {}


def autocast_forward(model: Any, dtype: str) -> Any:
    """Make every forward of `model` run under `torch.autocast` in `dtype` (a key of AUTOCAST_DTYPES) on its
    device, logits returned in float32: the forward as accelerate's mixed precision wraps it, but per model, so
    every caller (the update, the no-grad reference and old log-probs in their own thread, hf sampling, the SFT
    terms) computes the same distribution. The weights keep their dtype. Returns `model`."""
    forward, cast = model.forward, AUTOCAST_DTYPES[dtype]

    def autocast(*args: Any, **kwargs: Any) -> Any:
        device = next(model.parameters()).device.type
        with torch.autocast(device, dtype=cast):
            out = forward(*args, **kwargs)
        if getattr(out, "logits", None) is not None:
            out.logits = out.logits.float()
        return out

    model.forward = autocast
    return model


def completion_logprobs(model: Any, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs (B, T) of the completion tokens under `model`.

    Only the last T + 1 positions go through the LM head (`logits_to_keep`); the logit at position
    P - 1 + j predicts completion token j. Logits are divided by the sampling temperature, so the
    log-probs are those of the distribution the completions were drawn from.
    """
    length = batch["completion_ids"].shape[1]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        logits_to_keep=length + 1,
    )
    logits = out.logits[:, :-1]  # (B, T, V), in the model's dtype: divided by T only after the float32 cast
    return selective_log_softmax(logits, batch["completion_ids"], temperature=temperature)


def row_chunks(num_rows: int, chunk_size: int) -> list[list[int]]:
    """Consecutive groups of at most `chunk_size` row indices (0: one group with every row)."""
    size = chunk_size if chunk_size > 0 else max(num_rows, 1)
    return [list(range(start, min(start + size, num_rows))) for start in range(0, num_rows, size)]


def slice_rollout_batch(batch: dict[str, torch.Tensor], rows: list[int]) -> tuple[dict[str, torch.Tensor], int]:
    """The rows of a `pad_rollout_batch` batch, without the padding columns none of them need.

    Left-padding columns that every chosen row pads are cut (position ids are explicit, so nothing
    shifts), and completions are cut to the longest chosen one. Returns the batch and its completion
    width T' (per-token tensors of the full batch are cut to [rows, :T'] to match).
    """
    index = torch.tensor(rows, device=batch["input_ids"].device)
    prompt_width = batch["input_ids"].shape[1] - batch["completion_ids"].shape[1]
    # the longest chosen completion, environment tokens included (completion_mask leaves them out)
    width = max(int(batch["attention_mask"][index, prompt_width:].sum(dim=1).max()), 1) if rows else 1
    longest_prompt = int(batch["attention_mask"][index, :prompt_width].sum(dim=1).max())
    start = prompt_width - longest_prompt
    end = prompt_width + width
    out = {k: batch[k][index, start:end] for k in ("input_ids", "attention_mask", "position_ids")}
    for key in ("completion_ids", "completion_mask", "sampling_logps"):
        if key in batch:
            out[key] = batch[key][index, :width]
    return out, width


def chunked_completion_logprobs(
    model: Any, batch: dict[str, torch.Tensor], chunk_size: int, temperature: float = 1.0
) -> torch.Tensor:
    """`completion_logprobs` (B, T) computed `chunk_size` rows at a time (for no-grad passes)."""
    out = torch.zeros(batch["completion_ids"].shape, dtype=torch.float32, device=batch["completion_ids"].device)
    for rows in row_chunks(batch["completion_ids"].shape[0], chunk_size):
        part, width = slice_rollout_batch(batch, rows)
        out[rows, :width] = completion_logprobs(model, part, temperature)
    return out


def sft_tokens(batch: dict[str, torch.Tensor]) -> float:
    """Supervised (shifted) label tokens of a `collate_sft` batch: what `masked_sft_nll` averages over."""
    return float((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


@contextlib.contextmanager
def dropout_disabled(model: Any):
    """Every `torch.nn.Dropout` of `model` (LoRA's dropout among them) has p = 0 inside the block.

    The RL terms need the log-probs of the policy that sampled, not of a randomly thinned copy: with
    dropout on, old and current log-probs of the same tokens differ (the first pass's ratio is not 1),
    the KL carries dropout noise, and the gradient belongs to a sub-network. Forward and backward must
    both run inside (gradient checkpointing recomputes the forward during backward). SFT terms keep
    the configured dropout.
    """
    saved = [(module, module.p) for module in model.modules() if isinstance(module, torch.nn.Dropout)]
    for module, _ in saved:
        module.p = 0.0
    try:
        yield
    finally:
        for module, p in saved:
            module.p = p
