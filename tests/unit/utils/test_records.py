"""Typed records that cross modules or files: one frozen owner each, rows unchanged on disk."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from clients.openai_compat import TeacherResponse
from rollouts.completion import MultiTurnInfo, RolloutCompletion, completion_record
from sandbox.executor import ExecutionResult
from synthesis.generate_traces import (
    TeacherTrace,
    TraceTurn,
    build_record,
    latest_records,
    load_teacher_examples,
)
from utils.dataset_loader import EMBEDDED_MBPP, load_mbpp
from utils.jsonl import JsonlAppender
from utils.thinking_extraction import ParsedResponse, extract_thinking_and_code_unified

# Rows written by phase 2 before the record was typed (main at 9ede27c, build_record + the feedback fields),
# with the timestamp fixed: an answer that failed a test after two API errors, an api_error row, a feedback
# exchange of two turns. Non-ASCII text checks that the writer still writes UTF-8, not \u escapes.
GOLDEN_TRACE_ROWS = Path(__file__).resolve().parents[2] / "data" / "golden_trace_rows.jsonl"
TIMESTAMP = "2026-11-23T14:00:00+00:00"


def test_a_parsed_response_is_a_frozen_record_with_every_field():
    parsed = extract_thinking_and_code_unified("<think>plan</think>\n\n```python\nx = 1\n```")
    assert isinstance(parsed, ParsedResponse)
    assert [f.name for f in dataclasses.fields(parsed)] == [
        "thinking",
        "answer",
        "has_thinking",
        "think_closed",
        "thinking_source",
        "code",
        "has_code",
        "code_source",
        "num_code_blocks",
        "well_formed",  # whether the code compiles is the sandbox's verdict (ExecutionResult.compiles)
    ]
    assert (parsed.thinking, parsed.code, parsed.well_formed, parsed.code_source) == (
        "plan",
        "x = 1",
        True,
        "python_block",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.code = "import os"


def golden_records() -> list[TeacherTrace]:
    """The golden rows' records, built the way phase 2 builds them (`build_record`, then the feedback fields)."""
    task = load_mbpp(EMBEDDED_MBPP)[0][0]
    text = f"<think>plan — ünïcode</think>\n\n```python\n{task.reference_solutions[0]}\n```"
    usage = {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}
    parsed = extract_thinking_and_code_unified(text, "why")
    answer = build_record(
        task,
        0,
        "p",
        TeacherResponse(text, "why", "stop", usage, 0.51234),
        ExecutionResult(passed=False, tests_passed=2, tests_total=3, status="wrong_answer", error="assert failed"),
        parsed,
        "teacher-x",
        ["HTTP 500", "timeout"],
    )
    failure = build_record(
        task, 1, "p", TeacherResponse(None, error="HTTP 503", latency=1.0), None, None, "teacher-x", ["HTTP 500"]
    )
    turns = (
        TraceTurn("```python\nx = 0\n```", None, "assert f() == 1 failed: got 0", False),
        TraceTurn(text, "why", None, True),
    )
    feedback = build_record(
        task,
        2,
        "p",
        TeacherResponse(text, "why", "length", usage, 2.0),
        ExecutionResult(passed=True, tests_passed=3, tests_total=3, status="passed"),
        parsed,
        "teacher-x",
    )
    feedback = dataclasses.replace(feedback, mode="feedback", num_turns=2, turns=turns)
    return [dataclasses.replace(r, timestamp=TIMESTAMP) for r in (answer, failure, feedback)]


def test_trace_rows_are_written_byte_identically_to_the_untyped_writer(tmp_path):
    path = tmp_path / "traces.jsonl"
    with JsonlAppender(path) as out:  # phase 2's writer
        for record in golden_records():
            out.write(record.to_row())
    assert path.read_bytes() == GOLDEN_TRACE_ROWS.read_bytes()


def test_a_golden_row_round_trips_through_the_record():
    for line in GOLDEN_TRACE_ROWS.read_text(encoding="utf-8").splitlines():
        record = TeacherTrace.from_row(json.loads(line))
        assert json.dumps(record.to_row(), ensure_ascii=False) == line
    assert [TeacherTrace.from_row(json.loads(line)) for line in GOLDEN_TRACE_ROWS.read_text().splitlines()] == (
        golden_records()
    )


