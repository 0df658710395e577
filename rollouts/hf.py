"""The transformers sampler: `generate_completions` over `model.generate`, and `HFRollout`, the `Sampler`
built on it (the CPU default for training and evaluation).

Batched with left padding; every sampling knob passed explicitly (`SamplingSettings`), so the
checkpoint's generation_config never changes the distribution; generation stops where vLLM's would.
"""

from __future__ import annotations

from typing import Any

import torch

from rollouts.completion import RolloutCompletion, stop_ids
from rollouts.protocol import Continuation, SamplerBase, cut_continuation
from rollouts.sampling import FULL_SOFTMAX, SamplingSettings
from utils.prompts import SYSTEM_PROMPT_UNIFIED
from utils.sft_data import encode_prompt, end_of_turn_id


def generation_eos_ids(model: Any) -> set[int]:
    """The end-of-sequence ids of the model's generation config (an int, a list, or none)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return set() if eos is None else {int(eos)} if isinstance(eos, int) else {int(t) for t in eos}


@torch.no_grad()
def left_padded(sequences: list[list[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, longest): each sequence right-aligned after pad_id, as
    `generate` wants a decoder-only batch."""
    width = max(len(ids) for ids in sequences)
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in sequences], device=device)
    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in sequences], device=device)
    return input_ids, attention


def generate_completions(
    model: Any,
    tokenizer: Any,
    user_prompts: list[str],
    *,
    num_samples: int = 1,
    max_new_tokens: int = 256,
    sampling: SamplingSettings = FULL_SOFTMAX,
    system_prompt: str | None = SYSTEM_PROMPT_UNIFIED,
    chat_template_kwargs: dict[str, Any] | None = None,
    batch_size: int = 8,
) -> list[list[RolloutCompletion]]:
    """Sample `num_samples` completions for each prompt with `model.generate`.

    `sampling` is passed whole (`SamplingSettings.hf_generate_kwargs`), so the checkpoint's
    generation_config cannot truncate the distribution behind the caller's back; temperature 0 is
    greedy (then all samples of a prompt are identical). Generation stops on the chat template's
    end-of-turn, the tokenizer's EOS and every EOS id of the model's generation config, as vLLM does.

    Returns one list of `RolloutCompletion`s per prompt. token_ids include the stop token when the
    model emitted one (finish_reason "stop"), and nothing after it; "length" means cut at max_new_tokens.
    """
    ends = {end_of_turn_id(tokenizer)} | generation_eos_ids(model)
    if tokenizer.eos_token_id is not None:
        ends.add(tokenizer.eos_token_id)
    device = next(model.parameters()).device
    kwargs = sampling.hf_generate_kwargs()
    results: list[list[RolloutCompletion]] = []
    for start in range(0, len(user_prompts), batch_size):
        chunk = user_prompts[start : start + batch_size]
        encoded = [encode_prompt(tokenizer, p, system_prompt, chat_template_kwargs) for p in chunk]
        input_ids, attention = left_padded(encoded, tokenizer.pad_token_id, device)
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            num_return_sequences=num_samples,
            eos_token_id=sorted(ends),
            pad_token_id=tokenizer.pad_token_id,
            **kwargs,
        )
        new_tokens = output[:, input_ids.shape[1] :].tolist()  # (len(chunk) * num_samples, <= max_new_tokens)
        for i, prompt_ids in enumerate(encoded):
            samples = []
            for row in new_tokens[i * num_samples : (i + 1) * num_samples]:
                stop_at = next((j for j, t in enumerate(row) if t in ends), None)
                ids = row[: stop_at + 1] if stop_at is not None else row
                text_ids = ids[:-1] if stop_at is not None else ids
                samples.append(
                    RolloutCompletion(
                        text=tokenizer.decode(text_ids, skip_special_tokens=True),
                        token_ids=tuple(ids),
                        prompt_ids=tuple(prompt_ids),
                        finish_reason="stop" if stop_at is not None else "length",
                    )
                )
            results.append(samples)
    return results


class HFRollout(SamplerBase):
    """The `Sampler` over transformers `generate` (the policy `sync` names is a transformers model, put in eval
    mode while it samples: no dropout)."""

    def __init__(
        self,
        tokenizer: Any,
        max_new_tokens: int,
        sampling: SamplingSettings,
        chat_template_kwargs: dict | None = None,
        *,
        batch_size: int = 8,
        sequences_per_call: int = 0,
    ) -> None:
        """batch_size: prompts per `generate` call of `sample`; each call holds batch_size x num_samples sequences.
        sequences_per_call: sequences per `generate` call of `continue_sequences` (every sequence one sample),
        normally batch_size x num_samples; 0: batch_size."""
        super().__init__(tokenizer, max_new_tokens, sampling, chat_template_kwargs)
        self.batch_size = batch_size
        self.sequences_per_call = sequences_per_call or batch_size
        self._was_training = False

    def sync(self, policy: Any, step: int) -> None:
        self.policy, self._was_training = policy, policy.training
        policy.eval()  # no dropout while sampling

    def release(self) -> None:
        if self.policy is not None:
            self.policy.train(self._was_training)

    def sample(self, prompts: list[str], num_samples: int, *, seed: int | None = None) -> list[list[RolloutCompletion]]:
        """`seed` is not used: transformers draws from the process's (seeded) torch generator."""
        return generate_completions(
            self.policy,
            self.tokenizer,
            prompts,
            num_samples=num_samples,
            max_new_tokens=self.max_new_tokens,
            sampling=self.sampling,
            chat_template_kwargs=self.chat_template_kwargs,
            batch_size=self.batch_size,
        )

    @torch.no_grad()
    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]:
        """Left-padded batches of `sequences_per_call`, each as long as its longest budget, every row cut at its
        own (`cut_continuation`); stops at the end of turn, the EOS ids and `stop_strings`."""
        tok, model = self.tokenizer, self.policy
        stops = sorted(set(stop_ids(tok)) | generation_eos_ids(model))
        device = next(model.parameters()).device
        sampling = self.sampling.hf_generate_kwargs()
        if stop_strings:
            sampling.update(stop_strings=list(stop_strings), tokenizer=tok)
        results: list[Continuation] = []
        for start in range(0, len(sequences), self.sequences_per_call):
            chunk = sequences[start : start + self.sequences_per_call]
            budgets = max_new_tokens[start : start + self.sequences_per_call]
            input_ids, attention = left_padded(chunk, tok.pad_token_id, device)
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=max(budgets),
                eos_token_id=stops,
                pad_token_id=tok.pad_token_id,
                **sampling,
            )
            for row, budget in zip(output[:, input_ids.shape[1] :].tolist(), budgets, strict=True):
                results.append(cut_continuation(tok, row, budget, stops, stop_strings))
        return results
