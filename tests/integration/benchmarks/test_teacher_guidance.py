"""The teacher-guidance experiment (benchmarks/bench_teacher_guidance.py) without training: its run order, its gate,
arm B's two stages, resumption, and a report with per-stratum paired-t contrasts from partial evidence."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_teacher_guidance as harness
import teacher_guidance_report as report_mod

HELDOUT = ["mbpp/1", "mbpp/2", "apps/3"]


def run_evidence(arm: str, seed: int, passes: list[int], samples: int = 2, no_code: int = 0, lenient: int = 0):
    """One run's evidence: `passes[i]` of `samples` pass on held-out task i; the first `no_code` failing samples
    of the last task have no code, `lenient` of those hide a passing program."""
    rows = []
    for task, c in zip(HELDOUT, passes, strict=True):
        for i in range(samples):
            passed = i < c
            hidden = task == HELDOUT[-1] and not passed and i - c < no_code
            rows.append(
                [
                    task,
                    i,
                    int(passed),
                    "passed" if passed else "no_code" if hidden else "wrong_answer",
                    "stop",
                    20,
                    int(passed or (hidden and i - c < lenient)),
                ]
            )
    return {
        "arm": arm,
        "seed": seed,
        "command": "cmd",
        "git": {"commit": "abc", "dirty": False},
        "overrides": {},
        "train_s": 10.0,
        "eval_s": 2.0,
        "load": {"start": [1.0, 1.0, 1.0], "end": [2.0, 2.0, 2.0]},
        "pass_at_k": {"1": sum(passes) / (samples * len(passes))},
        "samples": rows,
        "metrics": [] if arm == "base" else [{"step": 1, "pass_rate": 0.4, "frac_reward_zero_std": 0.25}],
    }


def write_evidence(folder: Path, runs: list[dict], samples: int = 2) -> None:
    (folder / "runs").mkdir(parents=True)
    (folder / "recipe.json").write_text(json.dumps(harness.recipe_of(harness.parse_args(["--samples", str(samples)]))))
    prepass = {
        "samples": samples,
        "seed": 42,
        "split": {"train": ["t1", "t2"], "heldout": HELDOUT},
        "counts": {"t1": 1, "t2": 0, "mbpp/1": 0, "mbpp/2": 1, "apps/3": 1},
        "training_pool": ["t1"],
        "heldout_set": HELDOUT,
    }
    (folder / "prepass.json").write_text(json.dumps(prepass))
    for run in runs:
        (folder / "runs" / f"{run['arm']}-s{run['seed']}.json").write_text(json.dumps(run))


def test_runs_are_seed_major_with_the_base_and_the_gate_arm_first():
    plan = harness.plan_runs([1, 2], ["grpo", "tsft", "full"])
    assert plan == [
        (1, "base"),
        (1, "tsft"),
        (1, "grpo"),
        (1, "full"),
        (2, "base"),
        (2, "tsft"),
        (2, "grpo"),
        (2, "full"),
    ]
    assert [a for _, a in harness.plan_runs([1], list(harness.DEFAULT_ARMS))] == [
        "base",
        "tsft",
        "grpo",
        "sft_grpo",
        "grpo_tsft",
        "full",
    ]


def test_the_gate_compares_no_code_shares_with_a_five_point_margin():
    base = run_evidence("base", 1, [0, 1, 0], no_code=0)
    # 6 samples: one no_code sample is 1/6 = 0.167 > 0 + 0.05 -> failed; none -> passed
    assert harness.gate_outcome(base, run_evidence("tsft", 1, [0, 1, 0], no_code=1))["passed"] is False
    ok = harness.gate_outcome(base, run_evidence("tsft", 1, [1, 1, 0]))
    assert ok["passed"] is True and ok["no_code"] == 0.0 and ok["base_no_code"] == 0.0


def fake_phases(runner, calls: list):
    """Stand-in for the phase processes: records each command and writes the files the real one would."""

    def run(name, command, watch=None, total_steps=0):
        calls.append((name, command))
        flag = {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}
        if name.endswith(".train"):
            out = Path(flag["--output_dir"])
            (out / "final_model").mkdir(parents=True, exist_ok=True)
            (out / "final_model" / "adapter_config.json").write_text("{}")
            (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "pass_rate": 0.3, "loss/teacher_sft": 1.5}))
        elif name.endswith(".merge"):
            Path(flag["--output_dir"]).mkdir(parents=True)
            (Path(flag["--output_dir"]) / "config.json").write_text("{}")
        else:
            rows = [
                {
                    "task_id": t,
                    "sample_idx": i,
                    "passed": i == 0,
                    "lenient_passed": i == 0,
                    "status": "passed" if i == 0 else "no_code",
                    "finish_reason": "length",
                    "num_tokens": 9,
                    "completion": "<think>never closed",
                }
                for t in HELDOUT
                for i in range(2)
            ]
            Path(flag["--output"]).write_text(json.dumps({"pass_at_k": {"1": 0.5}, "decoding": "T 0.7"}))
            Path(flag["--samples_output"]).write_text("\n".join(json.dumps(r) for r in rows))
        return 1.0

    runner.run = run


def test_sft_then_grpo_trains_teacher_sft_merges_it_and_runs_grpo_on_the_merged_model(tmp_path):
    ev = tmp_path / "ev"
    write_evidence(ev, [])
    runner = harness.Runner(harness.parse_args(["--samples", "2"]), tmp_path / "work", ev, "cmd")
    calls: list = []
    fake_phases(runner, calls)
    runner.one_run("sft_grpo", 1, "[1/1]")
    assert [n for n, _ in calls] == [
        "sft_grpo-s1.sft.train",
        "sft_grpo-s1.merge",
        "sft_grpo-s1.train",
        "sft_grpo-s1.eval",
    ]
    sft, grpo = " ".join(calls[0][1]), " ".join(calls[2][1])
    assert "dual_source.grpo_weight=0.0" in sft and "dual_source.teacher_sft_batch_size=8" in sft
    assert f"student.model_name={runner.merged_folder('sft_grpo-s1')}" in grpo and "dual_source.grpo_weight=1.0" in grpo
    assert f"--teacher_traces {runner.refs}" in sft  # the code-only references of every training task
    run = json.loads((ev / "runs" / "sft_grpo-s1.json").read_text())
    assert run["git"] is not None and run["metrics"][0]["loss/teacher_sft"] == 1.5
    # the evidence keeps the lenient verdicts and what the no_code answers looked like
    assert run["sample_columns"][-1] == "lenient_passed" and len(run["samples"][0]) == 7
    assert run["no_code_completions"][0] == ["mbpp/1", 1, "<think>never closed"]
    assert not runner.merged_folder("sft_grpo-s1").exists()  # the 0.5 GB merged copy is not kept
    calls.clear()
    runner.one_run("sft_grpo", 1, "[1/1]")  # evidence exists: nothing runs
    assert calls == []


def test_the_gate_arm_is_teacher_sft_only_with_its_own_steps(tmp_path):
    ev = tmp_path / "ev"
    write_evidence(ev, [])
    runner = harness.Runner(harness.parse_args(["--tsft_steps", "5"]), tmp_path / "work", ev, "cmd")
    calls: list = []
    fake_phases(runner, calls)
    runner.one_run("tsft", 3, "[1/1]")
    command = " ".join(calls[0][1])
    assert "--max_steps 5" in command and "dual_source.teacher_sft_weight=1.0" in command
    assert "dual_source.teacher_sft_batch_size=4" in command and "training.seed=3" in command


def test_a_failed_gate_stops_the_experiment_before_any_grpo_arm(tmp_path, monkeypatch):
    ev = tmp_path / "ev"
    write_evidence(ev, [run_evidence("base", 1, [0, 1, 0]), run_evidence("tsft", 1, [0, 0, 0], no_code=2)])
    monkeypatch.setattr(harness.Runner, "prepass", lambda self: None)
    monkeypatch.setattr(harness.Runner, "references", lambda self: None)

    def refuse(self, arm, seed, index):
        if (ev / "runs" / f"{arm}-s{seed}.json").is_file():
            return
        raise AssertionError(f"{arm} ran after a failed gate")

    monkeypatch.setattr(harness.Runner, "one_run", refuse)
    with pytest.raises(SystemExit, match="the gate failed"):
        harness.main(
            [
                "--samples",
                "2",
                "--seeds",
                "1",
                "--evidence_dir",
                str(ev),
                "--output_dir",
                str(tmp_path / "work"),
                "--results_dir",
                str(tmp_path / "r"),
            ]
        )
    assert json.loads((ev / "gate.json").read_text())["passed"] is False
    assert "FAILED" in (tmp_path / "r" / "teacher_guidance.md").read_text()


def test_a_report_from_partial_evidence_has_paired_t_contrasts_per_stratum(tmp_path):
    ev = tmp_path / "ev"
    runs = [
        run_evidence("base", 1, [0, 1, 0]),
        run_evidence("base", 2, [0, 1, 0]),
        run_evidence("grpo", 1, [1, 1, 0]),
        run_evidence("grpo", 2, [1, 2, 0]),
        run_evidence("full", 1, [2, 2, 0], no_code=2, lenient=1),
        run_evidence("full", 2, [2, 1, 1], no_code=1, lenient=1),
    ]
    write_evidence(ev, runs)
    report = report_mod.build_report(ev, "python benchmarks/bench_teacher_guidance.py")
    assert report["complete"] is False and report["seeds"] == [1, 2]
    block = report["analysis"]["mbpp_format"]
    assert block["tasks"] == 2
    # MBPP-format pass@1 per seed: full s1 (1 + 1)/2 = 1, grpo s1 (.5 + .5)/2 = .5 -> d .5; s2: .75 vs .75 -> 0
    c = block["strict_pass@1"]["contrasts"]["full - grpo"]
    assert c["per_seed"] == pytest.approx([0.5, 0.0])
    # paired t, df 1: mean .25, sd .35355, se .25, t_1 = 12.706 -> half 3.1766
    assert c["ci95"] == pytest.approx([0.25 - 3.17655, 0.25 + 3.17655], abs=1e-4)
    # the APPS-format stratum (apps/3): full s1 strict 0 of 2, lenient 1 of 2; grpo 0
    apps = report["analysis"]["apps_format"]
    assert apps["strict_pass@1"]["contrasts"]["full - grpo"]["per_seed"] == pytest.approx([0.0, 0.5])
    assert apps["lenient_pass@1"]["contrasts"]["full - grpo"]["per_seed"] == pytest.approx([0.5, 1.0])
    assert report["runs"]["full-s1"]["no_code"] == pytest.approx(2 / 6)
    assert report["runs"]["full-s1"]["no_code_by_stratum"]["apps_format"] == pytest.approx(1.0)
    assert "grpo - base" in report["analysis"]["all"]["strict_pass@1"]["contrasts"]
    assert report["gate"] is None and report["commits"] == ["abc"]
    paths = report_mod.write_report(report, tmp_path / "results")
    text = paths[1].read_text()
    assert "partial" in text and "D full − A grpo" in text and "not decided yet" in text
    assert paths[2].is_file()
