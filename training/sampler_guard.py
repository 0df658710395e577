"""Stop a run whose sampler does not sample the policy being trained, before the optimizer steps on its samples.

A sampler other than the trainer (a vLLM engine, a server, the kv sampler) returns each sampled token's log-prob.
Two ways they can show a broken sampler, each stopped with one line instead of trained on:

- a non-finite log-prob (NaN or infinite): the truncated importance weights exp(old - sampling), clamped at the
  cap, carry a NaN through to the loss, every gradient and, at the optimizer step, the adapter itself;
- a mean |logp_sampler - logp_trainer| over the step's tokens (`rollout/logp_abs_diff`) far above any gap a
  healthy sampler shows: float32 engines agree to ~1e-5, bf16 engines within a few hundredths of a nat, an
  adapter one step stale ~0.2 (tests/vllm_cpu); an engine whose weights are garbage gives several nats (a
  merged sync that rebuilt vLLM's fused qkv_proj from uninitialised memory: 3.7-5.0). Capped importance weights
  would keep training on such samples with no message.

Pure functions over plain values: the trainer calls `check_sampler_logprobs` on a rollout batch's completions
and `check_logp_gap` on a step's metrics before it steps the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

GAP_METRIC = "rollout/logp_abs_diff"


class SamplerMismatchError(RuntimeError):
    """The sampler's log-probs say it did not sample the policy being trained; one line, the run stops."""


def nonfinite_count(logprobs: Iterable[Sequence[float] | None]) -> tuple[int, int]:
    """(non-finite, all) sampled-token log-probs over the completions' `logprobs` lists (None: a sampler that
    returns none, e.g. hf, which is the trainer itself)."""
    bad = total = 0
    for values in logprobs:
        if values is None:
            continue
        total += len(values)
        bad += sum(not math.isfinite(value) for value in values)
    return bad, total


def check_sampler_logprobs(logprobs: Iterable[Sequence[float] | None], step: int) -> None:
    """Raise `SamplerMismatchError` when any sampled token's log-prob is NaN or infinite."""
    bad, total = nonfinite_count(logprobs)
    if bad:
        raise SamplerMismatchError(
            f"the sampler returned non-finite log-probs for {bad} of {total} sampled tokens at step {step + 1}: it "
            "is not sampling the policy (broken engine weights, e.g. a weight sync that left uninitialised memory), "
            "and training on them would write NaN into the adapter; stopped before the update "
            "(docs/gpu.md, 'The weight sync')"
        )


def check_logp_gap(metrics: dict[str, float], bound: float, step: int) -> None:
    """Raise `SamplerMismatchError` when the step's `rollout/logp_abs_diff` is non-finite or above `bound` nats per
    token (bound 0: only the non-finite check). No metric (no sampler log-probs, importance sampling off): nothing."""
    gap = metrics.get(GAP_METRIC)
    if gap is None:
        return
    if not math.isfinite(gap):
        raise SamplerMismatchError(
            f"{GAP_METRIC} is {gap} at step {step + 1}: the sampler's or the trainer's log-probs are not finite; "
            "stopped before the optimizer step (docs/gpu.md, 'The weight sync')"
        )
    if bound > 0 and gap > bound:
        raise SamplerMismatchError(
            f"{GAP_METRIC} = {gap:.3g} nats per token at step {step + 1}, above grpo.max_logp_abs_diff = {bound:g}: "
            "the sampler does not sample the policy being trained (broken engine weights, a server serving another "
            "model or adapter); stopped before the optimizer step. A healthy sampler stays within a few hundredths "
            "(bf16) or one stale step's ~0.2; raise grpo.max_logp_abs_diff (0: off) only when such a gap is expected "
            "(docs/gpu.md, 'The weight sync')"
        )
