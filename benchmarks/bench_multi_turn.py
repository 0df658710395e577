"""Multi-turn check: `feedback` mode vs single-turn at the same generated-token budget (not a CI test).

    python benchmarks/bench_multi_turn.py [--tasks 16] [--samples 8] [--budget 256] [--max_turns 2]
                                          [--model embedded:SmolLM2-135M-Instruct]
                                          [--output outputs/multi_turn_check.json]

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

Learning check, `--train_steps N`:

    python benchmarks/bench_multi_turn.py --train_steps 8 --tasks 12 --samples 4 --budget 256 \
        --output benchmarks/results/multi_turn_learning.json

trains the student twice from the same seed and the same LoRA initialization, on the same fixture
tasks with the same step count, prompts per step, group size and learning rate: once single-turn
(phase 3 `--mode single`, `grpo.max_new_tokens = --budget`) and once in feedback mode (phase 3
`--mode feedback`, `grpo.max_new_tokens = --budget // --max_turns` per answer). So in both variants
the policy writes at most `--budget` tokens per sample, in training and in evaluation (the feedback
turns the environment inserts are not policy tokens and are never trained on). GRPO + self-SFT
only (no teacher traces: `--teacher_sft` off), the rollout backend of the cpu preset (kv sampler).
Each variant is evaluated in its own mode before (adapter off) and after training, on the same
tasks it trained on (a learning check, not a generalization measurement), with the evaluation
section's sampling settings: the final-answer pass rate with 95% bootstrap intervals over tasks and
the paired after - before difference, the feedback variant's turn-1 vs final-turn pass rate, and the
difference of the two variants' gains (paired over tasks). One thread (`--threads`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from evaluation.evaluate import CachedCompletion, EvalSample
    from rollouts.completion import RolloutCompletion

# generate_cached's `generate`: (prompts, n) or (prompts, n, tasks) -> the rollout completions of each prompt
Generate: TypeAlias = "Callable[..., list[list[RolloutCompletion]]]"


def per_task_mean(rows: list[dict], key: str) -> dict[str, float]:
    by_task: dict[str, list[float]] = {}
    for row in rows:
        by_task.setdefault(row["task_id"], []).append(float(row[key]))
    return {k: sum(v) / len(v) for k, v in sorted(by_task.items())}


def sample_rows(samples: Sequence[EvalSample], cache: Mapping[tuple[str, int], CachedCompletion]) -> list[dict]:
    """Judged samples as rows, plus what the reports read: `policy_tokens` (tokens the policy wrote),
    `first_passed` (the first answer's verdict on all tests; single-turn: the only answer's) and `truncated`."""
    rows = []
    for sample in samples:
        cached = cache[(sample.task_id, sample.sample_idx)]
        row = sample.to_row()
        row["policy_tokens"] = cached.num_policy_tokens if cached.num_policy_tokens is not None else cached.num_tokens
        row["first_passed"] = (sample.answers_passed or (sample.passed,))[0]
        row["truncated"] = bool(cached.truncated)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=16, help="Fixture tasks (MBPP first, then APPS).")
    parser.add_argument("--samples", type=int, default=8, help="Samples per task in each mode.")
    parser.add_argument("--budget", type=int, default=256, help="Policy tokens per sample in each mode.")
    parser.add_argument("--max_turns", type=int, default=2, help="Answers per sample in feedback mode.")
    parser.add_argument("--model", default="embedded:SmolLM2-135M-Instruct")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(ROOT / "outputs" / "multi_turn_check.json"))
    parser.add_argument(
        "--train_steps", type=int, default=0, help="Learning check: train each variant this many optimizer steps."
    )
    parser.add_argument("--prompts_per_step", type=int, default=4, help="Learning check: tasks per optimizer step.")
    parser.add_argument("--group", type=int, default=4, help="Learning check: samples per task in a GRPO group.")
    parser.add_argument("--lr", type=float, default=5e-4, help="Learning check: learning rate.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the measurement is sized for one).")
    parser.add_argument(
        "--work_dir",
        help="Learning check: where samples, checkpoints and metrics go (default: outputs/<output's stem>).",
    )
    args = parser.parse_args(argv)
    if args.train_steps > 0:
        return learning_check(args)

    import torch

    from config import build_config
    from environments.code_env import make_environment
    from evaluation.bootstrap import bootstrap_interval, paired_bootstrap_interval
    from evaluation.evaluate import execute_samples, generate_cached, summarize
    from rollouts.groups import Episodes, sample_groups
    from rollouts.hf import HFRollout
    from rollouts.sampling import SamplingSettings
    from sandbox.executor import SandboxPool
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
    template = config.student.chat_template_kwargs
    out_dir = Path(args.output).parent / "multi_turn_check_cache"
    results: dict = {"settings": vars(args), "tasks": [t.task_id for t in tasks]}
    rows_of: dict[str, list[dict]] = {}
    with SandboxPool.from_config(config.sandbox, workers=0) as pool:
        single = HFRollout(tokenizer, args.budget, sampling, template, batch_size=8)
        environment = make_environment("feedback", pool, config.multi_turn, 1)
        feedback = HFRollout(tokenizer, args.budget // args.max_turns, sampling, template)
        episodes = Episodes(
            environment, "feedback", args.budget // args.max_turns, config.multi_turn.max_total_tokens, template
        )
        runs: dict[str, tuple[Generate, str]] = {  # (prompts, n, tasks) -> completions per prompt, mode
            "single": (lambda prompts, n, _tasks: sample_groups(single, model, prompts, n), "single"),
            "feedback": (
                lambda prompts, n, tasks_: sample_groups(feedback, model, prompts, n, tasks=tasks_, episodes=episodes),
                "feedback",
            ),
        }
        for name, (generate, mode) in runs.items():
            torch.manual_seed(args.seed)
            start = time.monotonic()
            cache = generate_cached(
                tasks,
                generate,
                args.samples,
                cache_path=out_dir / f"{name}-{args.seed}.jsonl",
                num_visible_tests=1,
                mode=mode,
            )
            samples = execute_samples(tasks, cache, args.samples, pool)
            summary = summarize(samples, [1])
            rows = sample_rows(samples, cache)
            rows_of[name] = rows
            rate = per_task_mean(rows, "passed")
            results[name] = {
                "pass_rate": sum(rate.values()) / len(rate),
                "pass_rate_ci95": list(bootstrap_interval(list(rate.values()), seed=args.seed)),
                "mean_policy_tokens": sum(r["policy_tokens"] for r in rows) / len(rows),
                "multi_turn": summary["multi_turn"],
                "seconds": time.monotonic() - start,
            }
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


def train_and_measure(
    args: argparse.Namespace, variant: str, tasks: list, out: Path, per_turn: dict[str, int]
) -> tuple[list[dict], list[dict], list[dict]]:
    """One variant of the learning check: (evaluation rows before, rows after, training metrics per step)."""
    import torch

    from config import build_config
    from evaluation.evaluate import execute_samples, generate_cached
    from rollouts.from_config import build_sampler, episodes_for
    from rollouts.groups import sample_groups
    from sandbox.executor import SandboxPool
    from training.grpo_trainer import GRPOTrainer
    from training.setup import build_run
    from utils.student_model import attach_lora, load_student

    config = build_config(
        "cpu",
        overrides=[
            f"paths.output_dir={out / variant}",
            f"multi_turn.mode={variant}",
            f"multi_turn.max_turns={args.max_turns}",
            f"multi_turn.max_total_tokens={args.budget + 300 * (args.max_turns - 1)}",
            f"grpo.max_new_tokens={per_turn[variant]}",
            f"grpo.num_samples_per_prompt={args.group}",
            f"evaluation.max_new_tokens={per_turn[variant]}",
            f"training.max_steps={args.train_steps}",
            "training.save_steps=0",
            f"training.per_device_train_batch_size={args.prompts_per_step}",
            f"training.learning_rate={args.lr}",
            f"training.seed={args.seed}",
            "dual_source.teacher_sft_weight=0",
        ],
    )
    shutil.rmtree(out / variant, ignore_errors=True)  # no cached samples or checkpoints of an earlier run
    torch.manual_seed(args.seed)  # the same LoRA initialization for both variants
    model, tokenizer = load_student(args.model, "float32", device="cpu")
    lora = config.lora
    model = attach_lora(model, lora.r, lora.lora_alpha, lora.lora_dropout, lora.target_modules)
    with SandboxPool.from_config(config.sandbox, workers=2) as pool:
        evaluator = build_sampler(config, purpose="eval", tokenizer=tokenizer)
        episodes = episodes_for(config, pool, max_new_tokens=per_turn[variant])

        def measure(tag: str) -> list[dict]:
            torch.manual_seed(args.seed + 1)  # the same sampling noise before and after

            def generate(prompts: list[str], n: int, tasks_: list) -> list:
                return sample_groups(evaluator, model, prompts, n, tasks=tasks_, episodes=episodes)

            cache = generate_cached(
                tasks,
                generate,
                args.samples,
                cache_path=out / variant / f"samples_{tag}.jsonl",
                num_visible_tests=config.prompt.num_visible_tests,
                chunk=args.samples,
                batch_samples=32,  # the kv sampler's best batch on CPU (bench_sampling)
                mode=variant,
            )
            return sample_rows(execute_samples(tasks, cache, args.samples, pool), cache)

        with model.disable_adapter():
            before = measure("before")
        parts = build_run(
            config,
            tasks=tasks,
            teacher_examples=[],
            output_dir=out / variant,
            model=model,
            tokenizer=tokenizer,
            rollout=build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=out / variant),
            pool=pool,
        )
        trainer = GRPOTrainer(parts)
        trainer.train()
        after = measure("after")
    curve = [json.loads(line) for line in (out / variant / "metrics.jsonl").read_text().splitlines() if line]
    return before, after, curve


def learning_check(args: argparse.Namespace) -> dict:
    import torch

    from evaluation.bootstrap import bootstrap_interval, paired_bootstrap_interval
    from utils.dataset_loader import load_apps, load_mbpp

    torch.set_num_threads(args.threads)
    mbpp = load_mbpp(ROOT / "data" / "embedded" / "mbpp_fixtures.jsonl")[0]
    apps = load_apps(ROOT / "data" / "embedded" / "apps_fixtures.jsonl")[0]
    tasks = (mbpp + apps)[: args.tasks]
    out = Path(args.work_dir) if args.work_dir else ROOT / "outputs" / Path(args.output).stem  # both variants' files
    per_turn = {"single": args.budget, "feedback": args.budget // args.max_turns}
    results: dict = {
        "settings": vars(args),
        "budget": {
            "rule": "at most --budget policy tokens per sample in both variants: single-turn answers of --budget "
            "tokens, feedback answers of --budget // --max_turns tokens each (environment turns not counted)",
            "max_new_tokens_per_answer": per_turn,
        },
        "tasks": [t.task_id for t in tasks],
    }
    by_task: dict[str, dict[str, dict[str, float]]] = {}
    for variant in ("single", "feedback"):
        start = time.monotonic()
        before, after, curve = train_and_measure(args, variant, tasks, out, per_turn)
        entry: dict = {"seconds": time.monotonic() - start}
        for tag, rows in (("before", before), ("after", after)):
            rate = per_task_mean(rows, "passed")
            first = per_task_mean(rows, "first_passed")
            by_task[f"{variant}_{tag}"] = {"final": rate, "first": first}
            entry[tag] = {
                "pass_rate": sum(rate.values()) / len(rate),
                "pass_rate_ci95": list(bootstrap_interval(list(rate.values()), seed=args.seed)),
                "turn1_pass_rate": sum(first.values()) / len(first),
                "mean_policy_tokens": sum(r["policy_tokens"] for r in rows) / len(rows),
                "truncated": sum(r["truncated"] for r in rows) / len(rows),
            }
        ids = sorted(by_task[f"{variant}_before"]["final"])
        b, a = by_task[f"{variant}_before"]["final"], by_task[f"{variant}_after"]["final"]
        entry["gain"] = entry["after"]["pass_rate"] - entry["before"]["pass_rate"]
        entry["gain_ci95"] = list(paired_bootstrap_interval([a[t] for t in ids], [b[t] for t in ids], seed=args.seed))
        entry["training"] = {
            "train_pass_rate_by_step": [m.get("pass_rate") for m in curve],
            "reward_by_step": [m.get("reward/mean") for m in curve],
            **{
                k: [m.get(k) for m in curve] for k in ("multi_turn/turns_mean", "multi_turn/truncated") if k in curve[0]
            },
        }
        results[variant] = entry
        print(
            f"{variant}: pass rate {entry['before']['pass_rate']:.3f} -> {entry['after']['pass_rate']:.3f} "
            f"(gain {entry['gain']:+.3f}, paired 95% CI [{entry['gain_ci95'][0]:+.3f}, {entry['gain_ci95'][1]:+.3f}]; "
            f"turn-1 {entry['before']['turn1_pass_rate']:.3f} -> {entry['after']['turn1_pass_rate']:.3f}) "
            f"in {entry['seconds']:.0f} s",
            flush=True,
        )
    ids = sorted(by_task["single_before"]["final"])

    def gain(variant: str) -> list[float]:
        a, b = by_task[f"{variant}_after"]["final"], by_task[f"{variant}_before"]["final"]
        return [a[t] - b[t] for t in ids]

    results["feedback_gain_minus_single_gain"] = results["feedback"]["gain"] - results["single"]["gain"]
    results["feedback_gain_minus_single_gain_ci95"] = list(
        paired_bootstrap_interval(gain("feedback"), gain("single"), seed=args.seed)
    )
    fa, sa = by_task["feedback_after"]["final"], by_task["single_after"]["final"]
    results["after_feedback_minus_single"] = (
        results["feedback"]["after"]["pass_rate"] - results["single"]["after"]["pass_rate"]
    )
    results["after_feedback_minus_single_ci95"] = list(
        paired_bootstrap_interval([fa[t] for t in ids], [sa[t] for t in ids], seed=args.seed)
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    low, high = results["feedback_gain_minus_single_gain_ci95"]
    print(
        f"feedback gain - single gain: {results['feedback_gain_minus_single_gain']:+.3f} "
        f"(paired 95% CI [{low:+.3f}, {high:+.3f}]); wrote {args.output}"
    )
    return results


if __name__ == "__main__":
    main()
