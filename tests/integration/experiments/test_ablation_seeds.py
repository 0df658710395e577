"""The seeded ablation harness (experiments/ablation_seeds) without training: the pre-pass bands, the
recipe guard, resumption from committed evidence, and a report from partial evidence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import frame
from experiments.ablation_seeds import report as report_mod
from experiments.ablation_seeds import run as harness

HELDOUT = ["mbpp/1", "mbpp/2", "apps/3"]


def test_bands_keep_training_tasks_with_spread_and_held_out_tasks_below_all_pass():
    counts = {"t1": 0, "t2": 1, "t3": 7, "t4": 8, "t5": 4, "h1": 0, "h2": 7, "h3": 8}
    pool, heldout = frame.select_bands(counts, ["t1", "t2", "t3", "t4", "t5"], ["h1", "h2", "h3"], 8)
    assert pool == ["t2", "t3", "t5"]  # 1..7 of 8, split order kept
    assert heldout == ["h1", "h2"]  # < 8 of 8


def test_k_values_are_the_powers_of_two_up_to_the_samples_and_the_samples_themselves():
    assert frame.ks_for(8) == [1, 2, 4, 8]
    assert frame.ks_for(6) == [1, 2, 4, 6]


def test_a_recipe_change_is_refused(tmp_path):
    args = harness.parse_args(["--evidence_dir", str(tmp_path)])
    frame.check_evidence_recipe(tmp_path, harness.recipe_of(args))
    frame.check_evidence_recipe(tmp_path, harness.recipe_of(args))  # the same recipe resumes
    other = harness.parse_args(["--steps", "20", "--evidence_dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="another recipe"):
        frame.check_evidence_recipe(tmp_path, harness.recipe_of(other))
    # seeds and arms choose what runs, not how: adding seeds to two arms is the same recipe
    more = harness.parse_args(["--seeds", "4", "5", "--arms", "full", "tsft", "--evidence_dir", str(tmp_path)])
    frame.check_evidence_recipe(tmp_path, harness.recipe_of(more))


def test_every_recipe_key_exists_in_the_config():
    keys = [*harness.RECIPE, *harness.TEACHER_RECIPE]
    keys += [f"dual_source.{k}" for arm in harness.ARMS.values() for k in arm.weights]
    frame.check_config_keys(keys)
    with pytest.raises(SystemExit, match="no key grpo.not_a_key"):
        frame.check_config_keys(["grpo.not_a_key"])


def test_arms_differ_only_in_their_weights(tmp_path):
    runner = harness.Runner(harness.parse_args([]), tmp_path, tmp_path / "ev")
    full = runner.arm_overrides(harness.ARMS["full"], 2)
    grpo = runner.arm_overrides(harness.ARMS["grpo"], 2)
    shared = {k: v for k, v in full.items() if not k.startswith("dual_source.")}
    assert shared == {k: v for k, v in grpo.items() if not k.startswith("dual_source.")}
    assert full["training.seed"] == 2 and full["grpo.num_samples_per_prompt"] == 8
    opd = runner.arm_overrides(harness.ARMS["grpo_opd"], 2)
    assert opd["teacher.logprob_source"] == "local" and opd["teacher.local_adapter"].endswith("final_model")


def run_evidence(arm: str, seed: int, passes: list[int], samples: int = 2, flat: float = 0.25, rate: float = 0.4):
    """One run's evidence with `passes[i]` of `samples` passing on held-out task i."""
    rows = [
        [task, i, int(i < c), "passed" if i < c else "wrong_answer", "stop" if i else "length", 20 + i]
        for task, c in zip(HELDOUT, passes, strict=True)
        for i in range(samples)
    ]
    return {
        "arm": arm,
        "seed": seed,
        "overrides": {},
        "train_s": 10.0,
        "eval_s": 2.0,
        "load": {"start": [1.0, 1.0, 1.0], "end": [2.0, 2.0, 2.0]},
        "pass_at_k": {"1": sum(passes) / (samples * len(passes))},
        "samples": rows,
        "metrics": [] if arm == "base" else [{"step": 1, "pass_rate": rate, "frac_reward_zero_std": flat}],
    }


def write_evidence(folder, runs, samples: int = 2):
    (folder / "runs").mkdir(parents=True)
    args = harness.parse_args(["--samples", str(samples)])
    (folder / "recipe.json").write_text(json.dumps(harness.recipe_of(args)))
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


def test_a_run_with_evidence_is_not_redone(tmp_path):
    ev = tmp_path / "ev"
    write_evidence(ev, [run_evidence("full", 1, [1, 1, 0])])
    runner = harness.Runner(harness.parse_args([]), tmp_path / "work", ev)

    def refuse(*_args, **_kwargs):
        raise AssertionError("a finished run was started again")

    runner.run = refuse
    runner.one_run("full", 1, "[1/1]")
    assert not (tmp_path / "work" / "runs").exists()


