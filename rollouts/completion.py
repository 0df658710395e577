"""What a rollout backend returns per sample, and the rules every backend follows to build it.

Every backend returns, per prompt, a list of completions: `text`, `token_ids` (ending with the stop
token when the model stopped), `prompt_ids`, `finish_reason` ("stop" or "length") and `num_tokens`;
samplers that report log-probs (vLLM) add `logprobs`, the sampler's log-prob of each token.
"""

from __future__ import annotations

from typing import Any

from utils.sft_data import end_of_turn_id


def stop_ids(tokenizer: Any) -> list[int]:
    """Token ids that end a completion: the chat template's end-of-turn and the tokenizer's EOS."""
    return sorted({end_of_turn_id(tokenizer), tokenizer.eos_token_id} - {None})


def completion_record(
    token_ids: list[int],
    finish_reason: str | None,
    text: str,
    prompt_ids: list[int],
    end_ids: set[int],
    logprobs: list[float] | None = None,
) -> dict:
    """One sample from a vLLM completion, trusting vLLM's token ids.

    vLLM keeps the token it stopped on (ours, or an EOS from the model's generation config) as the
    last id, so nothing is appended: a completion is exactly what the policy produced. Anything after
    a first end-of-turn id (never produced by vLLM, but a server may) is cut, so the trainer never
    scores tokens past the end of the turn.
    """
    cut = next((i + 1 for i, t in enumerate(token_ids) if t in end_ids), len(token_ids))
    ids = list(token_ids[:cut])
    record = {
        "text": text,
        "token_ids": ids,
        "prompt_ids": prompt_ids,
        "finish_reason": "stop" if finish_reason == "stop" or cut < len(token_ids) else "length",
        "num_tokens": len(ids),
    }
    if logprobs is not None:
        record["logprobs"] = [float(x) for x in logprobs[:cut]]
    return record
