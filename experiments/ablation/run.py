"""The ablation: does each loss term earn its place? (Not a CI test: hours of CPU at a useful size.)

    python -m experiments.ablation.run [--steps 60] [--tasks 0] [--eval_set humaneval] [--samples 1] ...

From one seed and one data preparation, five variants are trained at an identical budget and
evaluated on the same held-out set with the same sample budget:

    base          no training (the student as shipped)
    teacher_sft   teacher-SFT only          (GRPO and self-SFT weights 0)
    grpo          GRPO only                 (teacher-SFT and self-SFT weights 0)
    grpo_teacher  GRPO + teacher-SFT        (self-SFT weight 0)
    full          GRPO + teacher-SFT + self-SFT: the product's objective (the configured weights)

Identical budget: every trained variant runs phase 3 itself (`phase3_train_grpo.main`) with the same
config except the loss weights: the same steps, seed, data order, LoRA initialization, rollouts per
step (phase 3 samples and scores rollouts whatever the weights, so even teacher-SFT-only pays for
them) and token limits. Evaluation is phase 4 itself (`phase4_evaluate.main`) on the chosen set with
the same decoding for every variant; pass@k gets a 95% bootstrap interval over tasks and each
variant's difference from `full` and from `base` a paired one (the same tasks resampled together).

Teacher-SFT data (`--teacher`): `references` (default) uses the training tasks' reference solutions
as verified teacher traces, the stand-in for a strong teacher that the CPU machine can afford;
`traces` uses a phase-2 trace file (`--teacher_traces`).

Resumable: everything lives under `--output_dir` (default outputs/ablation). A variant with a
`final_model` is not trained again, one with checkpoints resumes from the newest, and a variant
with an evaluation result is not evaluated again (completions are cached by phase 4 as well). The
recipe (every flag that changes a number) is stored there; resuming with a different recipe is
refused. Writes experiments/results/ablation.json, ablation.md and ablation.png (pass@1 per variant
with its interval).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from experiments.frame import add_experiment_flags, claim_work_folder, phase4_grades, recipe_values

# Every flag that changes a number: a resumed experiment must have the same values.
RECIPE_FLAGS = (
    "steps tasks train_file eval_set eval_tasks mbpp_path apps_path samples k "
    "temperature eval_max_new_tokens max_new_tokens lr teacher teacher_traces teacher_batch seed model"
)


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    weights: dict[str, float] | None  # dual_source overrides; None: no training


def variants(grpo: float, teacher: float, self_sft: float) -> tuple[Variant, ...]:
    """The five variants; the trained ones keep the configured weights of the terms they use."""
    return (
        Variant("base", "base model (no training)", None),
        Variant(
            "teacher_sft",
            "teacher-SFT only",
            {"grpo_weight": 0.0, "teacher_sft_weight": teacher, "self_sft_weight": 0.0},
        ),
        Variant("grpo", "GRPO only", {"grpo_weight": grpo, "teacher_sft_weight": 0.0, "self_sft_weight": 0.0}),
        Variant(
            "grpo_teacher",
            "GRPO + teacher-SFT",
            {"grpo_weight": grpo, "teacher_sft_weight": teacher, "self_sft_weight": 0.0},
        ),
        Variant(
            "full",
            "GRPO + teacher-SFT + self-SFT (product)",
            {"grpo_weight": grpo, "teacher_sft_weight": teacher, "self_sft_weight": self_sft},
        ),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_experiment_flags(parser, output_dir="outputs/ablation", steps=60, samples=1, temperature=0.0)
    parser.add_argument(
        "--tasks",
        type=int,
        default=0,
        help="Training tasks, a seeded sample of the training split (0 = all; default 0).",
    )
    parser.add_argument(
        "--train_file",
        help="A task file to train on instead of phase 1's split of the embedded "
        "fixtures (e.g. phase 1's --split_mode standard train.jsonl on real MBPP).",
    )
    parser.add_argument(
        "--eval_set",
        default="humaneval",
        choices=("val", "humaneval", "mbpp_test", "apps_test"),
        help="Held-out evaluation set (phase 4 --eval_set; val = phase 1's split; default humaneval).",
    )
    parser.add_argument("--mbpp_path", help="Local MBPP file for --eval_set mbpp_test.")
    parser.add_argument("--apps_path", help="Local APPS test file for --eval_set apps_test.")
    parser.add_argument("--k", type=int, nargs="+", help="The k values of pass@k (default: 1 and --samples).")
    parser.add_argument(
        "--eval_max_new_tokens", type=int, default=256, help="Evaluation completion budget (default 256)."
    )
    parser.add_argument("--max_new_tokens", type=int, default=160, help="Training rollout budget (default 160).")
    parser.add_argument(
        "--lr",
        type=float,
        default=5e-4,
        help="Learning rate (default 5e-4: the cpu preset's 1e-4 "
        "moves a 135M LoRA too little in tens of steps, see the learning check).",
    )
    parser.add_argument(
        "--teacher",
        choices=("references", "traces"),
        default="references",
        help="Teacher-SFT data: the training tasks' reference solutions, or --teacher_traces.",
    )
    parser.add_argument("--teacher_traces", help="Phase-2 trace file for --teacher traces.")
    parser.add_argument(
        "--teacher_batch", type=int, default=2, help="Teacher-SFT examples per micro-batch (default 2)."
    )
    parser.add_argument("--variants", nargs="+", help="Run only these variants (names above; default all five).")
    args = parser.parse_args(argv)
    if args.temperature == 0 and args.samples > 1:
        parser.error("--temperature 0 is greedy: every sample would be the same; use --samples 1 or a temperature > 0")
    return args


def prepare_data(args: argparse.Namespace, out: Path, base_config) -> tuple[Path, Path, int]:
    """The one data preparation: (training task file, teacher trace file, number of training tasks)."""
    import phase1_prepare_data as phase1
    from utils.dataset_loader import read_tasks, seeded_sample, write_tasks
    from utils.jsonl import write_jsonl_atomic
    from utils.prompts import get_unified_prompt

    data = out / "data"
    if args.train_file:
        source = Path(args.train_file)
    else:
        source = data / "train.jsonl"
        if not source.is_file():
            phase1.main(base_config)
    train_file = data / "ablation_train.jsonl"
    if not train_file.is_file():
        tasks = seeded_sample(read_tasks(source), args.tasks, args.seed)
        write_tasks(train_file, tasks)
    tasks = read_tasks(train_file)
    if args.teacher == "traces":
        if not args.teacher_traces:
            raise SystemExit("--teacher traces needs --teacher_traces FILE (phase 2's output)")
        return train_file, Path(args.teacher_traces), len(tasks)
    traces = data / "reference_traces.jsonl"
    if not traces.is_file():
        visible = base_config.prompt.num_visible_tests
        write_jsonl_atomic(
            traces,
            (
                {
                    "task_id": t.task_id,
                    "sample_idx": 0,
                    "prompt": get_unified_prompt(t, visible),
                    "thinking": "",
                    "code": t.reference_solutions[0],
                    "passed": True,
                }
                for t in tasks
                if t.reference_solutions
            ),
        )
    return train_file, traces, len(tasks)


def train_variant(variant: Variant, base_overrides: list[str], folder: Path, train_file: Path, traces: Path) -> str:
    """Train one variant with phase 3 (or resume it); returns 'trained', 'resumed' or 'finished earlier'."""
    import phase3_train_grpo as phase3
    from config import build_config

    if (folder / "final_model" / "adapter_config.json").is_file():
        return "finished earlier"
    resume = "latest" if any(folder.glob("checkpoint-*")) else None
    weights = [f"dual_source.{k}={v}" for k, v in (variant.weights or {}).items()]
    config = build_config("cpu", overrides=[*base_overrides, f"paths.output_dir={folder}", *weights])
    # without a checkpoint to resume, whatever a killed attempt left in the folder is this ablation's and is replaced
    phase3.main(config, resume, traces, train_file, overwrite_output_dir=resume is None)
    return "resumed" if resume else "trained"


def evaluate_variant(variant: Variant, config, folder: Path, eval_set, eval_tasks: int) -> dict:
    """Phase 4 on the variant (its adapter, or the base model); cached, so a rerun only re-executes."""
    import phase4_evaluate as phase4

    model_path = config.student.model_name if variant.weights is None else str(folder / "final_model")
    return phase4.main(
        config,
        model_path,
        False,
        folder / "evaluation_results.json",
        folder / "eval_samples.jsonl",
        eval_set,
        eval_tasks or None,
    )


def read_rows(folder: Path) -> list:
    from evaluation.evaluate import read_samples

    return read_samples(folder / "eval_samples.jsonl")


def write_reports(report: dict, results_dir: Path) -> list[Path]:
    """ablation.json, ablation.md and ablation.png (pass@1 per variant with its 95% interval)."""
    from utils.jsonl import write_json_atomic

    results_dir.mkdir(parents=True, exist_ok=True)
    json_path = write_json_atomic(results_dir / "ablation.json", report) or results_dir / "ablation.json"
    r = report["recipe"]
    k_first = str(report["k_values"][0])
    lines = [
        f"# Ablation: {report['eval_set']['name']} ({report['eval_set']['num_tasks']} tasks), {report['decoding']}",
        "",
        f"Eval set version: {report['eval_set']['version']}.",
        f"Recipe: {r['steps']} steps per trained variant, {report['train_tasks']} training tasks, learning rate "
        f"{r['lr']}, training rollouts of <= {r['max_new_tokens']} tokens, teacher-SFT from {r['teacher']}, "
        f"evaluation <= {r['eval_max_new_tokens']} tokens, seed {r['seed']}.",
        "",
        "| variant | "
        + " | ".join(f"pass@{k} [95% CI]" for k in report["k_values"])
        + f" | sanitized pass@{k_first} | ended by the budget"
        + f" | full − variant, pass@{k_first} [paired 95% CI] | variant − base, pass@{k_first} [paired 95% CI] |",
        "|---|" + "---|" * (len(report["k_values"]) + 4),
    ]

    def fmt(value, interval, signed=False):
        if value is None:
            return "n/a"
        sign = "+" if signed else ""
        return (
            f"{value:{sign}.4f} [{interval[0]:{sign}.4f}, {interval[1]:{sign}.4f}]"
            if interval
            else f"{value:{sign}.4f}"
        )

    for row in report["variants"]:
        cells = [fmt(row["pass_at_k"][str(k)], row["pass_at_k_ci95"][str(k)]) for k in report["k_values"]]
        cells.append(fmt(row.get("sanitized_pass"), None))
        cells.append(f"{row['at_budget']:.1%}" if row.get("at_budget") is not None else "n/a")
        vs_full = row["full_minus_variant"].get(k_first) if row["full_minus_variant"] else None
        vs_base = row["variant_minus_base"].get(k_first) if row["variant_minus_base"] else None
        cells.append(fmt(vs_full["delta"], vs_full["ci95"], True) if vs_full else "—")
        cells.append(fmt(vs_base["delta"], vs_base["ci95"], True) if vs_base else "—")
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Training time per variant (s): "
        + ", ".join(f"{v['name']} {v['train_seconds']:.0f}" for v in report["variants"] if v["train_seconds"]),
        "",
    ]
    md_path = results_dir / "ablation.md"
    md_path.write_text("\n".join(lines))
    png_path = results_dir / "ablation.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [v["name"] for v in report["variants"]]
    values = [v["pass_at_k"][k_first] or 0.0 for v in report["variants"]]
    low = [
        max(0.0, val - (v["pass_at_k_ci95"][k_first] or [val, val])[0])
        for val, v in zip(values, report["variants"], strict=True)
    ]
    high = [
        max(0.0, (v["pass_at_k_ci95"][k_first] or [val, val])[1] - val)
        for val, v in zip(values, report["variants"], strict=True)
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(
        names,
        values,
        yerr=[low, high],
        capsize=6,
        color=["#999999", "#6baed6", "#fd8d3c", "#74c476", "#9e9ac8"][: len(names)],
    )
    ax.set_ylabel(f"pass@{k_first} (95% bootstrap CI over tasks)")
    ax.set_title(
        f"Ablation on {report['eval_set']['name']} ({report['eval_set']['num_tasks']} tasks, {report['decoding']})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return [json_path, md_path, png_path]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from config import build_config
    from evaluation.eval_sets import load_eval_set
    from evaluation.evaluate import delta_intervals
    from utils.jsonl import write_json_atomic

    out = claim_work_folder(args, RECIPE_FLAGS)
    ks = tuple(args.k or sorted({1, args.samples}))
    base_overrides = [
        f"paths.data_dir={out / 'data'}",
        f"training.max_steps={args.steps}",
        f"training.learning_rate={args.lr}",
        f"training.seed={args.seed}",
        f"data.seed={args.seed}",
        f"grpo.max_new_tokens={args.max_new_tokens}",
        f"dual_source.teacher_sft_batch_size={args.teacher_batch}",
        "training.save_steps=10",
        f"evaluation.num_samples={args.samples}",
        f"evaluation.temperature={args.temperature}",
        f"evaluation.max_new_tokens={args.eval_max_new_tokens}",
        f"evaluation.k_values={list(ks)}",
    ]
    if args.model:
        base_overrides.append(f"student.model_name={args.model}")
    base_config = build_config("cpu", overrides=base_overrides)
    d = base_config.dual_source
    chosen = [
        v
        for v in variants(d.grpo_weight, d.teacher_sft_weight, d.self_sft_weight)
        if not args.variants or v.name in args.variants
    ]
    unknown = set(args.variants or ()) - {v.name for v in variants(1, 1, 1)}
    if unknown:
        raise SystemExit(f"error: unknown variant(s) {', '.join(sorted(unknown))}")
    train_file, traces, num_train = prepare_data(args, out, base_config)
    eval_set = load_eval_set(
        args.eval_set,
        val_file=out / "data" / "val.jsonl",
        mbpp_path=args.mbpp_path,
        apps_path=args.apps_path,
        visible_tests=base_config.prompt.num_visible_tests,
    )
    print(
        f"ablation: {len(chosen)} variants, {args.steps} steps each on {num_train} tasks; evaluation on "
        f"{eval_set.name} ({args.eval_tasks or len(eval_set.tasks)} tasks); folder {out}",
        flush=True,
    )
    eval_config = build_config("cpu", overrides=[*base_overrides, f"paths.output_dir={out}"])
    status = {}
    for i, variant in enumerate(chosen, start=1):
        folder = out / variant.name
        folder.mkdir(parents=True, exist_ok=True)
        timing_file = folder / "train_seconds.json"
        if variant.weights is None:
            status[variant.name] = "nothing to train"
        else:
            print(f"\n[{i}/{len(chosen)}] {variant.name} ({variant.label}): training {args.steps} steps", flush=True)
            start = time.monotonic()
            status[variant.name] = train_variant(variant, base_overrides, folder, train_file, traces)
            if status[variant.name] != "finished earlier":
                previous = json.loads(timing_file.read_text())["seconds"] if timing_file.is_file() else 0.0
                write_json_atomic(timing_file, {"seconds": previous + time.monotonic() - start})
            else:
                print("  finished earlier: not trained again", flush=True)
        done = folder / "evaluation_results.json"
        if done.is_file() and (folder / "eval_samples.jsonl").is_file():
            print(f"[{i}/{len(chosen)}] {variant.name}: evaluated earlier", flush=True)
        else:
            print(f"\n[{i}/{len(chosen)}] {variant.name}: evaluating on {eval_set.name}", flush=True)
            evaluate_variant(variant, eval_config, folder, eval_set, args.eval_tasks)
    results = {v.name: json.loads((out / v.name / "evaluation_results.json").read_text()) for v in chosen}
    rows = {v.name: read_rows(out / v.name) for v in chosen}

    def paired(a: str, b: str) -> dict | None:
        if a not in rows or b not in rows or a == b:
            return None
        intervals = delta_intervals(
            rows[a], rows[b], ks, base_config.evaluation.bootstrap_resamples, base_config.evaluation.bootstrap_seed
        )
        return {
            str(k): {
                "delta": (results[a]["pass_at_k"][str(k)] - results[b]["pass_at_k"][str(k)])
                if results[a]["pass_at_k"][str(k)] is not None and results[b]["pass_at_k"][str(k)] is not None
                else None,
                "ci95": intervals[str(k)],
            }
            for k in ks
        }

    first = results[chosen[0].name]
    report = {
        "recipe": recipe_values(args, RECIPE_FLAGS),
        "k_values": list(ks),
        "train_tasks": num_train,
        "train_file": str(train_file),
        "teacher_traces": str(traces),
        "eval_set": first["eval_set"],
        "decoding": first["decoding"],
        "variants": [
            {
                "name": v.name,
                "label": v.label,
                "loss_weights": v.weights,
                "status": status[v.name],
                "train_seconds": json.loads((out / v.name / "train_seconds.json").read_text())["seconds"]
                if (out / v.name / "train_seconds.json").is_file()
                else None,
                "pass_at_k": results[v.name]["pass_at_k"],
                "pass_at_k_ci95": results[v.name]["pass_at_k_ci95"],
                **phase4_grades(results[v.name], str(ks[0])),
                "full_minus_variant": paired("full", v.name),
                "variant_minus_base": paired(v.name, "base"),
            }
            for v in chosen
        ],
    }
    paths = write_reports(report, Path(args.results_dir))
    print("\n" + (Path(args.results_dir) / "ablation.md").read_text())
    print("results: " + ", ".join(str(p) for p in paths))
    return report


if __name__ == "__main__":
    main()
