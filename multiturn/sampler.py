"""Multi-turn sampling for the phases: G samples per task through `run_episodes`, grouped per task.

`MultiTurnSampler.generate(model, prompts, num_samples, step, tasks)` returns what a single-turn
rollout's `generate` returns (one list of `RolloutCompletion`s per prompt), each with its action mask
and `MultiTurnInfo` (`multiturn.loop`). The backend is made per call from the model and the step
(`backend_for(model, step)`, see `multiturn.backends.continuer_for`), so the trainer's current
weights (or the evaluated adapter) sample; a backend with a `close()` is closed after the episodes.

Also here: the optional reward terms of `multi_turn` (tool use, turn cost). The per-turn statistics
phase 4 reports live with its record, in `evaluation.evaluate`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from multiturn.loop import ContinueBackend, Environment, run_episodes
from rollouts.completion import RolloutCompletion
from utils.dataset_loader import Task
from utils.sft_data import encode_prompt


class MultiTurnSampler:
    def __init__(
        self,
        backend_for: Callable[[Any, int], ContinueBackend],
        environment: Environment | None,  # None until attached: phase 4 attaches it once its sandbox pool runs
        tokenizer: Any,
        mode: str,
        max_new_tokens: int,
        max_total_tokens: int,
        chat_template_kwargs: dict | None = None,
    ) -> None:
        self.backend_for, self.environment, self.tokenizer = backend_for, environment, tokenizer
        self.mode, self.max_new_tokens, self.max_total_tokens = mode, max_new_tokens, max_total_tokens
        self.chat_template_kwargs = chat_template_kwargs

    def generate(
        self, model: Any, prompts: list[str], num_samples: int, step: int = 0, tasks: Sequence[Task] | None = None
    ) -> list[list[RolloutCompletion]]:
        if tasks is None or len(tasks) != len(prompts):
            raise ValueError("multi-turn sampling needs the task of every prompt (the environment runs its tests)")
        ids = [encode_prompt(self.tokenizer, p, chat_template_kwargs=self.chat_template_kwargs) for p in prompts]
        flat_ids = [i for i in ids for _ in range(num_samples)]
        flat_tasks = [t for t in tasks for _ in range(num_samples)]
        if self.environment is None:
            raise RuntimeError("the multi-turn sampler has no environment: attach one before sampling")
        backend = self.backend_for(model, step)
        try:
            records = run_episodes(
                backend,
                self.environment,
                self.tokenizer,
                flat_ids,
                flat_tasks,
                self.mode,
                self.max_new_tokens,
                self.max_total_tokens,
                self.chat_template_kwargs,
            )
        finally:
            close = getattr(backend, "close", None)
            if callable(close):
                close()
        return [records[k * num_samples : (k + 1) * num_samples] for k in range(len(prompts))]


def sample_groups(
    rollout: Any,
    multi_turn: MultiTurnSampler | None,
    model: Any,
    prompts: list[str],
    num_samples: int,
    *,
    step: int = 0,
    tasks: Sequence[Task] | None = None,
) -> list[list[RolloutCompletion]]:
    """`num_samples` samples per prompt, one list per prompt: through `multi_turn`'s episodes in a tool or feedback
    mode (`multi_turn_sampler`; its records carry the action mask), else single-turn from `rollout`."""
    if multi_turn is not None:
        return multi_turn.generate(model, prompts, num_samples, step, tasks)
    return rollout.generate(model, prompts, num_samples, step)


def multi_turn_sampler(
    config: Any,
    tokenizer: Any,
    rollout: Any,
    pool: Any = None,
    limits: Any = None,
    *,
    max_new_tokens: int | None = None,
) -> MultiTurnSampler | None:
    """The sampler of `multi_turn.mode` for phases 3 and 4 and `evaluation.solve` (None in single mode): the
    environment on `pool` (none yet without one: phase 4 attaches its own once its pool runs), the continuer of
    the single-turn `rollout` (`continuer_for`), each turn bounded by `max_new_tokens` (grpo's if None) and the
    sample by `multi_turn.max_total_tokens`."""
    mode = config.multi_turn.mode
    if mode == "single":
        return None
    from environments.code_env import make_environment
    from multiturn.backends import continuer_for
    from rollouts.from_config import chat_template_kwargs

    if rollout is None:
        raise ValueError(f"multi_turn.mode={mode} needs a rollout backend to continue its samples")
    return MultiTurnSampler(
        continuer_for(rollout),
        None
        if pool is None
        else make_environment(mode, pool, config.multi_turn, config.prompt.num_visible_tests, limits),
        tokenizer,
        mode,
        config.grpo.max_new_tokens if max_new_tokens is None else max_new_tokens,
        config.multi_turn.max_total_tokens,
        chat_template_kwargs(config),
    )


def multi_turn_metrics(
    records: Sequence[RolloutCompletion], passed: Sequence[bool], shaping: Sequence[float]
) -> dict[str, float]:
    """Phase 3's per-step multi-turn metrics: turns per sample, the share truncated by a limit (scored on
    their last answer), the share of passing samples that needed more than one turn, the share of the
    sequence the environment inserted, tool use, and the mean shaping term (single-turn records count
    as one turn, no tool call, nothing inserted)."""
    n = max(len(records), 1)
    tokens = max(sum(r.num_tokens for r in records), 1)
    infos = [r.multi_turn for r in records if r.multi_turn is not None]
    tool_calls = sum(i.tool_calls for i in infos)
    return {
        "multi_turn/turns_mean": sum(r.num_turns for r in records) / n,
        "multi_turn/truncated": sum(i.truncated for i in infos) / n,
        "multi_turn/passed_after_first_turn": sum(ok and r.num_turns > 1 for r, ok in zip(records, passed, strict=True))
        / n,
        "multi_turn/environment_token_share": 1.0
        - sum(sum(r.action_mask) for r in records if r.action_mask is not None) / tokens,
        "multi_turn/tool_calls_mean": tool_calls / n,
        "multi_turn/tool_success_share": sum(i.tool_successes for i in infos) / max(tool_calls, 1),
        "multi_turn/shaping_mean": sum(shaping) / n,
    }


def shaping_reward(
    record: RolloutCompletion, tool_call_reward: float, tool_reward_cap: float, turn_cost: float
) -> float:
    """The optional multi-turn reward terms of one sample (0 when off, and for single-turn records):
    + tool_call_reward per program that ran without error, at most tool_reward_cap in all;
    - turn_cost per extra turn (feedback: answers after the first; tool: programs asked for)."""
    info = record.multi_turn
    if info is None or info.mode not in ("tool", "feedback"):
        return 0.0
    tool = info.mode == "tool"
    bonus = min(tool_call_reward * info.tool_successes, tool_reward_cap) if tool else 0.0
    extra_turns = info.tool_calls if tool else max(info.num_turns - 1, 0)
    return bonus - turn_cost * extra_turns
