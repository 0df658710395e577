"""benchmarks.bench_async_grpo without a server: the order of the modes per seed, the learning-parity summary
(paired differences over seeds, hand-computed), and resumption from the written results."""

from __future__ import annotations

import json

from benchmarks import bench_async_grpo as bench


def run(seed: int, staleness: int, pass_rate: float, steps: int = 4, rollouts_per_hour: float = 400.0) -> dict:
    return {
        "seed": seed,
        "max_staleness": staleness,
        "steps": steps,
        "pass_rates": [pass_rate] * steps,
        "pass_rate_mean": pass_rate,
        "rollouts_per_hour": rollouts_per_hour,
        "wall_s_per_step": 8 * 3600 / rollouts_per_hour,
        "load_before": "0",
        "load_after": "0",
    }


def test_the_modes_alternate_their_order_between_seeds():
    assert bench.run_order(0, [0, 1, 2]) == [0, 1, 2]
    assert bench.run_order(1, [0, 1, 2]) == [2, 1, 0]


def test_parity_is_the_paired_difference_over_seeds_with_both_runs():
    runs = [run(0, 0, 0.10), run(0, 1, 0.20), run(1, 0, 0.30), run(1, 1, 0.20), run(2, 1, 0.90)]
    summary = bench.parity(runs)
    # seed 0: +0.10, seed 1: -0.10; seed 2 has no synchronous run and is left out
    assert summary["1"]["seeds"] == [0, 1]
    assert abs(summary["1"]["delta"]) < 1e-12
    assert abs(summary["1"]["sd"] - 0.1414213562) < 1e-9  # sd of (+0.1, -0.1)
    assert summary["1"]["df"] == 1
    assert "0" not in summary


def test_a_finished_benchmark_is_not_rerun_and_its_summary_is_rewritten(tmp_path):
    output = tmp_path / "async.json"
    runs = [run(0, 0, 0.10, rollouts_per_hour=400.0), run(0, 1, 0.15, rollouts_per_hour=600.0)]
    output.write_text(json.dumps({"runs": runs}))
    # every planned run is already there: nothing starts (no server, no phase 1), the summary is written
    assert bench.main(["--steps", "4", "--seeds", "0", "--staleness", "0,1", "--output", str(output)]) == 0
    written = json.loads(output.read_text())
    assert [r["speedup_vs_sync"] for r in written["runs"]] == [1.0, 1.5]
    assert abs(written["parity"]["1"]["delta"] - 0.05) < 1e-12
