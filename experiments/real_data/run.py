"""The real-data experiment's runner (design: experiments/real_data/design.py): the fixture rerun's runner
(experiments/teacher_guidance/run.py) over MBPP's published ids, evaluated on MBPP test and HumanEval.

    python -m experiments.real_data.run --mbpp_path ../shared/data/mbpp.jsonl [--seeds 1 2 3] [--commit_evidence]
    python -m experiments.real_data.run --report_only

Resumable like every experiment here: each finished (arm, seed) run's evidence lands in --evidence_dir
(experiments/results/real_data/runs/), with one block per evaluation set.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from experiments import frame
from experiments.real_data import design as real
from experiments.teacher_guidance import design as tg
from experiments.teacher_guidance import run as tg_run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def add_flags(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--mbpp_path", default="../shared/data/mbpp.jsonl", help="Local MBPP file (empty: the hub)."
        )

    defaults = {
        "samples": real.SAMPLES,
        "seeds": list(real.DEFAULT_SEEDS),
        "output_dir": "outputs/real_data",
        "evidence_dir": str(real.EVIDENCE_DIR),
        "report_name": real.NAME,
        "budgets": real.BUDGETS,
        "samples_help": f"Samples per task in every evaluation (default {real.SAMPLES}; pass@k for k = 1, 2, 4 .. up "
        f"to it); the budget tries, the training-task pass and the pool re-selections sample {real.POOL_SAMPLES} "
        "(the design's POOL_SAMPLES).",
    }
    return tg_run.parse_args(argv, {"description": __doc__, "add_flags": add_flags, "defaults": defaults})


class Runner(tg_run.Runner):
    """The fixture rerun's runner with MBPP's ids as the population, two evaluation sets and real sizes."""

    design = real
    prepass_seed = real.PREPASS_SEED

    def split(self) -> tuple[list[str], list[str]]:
        from utils.dataset_loader import load_mbpp, write_tasks

        self.data.mkdir(parents=True, exist_ok=True)
        tasks, _ = load_mbpp(self.args.mbpp_path or None)
        by_id = {t.metadata.get("original_id"): t for t in tasks}
        n = self.args.max_tasks or None
        train = [by_id[i] for i in real.TRAIN_IDS if i in by_id][:n]
        val = [by_id[i] for i in real.VALIDATION_IDS if i in by_id][:n]
        for name, rows in (("train.jsonl", train), ("val.jsonl", val), ("population.jsonl", [*train, *val])):
            write_tasks(self.data / name, rows)
        return [t.task_id for t in train], [t.task_id for t in val]

    def budget_population(self, train_ids: list[str], heldout_ids: list[str]) -> tuple[Path, list[str]]:
        """The budget rule reads the validation tasks only (the held-out side of this split)."""
        return self.data / "val.jsonl", heldout_ids

    def train_pass_path(self, budget: int) -> Path:
        return self.evidence / "prepass" / f"train-{budget}.json"

    def population_counts(self, chosen: dict, train_ids: list[str], heldout_ids: list[str]) -> dict:
        """The training tasks' base passes at the chosen budget (one pass, POOL_SAMPLES a task, evidence of its own
        committed as it lands), beside the validation tasks' from the budget rule."""
        budget = chosen["budget"]
        stored = self.train_pass_path(budget)
        if not stored.is_file():
            print(f"pre-pass: the base on the {len(train_ids)} training tasks at {budget} tokens", flush=True)
            self.base_pass(budget, self.data / "train.jsonl", train_ids, self.work / f"prepass-{budget}-train", stored)
            self.commit([stored], f"the training tasks' pre-pass at {budget} tokens")
        return {**json.loads(stored.read_text())["counts"], **chosen["counts"]}

    def base_model_caches(self) -> list[Path]:
        out = super().base_model_caches()
        for budget in real.BUDGETS:
            if not self.train_pass_path(budget).is_file():
                out += sorted((self.work / f"prepass-{budget}-train" / "eval_cache").glob("*.jsonl"))
        return out

    def duplicates(self) -> dict[str, str]:
        return {}  # MBPP's own splits; HumanEval is a different source

    def evaluate(self, name: str, folder: Path, model_path: str, seed: int) -> float:
        """Phase 4 on each evaluation set of the design (cached completions make a rerun continue)."""
        wall = 0.0
        for eval_set in real.EVAL_SETS:
            out = folder / eval_set
            if (out / "result.json").is_file():
                continue
            flags = ["--eval_set", eval_set, *(["--mbpp_path", self.args.mbpp_path] if self.args.mbpp_path else [])]
            if self.args.max_tasks:
                flags += ["--max_tasks", str(self.args.max_tasks)]
            command, env = self.phase4(model_path, seed, out, out / "result.json", *flags)
            wall += self.run(f"{name}.eval.{eval_set}", command, env=env)
        return wall

    def write_evidence(self, path: Path, folder: Path, header: dict) -> None:
        evals = {}
        for eval_set in real.EVAL_SETS:
            result = json.loads((folder / eval_set / "result.json").read_text())
            rows = frame.read_jsonl(folder / eval_set / "result.samples.jsonl")
            evals[eval_set] = {
                "pass_at_k": result["pass_at_k"],
                "pass_at_k_sanitized": result.get("pass_at_k_sanitized"),
                "at_budget": sum(r["finish_reason"] == "length" for r in rows) / max(len(rows), 1),
                "samples": frame.sample_rows(rows),
            }
        first = evals[real.EVAL_SETS[0]]
        frame.write_evidence_json(
            path,
            {
                **header,
                "pass_at_k": first["pass_at_k"],
                "pass_at_k_sanitized": first["pass_at_k_sanitized"],
                "at_budget": first["at_budget"],
                "sample_columns": list(frame.SAMPLE_COLUMNS),
                "evals": evals,
                "metrics": frame.metric_rows(folder),
            },
        )


