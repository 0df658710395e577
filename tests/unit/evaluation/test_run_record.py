"""Phase 4's run record: the completion cache key (an existing cache must still be found), the results record and
the printed report, each against values written out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import build_config, config_to_dict
from evaluation.eval_sets import EvalSet
from evaluation.evaluate import EvalSample
from evaluation.run_record import completion_cache_key, format_report, results_record
from tests.trainer_helpers import small_tasks

# (preset, overrides, shown tests, base key, adapter key) -> the key phase 4 filed its cache under before the key
# moved out of the phase script; a cache written then must still be found. A new config key that enters the
# multi-turn section changes the multi-turn rows (those caches are then regenerated, as intended).
PINNED_KEYS = [
    ("cpu", [], 1, "embedded:tiny-random", None, "5a11e144b7fb2480"),
    (
        "cpu",
        ["evaluation.backend=kv", "grpo.sampler_dtype=float32"],
        1,
        "0123456789abcdef",
        "fedcba9876543210",
        "832c8b470e936d90",
    ),
    (
        "cpu",
        ["evaluation.backend=hf", "evaluation.top_k=7", "evaluation.min_p=0.02"],
        0,
        "basekey",
        "adapterkey",
        "6543735d37b8376c",
    ),
    ("cpu", ["evaluation.backend=kv", "multi_turn.mode=feedback"], 2, "embedded:tiny-random", "aa", "38ad45361644e6ef"),
    (
        "gpu",
        ["evaluation.backend=vllm", "evaluation.repetition_penalty=1.05"],
        1,
        "Qwen/Qwen3-1.7B",
        "bb",
        "b5279238d0a7b7ce",
    ),
    (
        "gpu",
        ["evaluation.backend=vllm", "multi_turn.mode=tool", "student.enable_thinking=false"],
        1,
        "cc",
        None,
        "1852ad36be299d38",
    ),
]


@pytest.mark.parametrize(("preset", "overrides", "shown", "base", "adapter", "key"), PINNED_KEYS)
def test_the_cache_key_of_a_fixed_config_is_the_one_existing_caches_are_filed_under(
    preset, overrides, shown, base, adapter, key
):
    config = build_config(preset, overrides=overrides)
    assert completion_cache_key(config, visible_tests=shown, base=base, adapter=adapter) == key


def test_every_sampling_setting_and_model_part_changes_the_key():
    config = build_config("cpu", overrides=["evaluation.backend=kv"])

    def key(overrides=(), shown=1, base="b", adapter="a"):
        changed = build_config("cpu", overrides=["evaluation.backend=kv", *overrides])
        return completion_cache_key(changed, visible_tests=shown, base=base, adapter=adapter)

    same = completion_cache_key(config, visible_tests=1, base="b", adapter="a")
    assert key() == same
    variants = [
        key(["evaluation.temperature=0.5"]),
        key(["evaluation.top_p=0.5"]),
        key(["evaluation.max_new_tokens=7"]),
        key(["evaluation.top_k=3"]),
        key(["grpo.sampler_dtype=float32"]),
        key(["evaluation.backend=hf"]),
        key(["student.torch_dtype=bfloat16"]),
        key(["multi_turn.mode=tool"]),
        key(shown=0),
        key(base="c"),
        key(adapter=None),
    ]
    assert len({same, *variants}) == len(variants) + 1
    # the kv sampler's dtype is no setting of the other backends: their caches keep one key across it
    assert key(["evaluation.backend=hf", "grpo.sampler_dtype=float32"]) == key(["evaluation.backend=hf"])


def _row(task_id: str, role: str, passed: bool) -> EvalSample:
    return EvalSample(
        task_id, "mbpp", "basic", 0, "c", 5, "stop", "", "x = 1", True, True, True, passed,
        "passed" if passed else "failed", int(passed), 1, float(passed), None, model=role,
    )  # fmt: skip


def _eval_set(tasks, visible_tests: int) -> EvalSet:
    return EvalSet("file", "sha256:0123", "/data/eval.jsonl", tuple(tasks), visible_tests)


def test_the_results_record_of_a_trained_model_and_its_baseline():
    config = build_config("cpu", overrides=["evaluation.k_values=[1]", "evaluation.temperature=0"])
    tasks = small_tasks(3)
    evaluated = tasks[:2]  # --max_tasks 2: an incomplete set
    trained = {"num_tasks": 2, "pass_at_k": {"1": 1.0}, "status_counts": {"passed": 2}}
    baseline = {"num_tasks": 2, "pass_at_k": {"1": 0.0}, "status_counts": {"failed": 2}}
    rows = [_row(t.task_id, "trained", True) for t in evaluated] + [
        _row(t.task_id, "baseline", False) for t in evaluated
    ]
    record = results_record(
        config,
        model_path="runs/a/final_model",
        base_name="embedded:tiny-random",
        adapter=Path("runs/a/final_model"),
        eval_set=_eval_set(tasks, 3),
        tasks=evaluated,
        summaries={"trained": trained, "baseline": baseline},
        rows=rows,
        timestamp="2026-01-02T03:04:05+00:00",
        provenance={"git_commit": "abc"},
    )
    assert record == {
        "model": {"path": "runs/a/final_model", "base_model": "embedded:tiny-random", "adapter": "runs/a/final_model"},
        "timestamp": "2026-01-02T03:04:05+00:00",
        "eval_file": "/data/eval.jsonl",
        "eval_set": {
            "name": "file",
            "version": "sha256:0123",
            "origin": "/data/eval.jsonl",
            "num_tasks": 2,
            "visible_tests": 3,
            "complete": False,
        },
        "decoding": f"greedy, {config.evaluation.num_samples} identical samples per task",
        "samples": {"per_task": config.evaluation.num_samples, "total": 2 * config.evaluation.num_samples},
        "untrusted_tasks": [],
        "no_hidden_test_tasks": ["mbpp/9001", "mbpp/9002"],  # 3 shown of their 3 tests
        "config": config_to_dict(config),
        "provenance": {"git_commit": "abc"},
        "num_tasks": 2,
        "pass_at_k": {"1": 1.0},
        "status_counts": {"passed": 2},
        "baseline": baseline,
        "delta": {"1": 1.0},
        "delta_ci95": {"1": [1.0, 1.0]},  # every resampled task differs by 1
    }
    # the JSON's key order is part of its bytes: the record's keys, then the summary's
    assert list(record)[:13] == [
        "model",
        "timestamp",
        "eval_file",
        "eval_set",
        "decoding",
        "samples",
        "untrusted_tasks",
        "no_hidden_test_tasks",
        "config",
        "provenance",
        "num_tasks",
        "pass_at_k",
        "status_counts",
    ]


def test_a_model_evaluated_alone_has_no_baseline_or_delta():
    config = build_config("cpu")
    tasks = small_tasks(2)
    record = results_record(
        config,
        model_path="embedded:tiny-random",
        base_name="embedded:tiny-random",
        adapter=None,
        eval_set=_eval_set(tasks, 1),
        tasks=tasks,
        summaries={"model": {"pass_at_k": {"1": 0.5}}},
        rows=[_row(t.task_id, "model", i == 0) for i, t in enumerate(tasks)],
        timestamp="t",
        provenance={},
    )
    assert record["model"]["adapter"] is None and record["eval_set"]["complete"] is True
    assert (record["baseline"], record["delta"], record["delta_ci95"]) == (None, None, None)
    assert record["pass_at_k"] == {"1": 0.5} and record["no_hidden_test_tasks"] == []


BAR = "=" * 70


def _summary(pass_1: float | None, lenient_1: float | None) -> dict:
    return {
        "pass_at_k": {"1": pass_1, "4": None},
        "pass_at_k_ci95": {"1": [0.25, 0.75], "4": None},
        "pass_at_k_lenient": {"1": lenient_1, "4": None},
        "pass_at_k_sanitized": {"1": None if pass_1 is None else pass_1 + 0.125, "4": None},
        "format": {
            "closed_thinking": 0.5,
            "extractable_code": 0.75,
            "no_code": 0.25,
            "valid_python": 0.625,
            "truncated": 0.375,
        },
        "mean_completion_tokens": 99.6,
        "multi_turn": None,
    }


def test_the_report_of_a_trained_model_with_its_baseline():
    result = {
        "eval_set": {"name": "val", "num_tasks": 4},
        "decoding": "greedy, 1 sample per task",
        **_summary(0.5, 0.625),
        "baseline": _summary(0.25, 0.25),
        "delta": {"1": 0.25, "4": None},
        "delta_ci95": {"1": [-0.125, 0.5], "4": None},
        "untrusted_tasks": ["mbpp/1"],
        "no_hidden_test_tasks": ["mbpp/2", "mbpp/3"],
    }
    assert format_report(result).splitlines() == [
        BAR,
        "Pass@k Results (val, 4 tasks, greedy, 1 sample per task):",
        BAR,
        "pass@  1: 0.5000 (50.00%)  95% CI [0.2500, 0.7500]",
        "pass@  4: not computable (needs >= 4 samples per task)",
        BAR,
        BAR,
        "Baseline (adapter disabled): val, 4 tasks, greedy, 1 sample per task:",
        BAR,
        "pass@  1: 0.2500 (25.00%)  95% CI [0.2500, 0.7500]",
        "pass@  4: not computable (needs >= 4 samples per task)",
        BAR,
        "Delta (trained - baseline), paired bootstrap over tasks:",
        "  pass@  1: +0.2500  95% CI [-0.1250, +0.5000]",
        "  pass@  4: n/a",
        "format: closed thinking 50.0%, code 75.0% (no code 25.0%), valid Python 62.5%; mean completion tokens 100; "
        "ended by the token budget 37.5%",
        "pass@1 strict 0.5000, lenient 0.6250 (code inside an unclosed <think> counted)",
        "pass@1 strict 0.5000, sanitized 0.6250 (EvalPlus-style: the entry point and the definitions it uses, "
        "top-level calls, asserts and prints dropped)",
        "1 tasks have a test judged inside the program's process (untrusted_tasks)",
        "2 tasks show every test in the prompt (no_hidden_test_tasks): a pass there is no evidence of solving",
    ]


def test_the_report_of_a_model_alone_leaves_out_what_did_not_run():
    result = {
        "eval_set": {"name": "humaneval", "num_tasks": 164},
        "decoding": "greedy, 1 sample per task",
        **_summary(None, None),
        "multi_turn": {"pass_rate_by_turn": {"1": 0.25, "2": 0.5}, "mean_turns": 1.5, "truncated": 0.0},
        "baseline": None,
        "untrusted_tasks": [],
        "no_hidden_test_tasks": [],
    }
    lines = format_report(result).splitlines()
    assert lines[3] == "pass@  1: not computable (needs >= 1 samples per task)"
    assert lines[6].startswith("pass rate after each turn: turn 1: 25.0%, turn 2: 50.0%; mean turns 1.50")
    assert not any("Baseline" in line or "Delta" in line or "strict" in line for line in lines)
    assert lines[-1].startswith("format: closed thinking 50.0%")