def test_a_report_from_partial_evidence_says_it_is_not_complete(tmp_path):
    ev = tmp_path / "ev"
    runs = [
        run_evidence("full", 1, [2, 1, 0]),
        run_evidence("tsft", 1, [1, 1, 0]),
        run_evidence("full", 2, [2, 2, 0]),
        run_evidence("tsft", 2, [1, 0, 0]),
        run_evidence("base", 1, [0, 1, 0]),
        run_evidence("grpo", 1, [0, 1, 0], flat=0.9),  # no signal: the check must say so
    ]
    write_evidence(ev, runs)
    report = report_mod.build_report(ev, "python -m experiments.ablation_seeds.run")
    assert report["complete"] is False and report["seeds_done"] == []
    full_tsft = report["pass_at_k"]["1"]["contrasts"]["full - tsft"]
    # pass@1 per seed: full s1 (1 + .5 + 0)/3 = .5, tsft s1 (.5 + .5)/3 = 1/3; s2: 2/3 vs 1/6 -> d = 1/6, 1/2
    assert full_tsft["per_seed"] == pytest.approx([1 / 6, 1 / 2])
    assert full_tsft["delta"] == pytest.approx(1 / 3)
    assert full_tsft["ci95_two_way"] is not None  # 3 trained arms, 2 seeds, 5 cells: df 5 - 4 = 1
    assert "grpo_opd - grpo" not in report["pass_at_k"]["1"]["contrasts"]
    # the MBPP-format subgroup (the first two tasks): full s1 (1 + .5)/2, tsft s1 .5 -> d .25; s2 1 vs .25 -> .75
    sub = report["pass_at_1_mbpp_format"]
    assert sub["tasks"] == 2 and sub["contrasts"]["full - tsft"]["per_seed"] == pytest.approx([0.25, 0.75])
    assert report["signal"]["signal_ok"] is False
    assert report["signal"]["runs"]["full-s1"]["ok"] is True
    assert report["failure_taxonomy"]["full"]["truncated"] == pytest.approx(0.5)
    paths = report_mod.write_report(report, tmp_path / "results")
    text = paths[1].read_text()
    assert "partial" in text and "SIGNAL CHECK FAILED" in text and "raise G" in text
    assert json.loads(paths[0].read_text())["complete"] is False
    assert paths[2].is_file()


def test_report_only_builds_from_the_evidence_without_running_anything(tmp_path):
    ev = tmp_path / "ev"
    write_evidence(ev, [run_evidence("base", 1, [0, 1, 0])])
    out = harness.main(["--report_only", "--evidence_dir", str(ev), "--results_dir", str(tmp_path / "r")])
    assert out["complete"] is False and not (tmp_path / "outputs").exists()
    assert (tmp_path / "r" / "ablation_seeds.md").is_file()


def test_evidence_json_is_compact_and_reads_back(tmp_path):
    record = run_evidence("full", 1, [2, 1, 0])
    frame.write_evidence_json(tmp_path / "run.json", record)
    text = (tmp_path / "run.json").read_text()
    assert json.loads(text) == record
    assert text.count("\n") == len(record) + len(record["samples"]) + len(record["metrics"]) + 4  # {, two closing ], }


def test_a_report_before_the_pre_pass_is_empty_but_written(tmp_path):
    report = report_mod.build_report(tmp_path, "cmd")
    assert report["complete"] is False
    assert report_mod.write_report(report, tmp_path / "r")[1].read_text().startswith("# Seeded ablation")


def fake_phases(runner, calls: list):
    """Stand-in for the phase processes: records each command and writes the files the real phase would."""

    def run(name, command, watch=None, total_steps=0, env=None):
        calls.append((name, command))
        flag = {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}
        if name.endswith(".train"):
            out = runner.work / "teacher" if name == "teacher.train" else runner.work / "runs" / name[: -len(".train")]
            (out / "final_model").mkdir(parents=True, exist_ok=True)
            (out / "final_model" / "adapter_config.json").write_text("{}")
            (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "pass_rate": 0.3, "frac_reward_zero_std": 0.2}))
        else:
            rows = [
                {
                    "task_id": t,
                    "sample_idx": i,
                    "passed": i == 0,
                    "status": "passed" if i == 0 else "wrong_answer",
                    "finish_reason": "stop",
                    "num_tokens": 9,
                }
                for t in HELDOUT
                for i in range(2)
            ]
            Path(flag["--output"]).write_text(json.dumps({"pass_at_k": {"1": 0.5}, "decoding": "T 0.7"}))
            Path(flag["--samples_output"]).write_text("\n".join(json.dumps(r) for r in rows))
        return 1.0

    runner.run = run


def test_an_opd_arm_refuses_a_teacher_no_better_than_the_base(tmp_path):
    ev = tmp_path / "ev"
    # the fake evaluation passes sample 0 of every task: teacher and base tie at pass@1 0.5
    write_evidence(ev, [])
    runner = harness.Runner(harness.parse_args(["--samples", "2"]), tmp_path / "work", ev, "cmd")
    calls: list = []
    fake_phases(runner, calls)
    with pytest.raises(SystemExit, match="the OPD teacher fails its gate"):
        runner.one_run("grpo_opd", 1, "[1/1]")
    assert "grpo_opd-s1.train" not in [name for name, _ in calls]
    assert harness.teacher_check(run_evidence("t", 1, [2, 1, 0]), run_evidence("base", 1, [1, 1, 0]))["passed"]


