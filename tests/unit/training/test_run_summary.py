"""training/run_summary.py against hand-made phase outputs."""

from __future__ import annotations

import json
from pathlib import Path

from training.run_summary import DEGRADED_EXIT, main, summarize_run


def write_run(tmp_path: Path, asked: int, failed: int, usable: int) -> tuple[Path, Path]:
    data, out = tmp_path / "data", tmp_path / "outputs"
    data.mkdir()
    out.mkdir()
    stats = {
        "total": asked,
        "api_errors": failed,
        "skipped_existing": 0,
        "teacher_sft_fit": {"usable": usable, "too_long": 0},
    }
    (data / "teacher_traces.stats.json").write_text(json.dumps(stats))
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in range(1, 13)))
    results = {
        "eval_set": {"num_tasks": 14},
        "pass_at_k": {"1": 0.3214, "8": 0.5},
        "pass_at_k_ci95": {"1": [0.125, 0.545], "8": [0.25, 0.75]},
        "baseline": {"pass_at_k": {"1": 0.1786, "8": 0.5}, "pass_at_k_ci95": {"1": [0.071, 0.295], "8": None}},
        "delta": {"1": 0.1429, "8": 0.0},
        "delta_ci95": {"1": [0.009, 0.295], "8": [-0.1, 0.1]},
    }
    (out / "evaluation_results.json").write_text(json.dumps(results))
    return data, out


def test_a_healthy_run(tmp_path: Path, capsys) -> None:
    data, out = write_run(tmp_path, asked=12, failed=0, usable=9)
    summary = summarize_run(data, out)
    assert summary.healthy
    text = summary.text()
    assert "answered 12 of 12" in text
    assert "9 traces usable" in text
    assert "12 training steps" in text
    assert "pass@1 adapter 0.321 [0.125, 0.545], base 0.179 [0.071, 0.295], delta +0.143 [0.009, 0.295]" in text
    assert "delta +0.000 [-0.100, +0.100]" in text
    assert text.endswith("run healthy")
    assert main(["--data_dir", str(data), "--output_dir", str(out)]) == 0


def test_the_degraded_run_of_the_review_is_flagged(tmp_path: Path, capsys) -> None:
    data, out = write_run(tmp_path, asked=12, failed=10, usable=1)
    assert main(["--data_dir", str(data), "--output_dir", str(out)]) == DEGRADED_EXIT
    printed = capsys.readouterr().out
    assert "WARNING: phase 2's teacher answered under half of the requests (2 of 12)" in printed
    assert "run healthy" not in printed


def test_no_usable_traces_and_missing_phases(tmp_path: Path) -> None:
    data, out = write_run(tmp_path, asked=4, failed=0, usable=0)
    (out / "evaluation_results.json").unlink()
    (out / "metrics.jsonl").unlink()
    summary = summarize_run(data, out)
    assert len(summary.warnings) == 3
    assert any("no usable teacher traces" in w for w in summary.warnings)


def test_the_summary_says_where_the_step_time_went(tmp_path: Path) -> None:
    """Rollout, scoring (with the log-prob forwards that ran beside it) and update, each the mean over the logged
    steps, in the closing summary."""
    data, out = write_run(tmp_path, asked=12, failed=0, usable=9)
    rows = [
        {"step": 1, "time/rollout_s": 10.0, "time/score_s": 3.0, "time/logprobs_s": 1.0, "time/update_s": 20.0},
        {"step": 2, "time/rollout_s": 12.0, "time/score_s": 5.0, "time/logprobs_s": 2.0, "time/update_s": 22.0},
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = summarize_run(data, out).text()
    assert (
        "phase 3: 2 training steps; step time (mean of 2 steps): rollout 11.0 s, scoring 4.0 s "
        "(log-probs beside it 1.5 s), update 21.0 s"
    ) in text


def test_a_run_without_any_update_is_a_warning_that_says_why(tmp_path: Path, capsys) -> None:
    data, out = write_run(tmp_path, asked=12, failed=0, usable=9)
    skipped = {"update/skipped": 1.0, "frac_reward_zero_std": 1.0, "pass_rate": 0.0, "teacher_sft/pool": 0}
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **skipped}) + "\n" for s in (1, 2)))
    summary = summarize_run(data, out)
    assert not summary.healthy
    text = summary.text()
    assert "phase 3: 2 training steps (0 updates)" in text
    assert "WARNING: phase 3 made no update in 2 steps (no reward spread in any group" in text
    assert "no teacher-SFT data" in text and f"the adapter in {out / 'final_model'} is the initial one" in text


def test_a_warning_from_the_pipeline_is_listed_and_degrades_the_run(tmp_path: Path, capsys) -> None:
    data, out = write_run(tmp_path, asked=12, failed=0, usable=9)
    died = "the local teacher this run started (pid 7) died during phase 2; its log: data/local_teacher.log"
    assert main(["--data_dir", str(data), "--output_dir", str(out), "--warn", died]) == DEGRADED_EXIT
    assert f"WARNING: {died}" in capsys.readouterr().out


def test_the_progress_bar_says_skipped_not_nan_on_a_step_without_an_update() -> None:
    from training.metric_sinks import progress_loss

    assert progress_loss({"update/skipped": 1.0}) == "skipped"
    assert progress_loss({"update/skipped": 0.0, "loss/total": 0.25}) == "0.250"


def _no_code_everywhere(out: Path, adapter_code: float, base_code: float) -> None:
    results = json.loads((out / "evaluation_results.json").read_text())
    results["pass_at_k"] = {"1": 0.0}
    results["format"] = {"extractable_code": adapter_code, "closed_thinking": 0.0}
    results["baseline"] = {"pass_at_k": {"1": 0.0}, "format": {"extractable_code": base_code}}
    (out / "evaluation_results.json").write_text(json.dumps(results))


def test_an_evaluation_that_found_no_code_does_not_end_healthy(tmp_path: Path, capsys) -> None:
    data, out = write_run(tmp_path, asked=12, failed=0, usable=9)
    _no_code_everywhere(out, adapter_code=0.0, base_code=0.0)
    assert main(["--data_dir", str(data), "--output_dir", str(out)]) == DEGRADED_EXIT
    text = capsys.readouterr().out
    assert "run healthy" not in text
    [warning] = [line for line in text.splitlines() if line.startswith("WARNING:") and "code" in line]
    assert "adapter 0%" in warning and "base 0%" in warning and "format" in warning
    _no_code_everywhere(out, adapter_code=0.5, base_code=0.25)  # code in some samples: the numbers measure
    assert summarize_run(data, out).healthy


def test_the_reference_teacher_is_named_as_such(tmp_path: Path) -> None:
    data, out = write_run(tmp_path, asked=12, failed=0, usable=9)
    stats = json.loads((data / "teacher_traces.stats.json").read_text())
    stats.update({"teacher_model": "references", "passed": 11, "total": 12, "candidates": 12})
    (data / "teacher_traces.stats.json").write_text(json.dumps(stats))
    text = summarize_run(data, out).text()
    assert "the teacher answered" not in text
    assert "12 reference solutions run, 11 passed" in text
