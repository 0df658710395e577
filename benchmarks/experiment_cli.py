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
