"""The held-out learning harness (experiments/learning_heldout) at toy size: standard split, verified
reference traces, the report's fields, the power analysis, the chart, and a rerun that redoes nothing."""

from __future__ import annotations

import json

import pytest

from experiments.learning_heldout import run as harness
from tests.conftest import ROOT


def _mbpp_row(task_id: int, name: str, body: str, tests: list[str]) -> dict:
    return {
        "text": f"Write a function {name}.",
        "code": f"def {name}(a, b):\r\n    return {body}",
        "task_id": task_id,
        "test_setup_code": "",
        "test_list": tests,
        "challenge_test_list": [],
    }


def _mini_mbpp(path):
    rows = [
        _mbpp_row(11, "add", "a + b", ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(2, 2) == 4"]),
        _mbpp_row(12, "sub", "a - b", ["assert sub(3, 1) == 2", "assert sub(1, 1) == 0", "assert sub(5, 0) == 5"]),
        _mbpp_row(601, "mul", "a * b", ["assert mul(2, 3) == 6", "assert mul(0, 5) == 0", "assert mul(1, 1) == 1"]),
        # a wrong reference in the training split: the reference teacher drops it
        _mbpp_row(602, "mx", "a + b", ["assert mx(1, 2) == 2", "assert mx(5, 3) == 5", "assert mx(0, 0) == 0"]),
        _mbpp_row(603, "mn", "min(a, b)", ["assert mn(1, 2) == 1", "assert mn(5, 3) == 3", "assert mn(0, 0) == 0"]),
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_ks_are_powers_of_two_up_to_the_samples():
    assert harness.ks_for(8) == [1, 2, 4, 8] and harness.ks_for(6) == [1, 2, 4, 6] and harness.ks_for(2) == [1, 2]


@pytest.mark.slow
def test_toy_experiment_reports_every_field_and_resumes_without_redoing_anything(tmp_path):
    sizes = "--steps 1 --samples 2 --max_new_tokens 8 --eval_max_new_tokens 8 --model embedded:tiny-random"
    folders = ["--output_dir", str(tmp_path / "out"), "--results_dir", str(tmp_path / "results")]
    argv = ["--mbpp_path", str(_mini_mbpp(tmp_path / "mbpp.jsonl")), *sizes.split(), "--variants", "base", "full"]
    argv += folders
    report = harness.main(argv)
    out, results = tmp_path / "out", tmp_path / "results"
    assert {p.name for p in results.iterdir()} == {
        "learning_heldout.json",
        "learning_heldout.md",
        "learning_heldout.png",
    }
    saved = json.loads((results / "learning_heldout.json").read_text())
    assert saved["eval_set"]["name"] == "mbpp_test" and saved["eval_set"]["num_tasks"] == 2
    assert saved["command"].startswith("python -m experiments.learning_heldout.run --mbpp_path")
    assert saved["complete"] is False  # two of the five variants
    assert saved["teacher"]["passed"] == 2 and saved["teacher"]["dropped"] == 1  # mx's wrong reference
    train = [json.loads(line)["task_id"] for line in (out / "data" / "train.jsonl").read_text().splitlines()]
    assert sorted(train) == ["mbpp/601", "mbpp/602", "mbpp/603"]  # the standard split: test ids held out
    base, full = saved["variants"]
    for v in (base, full):
        assert v["evaluated"] and v["pass_at_1_ci"] is not None and set(v["pass_at_k"]) == {"1", "2"}
        assert v["sanitized_pass"] is not None and v["at_budget"] is not None  # phase 4's, read
    assert base["delta_vs_base"] is None and full["delta_vs_full"] is None
    assert full["delta_vs_base_ci"] is not None and base["delta_vs_full_ci"] is not None
    assert full["delta_vs_base"] == pytest.approx(full["pass_at_1"] - base["pass_at_1"])
    assert full["training"]["entropy"][0] is not None and full["training"]["entropy"][0] > 0
    power = saved["power_full_vs_base"]
    assert power["problems"] == 2 and power["samples_per_problem"] == 2 and "8" in power["needed"]
    assert "| GRPO + teacher-SFT + self-SFT (product) |" in (results / "learning_heldout.md").read_text()
    # the teacher-SFT data the full variant trained on is the verified reference traces
    first_step = json.loads((out / "full" / "metrics.jsonl").read_text().splitlines()[0])
    assert first_step["teacher_sft/pool"] == 2

    adapter = out / "full" / "final_model" / "adapter_model.safetensors"
    stamp = adapter.stat().st_mtime_ns
    again = harness.main(argv)
    assert adapter.stat().st_mtime_ns == stamp  # nothing retrained
    assert [v.get("pass_at_k") for v in again["variants"]] == [v.get("pass_at_k") for v in report["variants"]]
    with pytest.raises(SystemExit, match="another recipe"):
        harness.main([*argv, "--lr", "0.1"])


def test_make_plans_the_experiment_niced_with_humaneval():
    import subprocess

    planned = subprocess.run(
        ["make", "-n", "learning-heldout", "MBPP_PATH=m.jsonl", "LEARNING_ARGS=--eval_tasks 3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "nice -n 19" in planned and "-m experiments.learning_heldout.run --mbpp_path m.jsonl --humaneval" in planned
    assert "--eval_tasks 3" in planned


def test_make_learning_heldout_in_a_clone_without_the_side_folder_loads_mbpp_from_the_hub(tmp_path):
    import shutil
    import subprocess

    clone = tmp_path / "elsewhere" / "clone"  # no ../shared beside it, as in a user's clone
    clone.mkdir(parents=True)
    for path in ROOT.glob("requirements*.txt"):
        shutil.copy(path, clone)
    shutil.copy(ROOT / "Makefile", clone)
    planned = subprocess.run(
        ["make", "-n", "learning-heldout"], cwd=clone, capture_output=True, text=True, timeout=60
    ).stdout
    [line] = [line for line in planned.splitlines() if "experiments.learning_heldout.run" in line]
    assert "--mbpp_path" not in line, line


def test_a_missing_mbpp_file_is_one_line_before_anything_loads(tmp_path):
    from tests.cli_helpers import run_script

    missing = tmp_path / "no" / "mbpp.jsonl"
    result = run_script(
        "-m", "experiments.learning_heldout.run", "--mbpp_path", str(missing), "--output_dir", str(tmp_path)
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if "error:" in line]
    assert str(missing) in line and "hub" in line