def test_the_readers_hand_phase_3_trace_records(tmp_path):
    answer, failure, feedback = golden_records()
    passed = dataclasses.replace(answer, passed=True, sample_idx=3)
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(r.to_row()) + "\n" for r in (answer, failure, feedback, passed)))
    assert latest_records(path) == {(answer.task_id, i): r for i, r in enumerate((answer, failure, feedback, passed))}
    assert load_teacher_examples(path, {answer.task_id}, True) == [feedback, passed]
    assert load_teacher_examples(path, {answer.task_id}, False) == [answer, feedback, passed]
    assert feedback.conversation() == [
        {"role": "assistant", "content": "```python\nx = 0\n```"},
        {"role": "user", "content": "assert f() == 1 failed: got 0"},
        {"role": "assistant", "content": feedback.turns[1].response},
    ]
    assert answer.conversation() is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        answer.code = "x"


def test_a_trace_row_with_messages_keeps_them_and_unknown_keys_are_ignored():
    messages = [
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "failed"},
        {"role": "assistant", "content": "b"},
    ]
    row = {"task_id": "a/1", "sample_idx": 0, "prompt": "p", "code": "x = 1", "passed": True, "messages": messages}
    trace = TeacherTrace.from_row({**row, "a_newer_field": 1})
    assert trace.conversation() == messages and trace.to_row()["messages"] == messages
    assert "a_newer_field" not in trace.to_row()
    single = TeacherTrace.from_row({**row, "messages": None, "turns": None, "mode": None})
    assert single.conversation() is None
    assert not {"messages", "turns", "mode", "num_turns"} & set(single.to_row())


# ----------------------------------------------------------------------------- phase 4's records

# Written by phase 4 before its records were typed (main at 9ede27c): the completion cache of a single-turn and a
# feedback-mode run, and the per-sample rows phase 4 wrote for them (`eval_samples.jsonl`, with the role first).
GOLDEN_EVAL = Path(__file__).resolve().parents[2] / "data" / "golden_eval"


def _scripted_single(code):
    def generate(prompts, n, tasks):
        samples = [  # placeholder token ids: the cache keeps only their number
            RolloutCompletion(f"<think>é</think>\n```python\n{code}\n```", (0,) * 7, (), "stop"),
            RolloutCompletion("no code", (0,) * 2, (), "length"),
        ]
        return [samples[:n] for _ in prompts]

    return generate


def _feedback_completion(code):
    """A multi-turn rollout completion (rollouts.episodes' shape): 30 tokens, 20 of them the policy's."""
    answers = ("```python\nx = 0\n```", f"```python\n{code}\n```")
    return RolloutCompletion(
        text=answers[1],
        token_ids=(0,) * 30,
        prompt_ids=(),
        finish_reason="stop",
        action_mask=(1,) * 20 + (0,) * 10,
        multi_turn=MultiTurnInfo(
            mode="feedback",
            turns=(
                {"text": answers[0], "finish_reason": "stop", "feedback": "no"},
                {"text": answers[1], "finish_reason": "stop"},
            ),
            answers=answers,
            transcript="t",
            truncated=False,
            tool_calls=0,
            tool_successes=0,
        ),
    )


def _scripted_feedback(code):
    def generate(prompts, n, tasks):
        return [[_feedback_completion(code) for _ in range(n)] for _ in prompts]

    return generate


def test_phase4_rows_are_written_byte_identically_to_the_untyped_writers(tmp_path):
    from evaluation.evaluate import execute_samples, generate_cached, write_samples
    from sandbox.executor import SandboxPool

    tasks = load_mbpp(EMBEDDED_MBPP)[0][:2]
    code = tasks[0].reference_solutions[0]
    single = generate_cached(tasks, _scripted_single(code), 2, cache_path=tmp_path / "single.jsonl", progress=False)
    feedback = generate_cached(
        tasks[:1], _scripted_feedback(code), 1, cache_path=tmp_path / "feedback.jsonl", progress=False, mode="feedback"
    )
    for name in ("single.jsonl", "feedback.jsonl"):
        assert (tmp_path / name).read_bytes() == (GOLDEN_EVAL / name).read_bytes()
    with SandboxPool(1) as pool:
        samples = execute_samples(tasks, single, 2, pool)
        samples += execute_samples(tasks[:1], feedback, 1, pool)
    write_samples(tmp_path / "samples.jsonl", [dataclasses.replace(s, model="trained") for s in samples])
    assert (tmp_path / "samples.jsonl").read_bytes() == (GOLDEN_EVAL / "samples.jsonl").read_bytes()
    assert samples[-1].answers_passed == (False, True) and samples[0].model is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        samples[0].passed = False


