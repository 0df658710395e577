"""The benchmarks' own code paths, run at toy sizes (their numbers are not checked here, only that they run
and report what their docstrings promise)."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.slow
def test_sampling_candidates_run_and_report_their_update_cost(tmp_path):
    import argparse

    import bench_sampling

    bench = bench_sampling.Bench(argparse.Namespace(prompts=1, samples=2, seed=0))
    runs, results = bench_sampling.setup_candidates(bench, ["generate", "kv-bf16", "ctranslate2"], tmp_path)
    assert set(runs) <= {"generate", "kv-bf16", "ctranslate2"} and {"generate", "kv-bf16"} <= set(runs)
    for name in ("generate", "kv-bf16"):
        assert 0 < runs[name](3) <= bench.rows * 3  # tokens sampled, each row stopping at its stop id or the budget
        assert results[name].update_s is not None and results[name].note and not results[name].skipped
    assert results["kv-bf16"].dtype == "bfloat16" and results["generate"].update_s == 0.0
    if "ctranslate2" not in runs:  # not a project dependency: reported as skipped, with the reason
        assert results["ctranslate2"].skipped.startswith("package missing (ctranslate2)")


@pytest.mark.slow
def test_the_gpu_step_split_runs_on_a_toy_shape_and_reports_every_measurement(tmp_path):
    """benchmarks/gpu_step_split.py --tiny: the script a GPU lease runs, on a 2-layer toy on the CPU. Every
    measurement of its three legs is there (generate at 8/32/64 sequences unmerged, 8/64 merged; the GRPO chunk,
    the reference forward and the teacher-SFT pass with the memory model's prediction; the adapter save), and the
    step estimate is built from them."""
    import json

    import gpu_step_split

    result = gpu_step_split.main(["--tiny", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "gpu_step_split.json").read_text()) == json.loads(json.dumps(result))
    found = {(r["measure"], r.get("lora"), r.get("sequences")) for r in result["measurements"]}
    generate = {("generate", "unmerged", n) for n in (8, 32, 64)} | {("generate", "merged", n) for n in (8, 64)}
    update = {("grpo_chunk", None, None), ("reference_forward", None, None), ("teacher_sft_pass", None, None)}
    assert found == generate | update | {("adapter_save", None, None)}
    assert all(r["seconds"] > 0 for r in result["measurements"])
    assert all(
        r["predicted_peak_bytes"] > 0 for r in result["measurements"] if r["measure"] in {m for m, _, _ in update}
    )
    estimate = result["preset_step_estimate"]
    assert estimate["rollout_sequences_per_call"] == 64  # the preset's whole rollout batch in one call
    assert estimate["update_s"] > 0 and estimate["reference_s"] > 0 and estimate["adapter_save_s"] > 0
