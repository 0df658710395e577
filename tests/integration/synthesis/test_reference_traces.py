"""The reference-solution teacher (phase 2 --teacher references): verified in the sandbox, failing references
dropped, phase 2's record format, and phase 3's teacher-SFT trains on the result."""

from __future__ import annotations

import json

import pytest
import torch

from synthesis.generate_traces import TeacherTrace, latest_records, load_teacher_examples
from synthesis.reference_traces import (
    REFERENCE_TEACHER,
    MixedTraceFile,
    reference_thinking,
    signature_of,
    write_reference_traces,
)
from tests.task_factory import assert_task, stdin_task
from utils.thinking_extraction import extract_thinking_and_code_unified


def _tasks():
    return [
        assert_task("t/1", "add", "assert add(1, 2) == 3", reference_solutions=("def add(a, b):\r\n    return a + b",)),
        assert_task("t/2", "sub", "assert sub(3, 1) == 2", reference_solutions=("def sub(a, b):\n    return a + b",)),
        assert_task("t/3", "mul", "assert mul(2, 2) == 4"),  # no reference at all
        stdin_task("t/4", ("2 3\n", "5\n"), reference_solutions=("a, b = map(int, input().split())\nprint(a + b)",)),
    ]


def test_a_failing_reference_is_dropped_and_the_rest_are_phase2_records(tmp_path, pool):
    out = tmp_path / "traces.jsonl"
    stats = write_reference_traces(_tasks(), out, 4, pool=pool, visible_tests=1, progress=False)
    assert (stats.passed, stats.dropped, stats.without_reference, stats.candidates) == (2, 1, 1, 3)
    assert len(stats.dropped_examples) == 1 and stats.dropped_examples[0].startswith("t/2#0: ")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["t/1", "t/4"]  # the failing sub is not written at all
    for row in rows:  # phase 2's exact record: the same keys, in the same order, and it reads back unchanged
        trace = TeacherTrace.from_row(row)
        assert list(row) == list(trace.to_row()) and trace.to_row() == row
        assert trace.passed and trace.teacher_model == REFERENCE_TEACHER and trace.status == "passed"
        parsed = extract_thinking_and_code_unified(trace.response)
        assert parsed.think_closed and parsed.code == trace.code and parsed.thinking == trace.thinking
    add = TeacherTrace.from_row(rows[0])
    assert "\r" not in add.code and "`add(a, b)`" in add.thinking  # CRLF normalized; facts only
    assert "standard input" in TeacherTrace.from_row(rows[1]).thinking
    # phase 3's reader takes them as any teacher's traces
    usable = load_teacher_examples(out, {"t/1", "t/2", "t/3", "t/4"}, only_passed=True)
    assert sorted(t.task_id for t in usable) == ["t/1", "t/4"]


def test_a_rerun_skips_what_is_there_and_a_model_teachers_file_is_refused(tmp_path, pool):
    out = tmp_path / "traces.jsonl"
    write_reference_traces(_tasks(), out, 1, pool=pool, visible_tests=1, progress=False)
    again = write_reference_traces(_tasks(), out, 1, pool=pool, visible_tests=1, progress=False)
    assert (again.skipped_existing, again.candidates, again.passed) == (2, 1, 0)  # only the failing one re-runs
    assert len(out.read_text().splitlines()) == 2
    theirs = tmp_path / "model.jsonl"
    theirs.write_text(json.dumps(TeacherTrace("t/1", 0, "p", teacher_model="Qwen/Qwen3-32B").to_row()) + "\n")
    with pytest.raises(MixedTraceFile, match="Qwen3-32B"):
        write_reference_traces(_tasks(), theirs, 1, pool=pool, visible_tests=1, progress=False)
    write_reference_traces(_tasks(), theirs, 1, pool=pool, visible_tests=1, overwrite=True, progress=False)
    assert {r.teacher_model for r in latest_records(theirs).values()} == {REFERENCE_TEACHER}


def test_thinking_modes_state_only_facts():
    task = _tasks()[0]
    assert reference_thinking(task, "def add(a, b, *rest):\n    return a", "none") == ""
    assert signature_of("x = 1\ndef helper(q):\n    pass\ndef add(a, b, *rest):\n    pass", "add") == "add(a, b, *rest)"
    assert signature_of("def (", "add") is None
    with pytest.raises(ValueError, match="short, none"):
        reference_thinking(task, "", "long")


def test_phase2_references_feed_phase3_teacher_sft(tmp_path, pool):
    """Phase 2's entry point with teacher.source=references writes the file; phase 3's trainer (teacher-SFT
    only) loads it through its own reader and its adapter moves on it."""
    import phase2_generate_teacher_traces as phase2
    from tests.trainer_helpers import ScriptedRollout, lora_state, small_tasks, tiny_config
    from training.grpo_trainer import GRPOTrainer
    from training.setup import build_run
    from utils.dataset_loader import write_tasks
    from utils.student_model import attach_lora, load_student

    tasks = small_tasks(4)
    train_file = tmp_path / "train.jsonl"
    write_tasks(train_file, tasks)
    config = tiny_config(
        tmp_path / "out",
        **{
            "teacher.source": "references",
            "teacher.max_tasks": 0,
            "sandbox.max_workers": 1,
            "dual_source.grpo_weight": 0,
            "dual_source.self_sft_weight": 0,
            "dual_source.teacher_sft_weight": 1,
            "training.max_steps": 1,
        },
    )
    traces = tmp_path / "traces.jsonl"
    result = phase2.main(config, train_file, traces)
    assert result["passed"] == 4 and result["dropped"] == 0 and phase2.exit_status(result) == 0
    assert json.loads(traces.with_suffix(".stats.json").read_text())["teacher_model"] == REFERENCE_TEACHER
    examples = load_teacher_examples(traces, {t.task_id for t in tasks}, config.dual_source.teacher_sft_only_passed)
    torch.manual_seed(0)
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    model = attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules)
    parts = build_run(
        config,
        tasks=tasks,
        teacher_examples=examples,
        output_dir=tmp_path / "out",
        model=model,
        tokenizer=tokenizer,
        rollout=ScriptedRollout(tokenizer, {t.problem: t for t in tasks}),
        pool=pool,
    )
    trainer = GRPOTrainer(parts)
    before = lora_state(trainer.model)
    metrics = trainer.train_on_rollouts(*trainer.collect_rollouts())[0]
    assert metrics["teacher_sft/pool"] == 4 and metrics["loss/teacher_sft"] > 0
    after = lora_state(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
