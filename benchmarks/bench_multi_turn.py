"""Multi-turn check: `feedback` mode vs single-turn at the same generated-token budget (not a CI test).

    python benchmarks/bench_multi_turn.py [--tasks 16] [--samples 8] [--budget 256] [--max_turns 2]
                                          [--model embedded:SmolLM2-135M-Instruct] [--output outputs/multi_turn_check.json]

On the embedded student and the fixture tasks (MBPP and APPS, one visible test each), sample
`--samples` answers per task two ways, with the same sampling settings (the evaluation section of
the cpu preset):
- single: one answer of at most `--budget` tokens;
- feedback: up to `--max_turns` answers of at most `--budget // --max_turns` tokens each, so the
  policy writes at most `--budget` tokens in all (the feedback turns the environment inserts do not
  count against it; `multi_turn.max_total_tokens` is set high enough for them).
Reported: the final-answer pass rate of each (share of samples passing all tests) with 95% bootstrap
intervals over tasks and the paired difference, the feedback mode's pass rate after turn 1 vs after
the last turn (how much the second answer adds), and the mean policy tokens per sample of each.

This measures the untrained model. The issue's learning check (pass rate before/after N training
steps in each mode) needs phase 3 in a multi-turn mode, which is not wired yet (the trainer must use
`action_mask`); this script is its measurement half.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def per_task_mean(rows: list[dict], key: str) -> dict[str, float]:
    by_task: dict[str, list[float]] = {}
    for row in rows:
        by_task.setdefault(row["task_id"], []).append(float(row[key]))
    return {k: sum(v) / len(v) for k, v in sorted(by_task.items())}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=16, help="Fixture tasks (MBPP first, then APPS).")
    parser.add_argument("--samples", type=int, default=8, help="Samples per task in each mode.")
    parser.add_argument("--budget", type=int, default=256, help="Policy tokens per sample in each mode.")
    parser.add_argument("--max_turns", type=int, default=2, help="Answers per sample in feedback mode.")
    parser.add_argument("--model", default="embedded:SmolLM2-135M-Instruct")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(ROOT / "outputs" / "multi_turn_check.json"))
    args = parser.parse_args(argv)

    import torch

    from config import build_config
    from evaluation.bootstrap import bootstrap_interval, paired_bootstrap_interval
    from evaluation.code_executor import SandboxLimits, SandboxPool
    from evaluation.evaluate import execute_samples, generate_cached, summarize
    from multiturn.backends import HFContinuer
    from multiturn.environments import make_environment
    from multiturn.sampler import MultiTurnSampler
    from rollouts.hf import HFRollout
    from rollouts.sampling import SamplingSettings
    from utils.dataset_loader import load_apps, load_mbpp
    from utils.student_model import load_student

    config = build_config(
        "cpu",
        overrides=[
            f"multi_turn.max_turns={args.max_turns}",
            f"multi_turn.max_total_tokens={args.budget + 400 * args.max_turns}",
        ],
    )
    mbpp = load_mbpp(ROOT / "data" / "embedded" / "mbpp_fixtures.jsonl")[0]
    apps = load_apps(ROOT / "data" / "embedded" / "apps_fixtures.jsonl")[0]
    tasks = (mbpp + apps)[: args.tasks]
    model, tokenizer = load_student(args.model, "float32", device="cpu")
    sampling = SamplingSettings.from_section(config.evaluation)
    template = {"enable_thinking": config.student.enable_thinking}
    limits = SandboxLimits.from_config(config.sandbox)
    out_dir = Path(args.output).parent / "multi_turn_check_cache"
    results: dict = {"settings": vars(args), "tasks": [t.task_id for t in tasks]}
    rows_of: dict[str, list[dict]] = {}
    with SandboxPool(0, limits, config.sandbox.isolate) as pool:
        single = HFRollout(tokenizer, args.budget, sampling, template, batch_size=8)
        environment = make_environment("feedback", pool, config.multi_turn, 1, limits)
        sampler = MultiTurnSampler(
            lambda m, _step: HFContinuer(m, tokenizer, sampling),
            environment,
            tokenizer,
            "feedback",
            args.budget // args.max_turns,
            config.multi_turn.max_total_tokens,
            template,
        )
        runs = {
            "single": (lambda prompts, n: single.generate(model, prompts, n, 0), "single"),
            "feedback": (lambda prompts, n, tasks_: sampler.generate(model, prompts, n, 0, tasks_), "feedback"),
        }
        for name, (generate, mode) in runs.items():
            torch.manual_seed(args.seed)
            start = time.monotonic()
            cache = generate_cached(tasks, generate, args.samples, out_dir / f"{name}-{args.seed}.jsonl", 1, mode=mode)
            rows = execute_samples(tasks, cache, args.samples, pool, limits)
            for row in rows:
                cached = cache[(row["task_id"], row["sample_idx"])]
                row["policy_tokens"] = cached.get("num_policy_tokens", cached["num_tokens"])
            rows_of[name] = rows
            summary = summarize(rows, [1])
            rate = per_task_mean(rows, "passed")
            results[name] = {
                "pass_rate": sum(rate.values()) / len(rate),
                "pass_rate_ci95": list(bootstrap_interval(list(rate.values()), seed=args.seed)),
                "mean_policy_tokens": sum(r["policy_tokens"] for r in rows) / len(rows),
                "multi_turn": summary["multi_turn"],
                "seconds": time.monotonic() - start,
            }
    for row in rows_of["feedback"]:
        row["first_passed"] = row.get("answers_passed", [row["passed"]])[0]
    first = per_task_mean(rows_of["feedback"], "first_passed")
    final = per_task_mean(rows_of["feedback"], "passed")
    single_rate = per_task_mean(rows_of["single"], "passed")
    ids = sorted(final)
    results["feedback"]["turn1_pass_rate"] = sum(first.values()) / len(first)
    results["feedback"]["turn1_to_final_ci95"] = list(
        paired_bootstrap_interval([final[t] for t in ids], [first[t] for t in ids], seed=args.seed)
    )
    results["feedback_minus_single"] = results["feedback"]["pass_rate"] - results["single"]["pass_rate"]
    results["feedback_minus_single_ci95"] = list(
        paired_bootstrap_interval([final[t] for t in ids], [single_rate[t] for t in ids], seed=args.seed)
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=2))
    s, f = results["single"], results["feedback"]
    print(f"\n{len(tasks)} tasks x {args.samples} samples, policy budget {args.budget} tokens per sample")
    print(
        f"single:   pass rate {s['pass_rate']:.3f} [{s['pass_rate_ci95'][0]:.3f}, {s['pass_rate_ci95'][1]:.3f}], "
        f"{s['mean_policy_tokens']:.0f} policy tokens per sample"
    )
    print(
        f"feedback: pass rate {f['pass_rate']:.3f} [{f['pass_rate_ci95'][0]:.3f}, {f['pass_rate_ci95'][1]:.3f}] "
        f"(after turn 1: {f['turn1_pass_rate']:.3f}; final - turn 1 paired 95% CI "
        f"[{f['turn1_to_final_ci95'][0]:+.3f}, {f['turn1_to_final_ci95'][1]:+.3f}]), "
        f"{f['mean_policy_tokens']:.0f} policy tokens per sample, {f['multi_turn']['mean_turns']:.2f} turns"
    )
    print(
        f"feedback - single: {results['feedback_minus_single']:+.3f} (paired 95% CI "
        f"[{results['feedback_minus_single_ci95'][0]:+.3f}, {results['feedback_minus_single_ci95'][1]:+.3f}])"
    )
    print(f"Wrote {args.output}")
    return results


if __name__ == "__main__":
    main()
