"""The benchmarks' own code paths, run at toy sizes (their numbers are not checked here, only that they run
and report what their docstrings promise)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_sampling_candidates_run_and_report_their_update_cost(tmp_path):
    import argparse

    from benchmarks import bench_sampling

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
    """python -m benchmarks.gpu_step_split --tiny: the script a GPU lease runs, on a 2-layer toy on the CPU. Every
    measurement of its three legs is there (generate at 8/32/64 sequences unmerged, 8/64 merged; the GRPO chunk,
    the reference forward and the teacher-SFT pass with the memory model's prediction; the adapter save), and the
    step estimate is built from them."""
    import json

    from benchmarks import gpu_step_split

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


@pytest.mark.slow
def test_the_gpu_update_probe_runs_on_a_toy_shape_without_the_packages_a_bare_gpu_machine_lacks(tmp_path):
    """python -m benchmarks.gpu_update_probe --tiny, in its own process as a GPU machine runs it: every leg lands in the
    JSON (written after each leg), the update estimate is built from them, and nothing beyond torch, transformers
    and peft was needed (no vLLM, openai, matplotlib or datasets imported: a bare GPU machine has none of them)."""
    import json
    import subprocess
    import sys

    check = (
        "import runpy, sys; "
        f"sys.argv = ['gpu_update_probe', '--tiny', '--out', {str(tmp_path)!r}]; "
        "runpy.run_module('benchmarks.gpu_update_probe', run_name='__main__', alter_sys=True); "
        "print('IMPORTED', sorted(m for m in ('vllm', 'openai', 'matplotlib', 'datasets') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "IMPORTED []" in done.stdout and "\ndone\n" in done.stdout, done.stdout[-2000:]
    result = json.loads((tmp_path / "gpu_update_probe.json").read_text())
    legs = result["legs"]
    assert set(legs) == {"build_s", "merged_weights", "update", "grpo_chunk_profile", "hf_generate", "update_estimate"}
    assert legs["merged_weights"]["seconds"] > 0 and legs["merged_weights"]["elements"] > 0
    passes = {"grpo_chunk_4_rows", "grpo_chunk_8_rows", "reference_4_rows", "teacher_sft_2_rows"}
    assert set(legs["update"]) == passes | {"grpo_chunk_4_rows_no_checkpointing"}
    assert all(p["seconds"] > 0 and p["predicted_gb"] > 0 for p in legs["update"].values())
    profile = legs["grpo_chunk_profile"]
    assert profile["wall_s"] > 0 and 0 < len(profile["top"]) <= 15
    assert set(legs["hf_generate"]) == {"8", "64"} and all(
        d["ms_per_decode_step"] > 0 for d in legs["hf_generate"].values()
    )
    estimate = legs["update_estimate"]
    assert estimate["update_s"] > 0 and estimate["decode_64_over_8_ms_per_step"] > 0
