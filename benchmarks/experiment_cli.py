"""The flags the learning experiments in benchmarks/ share (bench_ablation, bench_learning_heldout, bench_opd):
one definition, so "--samples" or "--output_dir" means the same in each and their --help cannot drift apart."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def add_experiment_flags(
    parser: argparse.ArgumentParser, *, output_dir: str, steps: int, samples: int, temperature: float
) -> None:
    """Size, seed, student and folders of one experiment; each script passes its own defaults."""
    parser.add_argument(
        "--steps", type=int, default=steps, help="Optimizer steps per trained run (default %(default)s)."
    )
    parser.add_argument(
        "--samples", type=int, default=samples, help="Completions per evaluation problem (default %(default)s)."
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=temperature,
        help="Evaluation temperature (default %(default)s; 0 is greedy and needs --samples 1).",
    )
    parser.add_argument("--eval_tasks", type=int, default=0, help="Evaluate the first N problems of each set (0: all).")
    parser.add_argument("--seed", type=int, default=42, help="The one seed: split, task sample, LoRA init, data order.")
    parser.add_argument("--model", default=None, help="Student model (default: the embedded SmolLM2-135M-Instruct).")
    parser.add_argument("--output_dir", default=output_dir, help="Work folder: data, adapters, caches (resumable).")
    parser.add_argument("--results_dir", default=str(RESULTS_DIR), help="Where the .json/.md/.png report goes.")


def recipe_values(args: argparse.Namespace, names: str) -> dict:
    """The flags (space-separated `names`) that change an experiment's numbers: a resumed run must match them."""
    return {name: getattr(args, name) for name in names.split()}


def claim_work_folder(args: argparse.Namespace, recipe_flags: str) -> Path:
    """--output_dir, made if missing, with the recipe (`recipe_flags`' values) in recipe.json: a folder that holds
    an experiment run with other values is refused, so a resumed run never mixes two recipes."""
    from utils.jsonl import write_json_atomic

    out = Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    recipe, recipe_file = recipe_values(args, recipe_flags), out / "recipe.json"
    if recipe_file.is_file() and json.loads(recipe_file.read_text()) != recipe:
        raise SystemExit(
            f"error: {out} holds an experiment with another recipe ({recipe_file}); resume it with the same flags, "
            "or pick another --output_dir."
        )
    write_json_atomic(recipe_file, recipe)
    return out


def ks_for(samples: int) -> list[int]:
    """1, 2, 4, ... up to `samples` (and `samples` itself)."""
    ks, k = [], 1
    while k <= samples:
        ks.append(k)
        k *= 2
    return ks if ks[-1] == samples else [*ks, samples]


def add_seeded_experiment_flags(
    parser: argparse.ArgumentParser,
    *,
    seeds: tuple[int, ...],
    arms: list[str],
    default_arms: tuple[str, ...],
    arms_note: str,
    steps_help: str,
    group_help: str,
    output_dir: str,
    evidence_dir: Path,
    evidence_help: str,
    report_name: str,
) -> None:
    """The flags of the seeded, resumable experiments (bench_ablation_seeds, bench_teacher_guidance): which seeds and
    arms run, the recipe's sizes, and the folders; each script adds its own after these."""
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=list(seeds),
        help=f"training.seed values to run, in this order (default {' '.join(map(str, seeds))}); "
        "extend later with more seeds.",
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=arms,
        default=list(default_arms),
        help=f"Arms to run for each seed (default {' '.join(default_arms)}{arms_note}). "
        "The base model is evaluated for every seed whatever the arms.",
    )
    parser.add_argument("--steps", type=int, default=16, help=steps_help)
    parser.add_argument(
        "--samples",
        type=int,
        default=8,
        help="Samples per task in the pre-pass and every evaluation (default 8; pass@k for k = 1, 2, 4 .. up to it).",
    )
    parser.add_argument("--group", type=int, default=8, help=group_help)
    parser.add_argument(
        "--max_new_tokens", type=int, default=96, help="Token budget of rollouts and evaluations (default 96)."
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.7,
        help="Temperature of the pre-pass, the rollouts and the evaluations (default 0.7; top-p is 1).",
    )
    parser.add_argument(
        "--max_tasks",
        type=int,
        default=0,
        help="Use only the first N tasks of each split (0: all; a smoke-test size, not the experiment).",
    )
    parser.add_argument("--model", default=None, help="Student model (default: the embedded SmolLM2-135M-Instruct).")
    parser.add_argument(
        "--output_dir",
        default=output_dir,
        help="Work folder: data, adapters, caches, logs (may be deleted; the evidence is enough to resume).",
    )
    parser.add_argument("--evidence_dir", default=str(evidence_dir), help=evidence_help)
    parser.add_argument("--results_dir", default=str(RESULTS_DIR), help=f"Where {report_name}.json/.md/.png go.")
    parser.add_argument(
        "--report_only", action="store_true", help="Only rebuild the report from the evidence; run nothing."
    )


def check_seeded_experiment_flags(parser: argparse.ArgumentParser, args: argparse.Namespace, prepass_seed: int) -> None:
    """Refuse what would make the pre-pass or the seeds meaningless."""
    if args.samples < 2:
        parser.error("--samples must be >= 2: the pre-pass band (1 .. n-1 passes) needs at least two samples")
    if len(set(args.seeds)) != len(args.seeds) or prepass_seed in args.seeds:
        parser.error(f"--seeds must be distinct and must not include the pre-pass seed {prepass_seed}")


def write_report_files(report: dict, results_dir: Path, name: str, markdown, plot, plotted: bool) -> list[Path]:
    """`name`.json and .md from a report, and .png when there is something to draw (`plotted`)."""
    from utils.jsonl import write_json_atomic

    results_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (results_dir / f"{name}.{ext}" for ext in ("json", "md", "png"))
    write_json_atomic(json_path, report)
    md_path.write_text(markdown(report), encoding="utf-8")
    if plotted:
        plot(report, png_path)
        return [json_path, md_path, png_path]
    return [json_path, md_path]