def test_an_opd_run_trains_the_teacher_first_and_scores_with_it(tmp_path):
    ev = tmp_path / "ev"
    write_evidence(ev, [run_evidence("base", 1, [0, 0, 0])])  # a base the fake teacher (pass@1 0.5) beats
    runner = harness.Runner(harness.parse_args(["--samples", "2"]), tmp_path / "work", ev, "cmd")
    calls: list = []
    fake_phases(runner, calls)
    runner.one_run("grpo_opd", 1, "[1/1]")
    assert [name for name, _ in calls] == ["teacher.train", "teacher.eval", "grpo_opd-s1.train", "grpo_opd-s1.eval"]
    arm_command = " ".join(calls[2][1])
    assert "teacher.logprob_source=local" in arm_command and "dual_source.opd_weight=1.0" in arm_command
    assert f"teacher.local_adapter={runner.teacher_adapter}" in arm_command
    assert "training.seed=1" in " ".join(calls[3][1])  # evaluated on the run's seed
    assert json.loads((ev / "teacher.json").read_text())["arm"] == "teacher"
    run = json.loads((ev / "runs" / "grpo_opd-s1.json").read_text())
    assert run["command"] == "cmd" and len(run["samples"]) == 6 and run["metrics"][0]["pass_rate"] == 0.3
    # a second OPD seed reuses the teacher: neither trained nor evaluated again
    calls.clear()
    runner.one_run("grpo_opd", 2, "[1/1]")
    assert [name for name, _ in calls] == ["grpo_opd-s2.train", "grpo_opd-s2.eval"]


def test_the_evidence_keeps_the_metrics_that_diagnose_opd_and_sft(tmp_path):
    for key in ("opd/advantage_p01", "opd/advantage_p99", "opd/clipped_frac", "loss/teacher_sft", "loss/self_sft"):
        assert key in frame.METRIC_COLUMNS
    ev = tmp_path / "ev"
    write_evidence(ev, [run_evidence("base", 1, [0, 0, 0])])
    runner = harness.Runner(harness.parse_args(["--samples", "2"]), tmp_path / "work", ev, "cmd")
    calls: list = []
    fake_phases(runner, calls)
    runner.one_run("full", 1, "[1/1]")
    run = json.loads((ev / "runs" / "full-s1.json").read_text())
    assert run["sample_columns"] == list(frame.SAMPLE_COLUMNS) and len(run["samples"][0]) == len(frame.SAMPLE_COLUMNS)
    assert "no_code_completions" in run


def test_an_opd_run_with_evidence_but_no_teacher_check_gets_its_check(tmp_path):
    ev = tmp_path / "ev"
    write_evidence(ev, [run_evidence("base", 1, [0, 0, 0]), run_evidence("grpo_opd", 1, [1, 1, 0])])
    runner = harness.Runner(harness.parse_args(["--samples", "2"]), tmp_path / "work", ev, "cmd")
    calls: list = []
    fake_phases(runner, calls)
    runner.one_run("grpo_opd", 1, "[1/1]")
    # the OPD run is not redone; its teacher is trained and evaluated so the evidence holds the teacher's check
    assert [name for name, _ in calls] == ["teacher.train", "teacher.eval"]
    assert json.loads((ev / "teacher.json").read_text())["arm"] == "teacher"


def test_the_committed_ablation_evidence_holds_the_opd_teachers_check():
    evidence = harness.EVIDENCE_DIR
    if not any((evidence / "runs").glob("grpo_opd-s*.json")):
        pytest.fail(f"no OPD run in {evidence}: this test reads the committed evidence")
    report = report_mod.build_report(evidence, "cmd")
    check = report["teacher"]
    assert check is not None, "an OPD arm's evidence must hold its teacher's held-out check (teacher.json)"
    assert {"teacher_pass@1", "base_pass@1", "teacher_no_code", "base_no_code"} <= set(check)


def test_every_phase_command_pins_the_target_format_the_committed_runs_used(tmp_path):
    # the cpu preset now trains code-only targets; a resumed or re-made run of this ablation must not
    ev = tmp_path / "ev"
    write_evidence(ev, [run_evidence("base", 1, [0, 0, 0])])
    runner = harness.Runner(harness.parse_args(["--samples", "2"]), tmp_path / "work", ev, "cmd")
    calls: list = []
    runner.run = lambda name, command, *_args, **_kwargs: calls.append((name, command))
    runner.references()
    fake_phases(runner, calls)
    runner.one_run("grpo_opd", 1, "[1/1]")
    commands = {name: " ".join(command) for name, command in calls}
    assert "teacher.reference_thinking=short" in commands["references"]
    for name in ("teacher.train", "grpo_opd-s1.train"):
        assert "dual_source.include_thinking=true" in commands[name], name
    assert harness.recipe_of(runner.args)["target_format"] == harness.TARGET_FORMAT
