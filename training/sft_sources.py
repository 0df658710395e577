"""Where the SFT terms' examples come from: verified teacher traces and the student's own successes.

Teacher-SFT: every usable trace is tokenized once at start (`build_teacher_sft`); one that does not
fit `dual_source.sft_max_length` is dropped and counted, never cut. A single-turn trace trains on the
canonical target (thinking + code block); a multi-turn one (`TeacherTrace.conversation()`: the exchange
after the prompt) on the teacher's replies as sent, with the environment's tokens (tool results, feedback turns) as
context only (`utils.sft_data.encode_conversation`). Self-SFT: each group's best
passing sample that ended its own turn (`best_passing_sample`), de-duplicated, or, on a step without
one, recent successes replayed from a bounded `SuccessBuffer`. Both use `utils.sft_data`'s masking.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from config import DualSourceConfig
from training.rewards import ScoredSample
from utils.sft_data import build_sft_example, check_thinking_targets, encode_conversation, teacher_sft_ids

if TYPE_CHECKING:  # the record type only: phase 3 reads the trace file through synthesis.generate_traces
    from synthesis.generate_traces import TeacherTrace

# (prompt ids, completion ids, action mask or None = all policy tokens)
SuccessKey = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None]


def best_passing_sample(group: Sequence[ScoredSample]) -> ScoredSample | None:
    """Self-SFT pick: a sample that passed every graded test and ended its turn itself (finish_reason "stop":
    a completion cut at max_new_tokens is not a whole answer to imitate); ties go to the shortest. A sample
    without a correctness signal (its task's prompt shows every test, or no verdict) is never imitated, nor is a
    guided one (`training.guidance`: it began from a teacher's prefix, so it is not the student's own answer)."""
    passing = [
        s
        for s in group
        if s.result.passed
        and s.reward.correctness is not None
        and s.completion.finish_reason == "stop"
        and not s.completion.teacher_prefix_tokens
    ]
    return min(passing, key=lambda s: s.completion.num_tokens) if passing else None


class SuccessBuffer:
    """Recent self-SFT successes of this process, for steps without a fresh one.

    One entry per distinct (prompt ids, completion ids, action mask), most recent last, each with the number of
    replays it has left: an entry is replayed at most `max_replays` times after the step that found
    it (a fresh success of the same completion renews it), then dropped, so a few lucky samples are
    not imitated on every step until the next success.
    """

    def __init__(self, size: int, max_replays: int) -> None:
        self.size, self.max_replays = size, max_replays
        self.entries: OrderedDict[SuccessKey, int] = OrderedDict()

    def add(self, items: list[SuccessKey]) -> None:
        for key in items:
            self.entries.pop(key, None)
            if self.size > 0 and self.max_replays > 0:
                self.entries[key] = self.max_replays
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def replay(self, count: int) -> list[SuccessKey]:
        """Up to `count` of the most recent entries; each use spends one of its replays."""
        chosen = list(self.entries)[-count:] if count > 0 else []
        for key in chosen:
            self.entries[key] -= 1
            if self.entries[key] <= 0:
                del self.entries[key]
        return chosen

    def __len__(self) -> int:
        return len(self.entries)

    def state(self) -> list:
        """[prompt, completion, replays left] per entry, plus the action mask where the completion has one."""
        return [
            [list(p), list(c), left] + ([list(m)] if m is not None else []) for (p, c, m), left in self.entries.items()
        ]

    def load(self, state: list) -> None:
        self.entries = OrderedDict(
            ((tuple(p), tuple(c), tuple(rest[0]) if rest else None), left) for p, c, left, *rest in state
        )


def self_sft_examples(groups: Sequence[Sequence[ScoredSample]], buffer: SuccessBuffer, max_length: int) -> list[dict]:
    """This step's self-SFT examples: each group's best passing sample (de-duplicated), or, when no
    group has one, the most recent buffered successes that still have replays left."""
    fresh: list[SuccessKey] = []
    for group in groups:
        best = best_passing_sample(group)
        if best is None:
            continue
        # multi-turn: the action mask makes environment tokens context, never targets
        key = (best.completion.prompt_ids, best.completion.token_ids, best.completion.action_mask)
        if key not in fresh:
            fresh.append(key)
    buffer.add(fresh)
    chosen = fresh if fresh else buffer.replay(len(groups))
    return [e for e in (build_sft_example(p, c, max_length, m) for p, c, m in chosen) if e]


def max_scheduled_weight(section: Any, term: str) -> float:
    """The largest weight a scheduled SFT term (`teacher_sft` or `self_sft`) reaches in a run: its initial weight,
    or its final one when a schedule moves it there (a schedule may rise from 0)."""
    initial = getattr(section, f"{term}_weight")
    final = getattr(section, f"{term}_final_weight")
    return max(initial, final) if section.sft_weight_schedule != "constant" else initial


def build_teacher_sft(
    examples: list[TeacherTrace],
    tokenizer: Any,
    dual_source: DualSourceConfig,
    *,
    chat_template_kwargs: dict | None,
    rollout_budget: int,
) -> tuple[list[dict], dict]:
    """Tokenize every usable teacher trace once, with the student's `chat_template_kwargs`.
    A trace whose prompt + target does not fit `sft_max_length` is dropped and counted, never cut.
    Returns the examples and their statistics: the share dropped, and the share of kept targets longer than
    `rollout_budget` (grpo.max_new_tokens: a student imitating them could not finish within it)."""
    d = dual_source
    template = chat_template_kwargs
    if not examples or d.teacher_sft_batch_size <= 0 or max_scheduled_weight(d, "teacher_sft") <= 0:
        return [], {"teacher_sft/dropped_too_long": 0.0, "teacher_sft/over_rollout_budget": 0.0}
    check_thinking_targets(tokenizer, d.include_thinking, template)
    built, over_budget = [], 0
    for example in examples:
        conversation = example.conversation()
        if conversation:  # a multi-turn trace: the teacher's turns as sent, environment turns masked
            prompt_ids, response_ids, mask = encode_conversation(tokenizer, example.prompt, conversation, template)
        else:
            (prompt_ids, response_ids), mask = teacher_sft_ids(tokenizer, example, d.include_thinking, template), None
        sft = build_sft_example(prompt_ids, response_ids, d.sft_max_length, mask)
        if sft is not None:
            built.append(sft)
            over_budget += len(response_ids) > rollout_budget
    stats = {
        "teacher_sft/dropped_too_long": 1.0 - len(built) / len(examples),
        "teacher_sft/over_rollout_budget": over_budget / max(len(built), 1),
    }
    return built, stats
