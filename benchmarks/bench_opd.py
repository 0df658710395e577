"""On-policy distillation on CPU: does the student learn from a better teacher's per-token
log-probs, beside or instead of GRPO? (Not a CI test: tens of minutes of CPU.)

    python benchmarks/bench_opd.py [--steps 10] [--eval_every 5] [--teacher_steps 30] [--samples 4] ...

1. Data: phase 1 on the embedded fixtures (71 tasks) with `--val_ratio` held out.
2. Teacher: the embedded student (SmolLM2-135M-Instruct) plus a LoRA adapter trained by phase 3 with
   teacher-SFT only on the training tasks' reference solutions (GRPO and self-SFT weights 0; its rollouts
   are cut to 8 tokens, since they train nothing). It is evaluated on the training tasks and on the held-out
   ones, so "genuinely better than the student" is a measured claim, not an assumption.
3. Students: three phase 3 runs from the same base student, seed, data order, rollouts per step and steps,
   differing only in the loss weights: `grpo` (GRPO only), `opd` (on-policy distillation only:
   dual_source.grpo_weight=0, opd_weight=1), `both` (GRPO + OPD). The teacher scores every rollout in
   process (teacher.logprob_source=local, the adapter from step 2). Teacher-SFT and self-SFT are off in all
   three, so the only teacher signal is OPD's.
4. Evaluation: phase 4 on the held-out tasks (the same decoding for every point) for the base student
   (step 0), the teacher, and each student at every `--eval_every` steps (its checkpoints); pass@1 with a
   95% bootstrap interval over tasks, and paired intervals (the same tasks resampled together) for each
   variant against the base and for opd and both against grpo. The training-prompt pass rate per step
   (from each run's metrics.jsonl) is reported beside it, with the teacher's time per step.

Resumable: everything is under `--output_dir` (default outputs/bench_opd); a finished run or evaluation is
not redone. Writes benchmarks/results/bench_opd.json and bench_opd.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiment_cli import add_experiment_flags  # noqa: E402  (benchmarks/ is on sys.path)

VARIANTS = {  # dual_source overrides
    "grpo": {"grpo_weight": 1.0, "opd_weight": 0.0},
    "opd": {"grpo_weight": 0.0, "opd_weight": 1.0},
    "both": {"grpo_weight": 1.0, "opd_weight": 1.0},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="On-policy distillation vs GRPO on CPU: held-out pass@1 per step.")
    add_experiment_flags(parser, output_dir="outputs/bench_opd", steps=10, samples=4, temperature=0.8)
    parser.add_argument("--eval_every", type=int, default=5, help="Evaluate every N steps (default 5).")
    parser.add_argument("--teacher_steps", type=int, default=30, help="Teacher-SFT steps (default 30).")
    parser.add_argument("--teacher_batch", type=int, default=8, help="Reference traces per teacher step (default 8).")
    parser.add_argument("--teacher_lr", type=float, default=1e-3, help="Teacher-SFT learning rate (default 1e-3).")
    parser.add_argument("--lr", type=float, default=5e-4, help="Student learning rate (the cpu preset's 5e-4).")
    parser.add_argument("--val_ratio", type=float, default=0.5, help="Share of tasks held out (default 0.5).")
    parser.add_argument("--opd_clip", type=float, default=0.0, help="dual_source.opd_advantage_clip (default 0).")
    parser.add_argument("--prompts", type=int, default=2, help="Student prompts per step (the cpu preset's 2).")
    parser.add_argument("--group", type=int, default=4, help="Student samples per prompt (the cpu preset's 4).")
    parser.add_argument("--kl_coef", type=float, default=0.05, help="Students' grpo.kl_coef (default 0.05).")
    parser.add_argument("--max_new_tokens", type=int, default=128, help="Rollout and evaluation tokens (default 128).")
    parser.add_argument("--variants", nargs="*", choices=sorted(VARIANTS), help="Only these student runs.")
    return parser.parse_args(argv)


def write_reference_traces(train_file: Path, traces: Path, visible_tests: int) -> int:
    """The training tasks' reference solutions as verified teacher traces (the teacher's SFT data)."""
    from utils.dataset_loader import read_tasks
    from utils.jsonl import write_jsonl_atomic
    from utils.prompts import get_unified_prompt

    rows = [
        {
            "task_id": t.task_id,
            "sample_idx": 0,
            "prompt": get_unified_prompt(t, visible_tests),
            "thinking": "",
            "code": t.reference_solutions[0],
            "passed": True,
        }
        for t in read_tasks(train_file)
        if t.reference_solutions
    ]
    if not traces.is_file():
        write_jsonl_atomic(traces, rows)
    return len(rows)


def train(config, folder: Path, train_file: Path, traces: Path) -> float:
    """phase 3 into `folder` (resumed from its newest checkpoint, or skipped when finished); returns seconds."""
    import phase3_train_grpo as phase3

    if (folder / "final_model" / "adapter_config.json").is_file():
        return 0.0
    resume = "latest" if any(folder.glob("checkpoint-*")) else None
    start = time.monotonic()
    phase3.main(config, resume, traces, train_file, overwrite_output_dir=resume is None)
    return time.monotonic() - start


def evaluate(config, model_path: str, out: Path, eval_set, max_tasks: int = 0) -> dict:
    """phase 4 of `model_path` on `eval_set` (its first `max_tasks`, 0: all) into out.json / out.samples.jsonl
    (cached)."""
    import phase4_evaluate as phase4

    result = out.with_suffix(".json")
    samples = out.with_suffix(".samples.jsonl")
    if result.is_file() and samples.is_file():
        return json.loads(result.read_text())
    return phase4.main(config, model_path, False, result, samples, eval_set, max_tasks or None)


def read_metrics(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import phase1_prepare_data as phase1
    from config import EMBEDDED_STUDENT, build_config
    from evaluation.eval_sets import load_eval_set
    from evaluation.evaluate import delta_intervals, read_samples
    from utils.jsonl import write_json_atomic

    out = Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    model = args.model or EMBEDDED_STUDENT
    common = [
        f"student.model_name={model}",
        f"grpo.max_new_tokens={args.max_new_tokens}",
        f"evaluation.max_new_tokens={args.max_new_tokens}",
        f"paths.data_dir={data}",
        f"data.val_ratio={args.val_ratio}",
        f"data.seed={args.seed}",
        f"training.seed={args.seed}",
        f"evaluation.num_samples={args.samples}",
        f"evaluation.temperature={args.temperature}",
        "evaluation.k_values=[1]",
    ]
    base_config = build_config("cpu", overrides=[*common, f"paths.output_dir={out}"])  # phase 1, phase 4
    if not (data / "train.jsonl").is_file():
        phase1.main(base_config)
    train_file, val_file = data / "train.jsonl", data / "val.jsonl"
    traces = data / "reference_traces.jsonl"
    num_traces = write_reference_traces(train_file, traces, base_config.prompt.num_visible_tests)
    held_out = load_eval_set("val", val_file=val_file, visible_tests=base_config.prompt.num_visible_tests)
    train_set = load_eval_set("file", eval_file=train_file, visible_tests=base_config.prompt.num_visible_tests)
    seconds: dict[str, float] = {}

    # ---- the teacher: teacher-SFT only on the training tasks' reference solutions
    teacher_dir = out / "teacher"
    print(f"teacher: {args.teacher_steps} teacher-SFT steps on {num_traces} reference solutions", flush=True)
    teacher_config = build_config(
        "cpu",
        overrides=[
            *common,
            f"paths.output_dir={teacher_dir}",
            f"training.max_steps={args.teacher_steps}",
            f"training.learning_rate={args.teacher_lr}",
            f"training.save_steps={args.teacher_steps}",
            "grpo.max_new_tokens=8",  # its rollouts train nothing (GRPO weight 0): keep them cheap
            "grpo.num_samples_per_prompt=2",
            "dual_source.grpo_weight=0",
            "dual_source.self_sft_weight=0",
            "dual_source.teacher_sft_weight=1",
            f"dual_source.teacher_sft_batch_size={args.teacher_batch}",
        ],
    )
    seconds["teacher"] = train(teacher_config, teacher_dir, train_file, traces)
    adapter = teacher_dir / "final_model"

    # ---- the students
    student_common = [
        *common,
        f"training.max_steps={args.steps}",
        f"training.learning_rate={args.lr}",
        f"training.save_steps={args.eval_every}",
        "training.save_total_limit=0",
        "dual_source.teacher_sft_weight=0",
        "dual_source.self_sft_weight=0",
        f"dual_source.opd_advantage_clip={args.opd_clip}",
        f"training.per_device_train_batch_size={args.prompts}",
        f"grpo.num_samples_per_prompt={args.group}",
        f"grpo.kl_coef={args.kl_coef}",
        "teacher.logprob_source=local",
        f"teacher.model_name={model}",
        f"teacher.local_adapter={adapter}",
    ]
    chosen = args.variants or list(VARIANTS)
    # ---- evaluation helpers: the base student and the teacher first (is the teacher better?), then each
    # student right after its training, so that an interrupted benchmark has its first results on disk
    evals = out / "eval"
    evals.mkdir(exist_ok=True)
    points: dict[str, dict[int, str]] = {}  # variant -> step -> evaluation name
    results: dict[str, dict] = {}

    def run(name: str, model_path: str, eval_set) -> None:
        print(f"\nevaluating {name}", flush=True)
        results[name] = evaluate(base_config, model_path, evals / name, eval_set, args.eval_tasks)

    run("base", model, held_out)
    run("teacher", str(adapter), held_out)
    run("base-train", model, train_set)
    run("teacher-train", str(adapter), train_set)
    steps = list(range(args.eval_every, args.steps + 1, args.eval_every))
    if args.steps not in steps:
        steps.append(args.steps)
    for name in chosen:
        weights = [f"dual_source.{k}={v}" for k, v in VARIANTS[name].items()]
        config = build_config("cpu", overrides=[*student_common, f"paths.output_dir={out / name}", *weights])
        print(f"\nstudent {name}: {args.steps} steps ({', '.join(weights)})", flush=True)
        seconds[name] = train(config, out / name, train_file, traces)
        points[name] = {0: "base"}
        for step in steps:
            label = f"{name}-step{step}"
            run(label, str(out / name / f"checkpoint-{step}"), held_out)
            points[name][step] = label

    rows = {name: read_samples(evals / f"{name}.samples.jsonl") for name in results}
    resamples, seed = base_config.evaluation.bootstrap_resamples, base_config.evaluation.bootstrap_seed

    def pass1(name: str) -> dict:
        r = results[name]
        return {"pass@1": r["pass_at_k"]["1"], "ci95": r.get("pass_at_k_ci95", {}).get("1")}

    def paired(a: str, b: str) -> dict:
        delta = results[a]["pass_at_k"]["1"] - results[b]["pass_at_k"]["1"]
        return {"delta": delta, "ci95": delta_intervals(rows[a], rows[b], [1], resamples, seed)["1"]}

    last = steps[-1]
    report = {
        "command": "python benchmarks/bench_opd.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": vars(args),
        "model": model,
        "held_out": {
            "name": held_out.name,
            "version": held_out.version,
            "tasks": results["base"]["eval_set"]["num_tasks"],
        },
        "train_tasks": len(train_set.tasks),
        "train_tasks_evaluated": results["base-train"]["eval_set"]["num_tasks"],
        "decoding": results["base"]["decoding"],
        "teacher": {
            "held_out": pass1("teacher"),
            "train_tasks": pass1("teacher-train"),
            "base_train_tasks": pass1("base-train"),
            "teacher_minus_base_held_out": paired("teacher", "base"),
            "teacher_minus_base_train_tasks": paired("teacher-train", "base-train"),
        },
        "curves": {name: {str(step): pass1(label) for step, label in points[name].items()} for name in chosen},
        "final_vs_base": {name: paired(points[name][last], "base") for name in chosen},
        "final_vs_grpo": {
            name: paired(points[name][last], points["grpo"][last])
            for name in chosen
            if name != "grpo" and "grpo" in chosen
        },
        "training": {
            name: {
                "pass_rate": [m["pass_rate"] for m in read_metrics(out / name)],
                "opd_kl": [m.get("opd/kl") for m in read_metrics(out / name)],
                "teacher_s_per_step": [m.get("opd/teacher_s") for m in read_metrics(out / name)],
                "step_s": [
                    m["time/rollout_s"] + m["time/reward_s"] + m["time/update_s"] + (m.get("opd/teacher_s") or 0.0)
                    for m in read_metrics(out / name)
                ],
            }
            for name in chosen
        },
        "train_seconds_this_invocation": seconds,
    }
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(results_dir / "bench_opd.json", report)
    (results_dir / "bench_opd.md").write_text(markdown(report, chosen, [0, *steps]), encoding="utf-8")
    print((results_dir / "bench_opd.md").read_text(encoding="utf-8"))
    return report


def markdown(report: dict, chosen: list[str], steps: list[int]) -> str:
    def cell(entry: dict) -> str:
        ci = entry.get("ci95")
        return f"{entry['pass@1']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    def delta(entry: dict) -> str:
        ci = entry["ci95"]
        return f"{entry['delta']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")

    t = report["teacher"]
    lines = [
        f"# On-policy distillation on CPU: held-out pass@1 vs training steps ({report['held_out']['tasks']} held-out "
        f"tasks, {report['decoding']})",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Teacher ({report['model']} + a teacher-SFT adapter on {report['train_tasks']} training tasks' references): "
        f"pass@1 {cell(t['train_tasks'])} on {report['train_tasks_evaluated']} of the training tasks (base "
        f"{cell(t['base_train_tasks'])}; "
        f"teacher − base {delta(t['teacher_minus_base_train_tasks'])}), {cell(t['held_out'])} held out "
        f"(teacher − base {delta(t['teacher_minus_base_held_out'])}).",
        "",
        "| variant | " + " | ".join(f"step {s}" for s in steps) + " | final − base [paired 95% CI] |",
        "|---|" + "---|" * (len(steps) + 1),
    ]
    for name in chosen:
        curve = report["curves"][name]
        lines.append(
            f"| {name} | "
            + " | ".join(cell(curve[str(s)]) if str(s) in curve else "—" for s in steps)
            + f" | {delta(report['final_vs_base'][name])} |"
        )
    if report["final_vs_grpo"]:
        lines += ["", "Final step against GRPO only (paired 95% CI):", ""]
        lines += [f"- {name} − grpo: {delta(d)}" for name, d in report["final_vs_grpo"].items()]
    lines += ["", "Training-prompt pass rate per step (rollouts) and the teacher's scoring time:", ""]
    for name in chosen:
        tr = report["training"][name]
        teacher = [s for s in tr["teacher_s_per_step"] if s is not None]
        lines.append(
            f"- {name}: pass rate {', '.join(f'{p:.2f}' for p in tr['pass_rate'])}; mean step "
            f"{sum(tr['step_s']) / max(len(tr['step_s']), 1):.1f} s"
            + (f", of which teacher scoring {sum(teacher) / len(teacher):.2f} s" if teacher else "")
            + (
                "; opd/kl (student − teacher log-prob per token) " + ", ".join(f"{k:.3f}" for k in tr["opd_kl"])
                if all(k is not None for k in tr["opd_kl"]) and tr["opd_kl"]
                else ""
            )
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
