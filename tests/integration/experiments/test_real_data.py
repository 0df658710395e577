"""The real-data experiment (experiments/real_data) without training: MBPP's published ids as the population,
its own sizes, two evaluation sets per run, and a report per evaluation set."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.real_data import design as real
from experiments.real_data import report as report_mod
from experiments.real_data import run as harness
from tests.integration.experiments.test_teacher_guidance import flags_of


def mbpp_file(tmp_path: Path) -> Path:
    rows = [
        {"task_id": i, "text": f"Write f{i}.", "code": f"def f{i}(x):\n    return x", "test_setup_code": "",
         "test_list": [f"assert f{i}(1) == 1"], "challenge_test_list": []}
        for i in (12, 13, 520, 530, 601, 602, 700, 974)
    ]  # fmt: skip
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fake_phases(runner, calls):
    def run(name, command, watch=None, total_steps=0, env=None):
        calls.append((name, command))
        flag = {k: v[-1] for k, v in flags_of(command).items()}
        if name.endswith(".train"):
            out = Path(flag["--output_dir"])
            (out / "final_model").mkdir(parents=True, exist_ok=True)
            (out / "final_model" / "adapter_config.json").write_text("{}")
            (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "pass_rate": 0.3}) + "\n")
            return 5.0
        if name.endswith(".merge"):
            Path(flag["--output_dir"]).mkdir(parents=True)
            (Path(flag["--output_dir"]) / "config.json").write_text("{}")
            return 1.0
        if name == "references":
            from utils.dataset_loader import read_tasks

            rows = [{"task_id": t.task_id, "sample_idx": 0, "prompt": "p", "code": "c", "passed": True}
                    for t in read_tasks(flag["--input"])]  # fmt: skip
            Path(flag["--output"]).write_text("".join(json.dumps(r) + "\n" for r in rows))
            Path(flag["--output"]).with_suffix(".stats.json").write_text("{}")
            return 1.0
        if "--eval_set" in flag:
            ids = ["mbpp/12", "mbpp/13"] if flag["--eval_set"] == "mbpp_test" else ["HumanEval/0"]
        else:
            from utils.dataset_loader import read_tasks

            ids = [t.task_id for t in read_tasks(flag["--eval_file"])]
        rows = [
            {"task_id": t, "sample_idx": i, "passed": i == 0, "status": "x", "finish_reason": "stop", "num_tokens": 3}
            for t in ids
            for i in range(int(flag["--num_samples"]))
        ]
        Path(flag["--samples_output"]).parent.mkdir(parents=True, exist_ok=True)
        Path(flag["--samples_output"]).write_text("".join(json.dumps(r) + "\n" for r in rows))
        Path(flag["--output"]).write_text(json.dumps({"pass_at_k": {"1": 0.25}, "decoding": "d"}))
        return 2.0

    runner.run = run


def test_the_population_is_mbpps_published_ids_and_each_run_is_evaluated_on_both_sets(tmp_path):
    args = harness.parse_args(
        [
            "--mbpp_path",
            str(mbpp_file(tmp_path)),
            "--output_dir",
            str(tmp_path / "w"),
            "--evidence_dir",
            str(tmp_path / "ev"),
            "--sampler",
            "kv",
        ]
    )
    assert args.samples == real.SAMPLES and args.seeds == list(real.DEFAULT_SEEDS)
    runner = harness.Runner(args, tmp_path / "w", tmp_path / "ev", "cmd")
    calls: list = []
    fake_phases(runner, calls)
    train, val = runner.split()
    assert train == ["mbpp/601", "mbpp/602", "mbpp/700", "mbpp/974"] and val == ["mbpp/520", "mbpp/530"]
    arms = ["grpo", "sft_grpo", "format"]
    # the plan's remainder (experiments/real_data/design.py's rates): all of it, then less what landed
    assert harness.remaining_line(tmp_path / "ev", [1, 2, 3], arms).startswith("real data: 0 of 12 runs landed; ~37 h")
    prepass = runner.prepass()
    # the budget rule on the validation tasks, then one pass on the training tasks at the chosen budget; the pools'
    # passes at the design's POOL_SAMPLES, the evaluations at SAMPLES
    passes = [(n, flags_of(c)) for n, c in calls if n.startswith("prepass")]
    assert [(Path(f["--eval_file"][-1]).name, f["--num_samples"][-1]) for _, f in passes] == [
        ("val.jsonl", str(real.POOL_SAMPLES)),
        ("train.jsonl", str(real.POOL_SAMPLES)),
    ]
    assert passes[1][1]["--max_new_tokens"][-1] == str(real.BUDGETS[0])
    assert prepass["budgets_tried"][0]["samples"] == len(val) * real.POOL_SAMPLES
    assert prepass["samples"] == real.SAMPLES and prepass["pool_samples"] == real.POOL_SAMPLES
    assert set(prepass["counts"]) == {*train, *val}
    assert (tmp_path / "ev" / "prepass" / f"train-{real.BUDGETS[0]}.json").is_file()
    runner.references()
    runner.one_run("base", 1, "[1]")
    runner.one_run("sft_grpo", 1, "[2]")
    sft = flags_of(dict(calls)["sft_references-s1.train"])
    assert sft["--max_steps"] == [str(real.SFT_STEPS)]
    assert flags_of(dict(calls)["sft_grpo-s1.train"])["--max_steps"] == [str(real.GRPO_STEPS)]
    assert flags_of(dict(calls)["sft_grpo-s1.prepass"])["--num_samples"][-1] == str(real.POOL_SAMPLES)
    assert {flags_of(c)["--num_samples"][-1] for n, c in calls if ".eval." in n} == {str(real.SAMPLES)}
    evals = [n for n, _ in calls if ".eval." in n]
    assert evals == [
        "base-s1.eval.mbpp_test",
        "base-s1.eval.humaneval",
        "sft_grpo-s1.eval.mbpp_test",
        "sft_grpo-s1.eval.humaneval",
    ]
    run = json.loads((tmp_path / "ev" / "runs" / "sft_grpo-s1.json").read_text())
    assert set(run["evals"]) == {"mbpp_test", "humaneval"}
    report = report_mod.build_report(tmp_path / "ev", "cmd")
    assert report["eval_sets"]["humaneval"]["tasks"] == 1
    assert "sft_grpo - grpo" not in report["eval_sets"]["mbpp_test"]["analysis"]["all"]["strict_pass@1"]["contrasts"]
    assert "## mbpp_test (2 problems)" in report_mod.markdown(report)
    # the header says what ran: the arms' sampler, the budgets the pre-pass tried, the commits, the arms' letters
    (tmp_path / "ev" / "recipe.json").write_text(json.dumps({"flags": {"sampler": "vllm"}}))
    text = report_mod.markdown(report_mod.build_report(tmp_path / "ev", "cmd"))
    assert "Arms sampled by vllm" in text
    assert f"(tried: {real.BUDGETS[0]}: 0.0% of the base's answers at the budget" in text
    assert f"commits {run['git']['commit'] or 'unknown'}" in text
    assert "| B sft_grpo (teacher-SFT, then GRPO" in text
    assert "near-duplicates" not in text and "mbpp_test: every problem (2), 4 samples each" in text
    left = real.remaining_hours({("base", 1), ("sft_grpo", 1)}, harness.tg_run.plan_runs([1, 2, 3], arms), True)
    assert f"2 of 12 runs landed; ~{left:.0f} h left" in harness.remaining_line(tmp_path / "ev", [1, 2, 3], arms)


def test_an_unfinished_training_task_pass_is_stashed_until_its_evidence_lands(tmp_path):
    args = harness.parse_args(["--output_dir", str(tmp_path / "w"), "--evidence_dir", str(tmp_path / "ev")])
    runner = harness.Runner(args, tmp_path / "w", tmp_path / "ev", "cmd")
    budget = real.BUDGETS[-1]
    cache = tmp_path / "w" / f"prepass-{budget}-train" / "eval_cache" / "c.jsonl"
    cache.parent.mkdir(parents=True)
    cache.write_text('{"task_id": "mbpp/601"}\n')
    assert cache in runner.base_model_caches()
    runner.train_pass_path(budget).parent.mkdir(parents=True)
    runner.train_pass_path(budget).write_text("{}")
    assert cache not in runner.base_model_caches()