def remaining_line(evidence: Path, seeds: list[int], arms: list[str]) -> str:
    """How much of the plan has landed in `evidence` and the idle 2-core hours the rest takes (design.RATES)."""
    done = {(r["arm"], r["seed"]) for r in map(json.loads, map(Path.read_text, (evidence / "runs").glob("*.json")))}
    plan = tg_run.plan_runs(seeds, arms)
    hours = real.remaining_hours(done, plan, prepass_done=(evidence / "prepass.json").is_file())
    landed = sum((arm, seed) in done for seed, arm in plan)
    return (
        f"real data: {landed} of {len(plan)} runs landed; ~{hours:.0f} h left on 2 CPU cores at the fixture rerun's "
        "rates (experiments/real_data/design.py RATES; a GPU takes minutes a run)"
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python -m experiments.real_data.run " + shlex.join(argv if argv is not None else sys.argv[1:])
    evidence = Path(args.evidence_dir).resolve()
    if not args.report_only:
        frame.lower_priority(args.niceness)
        frame.check_evidence_recipe(
            evidence,
            {
                **tg_run.recipe_of(args),
                "data": {"train": "601-974", "validation": "511-600", "eval_sets": list(real.EVAL_SETS)},
                "sizes": {
                    "sft": [real.SFT_STEPS, real.SFT_BATCH],
                    "grpo": real.GRPO_STEPS,
                    "pool_samples": real.POOL_SAMPLES,
                    "budget_rule": "validation",
                },
            },
        )
        print(remaining_line(evidence, args.seeds, args.arms), flush=True)
        work = frame.claim_work_folder(args, tg.RECIPE_FLAGS)
        runner = Runner(args, work, evidence, command)
        if args.stash_partial:
            stashed = runner.stash_partial()
            print(f"stashed {len(stashed)} completion caches into {evidence / tg_run.PARTIAL}")
            return {}
        runner.restore_partial()
        runner.prepass()
        runner.references()
        for i, (seed, arm) in enumerate(tg_run.plan_runs(args.seeds, args.arms), start=1):
            runner.one_run(arm, seed, f"[{i}]")
    from experiments.real_data.report import build_report, write_report

    report = build_report(evidence, command)
    paths = write_report(report, Path(args.results_dir))
    print("results: " + ", ".join(str(p) for p in paths))
    return report


if __name__ == "__main__":
    main()
