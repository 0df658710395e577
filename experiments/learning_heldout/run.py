"""Does the objective make a better coder on problems it never saw? (Hours to days of CPU.)

    python -m experiments.learning_heldout.run [--mbpp_path mbpp.jsonl] [--steps 200] ...

Train on real MBPP's standard training split (phase 1 --split_mode standard: every task outside the
published test ids 11-510, i.e. 1-10 and 511-974, 474 tasks), evaluate on MBPP's test split (500
problems) with sampled pass@k over `--samples` (default 8) per problem, and optionally HumanEval greedy.
The variants are bench_ablation's, from one seed, one data preparation and one LoRA initialization,
each trained by phase 3 itself with the same steps, rollouts and token limits, differing only in the
loss weights:

    base          no training
    teacher_sft   teacher-SFT only
    grpo          GRPO only
    grpo_teacher  GRPO + teacher-SFT
    full          GRPO + teacher-SFT + self-SFT (the product's objective)

Teacher-SFT data: the training tasks' reference solutions, verified in the sandbox by phase 2's reference
teacher (`synthesis.reference_traces`; failing ones dropped). `--curriculum` turns on phase 3's
difficulty filter (training.curriculum) in every variant.

The order is base, full, then the rest: the claim (full vs base) is measurable as soon as two variants are
done. Resumable at every level: a trained variant (final_model) is not retrained and an interrupted one
resumes from its newest checkpoint; phase 4 caches every completion, so an interrupted evaluation
continues where it stopped; a finished evaluation is read back. The recipe is stored and a resume with
another recipe is refused. The report is rewritten after every variant, so it always says where the
experiment stands (`complete`, each variant's `status`).

Writes experiments/results/learning_heldout.json (per variant: pass_at_1 and its interval, pass@k up to
--samples, the paired deltas delta_vs_base / delta_vs_full with intervals, HumanEval when asked, the
training curves with the policy's sampled-token entropy; the eval set's name and size; the command; the
power analysis: the measured spread of full - base per problem and the problems x samples it implies
for a +-3 point interval), learning_heldout.md and learning_heldout.png.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from experiments.frame import add_experiment_flags, claim_work_folder, ks_for, phase4_grades, recipe_values

ORDER = ("base", "full", "teacher_sft", "grpo", "grpo_teacher")
# Every flag that changes a number: a resumed experiment must have the same values.
RECIPE_FLAGS = (
    "mbpp_path steps samples temperature eval_tasks eval_max_new_tokens max_new_tokens "
    "lr teacher_batch curriculum humaneval humaneval_max_new_tokens seed model sets"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mbpp_path", help="Local MBPP file (default: the hub).")
    add_experiment_flags(parser, output_dir="outputs/learning_heldout", steps=200, samples=8, temperature=0.8)
    parser.add_argument("--eval_max_new_tokens", type=int, default=256, help="Evaluation budget (default 256).")
    parser.add_argument("--max_new_tokens", type=int, default=160, help="Training rollout budget (default 160).")
    parser.add_argument("--lr", type=float, default=5e-4, help="Learning rate (default 5e-4).")
    parser.add_argument("--teacher_batch", type=int, default=4, help="Teacher-SFT examples per micro-batch.")
    parser.add_argument("--save_steps", type=int, default=10, help="Checkpoint every N steps (default 10).")
    parser.add_argument("--curriculum", action="store_true", help="Phase 3's difficulty filter on (every variant).")
    parser.add_argument("--humaneval", action="store_true", help="Also HumanEval greedy (164 problems).")
    parser.add_argument(
        "--humaneval_max_new_tokens", type=int, default=256, help="HumanEval's greedy budget (default 256)."
    )
    parser.add_argument("--variants", nargs="+", choices=ORDER, help="Only these variants (default all five).")
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], help="Extra config override for every variant (repeatable)."
    )
    parser.add_argument("--half_width", type=float, default=0.03, help="Target paired half-width (default 0.03).")
    args = parser.parse_args(argv)
    if args.mbpp_path and not Path(args.mbpp_path).is_file():
        parser.error(
            f"--mbpp_path {args.mbpp_path}: file not found; drop the flag (make learning-heldout MBPP_PATH=) to load "
            "MBPP from the hub."
        )
    if args.samples < 2:
        parser.error("--samples must be >= 2: sampled pass@1 and the power analysis need several samples per problem")
    return args


def base_overrides(args: argparse.Namespace, out: Path) -> list[str]:
    sets = [
        f"paths.data_dir={out / 'data'}",
        "data.offline=false",
        "data.split_mode=standard",
        "data.skip_apps=true",
        f"training.max_steps={args.steps}",
        f"training.learning_rate={args.lr}",
        f"training.seed={args.seed}",
        f"training.save_steps={args.save_steps}",
        f"data.seed={args.seed}",
        f"grpo.max_new_tokens={args.max_new_tokens}",
        f"dual_source.teacher_sft_batch_size={args.teacher_batch}",
        f"evaluation.num_samples={args.samples}",
        f"evaluation.temperature={args.temperature}",
        f"evaluation.max_new_tokens={args.eval_max_new_tokens}",
        f"evaluation.k_values={ks_for(args.samples)}",
    ]
    if args.mbpp_path:
        sets.append(f"data.mbpp_path={Path(args.mbpp_path).resolve()}")
    if args.model:
        sets.append(f"student.model_name={args.model}")
    if args.curriculum:
        sets.append("curriculum.enabled=true")
    return [*sets, *args.sets]


def prepare_data(config, out: Path) -> tuple[Path, Path, dict]:
    """Phase 1's standard split and phase 2's reference teacher: (train file, trace file, trace statistics)."""
    import phase1_prepare_data as phase1
    from sandbox.executor import SandboxPool
    from synthesis.reference_traces import write_reference_traces
    from utils.dataset_loader import read_tasks

    data = out / "data"
    train_file = data / "train.jsonl"
    if not train_file.is_file():
        phase1.main(config)
    traces = data / "reference_traces.jsonl"
    stats_file = data / "reference_traces.stats.json"
    if not stats_file.is_file():
        with SandboxPool.from_config(config.sandbox) as pool:
            stats = write_reference_traces(
                read_tasks(train_file),
                traces,
                config.teacher.num_samples_per_problem,
                pool=pool,
                visible_tests=config.prompt.num_visible_tests,
                thinking_mode=config.teacher.reference_thinking,
            )
        stats_file.write_text(json.dumps(stats.to_dict(), indent=2) + "\n")
    return train_file, traces, json.loads(stats_file.read_text())


def evaluate(config, model_path: str, folder: Path, name: str, eval_set, eval_tasks: int) -> dict:
    """phase 4 of `model_path` on `eval_set` into folder/<name>.json and <name>.samples.jsonl (read back if done;
    phase 4's completion cache makes an interrupted evaluation continue where it stopped)."""
    import phase4_evaluate as phase4

    result, samples = folder / f"{name}.json", folder / f"{name}.samples.jsonl"
    if result.is_file() and samples.is_file():
        return json.loads(result.read_text())
    return phase4.main(config, model_path, False, result, samples, eval_set, eval_tasks or None)


def training_curves(folder: Path) -> dict:
    path = folder / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []

    def column(key: str) -> list:
        return [row.get(key) for row in rows]

    return {
        "step": column("step"),
        "entropy": column("entropy/token_mean"),
        "pass_rate": column("pass_rate"),
        "reward": column("reward/mean"),
        "frac_reward_zero_std": column("frac_reward_zero_std"),
        "closed_think": column("format/closed_think"),
        "completion_length": column("completion/mean_length"),
        "curriculum_zero_spread_share": column("curriculum/zero_spread_share"),
        "curriculum_settled_share_plain_draw": column("curriculum/settled_share_plain_draw"),
    }


def machine_load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from config import build_config
    from evaluation.eval_sets import load_eval_set
    from experiments.ablation.run import train_variant, variants
    from utils.jsonl import write_json_atomic

    out = claim_work_folder(args, RECIPE_FLAGS)
    overrides = base_overrides(args, out)
    config = build_config("cpu", overrides=[*overrides, f"paths.output_dir={out}"])
    train_file, traces, trace_stats = prepare_data(config, out)
    visible = config.prompt.num_visible_tests
    mbpp = load_eval_set("mbpp_test", mbpp_path=args.mbpp_path, visible_tests=visible)
    humaneval = load_eval_set("humaneval") if args.humaneval else None
    greedy = build_config(
        "cpu",
        overrides=[
            *overrides,
            f"paths.output_dir={out}",
            "evaluation.num_samples=1",
            "evaluation.temperature=0",
            "evaluation.k_values=[1]",
            f"evaluation.max_new_tokens={args.humaneval_max_new_tokens}",
        ],
    )
    d = config.dual_source
    table = {v.name: v for v in variants(d.grpo_weight, d.teacher_sft_weight, d.self_sft_weight)}
    chosen = [name for name in ORDER if not args.variants or name in args.variants]
    command = "python -m experiments.learning_heldout.run " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(
        f"learning_heldout: {len(chosen)} variants, {args.steps} steps each on {train_file} "
        f"({trace_stats['passed']} verified reference traces); evaluation on {mbpp.name} "
        f"({args.eval_tasks or len(mbpp.tasks)} problems x {args.samples} samples)"
        + (" + HumanEval greedy" if humaneval else "")
        + f"; folder {out}",
        flush=True,
    )
    for i, name in enumerate(chosen, start=1):
        variant, folder = table[name], out / name
        folder.mkdir(parents=True, exist_ok=True)
        timing = folder / "train_seconds.json"
        if variant.weights is not None:
            print(f"\n[{i}/{len(chosen)}] {name}: training {args.steps} steps", flush=True)
            start = time.monotonic()
            status = train_variant(variant, overrides, folder, train_file, traces)
            if status != "finished earlier":
                previous = json.loads(timing.read_text())["seconds"] if timing.is_file() else 0.0
                write_json_atomic(timing, {"seconds": previous + time.monotonic() - start})
        model_path = config.student.model_name if variant.weights is None else str(folder / "final_model")
        print(f"\n[{i}/{len(chosen)}] {name}: evaluating on {mbpp.name}", flush=True)
        evaluate(config, model_path, folder, "mbpp_test", mbpp, args.eval_tasks)
        if humaneval is not None:
            print(f"\n[{i}/{len(chosen)}] {name}: HumanEval greedy", flush=True)
            evaluate(greedy, model_path, folder, "humaneval", humaneval, 0)
        # the report after every variant: a long run always says where it stands
        write_reports(build_report(args, out, chosen, table, command, trace_stats, config), Path(args.results_dir))
    report = build_report(args, out, chosen, table, command, trace_stats, config)
    paths = write_reports(report, Path(args.results_dir))
    print("\n" + (Path(args.results_dir) / "learning_heldout.md").read_text())
    print("results: " + ", ".join(str(p) for p in paths))
    return report


def build_report(args, out: Path, chosen: list[str], table: dict, command: str, trace_stats: dict, config) -> dict:
    """The report from what is on disk: finished variants with numbers, the others 'pending'."""
    from evaluation.evaluate import delta_intervals, read_samples
    from evaluation.power import paired_design, pass_counts

    ev = config.evaluation
    ks = ks_for(args.samples)
    results: dict[str, dict] = {}
    rows: dict[str, list] = {}
    human: dict[str, dict] = {}
    human_rows: dict[str, list] = {}
    for name in chosen:
        folder = out / name
        if (folder / "mbpp_test.json").is_file():
            results[name] = json.loads((folder / "mbpp_test.json").read_text())
            rows[name] = read_samples(folder / "mbpp_test.samples.jsonl")
        if (folder / "humaneval.json").is_file():
            human[name] = json.loads((folder / "humaneval.json").read_text())
            human_rows[name] = read_samples(folder / "humaneval.samples.jsonl")

    def delta(res: dict, sample_rows: dict, a: str, b: str, k: int) -> tuple[float | None, list[float] | None]:
        if a not in res or b not in res or a == b:
            return None, None
        va, vb = res[a]["pass_at_k"].get(str(k)), res[b]["pass_at_k"].get(str(k))
        if va is None or vb is None:
            return None, None
        ci = delta_intervals(sample_rows[a], sample_rows[b], [k], ev.bootstrap_resamples, ev.bootstrap_seed)[str(k)]
        return va - vb, ci

    entries = []
    for name in chosen:
        v = table[name]
        timing = out / name / "train_seconds.json"
        entry: dict = {
            "name": name,
            "label": v.label,
            "loss_weights": v.weights,
            "trained": v.weights is None or (out / name / "final_model" / "adapter_config.json").is_file(),
            "evaluated": name in results,
            "train_seconds": json.loads(timing.read_text())["seconds"] if timing.is_file() else None,
            "training": training_curves(out / name) if v.weights is not None else None,
        }
        if name in results:
            r = results[name]
            entry["pass_at_1"] = r["pass_at_k"]["1"]
            entry["pass_at_1_ci"] = r["pass_at_k_ci95"]["1"]
            entry.update(phase4_grades(r, "1"))
            entry["pass_at_k"] = {str(k): r["pass_at_k"].get(str(k)) for k in ks}
            entry["pass_at_k_ci"] = {str(k): r["pass_at_k_ci95"].get(str(k)) for k in ks}
            entry["delta_vs_base"], entry["delta_vs_base_ci"] = delta(results, rows, name, "base", 1)
            entry["delta_vs_full"], entry["delta_vs_full_ci"] = delta(results, rows, name, "full", 1)
            entry["delta_vs_base_at_k"] = {
                str(k): dict(zip(("delta", "ci"), delta(results, rows, name, "base", k), strict=True)) for k in ks
            }
        if name in human:
            d, ci = delta(human, human_rows, name, "base", 1)
            entry["humaneval"] = {
                "pass_at_1": human[name]["pass_at_k"]["1"],
                "pass_at_1_ci": human[name]["pass_at_k_ci95"]["1"],
                **phase4_grades(human[name], "1"),
                "delta_vs_base": d,
                "delta_vs_base_ci": ci,
            }
        entries.append(entry)
    power = None
    if "full" in rows and "base" in rows:
        ids = sorted({r.task_id for r in rows["base"]})
        power = paired_design(
            pass_counts([(r.task_id, r.passed) for r in rows["full"]], ids),
            pass_counts([(r.task_id, r.passed) for r in rows["base"]], ids),
            args.samples,
            args.half_width,
        )
    first = next(iter(results.values()), None)
    return {
        "command": command,
        "recipe": recipe_values(args, RECIPE_FLAGS),
        "complete": all(e["evaluated"] for e in entries) and len(entries) == len(ORDER),
        "eval_set": {
            "name": first["eval_set"]["name"] if first else "mbpp_test",
            "num_tasks": first["eval_set"]["num_tasks"] if first else None,
            "version": first["eval_set"]["version"] if first else None,
            "samples_per_task": args.samples,
            "decoding": first["decoding"] if first else None,
        },
        "k_values": ks,
        "train_split": "MBPP standard split: task ids 1-10 and 511-974 (everything outside the test ids 11-510)",
        "teacher": {"source": "references (verified in the sandbox)", **trace_stats},
        "variants": entries,
        "power_full_vs_base": power,
        "machine_load_at_report": machine_load(),
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _mean(values: list) -> float:
    """The mean of the logged values (a step that did not log one is skipped); nan when none was logged."""
    present = [x for x in values if x is not None]
    return sum(present) / len(present) if present else float("nan")


def _fmt(value, interval=None, signed=False) -> str:
    if value is None:
        return "pending"
    sign = "+" if signed else ""
    text = f"{value:{sign}.4f}"
    return text + (f" [{interval[0]:{sign}.4f}, {interval[1]:{sign}.4f}]" if interval else "")


def grades(variant: dict) -> str:
    """The sanitized pass@1 and budget-share cells of a variant: pending until it is evaluated, n/a where its phase 4
    result predates them."""
    if variant.get("pass_at_1") is None:
        return "pending | pending"
    budget = variant.get("at_budget")
    sanitized = variant.get("sanitized_pass")
    return f"{_fmt(sanitized) if sanitized is not None else 'n/a'} | {f'{budget:.1%}' if budget is not None else 'n/a'}"


def write_reports(report: dict, results_dir: Path) -> list[Path]:
    """learning_heldout.json, .md (the table) and .png (pass@1 per variant with intervals; entropy per step)."""
    from utils.jsonl import write_json_atomic

    results_dir.mkdir(parents=True, exist_ok=True)
    json_path = results_dir / "learning_heldout.json"
    write_json_atomic(json_path, report)
    e = report["eval_set"]
    ks = report["k_values"]
    lines = [
        f"# Held-out learning: {e['name']} ({e['num_tasks']} problems, {e['decoding']})"
        + ("" if report["complete"] else " — IN PROGRESS"),
        "",
        f"Command: `{report['command']}`",
        "",
        "| variant | pass@1 [95% CI] | sanitized pass@1 | ended by the budget | "
        + " | ".join(f"pass@{k}" for k in ks[1:])
        + " | − base [paired 95% CI] | − full [paired 95% CI] | HumanEval greedy pass@1 | HumanEval − base |",
        "|---|---|---|---|" + "---|" * (len(ks) - 1) + "---|---|---|---|",
    ]
    for v in report["variants"]:
        he = v.get("humaneval")

        def versus(other: str, value, interval, name: str = v["name"]) -> str:
            return "—" if name == other else _fmt(value, interval, True)  # a variant against itself

        lines.append(
            f"| {v['label']} | {_fmt(v.get('pass_at_1'), v.get('pass_at_1_ci'))} | "
            + grades(v)
            + " | "
            + " | ".join(_fmt((v.get("pass_at_k") or {}).get(str(k))) for k in ks[1:])
            + f" | {versus('base', v.get('delta_vs_base'), v.get('delta_vs_base_ci'))}"
            f" | {versus('full', v.get('delta_vs_full'), v.get('delta_vs_full_ci'))}"
            f" | {_fmt(he['pass_at_1'], he['pass_at_1_ci']) if he else 'n/a'}"
            f" | {versus('base', he['delta_vs_base'], he['delta_vs_base_ci']) if he else 'n/a'} |"
        )
    trained = [v for v in report["variants"] if v.get("training") and any(v["training"]["step"])]
    if trained:
        lines += [
            "",
            "| trained variant | policy entropy, first → last 3 steps (nats/token) | rollouts passing | groups "
            "without spread | training seconds |",
            "|---|---|---|---|---|",
        ]
        for v in trained:
            t = v["training"]
            lines.append(
                f"| {v['label']} | {_mean(t['entropy'][:3]):.3f} → {_mean(t['entropy'][-3:]):.3f} | "
                f"{_mean(t['pass_rate']):.3f} | {_mean(t['frac_reward_zero_std']):.2f} | "
                f"{v['train_seconds'] or 0:.0f} |"
            )
    power = report["power_full_vs_base"]
    if power:
        needed = ", ".join(f"{m} samples: {n['problems']} problems" for m, n in power["needed"].items())
        lines += [
            "",
            f"Power (full − base, {power['problems']} problems × {power['samples_per_problem']} samples): sd of the "
            f"per-problem difference {power['sd_difference']:.4f} (within-problem sampling variance "
            f"{power['within_variance']:.5f}, between-problem {power['between_variance']:.5f}); half-width now "
            f"±{power['half_width_now']:.4f}. For ±{power['target_half_width']:.2f}: {needed}.",
        ]
    lines += ["", f"Machine load when written: {report['machine_load_at_report']}", ""]
    md_path = results_dir / "learning_heldout.md"
    md_path.write_text("\n".join(lines), encoding="utf-8")
    png_path = results_dir / "learning_heldout.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, curves) = plt.subplots(1, 2, figsize=(11, 4))
    done = [v for v in report["variants"] if v.get("pass_at_1") is not None]
    names = [v["name"] for v in done]
    values = [v["pass_at_1"] for v in done]
    low = [max(0.0, v["pass_at_1"] - v["pass_at_1_ci"][0]) if v["pass_at_1_ci"] else 0.0 for v in done]
    high = [max(0.0, v["pass_at_1_ci"][1] - v["pass_at_1"]) if v["pass_at_1_ci"] else 0.0 for v in done]
    bars.bar(names, values, yerr=[low, high], capsize=6, color="#6baed6")
    bars.set_ylabel("sampled pass@1 (95% CI over problems)")
    bars.set_title(f"{e['name']} ({e['num_tasks']} problems × {e['samples_per_task']})", fontsize=9)
    for v in report["variants"]:
        training = v.get("training") or {}
        points = [(s, h) for s, h in zip(training.get("step", []), training.get("entropy", []), strict=True) if h]
        if points:
            curves.plot([p[0] for p in points], [p[1] for p in points], label=v["name"])
    curves.set_xlabel("optimizer step")
    curves.set_ylabel("policy entropy (nats/token, sampled)")
    curves.set_title("entropy over training", fontsize=9)
    if curves.lines:
        curves.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return [json_path, md_path, png_path]


if __name__ == "__main__":
    main()