def test_phase4_rows_read_back_as_the_same_records(tmp_path):
    from evaluation.evaluate import read_cache, read_samples, write_samples

    for name in ("single.jsonl", "feedback.jsonl"):
        lines = (GOLDEN_EVAL / name).read_text(encoding="utf-8").splitlines()
        cache = read_cache(GOLDEN_EVAL / name)
        assert [json.dumps(record.to_row(), ensure_ascii=False) for record in cache.values()] == lines
    samples = read_samples(GOLDEN_EVAL / "samples.jsonl")
    assert [s.model for s in samples] == ["trained"] * 5 and samples[-1].num_turns == 2
    write_samples(tmp_path / "again.jsonl", samples)
    assert (tmp_path / "again.jsonl").read_bytes() == (GOLDEN_EVAL / "samples.jsonl").read_bytes()


# ----------------------------------------------------------------------------- the rollout completion


def test_a_rollout_completion_is_a_frozen_record_with_every_field():
    assert [f.name for f in dataclasses.fields(RolloutCompletion)] == [
        "text",
        "token_ids",
        "prompt_ids",
        "finish_reason",
        "logprobs",
        "action_mask",
        "stop_string",
        "multi_turn",
        "teacher_prefix_tokens",
    ]
    assert [f.name for f in dataclasses.fields(MultiTurnInfo)] == [
        "mode",
        "turns",
        "answers",
        "transcript",
        "truncated",
        "tool_calls",
        "tool_successes",
    ]
    # a vLLM completion that ran past an end-of-turn id (2) is cut after it, log-probs with it
    record = completion_record([5, 6, 2, 9], "length", "ab", [1], {2}, [-0.5, -1.0, -0.25, -3.0])
    assert record == RolloutCompletion("ab", (5, 6, 2), (1,), "stop", logprobs=(-0.5, -1.0, -0.25))
    assert record.num_tokens == record.num_policy_tokens == 3 and record.num_turns == 1 and record.multi_turn is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.text = "x"
    for name in ("logprobs", "action_mask"):  # one entry per token id, or the record refuses
        with pytest.raises(ValueError, match=name):
            RolloutCompletion("", (1, 2), (), "stop", **{name: (0,)})
    multi = _feedback_completion("x = 1")
    assert multi.num_tokens == 30 and multi.num_policy_tokens == 20 and multi.num_turns == 2


def test_a_completion_is_cached_as_the_row_its_untyped_dict_was_and_the_old_row_reads_back():
    from evaluation.evaluate import CachedCompletion

    [line] = (GOLDEN_EVAL / "feedback.jsonl").read_text(encoding="utf-8").splitlines()
    old = json.loads(line)  # written from the dict a multi-turn rollout returned before the record was typed
    completion = _feedback_completion(load_mbpp(EMBEDDED_MBPP)[0][0].reference_solutions[0])
    cached = CachedCompletion.from_sample(old["task_id"], old["sample_idx"], completion, old["prompt_sha256"])
    assert json.dumps(cached.to_row(), ensure_ascii=False) == line
    assert CachedCompletion.from_row(old) == cached
    single = RolloutCompletion("no code", (0, 0), (1,), "length", logprobs=(-1.0, -2.0), stop_string=None)
    row = CachedCompletion.from_sample("a/1", 3, single, "digest").to_row()
    assert row == {
        "task_id": "a/1",
        "sample_idx": 3,
        "completion": "no code",
        "num_tokens": 2,
        "finish_reason": "length",
        "prompt_sha256": "digest",
    }  # a single-turn completion: no multi-turn key, no token ids or log-probs in the cache


def test_phase4_multi_turn_statistics_read_the_judged_samples():
    from evaluation.evaluate import pass_rate_by_turn, read_samples, tool_statistics

    judged = read_samples(GOLDEN_EVAL / "samples.jsonl")[-1]  # the feedback sample: wrong, then right
    tool = dataclasses.replace(judged, mode="tool", tool_successes=1)
    samples = [
        dataclasses.replace(tool, tool_calls=2, truncated=False, answers_passed=(True,)),
        dataclasses.replace(tool, tool_calls=0, tool_successes=0, truncated=True, answers_passed=(False,)),
        dataclasses.replace(tool, tool_calls=None, tool_successes=None, truncated=None),  # fields it lacks count 0
    ]
    assert tool_statistics(samples) == {
        "calls_per_sample": 2 / 3,
        "samples_with_a_call": 1 / 3,
        "successful_call_share": 1 / 2,
        "truncated": 1 / 3,
    }
    # turn 1: right, wrong, wrong; turn 2: the first keeps its answer, the third is right now
    assert pass_rate_by_turn(samples, 2) == {"1": 1 / 3, "2": 2 / 3}
