"""`completions.jsonl`: every rollout sample phase 3 trains on, one line each, so a run's answers can be read.

An aggregate hides what the policy writes (a pass rate of 0 says nothing of whether the answers are programs);
this log keeps the text. One line per sample, written when its batch is made, in group order:
- `step`: the first optimizer step trained on the batch (a batch with `grpo.num_iterations` > 1 trains on more);
- `task_id`, `group` (the prompt's index in this process's share of the batch), `sample` (its index in the group);
- `text`: what the reward scored (the decoded completion; a guided sample's starts with the teacher's prefix);
- `finish_reason` ("stop": ended its turn; "length": cut at the budget), `tokens` (completion token ids);
- `reward` (the total; null: unscorable), `correctness`;
- `teacher_prefix_tokens`, `teacher_prefix`: a guided sample's teacher prefix (`training.guidance`): its token count
  and its text, which `text` starts with; 0 and "" for a sample the policy wrote alone.

Each process writes the share it trains on: `completions.jsonl` on the main process, `completions.rank<k>.jsonl`
on process k under `accelerate launch`. A resumed run keeps the lines of the steps its checkpoint holds and drops
the rest (they are sampled again), like metrics.jsonl. Off with `training.log_completions=false`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from training.rewards import ScoredSample
from utils.jsonl import read_jsonl, write_jsonl_atomic

Decode = Callable[[Sequence[int]], str]  # token ids -> text (the tokenizer's decode, special tokens skipped)


def completion_log_path(output_dir: Path, process_index: int) -> Path:
    """The file process `process_index` writes: completions.jsonl on the main process."""
    name = "completions.jsonl" if process_index == 0 else f"completions.rank{process_index}.jsonl"
    return output_dir / name


def completion_rows(groups: Sequence[Sequence[ScoredSample]], step: int, decode: Decode) -> list[dict]:
    """One row per sample of `groups` (G scored samples per prompt, in prompt order), trained from `step` on."""
    rows = []
    for g, group in enumerate(groups):
        for s, sample in enumerate(group):
            completion, reward = sample.completion, sample.reward
            prefix = completion.teacher_prefix_tokens
            rows.append(
                {
                    "step": step,
                    "task_id": sample.task.task_id,
                    "group": g,
                    "sample": s,
                    "text": completion.text,
                    "finish_reason": completion.finish_reason,
                    "tokens": len(completion.token_ids),
                    "reward": reward.total,
                    "correctness": reward.correctness,
                    "teacher_prefix_tokens": prefix,
                    "teacher_prefix": decode(completion.token_ids[:prefix]) if prefix else "",
                }
            )
    return rows


class CompletionLog:
    """This process's completions file (see the module docstring)."""

    def __init__(self, output_dir: str | Path, process_index: int, decode: Decode) -> None:
        self.path = completion_log_path(Path(output_dir), process_index)
        self.decode = decode

    def open(self, global_step: int) -> None:
        """Keep the lines of the steps up to `global_step` (a fresh run, step 0, starts a new file)."""
        if not self.path.exists():
            return
        kept = (
            []
            if global_step == 0
            else [row for row in read_jsonl(self.path, tolerate_torn_tail=True) if row.get("step", 0) <= global_step]
        )
        write_jsonl_atomic(self.path, kept)

    def write(self, groups: Sequence[Sequence[ScoredSample]], step: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            for row in completion_rows(groups, step, self.decode):
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
