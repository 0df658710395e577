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

    evaluated = run(
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
        "--max_new_tokens",
        "8",
    )
    assert "Pass@k Results" in evaluated.stdout and "Delta (trained - baseline)" in evaluated.stdout
    result = json.loads((out / "evaluation_results.json").read_text())
    assert (
        result["num_tasks"] == 3
        and result["num_samples_total"] == 6
        and result["num_samples_per_task"] == 2
        and set(result["pass_at_k"]) == {"1", "2"}
    )
    assert result["baseline"] is not None and set(result["delta"]) == {"1", "2"}
    samples = (out / "eval_samples.jsonl").read_text().splitlines()
    assert len(samples) == 12  # 3 tasks x 2 samples x (trained, baseline)
