"""The completions log (training.completion_log): one row per rollout sample with its text and a guided sample's
teacher prefix, one file per process, and a resumed run keeps only the steps its checkpoint holds."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rollouts.completion import RolloutCompletion
from training.completion_log import CompletionLog, completion_log_path, completion_rows
from training.rewards import Reward, ScoredSample

WORDS = {1: "def", 2: " f", 3: "():", 4: " return", 5: " 1"}


def decode(ids) -> str:
    return "".join(WORDS[i] for i in ids)


def sample(task_id: str, ids: tuple[int, ...], prefix: int, correctness: float | None, finish: str = "stop"):
    completion = RolloutCompletion(
        decode(ids),
        ids,
        (9, 9),
        finish,
        action_mask=(0,) * prefix + (1,) * (len(ids) - prefix) if prefix else None,
        teacher_prefix_tokens=prefix,
    )
    task: Any = SimpleNamespace(task_id=task_id)
    total = None if correctness is None else correctness + 0.1
    return ScoredSample(task, completion, None, None, Reward(total=total, correctness=correctness, format=1.0))  # type: ignore[arg-type]


def test_rows_keep_each_samples_text_reward_and_a_guided_samples_teacher_prefix():
    groups = [
        [sample("t/a", (1, 2, 3), 0, 0.0, "length"), sample("t/a", (1, 2, 3, 4, 5), 3, 1.0)],
        [sample("t/b", (4,), 0, None)],
    ]
    rows = completion_rows(groups, 7, decode)
    assert [(r["task_id"], r["group"], r["sample"], r["step"]) for r in rows] == [
        ("t/a", 0, 0, 7),
        ("t/a", 0, 1, 7),
        ("t/b", 1, 0, 7),
    ]
    plain, guided, unscorable = rows
    assert plain["text"] == "def f():" and plain["finish_reason"] == "length" and plain["tokens"] == 3
    assert plain["teacher_prefix_tokens"] == 0 and plain["teacher_prefix"] == ""
    assert plain["reward"] == 0.1 and plain["correctness"] == 0.0
    # the guided sample's text is prefix + what the policy wrote; the prefix is its first 3 token ids
    assert guided["teacher_prefix_tokens"] == 3 and guided["teacher_prefix"] == "def f():"
    assert guided["text"] == "def f(): return 1" and guided["text"].startswith(guided["teacher_prefix"])
    assert guided["correctness"] == 1.0 and guided["reward"] == 1.1
    assert unscorable["reward"] is None and unscorable["correctness"] is None


def test_each_process_writes_its_own_file():
    assert completion_log_path(Path("out"), 0) == Path("out/completions.jsonl")
    assert completion_log_path(Path("out"), 2) == Path("out/completions.rank2.jsonl")


def test_a_resumed_run_keeps_the_steps_its_checkpoint_holds_and_a_fresh_run_starts_over(tmp_path):
    log = CompletionLog(tmp_path, 0, decode)
    log.open(0)
    for step in (1, 2, 3):
        log.write([[sample("t/a", (1,), 0, 0.0)]], step)
    with log.path.open("a") as handle:
        handle.write('{"step": 4, "text": "torn')  # a crash mid-line
    log.open(2)  # resumed from checkpoint-2: steps 3 and 4 are sampled again
    assert [json.loads(line)["step"] for line in log.path.read_text().splitlines()] == [1, 2]
    log.write([[sample("t/a", (1,), 0, 0.0)]], 3)
    assert [json.loads(line)["step"] for line in log.path.read_text().splitlines()] == [1, 2, 3]
    log.open(0)
    assert log.path.read_text() == ""
