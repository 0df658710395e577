"""The ablation runner on a tiny setting: identical budget, reports, resume without retraining."""

from __future__ import annotations

import json

import pytest

from experiments.ablation import run as bench_ablation
from tests.conftest import ROOT


def tiny(tmp_path, *extra):
    sizes = "--steps 1 --tasks 2 --eval_set val --eval_tasks 2 --max_new_tokens 8 --eval_max_new_tokens 8"
    folders = ["--output_dir", str(tmp_path / "out"), "--results_dir", str(tmp_path / "results")]
    return [*sizes.split(), "--model", "embedded:tiny-random", *folders, *extra]


def test_variants_differ_only_in_their_loss_weights():
    by_name = {v.name: v for v in bench_ablation.variants(1.0, 0.3, 0.2)}
    assert list(by_name) == ["base", "teacher_sft", "grpo", "grpo_teacher", "full"]
    assert by_name["base"].weights is None
    assert by_name["teacher_sft"].weights == {"grpo_weight": 0.0, "teacher_sft_weight": 0.3, "self_sft_weight": 0.0}
    assert by_name["grpo"].weights == {"grpo_weight": 1.0, "teacher_sft_weight": 0.0, "self_sft_weight": 0.0}
    assert by_name["grpo_teacher"].weights == {"grpo_weight": 1.0, "teacher_sft_weight": 0.3, "self_sft_weight": 0.0}
    assert by_name["full"].weights == {"grpo_weight": 1.0, "teacher_sft_weight": 0.3, "self_sft_weight": 0.2}


@pytest.mark.slow
def test_tiny_ablation_reports_and_resumes_without_retraining(tmp_path):
    argv = tiny(tmp_path, "--variants", "base", "teacher_sft", "full")
    report = bench_ablation.main(argv)
    names = [v["name"] for v in report["variants"]]
    assert names == ["base", "teacher_sft", "full"]
    assert [v["status"] for v in report["variants"]] == ["nothing to train", "trained", "trained"]
    results = tmp_path / "results"
    assert {p.name for p in results.iterdir()} == {"ablation.json", "ablation.md", "ablation.png"}
    saved = json.loads((results / "ablation.json").read_text())
    assert saved["eval_set"]["name"] == "val" and saved["decoding"] == "greedy, 1 sample per task"
    for variant in saved["variants"]:
        assert variant["pass_at_k_ci95"]["1"] is not None
        assert variant["sanitized_pass"] is not None and variant["at_budget"] is not None  # phase 4's, read
    full, teacher = saved["variants"][2], saved["variants"][1]
    assert full["full_minus_variant"] is None and full["variant_minus_base"]["1"]["ci95"] is not None
    assert teacher["full_minus_variant"]["1"]["ci95"] is not None
    assert "| teacher-SFT only |" in (results / "ablation.md").read_text()

    # identical budget: the trained variants' phase-3 configs differ only in the loss weights and folder
    out = tmp_path / "out"
    configs = {n: json.loads((out / n / "config.json").read_text()) for n in ("teacher_sft", "full")}
    for config in configs.values():
        config["paths"].pop("output_dir")
        for key in ("grpo_weight", "teacher_sft_weight", "self_sft_weight"):
            config["dual_source"].pop(key)
    assert configs["teacher_sft"] == configs["full"]
    assert configs["full"]["training"]["max_steps"] == 1
    # teacher-SFT learned from the reference traces; the teacher-SFT-only variant had no GRPO weight
    first_step = json.loads((out / "teacher_sft" / "metrics.jsonl").read_text().splitlines()[0])
    assert first_step["loss/teacher_sft"] > 0

    # a rerun trains and evaluates nothing
    adapter = out / "full" / "final_model" / "adapter_model.safetensors"
    stamp = adapter.stat().st_mtime_ns
    again = bench_ablation.main(argv)
    assert [v["status"] for v in again["variants"]] == ["nothing to train", "finished earlier", "finished earlier"]
    assert adapter.stat().st_mtime_ns == stamp
    assert [v["pass_at_k"] for v in again["variants"]] == [v["pass_at_k"] for v in report["variants"]]

    # a kill during the last variant: only that variant is trained again
    import shutil

    shutil.rmtree(out / "full" / "final_model")
    (out / "full" / "evaluation_results.json").unlink()
    resumed = bench_ablation.main(argv)
    # phase 3 always checkpoints its last step, so the killed variant resumes from there (nothing retrained)
    assert [v["status"] for v in resumed["variants"]] == ["nothing to train", "finished earlier", "resumed"]
    assert adapter.is_file() and (out / "full" / "evaluation_results.json").is_file()

    # another recipe in the same folder is refused instead of mixing numbers
    with pytest.raises(SystemExit, match="another recipe"):
        bench_ablation.main(tiny(tmp_path, "--variants", "base", "teacher_sft", "full", "--lr", "0.1"))


def test_make_lists_the_heavy_benchmark_targets():
    import subprocess

    listed = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert "make eval-humaneval" in listed and "make ablation" in listed
    planned = subprocess.run(
        ["make", "-n", "eval-humaneval", "ablation"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout
    assert "phase4_evaluate.py --preset cpu --eval_set humaneval --temperature 0 --num_samples 1" in planned
    assert "-m experiments.ablation.run" in planned
    assert (
        "Results: outputs/humaneval_results.json" in planned and "Results: experiments/results/ablation.json" in planned
    )
