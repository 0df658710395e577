"""The teacher-guidance rerun's runner: one process per phase, one run per (arm, seed), resumable, each landed
run's evidence written to --evidence_dir (and committed there with --commit_evidence). The design, fixed before
any outcome, is `experiments/teacher_guidance/design.py`; the report, built from the evidence alone, is
`experiments/teacher_guidance/report.py`.

    python -m experiments.teacher_guidance.run [--seeds 1 2 3 4 5 6] [--arms tsft grpo sft_grpo format guided]
    python -m experiments.teacher_guidance.run --report_only
    python -m experiments.teacher_guidance.run --stash_partial --commit_evidence   # before the machine goes away

Order: the split, the duplicate map, the pre-pass (the budget chosen there), the references and the deranged
references; then seed-major, base first. The script lowers its own priority (--niceness, default 19).

What survives a lost work folder (another machine): the evidence (every finished run, the duplicate map, each
pre-pass budget's try) and, once stashed, the base model's unfinished completion caches (`partial/`), which a new
work folder gets back at its start. A trained arm's unfinished training is not kept: a new folder trains it again.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from experiments import frame
from experiments.teacher_guidance import design
from experiments.teacher_guidance.design import ARMS, BASE, Arm

PARTIAL = "partial"  # evidence/partial/<path in the work folder>: the base model's unfinished completion caches
TASK_TYPES = "task_types.json"  # evidence/task_types.json: the population's test types (Runner.task_types)


def parse_args(argv: list[str] | None = None, variant: dict | None = None) -> argparse.Namespace:
    """The flags; `variant` (another experiment on this runner) gives its description, its extra flags (a function
    that adds them) and its defaults."""
    variant = variant or {}
    defaults = variant.get("defaults", {})
    parser = argparse.ArgumentParser(
        description=variant.get("description", __doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    frame.add_seeded_experiment_flags(
        parser,
        seeds=tuple(defaults.get("seeds", design.DEFAULT_SEEDS)),
        arms=list(ARMS),
        default_arms=design.DEFAULT_ARMS,
        arms_note="",
        steps_help="Unused here: the design fixes every stage's steps (design.SFT_STEPS, design.GRPO_STEPS).",
        group_help="Rollouts per prompt in GRPO, G (default 8).",
        output_dir=defaults.get("output_dir", "outputs/teacher_guidance"),
        evidence_dir=Path(defaults.get("evidence_dir", design.EVIDENCE_DIR)),
        evidence_help="Evidence of every finished run, the pre-pass and the duplicate map "
        f"(default {Path(defaults.get('evidence_dir', design.EVIDENCE_DIR)).relative_to(frame.ROOT)}).",
        report_name=defaults.get("report_name", design.NAME),
        max_new_tokens=design.BUDGETS[0],
        max_new_tokens_help="Unused here: the pre-pass's budget rule chooses the budget of every rollout and "
        f"evaluation from {' / '.join(map(str, defaults.get('budgets', design.BUDGETS)))} tokens (the evidence's "
        "prepass.json).",
        samples=defaults.get("samples", 8),
        samples_help=defaults.get("samples_help"),
        sampler=defaults.get("sampler", design.SAMPLER),
    )
    parser.add_argument(
        "--commit_evidence",
        action="store_true",
        help="Commit each landed evidence file to the git checkout that holds --evidence_dir.",
    )
    parser.add_argument("--niceness", type=int, default=19, help="This process's nice level (default 19).")
    parser.add_argument(
        "--stash_partial",
        action="store_true",
        help="Only copy the base model's unfinished completion caches (pre-pass, base evaluations) from the work "
        "folder into the evidence's partial/ and commit them with --commit_evidence; a run started on a new work "
        "folder continues them. Use it before a machine goes away mid-pass.",
    )
    if "add_flags" in variant:
        variant["add_flags"](parser)
    args = parser.parse_args(argv)
    frame.check_seeded_experiment_flags(parser, args, design.PREPASS_SEED)
    return args


def recipe_of(args: argparse.Namespace) -> dict:
    """Everything that changes a number."""
    return {
        "flags": frame.recipe_values(args, design.RECIPE_FLAGS),
        "recipe": design.RECIPE,
        "budgets": list(design.BUDGETS),
        "max_at_budget": design.MAX_AT_BUDGET,
        "sft": {"steps": design.SFT_STEPS, "batch": design.SFT_BATCH},
        "grpo_steps": design.GRPO_STEPS,
        "arms": {
            name: {"sft": a.sft, "grpo_steps": a.grpo_steps, "pool": a.pool, "overrides": a.overrides}
            for name, a in ARMS.items()
        },
        "reviewed_duplicates": design.REVIEWED_DUPLICATES,
        "split": {"val_ratio": design.VAL_RATIO, "data_seed": design.DATA_SEED, "prepass_seed": design.PREPASS_SEED},
        "vllm_rollouts": frame.VLLM_ROLLOUTS if args.sampler == "vllm" else None,
    }


def signal_check(metrics: list[dict]) -> dict:
    """A GRPO run's median flat-group share and mean training pass rate against the design's thresholds."""
    import statistics

    flat = [m["frac_reward_zero_std"] for m in metrics if m.get("frac_reward_zero_std") is not None]
    rate = [m["pass_rate"] for m in metrics if m.get("pass_rate") is not None]
    median_flat = statistics.median(flat) if flat else None
    mean_rate = statistics.fmean(rate) if rate else None
    low, high = design.PASS_RATE_BAND
    ok = (
        median_flat is not None
        and mean_rate is not None
        and median_flat <= design.MAX_FLAT_SHARE
        and low <= mean_rate <= high
    )
    return {"median_flat_share": median_flat, "mean_pass_rate": mean_rate, "ok": ok}


class Runner(frame.SeededRunner):
    """The rerun's phases over one work folder and one evidence folder; its sizes and arms come from `design`."""

    design = design  # the experiment's design module (the real-data experiment passes its own)
    prepass_seed, val_ratio, data_seed = design.PREPASS_SEED, design.VAL_RATIO, design.DATA_SEED
    target_format = {"teacher.reference_thinking": "none", "dual_source.include_thinking": False}

    @property
    def all_train_file(self) -> Path:
        return self.data / "train_all.jsonl"

    @property
    def refs(self) -> Path:
        return self.data / "refs_code_only.jsonl"

    @property
    def deranged_refs(self) -> Path:
        return self.data / "refs_deranged.jsonl"

    # ---- the population
    def duplicates(self) -> dict[str, str]:
        """The measured duplicate map (stored once in the evidence), joined with the reviewed one."""
        from experiments.teacher_guidance.duplicates import main as measure

        path = self.evidence / "duplicates.json"
        if not path.is_file():
            measure(["--data", str(self.data), "--output", str(path)])
        return self.design.duplicated_heldout(json.loads(path.read_text())["duplicates"])

    def heldout_ids(self, heldout_ids: list[str]) -> list[str]:
        dropped = self.duplicates()
        return [t for t in heldout_ids if t not in dropped]

    def prepass(self) -> dict:
        """The base on every task at each of the design's BUDGETS until the share ended by the budget is at most its
        MAX_AT_BUDGET; stored once with the budget chosen."""
        from utils.jsonl import write_json_atomic

        path = self.evidence / "prepass.json"
        train_ids, heldout_ids = self.split()
        if not path.is_file():
            tried = []
            for budget in self.design.BUDGETS:
                tried.append(self.budget_try(budget, train_ids, heldout_ids))
                if tried[-1]["at_budget"] <= self.design.MAX_AT_BUDGET:
                    break
            chosen = tried[-1]
            counts = self.population_counts(chosen, train_ids, heldout_ids)
            pool, heldout = frame.select_bands(counts, train_ids, self.heldout_ids(heldout_ids), self.pool_samples)
            write_json_atomic(
                path,
                {
                    "samples": self.args.samples,
                    "pool_samples": self.pool_samples,
                    "seed": self.prepass_seed,
                    "split": {"train": train_ids, "heldout": heldout_ids},
                    "max_new_tokens": chosen["budget"],
                    "budget_ok": chosen["at_budget"] <= self.design.MAX_AT_BUDGET,
                    "budgets_tried": [{k: v for k, v in t.items() if k != "counts"} for t in tried],
                    "counts": counts,
                    "duplicates_dropped": sorted(set(heldout_ids) - set(self.heldout_ids(heldout_ids))),
                    "training_pool": pool,
                    "heldout_set": heldout,
                },
            )
            self.commit([path, self.evidence / "duplicates.json"], "the pre-pass and the duplicate map")
        stored = json.loads(path.read_text())
        if stored["split"] != {"train": train_ids, "heldout": heldout_ids}:
            raise SystemExit(f"error: phase 1's split differs from the stored one in {path}: the data changed")
        self.set_budget(stored["max_new_tokens"])
        if not stored["heldout_set"]:
            raise SystemExit(f"error: the pre-pass left an empty held-out set ({path})")
        self.write_task_files(stored)
        return stored

    @property
    def pool_samples(self) -> int:
        """Samples a task in the passes that choose a pool (the design's POOL_SAMPLES; else --samples)."""
        return getattr(self.design, "POOL_SAMPLES", None) or self.args.samples

    def budget_population(self, train_ids: list[str], heldout_ids: list[str]) -> tuple[Path, list[str]]:
        """The task file (and its ids) each budget try samples: here every task of the population."""
        return self.data / "population.jsonl", [*train_ids, *heldout_ids]

    def population_counts(self, chosen: dict, train_ids: list[str], heldout_ids: list[str]) -> dict:
        """Every population task's base passes at the chosen budget: here the chosen try's own counts."""
        return chosen["counts"]

    def budget_try_path(self, budget: int) -> Path:
        return self.evidence / "prepass" / f"budget-{budget}.json"

    def budget_try(self, budget: int, train_ids: list[str], heldout_ids: list[str]) -> dict:
        """The base on the budget rule's tasks at `budget` tokens: its pass counts and the share of answers the budget
        ended. Each budget's try is evidence of its own, committed as it lands, so a new work folder (another
        machine) goes on from the next budget."""
        stored = self.budget_try_path(budget)
        if stored.is_file():
            print(f"pre-pass at {budget} tokens: evidence exists, not redone", flush=True)
            return json.loads(stored.read_text())
        task_file, ids = self.budget_population(train_ids, heldout_ids)
        print(f"pre-pass: the base on {len(ids)} tasks at {budget} tokens", flush=True)
        record = self.base_pass(budget, task_file, ids, self.work / f"prepass-{budget}", stored)
        self.commit(
            [stored], f"the pre-pass at {budget} tokens ({record['at_budget']:.1%} of the answers ended by the budget)"
        )
        return record

    def base_pass(self, budget: int, task_file: Path, ids: list[str], folder: Path, stored: Path) -> dict:
        """The untrained base on `task_file` at `budget` tokens, `pool_samples` a task, into `folder`; its record
        (pass counts per id, the share the budget ended, tokens, time, load, commit) written to `stored`."""
        from utils.jsonl import write_json_atomic

        self.set_budget(budget)
        load_start = os.getloadavg()
        found, wall = self.pass_counts("prepass", self.model, task_file, folder, self.prepass_seed, self.pool_samples)
        rows = frame.read_jsonl(folder / "prepass.samples.jsonl")
        record = {
            "budget": budget,
            "at_budget": sum(r["finish_reason"] == "length" for r in rows) / max(len(rows), 1),
            "mean_tokens": sum(r["num_tokens"] for r in rows) / max(len(rows), 1),
            "wall_s": round(wall, 1),
            "sampler": self.sampler,
            "samples": len(rows),
            "load": {"start": list(load_start), "end": list(os.getloadavg())},
            "git": frame.git_commit(),
            "counts": {t: found.get(t, 0) for t in ids},
        }
        write_json_atomic(stored, record)
        return record

    # ---- the base model's unfinished sample caches, kept across work folders
    def base_model_caches(self) -> list[Path]:
        """The completion caches of the untrained base's passes that have no evidence yet (the pre-pass at each
        budget, the base's evaluation per seed). They depend on no training, so another work folder (another
        machine) can continue them; a trained arm's cache would belong to weights a new folder trains again."""
        out: list[Path] = []
        for budget in self.design.BUDGETS:
            if not self.budget_try_path(budget).is_file():
                out += sorted((self.work / f"prepass-{budget}" / "eval_cache").glob("*.jsonl"))
        for folder in sorted((self.work / "runs").glob(f"{BASE}-s*")):
            seed = int(folder.name.rsplit("-s", 1)[1])
            if not self.design.evidence_path(self.evidence, BASE, seed).is_file():
                out += sorted(folder.rglob("eval_cache/*.jsonl"))  # real data: one folder per evaluation set
        return out

    def stash_partial(self) -> list[Path]:
        """Copy the base model's unfinished completion caches into the evidence (`partial/`, replacing an earlier
        stash) and commit them: what a machine that ends mid-pass would otherwise lose."""
        from utils.jsonl import write_json_atomic

        target = self.evidence / PARTIAL
        listing = target / "stash.json"
        caches = [c for c in self.base_model_caches() if c.stat().st_size > 0]  # an empty one has nothing to keep
        if not caches and listing.is_file() and not json.loads(listing.read_text())["caches"]:
            return []  # nothing then, nothing now: a new time alone would be a commit that changes nothing
        shutil.rmtree(target, ignore_errors=True)
        stashed = []
        for cache in caches:
            dest = target / cache.relative_to(self.work)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cache, dest)
            stashed.append(dest)
        rows = {str(p.relative_to(target)): len(p.read_text().splitlines()) for p in stashed}
        write_json_atomic(listing, {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "caches": rows})
        self.commit([listing], f"{sum(rows.values())} completions of the base model's unfinished passes stashed")
        return stashed

    def restore_partial(self) -> list[Path]:
        """Put the stashed caches back into this work folder where it has fewer completions of them."""
        source = self.evidence / PARTIAL
        restored = []
        for cache in sorted(source.rglob("*.jsonl")):
            dest = self.work / cache.relative_to(source)
            if dest.is_file() and len(dest.read_text().splitlines()) >= len(cache.read_text().splitlines()):
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cache, dest)
            restored.append(dest)
        if restored:
            print(f"restored {len(restored)} stashed completion caches of the base model from {source}", flush=True)
        return restored

    def set_budget(self, budget: int) -> None:
        self.budget = budget
        at = self.eval_flags.index("--max_new_tokens")
        self.eval_flags[at + 1] = str(budget)

    def write_task_files(self, prepass: dict) -> None:
        from utils.dataset_loader import read_tasks, write_tasks

        super().write_task_files(prepass)
        tasks = {t.task_id: t for t in read_tasks(self.data / "population.jsonl")}
        write_tasks(self.all_train_file, [tasks[t] for t in prepass["split"]["train"]])

    def task_types(self) -> None:
        """evidence/task_types.json: each population task's test type (assert, call, stdin), once, so the report
        can tell the APPS tasks judged on stdin from the call-based ones (a descriptive split, not a stratum of the
        design)."""
        from utils.dataset_loader import read_tasks
        from utils.jsonl import write_json_atomic

        path = self.evidence / TASK_TYPES
        if path.is_file():
            return
        write_json_atomic(path, {t.task_id: t.test_type for t in read_tasks(self.data / "population.jsonl")})
        self.commit([path], "the population's test types")

    def references(self) -> None:
        """Phase 2's reference teacher on every training task, code-only; and their derangement (format control)."""
        from utils.dataset_loader import read_tasks

        if not self.refs.with_suffix(".stats.json").is_file():
            self.run(
                "references",
                self.python(
                    "phase2_generate_teacher_traces.py",
                    "--teacher",
                    "references",
                    "--input",
                    str(self.all_train_file),
                    "--output",
                    str(self.refs),
                    *frame.set_flags({"teacher.max_tasks": 0, **self.target_format}),
                ),
            )
        if not self.deranged_refs.is_file():
            style = {
                t.task_id: "stdin" if t.test_type == "stdin" else "function" for t in read_tasks(self.all_train_file)
            }
            rows = frame.read_jsonl(self.refs)
            deranged = self.design.derange([r for r in rows if r.get("passed") and r.get("code")], style)
            same = [r["task_id"] for r in deranged if r["deranged_from"] == r["task_id"]]
            if same:
                raise SystemExit(f"error: no derangement for {same}: a calling style with one reference")
            self.deranged_refs.write_text("".join(json.dumps(r) + "\n" for r in deranged))

    # ---- stages
    def sft_stage(self, kind: str, seed: int) -> tuple[Path, float]:
        """The teacher-SFT stage on the references (`kind` "references") or the deranged ones, shared by the arms
        that start from it (E and B share one); (its folder, its training seconds over every process)."""
        folder = self.work / "runs" / f"sft_{kind}-s{seed}"
        refs = self.refs if kind == "references" else self.deranged_refs
        overrides = {**self.design.RECIPE, **self.design.SFT_ONLY, "training.seed": seed}
        wall, _ = self.train(f"sft_{kind}-s{seed}", folder, overrides, self.design.SFT_STEPS, self.all_train_file, refs)
        return folder, wall

    def merged(self, sft_folder: Path) -> Path:
        """The SFT adapter folded into the base weights (float32), made once per stage folder."""
        target = sft_folder.with_name(sft_folder.name + ".merged")
        if not (target / "config.json").is_file():
            self.run(
                f"{sft_folder.name}.merge",
                [
                    sys.executable,
                    "-m",
                    "training.export",
                    *self.common,
                    "--model_path",
                    str(sft_folder / "final_model"),
                    "--output_dir",
                    str(target),
                    "--dtype",
                    "float32",
                ],
            )
        return target

    def reselected_pool(self, name: str, model: Path, folder: Path) -> dict:
        """The GRPO pool of an SFT'd model: its own pass counts on the training tasks, the design's band."""
        from utils.dataset_loader import read_tasks, write_tasks

        record = folder / "pool.json"
        if record.is_file():
            return json.loads(record.read_text())
        start = time.monotonic()
        counts, _ = self.pass_counts(
            f"{name}.prepass", str(model), self.all_train_file, folder, self.prepass_seed, self.pool_samples
        )
        train = read_tasks(self.all_train_file)
        pool = [t.task_id for t in train if 0 < counts.get(t.task_id, 0) < self.pool_samples]
        write_tasks(folder / "pool.jsonl", [t for t in train if t.task_id in pool])
        out = {"counts": counts, "pool": pool, "wall_s": round(time.monotonic() - start, 1)}
        record.write_text(json.dumps(out))
        return out

    def grpo_overrides(self, arm: Arm, seed: int) -> dict:
        return {
            **self.design.RECIPE,
            **self.design.GRPO_ONLY,
            "grpo.temperature": self.args.temperature,
            "grpo.num_samples_per_prompt": self.args.group,
            "grpo.max_new_tokens": self.budget,
            "training.seed": seed,
            **self.rollout_overrides(),
            **arm.overrides,
        }

    # ---- one run
    def one_run(self, arm_name: str, seed: int, index: str) -> None:
        """Train (unless base) and evaluate one arm on one seed, then write (and commit) its evidence."""
        path = self.design.evidence_path(self.evidence, arm_name, seed)
        if path.is_file():
            print(f"{index} seed {seed} {arm_name}: evidence exists, not redone", flush=True)
            return
        arm = self.design.ARMS.get(arm_name)
        if arm is not None and arm.needs_section and not frame.has_config_section(arm.needs_section):
            print(f"{index} seed {seed} {arm_name}: declared; the config has no {arm.needs_section} section yet")
            return
        name = f"{arm_name}-s{seed}"
        folder = self.work / "runs" / name
        folder.mkdir(parents=True, exist_ok=True)
        load_start = os.getloadavg()
        print(f"{index} seed {seed} {arm_name}: starting (load {load_start[0]:.1f})", flush=True)
        commit = frame.git_commit()
        stages: dict = {}
        overrides: dict = {"training.seed": seed}
        model_path, stopped, signal = self.model, None, None
        wall_start = time.monotonic()
        if arm is not None:
            start_model = self.model
            if arm.sft:
                sft_folder, sft_s = self.sft_stage(arm.sft, seed)
                stages["sft"] = self.stage_record(sft_folder, sft_s)
                start_model = str(sft_folder / "final_model")
            if arm.grpo_steps:
                train_file = self.train_file if arm.pool == "base" else self.all_train_file
                if arm.pool == "reselected":
                    merged = self.merged(sft_folder)
                    start_model = str(merged)
                    chosen = self.reselected_pool(name, merged, folder)
                    stages["pool"] = chosen
                    train_file = folder / "pool.jsonl"
                    pool_size = len(chosen["pool"])
                else:
                    pool_size = len(frame.read_jsonl(train_file))
                overrides = self.grpo_overrides(arm, seed)
                if start_model != self.model:
                    overrides["student.model_name"] = start_model
                if pool_size < self.design.MIN_POOL:
                    stopped = f"the GRPO pool holds {pool_size} tasks (< {self.design.MIN_POOL}): no GRPO stage"
                else:
                    grpo_s, _ = self.train(name, folder, overrides, arm.grpo_steps, train_file, self.refs)
                    stages["grpo"] = self.stage_record(folder, grpo_s)
                    signal = signal_check(stages["grpo"]["metrics"])
                    model_path = str(folder / "final_model")
            else:
                model_path = start_model
        train_s = sum(s.get("train_s", 0.0) for s in stages.values() if isinstance(s, dict))
        eval_s = 0.0
        if stopped is None:
            eval_s = self.evaluate(name, folder, model_path, seed)
        header = {
            "arm": arm_name,
            "seed": seed,
            "command": self.command,
            "git": commit,
            "overrides": overrides,
            "max_new_tokens": self.budget,
            "train_s": round(train_s, 1),
            "eval_s": round(eval_s, 1),
            "wall_s": round(time.monotonic() - wall_start, 1),
            "stopped": stopped,
            "signal": signal,
            "stages": stages,
            "load": {"start": list(load_start), "end": list(os.getloadavg())},
        }
        if stopped is None:
            self.write_evidence(path, folder, header)
        else:
            frame.write_evidence_json(path, header)
        if arm is not None and arm.pool == "reselected":  # 0.5 GB; rebuilt from the SFT adapter when needed again
            shutil.rmtree(self.work / "runs" / f"sft_{arm.sft}-s{seed}.merged", ignore_errors=True)
        run = json.loads(path.read_text())
        pass1, sanitized = (
            None if (v := (run.get(key) or {}).get("1")) is None else f"{v:.3f}"
            for key in ("pass_at_k", "pass_at_k_sanitized")
        )
        line = (
            f"{index} seed {seed} {arm_name}: trained {train_s:.0f} s, evaluated {eval_s:.0f} s, "
            f"run {header['wall_s']:.0f} s; "
            + (f"stopped: {stopped}" if stopped else f"held-out pass@1 {pass1} (sanitized {sanitized})")
        )
        print(line + f"; load {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
        self.commit([path], f"{name} ({line.split(': ', 1)[1]})")

    def stage_record(self, folder: Path, train_s: float) -> dict:
        used = folder / "teacher_data.json"
        return {
            "train_s": round(train_s, 1),
            "processes_s": json.loads((folder / "train_wall.json").read_text())["processes"]
            if (folder / "train_wall.json").is_file()
            else [],
            "teacher_data_used": json.loads(used.read_text()) if used.is_file() else None,
            "metrics": frame.metric_rows(folder),
            "rollout_columns": list(frame.ROLLOUT_COLUMNS),
            "rollouts": frame.rollout_rows(folder),
            "rollout_examples": frame.rollout_examples(folder, self.design.STRATA),
        }

    def commit(self, paths: list[Path], what: str) -> None:
        """Commit the evidence folder (only it: `paths` and any file an earlier, failed commit left) to the checkout
        that holds it, with --commit_evidence."""
        if not self.args.commit_evidence:
            return
        where = self.evidence
        existing = [str(where)] if any(p.is_file() for p in paths) else []
        for attempt in range(5):  # another git command in the same checkout holds its index lock for a moment
            added = subprocess.run(["git", "-C", str(where), "add", "--", *existing], capture_output=True, text=True)
            done = subprocess.run(
                [
                    "git",
                    "-C",
                    str(where),
                    "commit",
                    "-q",
                    "-m",
                    f"{self.design.EVIDENCE_LABEL} evidence: {what}",
                    "--",
                    *existing,
                ],
                capture_output=True,
                text=True,
            )
            if added.returncode == 0 and done.returncode == 0:
                return
            time.sleep(5 * (attempt + 1))
        print(f"warning: could not commit {existing}: {done.stderr.strip()}", file=sys.stderr, flush=True)


def plan_runs(seeds: list[int], arms: list[str]) -> list[tuple[int, str]]:
    """Seed-major; within a seed the base first, then E (B's first stage), then the other arms in --arms order."""
    first = [a for a in ("tsft",) if a in arms]
    return [(seed, arm) for seed in seeds for arm in [BASE, *first, *[a for a in arms if a not in first]]]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python -m experiments.teacher_guidance.run " + shlex.join(argv if argv is not None else sys.argv[1:])
    evidence = Path(args.evidence_dir).resolve()
    if not args.report_only:
        frame.lower_priority(args.niceness)
        frame.check_config_keys(
            [*design.RECIPE, *design.SFT_ONLY, *design.GRPO_ONLY, "grpo.temperature", "student.model_name"]
        )
        frame.check_evidence_recipe(evidence, recipe_of(args))
        work = frame.claim_work_folder(args, design.RECIPE_FLAGS)
        runner = Runner(args, work, evidence, command)
        if args.stash_partial:
            stashed = runner.stash_partial()
            print(f"stashed {len(stashed)} completion caches into {evidence / PARTIAL}")
            return {}
        runner.restore_partial()
        runner.split()
        runner.prepass()
        runner.task_types()
        runner.references()
        plan = plan_runs(args.seeds, args.arms)
        print(f"teacher guidance: {len(plan)} runs ({len(args.seeds)} seeds), budget {runner.budget}, work {work}")
        for i, (seed, arm) in enumerate(plan, start=1):
            runner.one_run(arm, seed, f"[{i}/{len(plan)}]")
    from experiments.teacher_guidance.report import build_report, write_report

    report = build_report(evidence, command)
    paths = write_report(report, Path(args.results_dir))
    print("results: " + ", ".join(str(p) for p in paths))
    return report


if __name__ == "__main__":
    main()
