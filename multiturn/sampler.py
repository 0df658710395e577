"""Multi-turn sampling for the phases: G samples per task through `run_episodes`, grouped per task.

`MultiTurnSampler.generate(model, prompts, num_samples, step, tasks)` returns what a single-turn
rollout's `generate` returns (one list of sample records per prompt), with the multi-turn fields
of `multiturn.loop` on every record. The backend is made per call from the model
(`backend_for(model)`), so the trainer's current weights (or the evaluated adapter) sample.

Also here: the optional reward terms of `multi_turn` (tool use, turn cost) and the per-turn
statistics phase 4 reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from multiturn.loop import ContinueBackend, Environment, run_episodes
from utils.dataset_loader import Task
from utils.sft_data import encode_prompt


class MultiTurnSampler:
    def __init__(
        self,
        backend_for: Callable[[Any], ContinueBackend],
        environment: Environment,
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
    ) -> list[list[dict]]:
        if tasks is None or len(tasks) != len(prompts):
            raise ValueError("multi-turn sampling needs the task of every prompt (the environment runs its tests)")
        ids = [encode_prompt(self.tokenizer, p, chat_template_kwargs=self.chat_template_kwargs) for p in prompts]
        flat_ids = [i for i in ids for _ in range(num_samples)]
        flat_tasks = [t for t in tasks for _ in range(num_samples)]
        records = run_episodes(
            self.backend_for(model),
            self.environment,
            self.tokenizer,
            flat_ids,
            flat_tasks,
            self.mode,
            self.max_new_tokens,
            self.max_total_tokens,
            self.chat_template_kwargs,
        )
        return [records[k * num_samples : (k + 1) * num_samples] for k in range(len(prompts))]


def shaping_reward(record: dict, tool_call_reward: float, tool_reward_cap: float, turn_cost: float) -> float:
    """The optional multi-turn reward terms of one sample (0 when off, and for single-turn records):
    + tool_call_reward per program that ran without error, at most tool_reward_cap in all;
    - turn_cost per extra turn (feedback: answers after the first; tool: programs asked for)."""
    mode = record.get("mode")
    if mode not in ("tool", "feedback"):
        return 0.0
    bonus = min(tool_call_reward * record.get("tool_successes", 0), tool_reward_cap) if mode == "tool" else 0.0
    extra_turns = record.get("tool_calls", 0) if mode == "tool" else max(record.get("num_turns", 1) - 1, 0)
    return bonus - turn_cost * extra_turns


def pass_rate_by_turn(rows: Sequence[dict], max_turns: int) -> dict[str, float]:
    """Share of samples whose answer after turn t passes all tests, t = 1..max_turns. A sample that
    stopped earlier keeps its last answer (`answers_passed`: one verdict per answer it gave)."""
    out = {}
    for turn in range(1, max_turns + 1):
        verdicts = [
            row["answers_passed"][min(turn, len(row["answers_passed"])) - 1]
            for row in rows
            if row.get("answers_passed")
        ]
        out[str(turn)] = sum(verdicts) / len(verdicts) if verdicts else 0.0
    return out


def tool_statistics(rows: Sequence[dict]) -> dict[str, float]:
    """How much the samples use the tool: calls per sample, share of samples with a call, calls that ran
    without error, share of samples truncated by a limit."""
    n = max(len(rows), 1)
    calls = sum(r.get("tool_calls", 0) for r in rows)
    return {
        "calls_per_sample": calls / n,
        "samples_with_a_call": sum(r.get("tool_calls", 0) > 0 for r in rows) / n,
        "successful_call_share": sum(r.get("tool_successes", 0) for r in rows) / max(calls, 1),
        "truncated": sum(bool(r.get("truncated")) for r in rows) / n,
    }
