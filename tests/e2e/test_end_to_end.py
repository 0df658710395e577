"""The four phase scripts through their real command lines, at the smallest sizes, in order.

The teacher is the fake OpenAI-compatible server (the real local teacher has its own slow test in
test_teacher.py) and the student the tiny random model, so this checks the wiring and every output
file's schema, not model quality; `make run` does the same with the real embedded model.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cli_helpers import TINY_STUDENT, cpu_argv, run_script
from tests.fake_openai_server import FakeTeacher, RunningServer
from utils.dataset_loader import read_tasks

RESULT_KEYS = {  # evaluation_results.json's top level
    "model",
    "timestamp",
    "eval_file",
    "config",
    "num_tasks",
    "num_samples_per_task",
    "num_samples_total",
    "pass_at_k",
    "not_computable_k",
    "pass_at_k_by_source",
    "pass_at_k_by_difficulty",
    "mean_pass_fraction",
    "format",
    "mean_completion_tokens",
    "status_counts",
    "baseline",
    "delta",
    "eval_set",
    "decoding",
    "samples",
    "pass_at_k_ci95",
    "pass_at_k_lenient",
    "pass_at_k_sanitized",
    "delta_ci95",
    "multi_turn",
    "untrusted_tasks",
    "no_hidden_test_tasks",
    "provenance",
}


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = run_script(*args, timeout=timeout)
    assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_four_phases_end_to_end(tmp_path):
    data, out = tmp_path / "data", tmp_path / "outputs"
    common = cpu_argv(sets=[f"paths.data_dir={data}", f"paths.output_dir={out}", TINY_STUDENT])

    run("phase1_prepare_data.py", *common)
    manifest = json.loads((data / "split_manifest.json").read_text())
    assert {"seed", "sources", "counts", "totals", "files"} <= set(manifest)
    train = read_tasks(data / "train.jsonl")
    assert len(train) == manifest["totals"]["train"] and read_tasks(data / "val.jsonl")

    answers = {t.problem.strip(): t.reference_solutions[0] for t in train}
    with RunningServer(FakeTeacher(answers=answers, shape="reasoning")) as server:
        run(
            "phase2_generate_teacher_traces.py",
            *common,
            "--api_url",
            server.url,
            "--model",
            "fake-teacher",
            "--max_tasks",
            "4",
            "--num_samples",
            "1",
        )
    traces = [json.loads(line) for line in (data / "teacher_traces.jsonl").read_text().splitlines()]
    assert len(traces) == 4 and all(t["passed"] for t in traces)
    stats = json.loads((data / "teacher_traces.stats.json").read_text())
    assert stats["total"] == 4 and stats["passed_tests"] == 4

    trained = run("phase3_train_grpo.py", *common, "--max_steps", "2", "--set", "grpo.max_new_tokens=8")
    assert "4 usable teacher traces" in trained.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("loss/teacher_sft" in r for r in rows)
    assert (out / "final_model" / "adapter_config.json").is_file() and (out / "training_curves.png").is_file()

    evaluate = (
        "phase4_evaluate.py",
        *common,
        "--model_path",
        str(out / "final_model"),
        "--baseline",
        "--max_tasks",
        "3",
        "--num_samples",
        "2",
        "--k",
        "1",
        "2",
        "5",
        "--max_new_tokens",
        "8",
    )
    evaluated = run(*evaluate)
    assert "Pass@k Results" in evaluated.stdout and "Delta (trained - baseline)" in evaluated.stdout
    assert "Baseline (adapter disabled)" in evaluated.stdout and "pass@  5: not computable" in evaluated.stdout
    assert "paired bootstrap over tasks" in evaluated.stdout
    result = json.loads((out / "evaluation_results.json").read_text())
    assert set(result) == RESULT_KEYS
    assert (
        result["model"]["adapter"].endswith("final_model") and result["model"]["base_model"] == "embedded:tiny-random"
    )
    assert (
        result["num_tasks"] == 3
        and result["num_samples_total"] == 6
        and result["num_samples_per_task"] == 2
        and set(result["pass_at_k"]) == {"1", "2", "5"}
        and result["pass_at_k"]["5"] is None  # 2 samples a task: pass@5 has no unbiased estimate
        and result["not_computable_k"] == [5]
    )
    assert set(result["baseline"]) >= {"pass_at_k", "format", "status_counts"}
    assert result["delta"]["1"] == pytest.approx(result["pass_at_k"]["1"] - result["baseline"]["pass_at_k"]["1"])
    low, high = result["delta_ci95"]["1"]
    assert low <= result["delta"]["1"] <= high and result["delta_ci95"]["5"] is None
    assert result["eval_set"]["name"] == "val" and result["eval_set"]["version"].startswith("phase-1 split, sha256:")
    assert result["decoding"].startswith("sampled at temperature")
    samples = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 12  # 3 tasks x 2 samples x (trained, baseline)
    assert {s["model"] for s in samples} == {"trained", "baseline"}
    assert {"task_id", "sample_idx", "completion", "code", "status", "passed"} <= set(samples[0])
    # the rerun finds every completion cached: nothing is generated again
    again = run(*evaluate)
    assert "generating:" not in again.stderr
