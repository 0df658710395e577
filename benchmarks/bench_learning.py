"""Learning check: does training raise the reward on easy tasks? (Not a CI test: it takes a while.)

    python benchmarks/bench_learning.py [--tasks 16] [--steps 30] [--samples 8]
                                        [--teacher references|traces|none] [--lr 5e-4]

On the embedded SmolLM2-135M and the easiest fixture tasks: measure the mean training reward
(share of tests passed) over tasks x samples with the adapter off, train `--steps` optimizer steps
with the cpu preset on those same tasks, then measure again with the adapter on, with the same
sampling settings. The difference is reported with a 95% bootstrap interval over tasks, so that it
can be told apart from sampling noise. `--teacher references` uses the tasks' reference solutions as
teacher traces (a stand-in for a strong teacher), `traces` uses data/teacher_traces.jsonl, `none`
trains on GRPO and self-SFT only. Whatever it measures is printed and saved to
outputs/learning_check.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def mean_pass_fraction_by_task(rows: list[dict]) -> dict[str, float]:
    by_task: dict[str, list[float]] = {}
    for row in rows:
        by_task.setdefault(row["task_id"], []).append(row["pass_fraction"])
    return {k: sum(v) / len(v) for k, v in by_task.items()}


def bootstrap_ci(differences: list[float], rounds: int = 5000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(differences) for _ in differences) / len(differences) for _ in range(rounds))
    return means[int(0.025 * rounds)], means[int(0.975 * rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=16, help="The first N (easiest) MBPP-format fixtures.")
    parser.add_argument("--steps", type=int, default=30, help="Optimizer steps of training.")
    parser.add_argument("--samples", type=int, default=8, help="Samples per task for each measurement.")
    parser.add_argument(
        "--teacher",
        choices=("references", "traces", "none"),
        default="references",
        help="Teacher-SFT source: the tasks' reference solutions, data/teacher_traces.jsonl, or none.",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=5e-4,
        help="Learning rate (the cpu preset's 1e-4 moves a 135M LoRA too little in a few dozen steps).",
    )
    parser.add_argument("--teacher_batch", type=int, default=2, help="Teacher-SFT examples per optimizer step.")
    parser.add_argument("--max_new_tokens", type=int, default=160, help="Completion budget, training and measuring.")
    parser.add_argument(
        "--output_dir", default="outputs/learning_check", help="Samples, metrics and learning_check.json."
    )
    args = parser.parse_args()

    import torch

    from config import build_config
    from evaluation.evaluate import execute_samples, generate_cached
    from rollouts.groups import sample_groups
    from rollouts.hf import HFRollout
    from rollouts.sampling import SamplingSettings
    from sandbox.executor import SandboxPool
    from synthesis.generate_traces import TeacherTrace, load_teacher_examples
    from training.grpo_trainer import GRPOTrainer
    from training.setup import build_run
    from utils.dataset_loader import EMBEDDED_MBPP, load_mbpp
    from utils.prompts import get_unified_prompt
    from utils.student_model import attach_lora, load_student

    out = Path(args.output_dir)
    config = build_config(
        "cpu",
        overrides=[
            f"paths.output_dir={out}",
            f"training.max_steps={args.steps}",
            "training.save_steps=0",
            "training.per_device_train_batch_size=2",
            f"training.learning_rate={args.lr}",
            f"grpo.max_new_tokens={args.max_new_tokens}",
            f"dual_source.teacher_sft_batch_size={args.teacher_batch}",
        ],
    )
    tasks = load_mbpp(EMBEDDED_MBPP)[0][: args.tasks]
    if args.teacher == "references":
        teacher = [
            TeacherTrace(t.task_id, 0, get_unified_prompt(t), code=t.reference_solutions[0], passed=True) for t in tasks
        ]
    elif args.teacher == "traces":
        teacher = load_teacher_examples(config.paths.teacher_traces_file, {t.task_id for t in tasks}, True)
    else:
        teacher = []
    torch.manual_seed(0)
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    model = attach_lora(
        model, config.lora.r, config.lora.lora_alpha, config.lora.lora_dropout, config.lora.target_modules
    )
    g = config.grpo
    rollout = HFRollout(
        tokenizer, g.max_new_tokens, SamplingSettings.from_section(g), {"enable_thinking": True}, batch_size=8
    )
    with SandboxPool.from_config(config.sandbox, workers=2) as pool:

        def measure(tag: str) -> list[dict]:
            cache = generate_cached(
                tasks,
                lambda p, n, _tasks: sample_groups(rollout, model, p, n),
                args.samples,
                cache_path=out / f"samples_{tag}.jsonl",
                chunk=args.samples,
            )
            return [s.to_row() for s in execute_samples(tasks, cache, args.samples, pool)]

        with model.disable_adapter():
            before = measure("before")
        parts = build_run(
            config,
            tasks=tasks,
            teacher_examples=teacher,
            output_dir=out,
            model=model,
            tokenizer=tokenizer,
            rollout=rollout,
            pool=pool,
        )
        trainer = GRPOTrainer(parts)
        trainer.train()
        after = measure("after")
    b, a = mean_pass_fraction_by_task(before), mean_pass_fraction_by_task(after)
    diffs = [a[t.task_id] - b[t.task_id] for t in tasks]
    low, high = bootstrap_ci(diffs)
    result = {
        "tasks": len(tasks),
        "samples_per_task": args.samples,
        "steps": args.steps,
        "teacher": args.teacher,
        "learning_rate": args.lr,
        "teacher_batch": args.teacher_batch,
        "max_new_tokens": args.max_new_tokens,
        "reward_before": sum(b.values()) / len(b),
        "reward_after": sum(a.values()) / len(a),
        "pass_rate_before": sum(r["passed"] for r in before) / len(before),
        "pass_rate_after": sum(r["passed"] for r in after) / len(after),
        "mean_difference": sum(diffs) / len(diffs),
        "ci95": [low, high],
    }
    (out / "learning_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    verdict = "improved" if low > 0 else "got worse" if high < 0 else "no difference distinguishable from noise"
    print(
        f"\nreward {result['reward_before']:.3f} -> {result['reward_after']:.3f} "
        f"(difference {result['mean_difference']:+.3f}, 95% CI [{low:+.3f}, {high:+.3f}]): {verdict}"
    )


if __name__ == "__main__":
    main()
