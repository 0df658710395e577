"""What a rollout backend returns per sample (`RolloutCompletion`), and the rules every backend
follows to build it.

Every backend (`rollouts.hf`, `rollouts.kv_sampler`, `rollouts.vllm_colocated`,
`rollouts.vllm_server`, and the multi-turn loop `rollouts.episodes`) returns, per prompt, a list of
`RolloutCompletion`s; the trainer, phase 4, `evaluation.solve` and the preflight read them by
attribute. The record is not written to a file itself: phase 4 caches what it needs of it as an
`evaluation.evaluate.CachedCompletion` line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from utils.sft_data import end_of_turn_id


@dataclass(frozen=True)
class MultiTurnInfo:
    """What a multi-turn episode (`rollouts.episodes`) adds to its completion.

    A nested record rather than optional fields on `RolloutCompletion`: a completion is either
    single-turn (`multi_turn is None`) or carries all of these together, so a consumer checks one
    field instead of guessing defaults for each (`num_turns` 1, `tool_calls` 0, ...), and the single-
    turn record every backend builds stays the five fields it always was.
    """

    mode: str  # "tool" or "feedback" (`multi_turn.mode`)
    # per policy turn, in order: {"text", "finish_reason", "observation", the environment's step info
    # ("tool_status" / "visible_passed"), and "feedback" when a feedback turn followed}. Plain rows,
    # not a record: their keys are the environment's, and phase 4's cache writes them as they are.
    turns: tuple[dict[str, Any], ...]
    answers: tuple[str, ...]  # feedback: each answer the policy gave; tool: the policy's own text alone
    transcript: str  # every policy turn with what the environment inserted, as text
    truncated: bool  # ended by a limit (tokens, turns), not by the policy: scored on its last answer
    tool_calls: int  # tool mode: programs the policy asked to run
    tool_successes: int  # tool mode: those that ran without an error

    @property
    def num_turns(self) -> int:
        return len(self.turns)


@dataclass(frozen=True)
class RolloutCompletion:
    """One sampled completion of one prompt.

    `token_ids` is everything after `prompt_ids`, ending with the stop token when the model stopped
    and nothing after it; in a multi-turn completion it also holds the environment's inserted
    tokens, marked 0 in `action_mask`.
    """

    # what the reward scores: the decoded completion without special tokens (multi-turn: `rollouts.episodes`)
    text: str
    token_ids: tuple[int, ...]
    prompt_ids: tuple[int, ...]  # the templated prompt the sample continues, unpadded
    finish_reason: str  # "stop": it ended its turn; "length": cut at the token budget
    logprobs: tuple[float, ...] | None = None  # the sampler's log-prob of each token id (vLLM, kv), else None
    action_mask: tuple[int, ...] | None = None  # per token id: 1 = sampled by the policy, 0 = inserted; None: all 1
    stop_string: str | None = None  # the kv sampler's `continue_ids`: the stop string it stopped at
    multi_turn: MultiTurnInfo | None = None
    # a guided sample: its first token ids are a teacher trace's answer prefix (marked 0 in `action_mask`); 0: none
    teacher_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("logprobs", "action_mask"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.token_ids):
                raise ValueError(
                    f"a rollout completion's {name} has {len(values)} entries for {len(self.token_ids)} tokens"
                )
        prefix = self.teacher_prefix_tokens
        if prefix and (self.action_mask is None or any(self.action_mask[:prefix]) or prefix > len(self.token_ids)):
            raise ValueError(f"a guided completion's {prefix} teacher prefix tokens must be marked 0 in action_mask")

    @property
    def num_tokens(self) -> int:
        """Tokens after the prompt (multi-turn: environment tokens included)."""
        return len(self.token_ids)

    @property
    def num_policy_tokens(self) -> int:
        """Tokens the policy sampled (what throughput and mean length count)."""
        return self.num_tokens if self.action_mask is None else sum(self.action_mask)

    @property
    def num_turns(self) -> int:
        return 1 if self.multi_turn is None else self.multi_turn.num_turns


def stop_ids(tokenizer: Any) -> list[int]:
    """Token ids that end a completion: the chat template's end-of-turn and the tokenizer's EOS."""
    return sorted({end_of_turn_id(tokenizer), tokenizer.eos_token_id} - {None})


def completion_record(
    token_ids: Sequence[int],
    finish_reason: str | None,
    text: str,
    prompt_ids: Sequence[int],
    end_ids: set[int],
    logprobs: Sequence[float] | None = None,
    stop_string: str | None = None,
) -> RolloutCompletion:
    """One sample from a vLLM completion (engine or server), trusting vLLM's token ids.

    vLLM keeps the token it stopped on (ours, or an EOS from the model's generation config) as the
    last id, so nothing is appended: a completion is exactly what the policy produced. Anything after
    a first end-of-turn id (never produced by vLLM, but a server may) is cut, so the trainer never
    scores tokens past the end of the turn. `stop_string`: the environment's stop string vLLM stopped on
    (its `stop_reason`, when a string), for a multi-turn continuation.
    """
    cut = next((i + 1 for i, t in enumerate(token_ids) if t in end_ids), len(token_ids))
    return RolloutCompletion(
        text=text,
        token_ids=tuple(token_ids[:cut]),
        prompt_ids=tuple(prompt_ids),
        finish_reason="stop" if finish_reason == "stop" or cut < len(token_ids) else "length",
        logprobs=None if logprobs is None else tuple(float(x) for x in logprobs[:cut]),
        stop_string=stop_string,
    )
