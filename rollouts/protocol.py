"""What every sampler is: the protocol of the four backends (`rollouts.hf`, `rollouts.kv_sampler`,
`rollouts.vllm_colocated`, `rollouts.vllm_server`) and of the scripted policies of the preflight and tests.

    sync(policy, step)        point the sampler at the policy to sample (the trainer's model at an optimizer
                              step, an evaluated model, a vLLM `LoRARequest`, None for vLLM's base model)
    sample(prompts, n, seed)  n completions of each prompt (its first turn), grouped per prompt
    continue_sequences(sequences, max_new_tokens, stop_strings)
                              one continuation of each token-id sequence (a multi-turn conversation so far)
    release()                 give back what sampling held (vLLM: prune old adapter folders, sleep)
    policy_for(adapter, model=, name=)
                              what `sync` takes to sample `adapter` (a LoRA adapter folder; None: the base
                              model): the transformers samplers sample `model` itself, which carries the
                              adapter already; phase 4's vLLM engine holds its own weights and takes a
                              `LoRARequest` for the folder (None for the base model)
    close()                   end the sampler: what it holds for the whole run (the server backend unloads its
                              last adapter and closes its connections); a no-op where it holds nothing

`rollouts.groups.sample_groups` is the one caller: sync, then one turn (`sample`) or whole episodes
(`rollouts.episodes.run_episodes` over `continue_sequences`), then release. A sampler is built by
`rollouts.from_config.build_sampler`.

A sampler that also loads adapters published by another thread is an `AdapterPublisher` (the server backend):
asynchronous rollouts need one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rollouts.completion import RolloutCompletion
from rollouts.sampling import FULL_SOFTMAX, SamplingSettings
from utils.sft_data import encode_prompt


@dataclass
class Continuation:
    """What a sampler returns for one continued sequence."""

    token_ids: list[int]  # new ids as sampled; an end-of-turn id the policy stopped on is the last one
    text: str  # their text, special tokens left out
    finish_reason: str  # "stop" (end-of-turn id), "stop_string" (an environment stop string), "length"
    logprobs: list[float] | None = None  # the sampler's log-prob of each new id (vLLM, kv)

    @classmethod
    def from_record(cls, record: RolloutCompletion) -> Continuation:
        """A completion record read as a continuation (its stop string, if any, is the finish reason)."""
        finish = "stop_string" if record.stop_string else record.finish_reason
        logprobs = list(record.logprobs) if record.logprobs is not None else None
        return cls(list(record.token_ids), record.text, finish, logprobs)


class Sampler(Protocol):
    tokenizer: Any
    max_new_tokens: int  # tokens of one sampled turn

    def encode(self, prompt: str) -> list[int]: ...

    def sync(self, policy: Any, step: int) -> None: ...

    def sample(
        self, prompts: list[str], num_samples: int, *, seed: int | None = None
    ) -> list[list[RolloutCompletion]]: ...

    def continue_sequences(
        self, sequences: list[list[int]], max_new_tokens: list[int], stop_strings: tuple[str, ...]
    ) -> list[Continuation]: ...

    def release(self) -> None: ...

    def policy_for(self, adapter: Path | None, *, model: Any = None, name: str = "adapter") -> Any: ...

    def close(self) -> None: ...


@runtime_checkable
class AdapterPublisher(Protocol):
    """A sampler that samples adapters the trainer publishes while it keeps training."""

    def publish_adapter(self, model: Any, step: int) -> None:
        """On the trainer's thread, which owns the weights: write the adapter of optimizer step `step`."""
        ...

    def load_adapter(self, step: int) -> None:
        """On the sampling thread: sample from the adapter published at `step` from now on."""
        ...


class SamplerBase:
    """What every sampler shares: its tokenizer, turn budget and sampling settings, how it renders a prompt (the
    unified system prompt and the chat template with `chat_template_kwargs`), a `sync` that only remembers the
    policy, a `policy_for` that is the model it is given, and a `release` and `close` that hold nothing."""

    policy: Any = None  # what `sync` pointed the sampler at

    def __init__(
        self,
        tokenizer: Any,
        max_new_tokens: int,
        sampling: SamplingSettings = FULL_SOFTMAX,
        chat_template_kwargs: dict | None = None,
    ) -> None:
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        self.sampling, self.chat_template_kwargs = sampling, chat_template_kwargs

    def encode(self, prompt: str) -> list[int]:
        """The templated prompt's ids, as every phase renders it."""
        return encode_prompt(self.tokenizer, prompt, chat_template_kwargs=self.chat_template_kwargs)

    def sync(self, policy: Any, step: int) -> None:
        self.policy = policy

    def release(self) -> None:
        return None

    def policy_for(self, adapter: Path | None, *, model: Any = None, name: str = "adapter") -> Any:
        """`model` itself: a sampler that samples the model object it is synced with takes the adapter attached to
        it (`utils.student_model.load_adapter`), and the base model with no adapter, or inside the adapter's
        `disable_adapter()`. `name` names the adapter where the engine keeps its own copy (vLLM)."""
        if adapter is not None and model is None:
            raise ValueError(
                f"{type(self).__name__} samples the model object it is synced with: pass the model that carries "
                f"the adapter {adapter} (model=...)"
            )
        return model

    def close(self) -> None:
        return None


def cut_continuation(
    tokenizer: Any, ids: Sequence[int], budget: int, stop_ids: Sequence[int], stop_strings: Sequence[str]
) -> Continuation:
    """The continuation a sampler should return for raw sampled `ids` (which may run past a stop: a
    batch keeps sampling other rows, and finished rows are padded)."""
    stops = set(stop_ids)
    last_chars = {s[-1] for s in stop_strings if s}
    for j, token in enumerate(ids[:budget]):
        if token in stops:
            kept = list(ids[: j + 1])
            return Continuation(kept, tokenizer.decode(kept[:-1], skip_special_tokens=True), "stop")
        if stop_strings and any(c in tokenizer.decode([token]) for c in last_chars):
            kept = list(ids[: j + 1])
            text = tokenizer.decode(kept, skip_special_tokens=True)
            if any(s in text for s in stop_strings):
                return Continuation(kept, text, "stop_string")
    kept = list(ids[:budget])
    return Continuation(kept, tokenizer.decode(kept, skip_special_tokens=True), "length")
