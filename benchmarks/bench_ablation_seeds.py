"""What each term of the objective is worth, with seeds in the interval: a seeded, resumable ablation on the
embedded fixtures. (Not a CI test: hours of CPU.)

    python benchmarks/bench_ablation_seeds.py [--seeds 1 2 3] [--arms full tsft grpo grpo_tsft grpo_opd]
    python benchmarks/bench_ablation_seeds.py --report_only

Design (fixed before any outcome is seen):

1. Population: the 71 fixture tasks, phase 1's seeded split (--val_ratio 0.5, data.seed 42): 36 training
   tasks, 35 held out, the same for every arm and seed.
2. Pre-pass, decided before any training and stored: the base model on every task, --samples samples at
   T 0.7, top-p 1, <= 96 new tokens, evaluation seed 42 (used nowhere else). Training pool: training tasks
   with 1 .. n-1 of n passes (GRPO has correctness spread there); held-out set: held-out tasks with < n of n.
3. Teacher-SFT data: phase 2's reference teacher on the training pool (verified reference solutions).
4. OPD teacher: the base + a LoRA trained by phase 3 with teacher-SFT only on those references (12 steps,
   lr 2e-3, 8 traces per step, its rollouts cut to 8 tokens), evaluated on the held-out set; an OPD arm runs
   only when it beats the base's held-out pass@1 with no_code at most the base's + 5 points (`teacher_check`).
5. One recipe for every arm (RECIPE below): 16 steps, 2 prompts x G 8 rollouts at T 0.7 (top-p 1), <= 96 new
   tokens, lr 5e-4, binary correctness reward, no format bonus, no dynamic filtering, no KL, 4 teacher traces
   per step. Arms differ only in the dual_source weights (ARMS below).
6. Seeds 1, 2, 3 (training.seed: LoRA init, data order, rollouts, evaluation streams), seed-major: every arm of
   seed 1, then the base on seed 1, then seed 2, so an interrupted experiment holds whole seeds.
7. Evaluation: phase 4 on the held-out set, --samples samples, pass@1/2/4/8, at the rollouts' decoding, seeded
   with the run's training.seed (within a seed every arm shares its evaluation random streams).

Every phase runs as its own process (its command line as a person would type it): a crash or a leak ends
that run only, memory is returned after each, and the commands in the evidence can be rerun by hand.
The script lowers its own priority to nice 10 at start; its children inherit it.

Resumable across machines: the work folder (--output_dir: data, adapters, caches) may vanish between
sessions; each finished run's evidence is written compactly to --evidence_dir (committed): its training
metrics, its per-sample evaluation rows (task, sample, passed, status, finish reason, tokens), its command,
wall time and machine load; the pre-pass counts and the split; the OPD teacher's held-out check. A run with
evidence is never redone; the pre-pass and the split are never recomputed once stored; the teacher adapter
is retrained (deterministically) only when an OPD run still needs it. The recipe is stored with the
evidence, and a different recipe is refused. The report is built from the evidence alone
(`--report_only` rebuilds it at any time; `complete` says whether every planned run is in).

Writes benchmarks/results/ablation_seeds.json, .md and .png (the analysis: evaluation/seed_contrasts.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ablation_seeds_design import (  # noqa: E402
    ARMS,
    BASE,
    DATA_SEED,
    DEFAULT_ARMS,
    DEFAULT_SEEDS,
    EVIDENCE_DIR,
    NICENESS,
    PREPASS_SEED,
    RECIPE,
    RECIPE_FLAGS,
    TARGET_FORMAT,
    TEACHER_NO_CODE_MARGIN,
    TEACHER_RECIPE,
    TEACHER_SEED,
    VAL_RATIO,
    Arm,
    teacher_check,
)
from experiment_cli import (  # noqa: E402
    add_seeded_experiment_flags,
    check_seeded_experiment_flags,
    claim_work_folder,
    ks_for,
    recipe_values,
)

METRIC_COLUMNS = (
    "step",
    "pass_rate",
    "frac_reward_zero_std",
    "reward/mean",
    "entropy/token_mean",
    "completion/mean_length",
    "opd/kl",
    "opd/advantage_p01",
    "opd/advantage_p99",
    "opd/clipped_frac",
    "loss/grpo",
    "loss/teacher_sft",
    "loss/self_sft",
    "loss/total",
    "grad_norm",
    "format/closed_think",
    "time/rollout_s",
    "time/reward_s",
    "time/update_s",
    "opd/teacher_s",
)


# one evidence row per held-out sample; lenient_passed counts code inside an unclosed <think> (phase 4's)
SAMPLE_COLUMNS = ("task_id", "sample_idx", "passed", "status", "finish_reason", "num_tokens", "lenient_passed")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_seeded_experiment_flags(
        parser,
        seeds=DEFAULT_SEEDS,
        arms=list(ARMS),
        default_arms=DEFAULT_ARMS,
        arms_note="; rft, self-SFT only, is optional",
        steps_help="Optimizer steps per arm (default 16).",
        group_help="Rollouts per prompt, G (default 8).",
        output_dir="outputs/ablation_seeds",
        evidence_dir=EVIDENCE_DIR,
        evidence_help="Committed evidence of every finished run and of the pre-pass "
        "(default benchmarks/results/ablation_seeds).",
        report_name="ablation_seeds",
    )
    args = parser.parse_args(argv)
    check_seeded_experiment_flags(parser, args, PREPASS_SEED)
    return args


def recipe_of(args: argparse.Namespace) -> dict:
    """Everything that changes a number: the flags, the shared recipe, the arms' weights, the teacher's recipe."""
    return {
        "flags": recipe_values(args, RECIPE_FLAGS),
        "recipe": RECIPE,
        "arms": {name: arm.weights for name, arm in ARMS.items()},
        "teacher": TEACHER_RECIPE,
        "target_format": TARGET_FORMAT,
        "split": {"val_ratio": VAL_RATIO, "data_seed": DATA_SEED, "prepass_seed": PREPASS_SEED},
    }


def check_evidence_recipe(evidence: Path, recipe: dict) -> None:
    """Refuse evidence gathered with another recipe: a resumed experiment never mixes two."""
    from utils.jsonl import write_json_atomic

    evidence.mkdir(parents=True, exist_ok=True)
    path = evidence / "recipe.json"
    if path.is_file() and json.loads(path.read_text()) != json.loads(json.dumps(recipe)):
        raise SystemExit(
            f"error: {evidence} holds evidence of another recipe ({path}); resume with the same flags and code, or "
            "pick another --evidence_dir."
        )
    write_json_atomic(path, recipe)


def check_config_keys(keys) -> None:
    """Every key the recipe sets exists in config.py (a renamed key would otherwise fail mid-experiment)."""
    from config import build_config

    config = build_config("cpu")
    missing = [k for k in keys if not hasattr(getattr(config, k.split(".")[0], None), k.split(".")[1])]
    if missing:
        raise SystemExit(f"error: config.py has no key {', '.join(missing)}: the recipe needs updating")


def select_bands(
    counts: dict[str, int], train_ids: list[str], heldout_ids: list[str], samples: int
) -> tuple[list[str], list[str]]:
    """The training pool (training tasks with 1 .. samples-1 passes of `samples`) and the held-out set (held-out
    tasks with fewer than `samples` passes), in split order; `counts`: task id -> passes in the pre-pass."""
    pool = [t for t in train_ids if 0 < counts[t] < samples]
    heldout = [t for t in heldout_ids if counts[t] < samples]
    return pool, heldout


def set_flags(values: dict) -> list[str]:
    flags = []
    for key, value in values.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        flags += ["--set", f"{key}={text}"]
    return flags


class Runner:
    """The experiment's commands (one process per phase) over one work folder and one evidence folder."""

    target_format: dict = TARGET_FORMAT  # pinned into every phase 2 and phase 3 command

    def __init__(self, args: argparse.Namespace, work: Path, evidence: Path, command: str = ""):
        self.args, self.work, self.evidence, self.command = args, work, evidence, command
        self.data = work / "data"
        self.ks = ks_for(args.samples)
        self.common = ["--preset", "cpu"] + (["--set", f"student.model_name={args.model}"] if args.model else [])
        self.eval_flags = [
            "--num_samples",
            str(args.samples),
            "--k",
            *map(str, self.ks),
            "--temperature",
            str(args.temperature),
            "--max_new_tokens",
            str(args.max_new_tokens),
            "--set",
            "evaluation.top_p=1.0",
        ]

    # ---- processes
    def run(self, name: str, command: list[str], watch: Path | None = None, total_steps: int = 0) -> float:
        """Run `command` (output to logs/<name>.log); prints a progress line per new training step in `watch`
        (a metrics.jsonl). Returns the wall seconds; exits on failure with the log's tail."""
        log = self.work / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        start, seen = time.monotonic(), 0
        with log.open("a") as handle:
            handle.write(f"\n$ {shlex.join(command)}\n")
            handle.flush()
            process = subprocess.Popen(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
            while True:
                try:
                    code = process.wait(timeout=20)
                    break
                except subprocess.TimeoutExpired:
                    if watch is not None and watch.is_file():
                        rows = [json.loads(x) for x in watch.read_text().splitlines() if x.strip()]
                        if len(rows) > seen:
                            seen, last = len(rows), rows[-1]
                            step_s = (time.monotonic() - start) / max(seen, 1)
                            print(
                                f"    {name}: step {last.get('step', seen)}/{total_steps}, ~{step_s:.0f} s/step, "
                                f"pass_rate {last.get('pass_rate', float('nan')):.2f}, flat groups "
                                f"{last.get('frac_reward_zero_std', float('nan')):.2f}",
                                flush=True,
                            )
        if code != 0:
            tail = "\n".join(log.read_text().splitlines()[-25:])
            raise SystemExit(f"error: {name} failed (exit {code}); log {log}:\n{tail}")
        return time.monotonic() - start

    def python(self, script: str, *flags: str) -> list[str]:
        return [sys.executable, str(ROOT / script), *self.common, *flags]

    # ---- data and pre-pass
    def split(self) -> tuple[list[str], list[str]]:
        """Phase 1's seeded split (deterministic, so rebuilt when the work folder is gone); task ids per split."""
        from utils.dataset_loader import read_tasks, write_tasks

        if not (self.data / "val.jsonl").is_file():
            self.run(
                "phase1",
                self.python(
                    "phase1_prepare_data.py",
                    "--val_ratio",
                    str(VAL_RATIO),
                    "--seed",
                    str(DATA_SEED),
                    "--output_dir",
                    str(self.data),
                ),
            )
        n = self.args.max_tasks or None
        train, val = read_tasks(self.data / "train.jsonl")[:n], read_tasks(self.data / "val.jsonl")[:n]
        write_tasks(self.data / "population.jsonl", [*train, *val])
        return [t.task_id for t in train], [t.task_id for t in val]

    def prepass(self) -> dict:
        """The stored pre-pass (counts, split, pool, held-out set), computed once."""
        from utils.jsonl import write_json_atomic

        path = self.evidence / "prepass.json"
        train_ids, heldout_ids = self.split()
        if path.is_file():
            stored = json.loads(path.read_text())
            if stored["split"] != {"train": train_ids, "heldout": heldout_ids}:
                raise SystemExit(f"error: phase 1's split differs from the stored one in {path}: the data changed")
        else:
            print(f"pre-pass: the base on {len(train_ids) + len(heldout_ids)} tasks x {self.args.samples}", flush=True)
            folder = self.work / "prepass"
            load_start = os.getloadavg()
            wall = self.run(
                "prepass",
                self.python(
                    "phase4_evaluate.py",
                    *self.eval_flags,
                    "--set",
                    f"training.seed={PREPASS_SEED}",
                    "--model_path",
                    self.model,
                    "--eval_file",
                    str(self.data / "population.jsonl"),
                    "--output_dir",
                    str(folder),
                    "--output",
                    str(folder / "prepass.json"),
                    "--samples_output",
                    str(folder / "prepass.samples.jsonl"),
                ),
            )
            rows = [json.loads(x) for x in (folder / "prepass.samples.jsonl").read_text().splitlines() if x.strip()]
            counts = {t: 0 for t in [*train_ids, *heldout_ids]}
            for row in rows:
                counts[row["task_id"]] += bool(row["passed"])
            pool, heldout = select_bands(counts, train_ids, heldout_ids, self.args.samples)
            stored = {
                "samples": self.args.samples,
                "seed": PREPASS_SEED,
                "split": {"train": train_ids, "heldout": heldout_ids},
                "counts": counts,
                "training_pool": pool,
                "heldout_set": heldout,
                "wall_s": round(wall, 1),
                "load": {"start": list(load_start), "end": list(os.getloadavg())},
            }
            write_json_atomic(path, stored)
        if not stored["training_pool"] or not stored["heldout_set"]:
            raise SystemExit(f"error: the pre-pass left an empty training pool or held-out set ({path})")
        self.write_task_files(stored)
        return stored

    def write_task_files(self, prepass: dict) -> None:
        from utils.dataset_loader import read_tasks, write_tasks

        tasks = {t.task_id: t for t in read_tasks(self.data / "population.jsonl")}
        write_tasks(self.train_file, [tasks[t] for t in prepass["training_pool"]])
        write_tasks(self.heldout_file, [tasks[t] for t in prepass["heldout_set"]])

    @property
    def model(self) -> str:
        from config import EMBEDDED_STUDENT

        return self.args.model or EMBEDDED_STUDENT

    @property
    def train_file(self) -> Path:
        return self.data / "train_band.jsonl"

    @property
    def heldout_file(self) -> Path:
        return self.data / "heldout.jsonl"

    @property
    def refs(self) -> Path:
        return self.data / "refs.jsonl"

    def references(self) -> None:
        """Phase 2's reference teacher on the training pool (verified; deterministic, so rebuilt when missing)."""
        if not (self.refs.with_suffix(".stats.json")).is_file():
            self.run(
                "references",
                self.python(
                    "phase2_generate_teacher_traces.py",
                    "--teacher",
                    "references",
                    "--input",
                    str(self.train_file),
                    "--output",
                    str(self.refs),
                    "--set",
                    "teacher.max_tasks=0",
                    *set_flags(self.target_format),
                ),
            )

    # ---- training and evaluation
    def train(self, name: str, folder: Path, overrides: dict, steps: int) -> tuple[float, bool]:
        """Phase 3 into `folder`, resumed from its newest checkpoint when it has one; (wall seconds, resumed)."""
        if (folder / "final_model" / "adapter_config.json").is_file():
            return 0.0, False
        resumed = any(folder.glob("checkpoint-*"))
        command = self.python(
            "phase3_train_grpo.py",
            "--max_steps",
            str(steps),
            "--output_dir",
            str(folder),
            "--train_file",
            str(self.train_file),
            "--teacher_traces",
            str(self.refs),
            *set_flags({**self.target_format, **overrides}),
            *(["--resume_from_checkpoint", "latest"] if resumed else ["--overwrite_output_dir"]),
        )
        return self.run(f"{name}.train", command, folder / "metrics.jsonl", steps), resumed

    def evaluate(self, name: str, folder: Path, model_path: str, seed: int) -> float:
        """Phase 4 on the held-out set, seeded with `seed` (cached completions make a rerun continue)."""
        if (folder / "heldout.json").is_file() and (folder / "heldout.samples.jsonl").is_file():
            return 0.0
        return self.run(
            f"{name}.eval",
            self.python(
                "phase4_evaluate.py",
                *self.eval_flags,
                "--set",
                f"training.seed={seed}",
                "--model_path",
                model_path,
                "--eval_file",
                str(self.heldout_file),
                "--output_dir",
                str(folder),
                "--output",
                str(folder / "heldout.json"),
                "--samples_output",
                str(folder / "heldout.samples.jsonl"),
            ),
        )

    def arm_overrides(self, arm: Arm, seed: int) -> dict:
        overrides = {
            **RECIPE,
            "grpo.temperature": self.args.temperature,
            "grpo.num_samples_per_prompt": self.args.group,
            "grpo.max_new_tokens": self.args.max_new_tokens,
            "training.seed": seed,
            **{f"dual_source.{k}": v for k, v in arm.weights.items()},
        }
        if arm.opd:
            overrides.update(
                {
                    "teacher.logprob_source": "local",
                    "teacher.model_name": self.model,
                    "teacher.local_adapter": str(self.teacher_adapter),
                }
            )
        return overrides

    @property
    def teacher_adapter(self) -> Path:
        return self.work / "teacher" / "final_model"

    def teacher(self) -> None:
        """The OPD teacher adapter (retrained when missing) and, once, its held-out check in the evidence."""
        folder = self.work / "teacher"
        if not (self.teacher_adapter / "adapter_config.json").is_file():
            print("OPD teacher: teacher-SFT only on the training pool's references", flush=True)
        steps = int(TEACHER_RECIPE["training.max_steps"])
        wall, _ = self.train("teacher", folder, {**TEACHER_RECIPE, "training.seed": TEACHER_SEED}, steps)
        path = self.evidence / "teacher.json"
        if not path.is_file():
            load_start = os.getloadavg()
            eval_wall = self.evaluate("teacher", folder, str(self.teacher_adapter), TEACHER_SEED)
            self.write_evidence(
                path,
                folder,
                {
                    "arm": "teacher",
                    "seed": TEACHER_SEED,
                    "overrides": {**TEACHER_RECIPE, "training.seed": TEACHER_SEED},
                    "train_s": round(wall, 1),
                    "eval_s": round(eval_wall, 1),
                    "load": {"start": list(load_start), "end": list(os.getloadavg())},
                },
            )

    def write_evidence(self, path: Path, folder: Path, header: dict) -> None:
        """The compact, committed record of one finished run."""
        result = json.loads((folder / "heldout.json").read_text())
        rows = [json.loads(x) for x in (folder / "heldout.samples.jsonl").read_text().splitlines() if x.strip()]
        metrics_path = folder / "metrics.jsonl"
        metrics = (
            [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
            if metrics_path.is_file()
            else []
        )
        write_evidence_json(
            path,
            {
                **header,
                "pass_at_k": result["pass_at_k"],
                "decoding": result["decoding"],
                "sample_columns": list(SAMPLE_COLUMNS),
                "samples": [
                    [
                        r["task_id"],
                        r["sample_idx"],
                        int(bool(r["passed"])),
                        r["status"],
                        r["finish_reason"],
                        r["num_tokens"],
                        int(bool(r.get("lenient_passed", r["passed"]))),
                    ]
                    for r in rows
                ],
                "metrics": [{k: m[k] for k in METRIC_COLUMNS if k in m} for m in metrics],
                # what a no_code answer looked like: the failure a score alone cannot explain
                "no_code_completions": [
                    [r["task_id"], r["sample_idx"], r.get("completion", "")] for r in rows if r["status"] == "no_code"
                ],
            },
        )

    def one_run(self, arm_name: str, seed: int, index: str) -> None:
        """Train (unless base) and evaluate one arm on one seed, then write its evidence."""
        path = self.evidence / "runs" / f"{arm_name}-s{seed}.json"
        if path.is_file():
            print(f"{index} seed {seed} {arm_name}: evidence exists, not redone", flush=True)
            if arm_name != BASE and ARMS[arm_name].opd and not (self.evidence / "teacher.json").is_file():
                print("OPD teacher: its held-out check is missing from the evidence; made now", flush=True)
                self.teacher()  # an OPD arm's evidence is read beside its teacher's check
            return
        folder = self.work / "runs" / f"{arm_name}-s{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        load_start = os.getloadavg()
        print(f"{index} seed {seed} {arm_name}: starting (load {load_start[0]:.1f})", flush=True)
        if arm_name == BASE:
            overrides, train_s, resumed, model_path = {"training.seed": seed}, 0.0, False, self.model
        else:
            arm = ARMS[arm_name]
            if arm.opd:
                self.teacher()
                self.one_run(BASE, TEACHER_SEED, index)  # the base the teacher is judged against
                check = teacher_check(
                    json.loads((self.evidence / "teacher.json").read_text()),
                    json.loads((self.evidence / "runs" / f"{BASE}-s{TEACHER_SEED}.json").read_text()),
                )
                if not check["passed"]:
                    raise SystemExit(
                        f"error: the OPD teacher fails its gate ({self.evidence / 'teacher.json'}): held-out pass@1 "
                        f"{check['teacher_pass@1']:.3f} vs the base's {check['base_pass@1']:.3f}, no_code "
                        f"{check['teacher_no_code']:.2f} vs {check['base_no_code']:.2f} + {TEACHER_NO_CODE_MARGIN}; "
                        "an OPD arm runs only with a teacher better than the base whose format holds"
                    )
            overrides = self.arm_overrides(arm, seed)
            train_s, resumed = self.train(f"{arm_name}-s{seed}", folder, overrides, self.args.steps)
            model_path = str(folder / "final_model")
        eval_s = self.evaluate(f"{arm_name}-s{seed}", folder, model_path, seed)
        load_end = os.getloadavg()
        self.write_evidence(
            path,
            folder,
            {
                "arm": arm_name,
                "seed": seed,
                "command": self.command,
                "overrides": overrides,
                "train_s": round(train_s, 1),
                "eval_s": round(eval_s, 1),
                "resumed_from_checkpoint": resumed,
                "load": {"start": list(load_start), "end": list(load_end)},
            },
        )
        step_s = f", {train_s / self.args.steps:.0f} s/step" if train_s else ""
        pass1 = json.loads(path.read_text())["pass_at_k"]["1"]
        print(
            f"{index} seed {seed} {arm_name}: trained in {train_s:.0f} s{step_s}, evaluated in {eval_s:.0f} s; "
            f"held-out pass@1 {pass1:.3f}; load {load_start[0]:.1f} -> {load_end[0]:.1f}",
            flush=True,
        )


def write_evidence_json(path: Path, record: dict) -> None:
    """`record` as JSON with one line per key and one line per row of its lists of rows (samples, metrics):
    readable in a diff, and about 15 KB for a run of 35 tasks x 8 samples instead of ~100 KB indented."""
    from utils.jsonl import write_atomic

    def value(v) -> str:
        if isinstance(v, list) and v and isinstance(v[0], (list, dict)):
            return "[\n" + ",\n".join("    " + json.dumps(row) for row in v) + "\n  ]"
        return json.dumps(v)

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "{\n" + ",\n".join(f"  {json.dumps(k)}: {value(v)}" for k, v in record.items()) + "\n}\n")


def lower_priority() -> None:
    """Nice 10 for this process and, by inheritance, every phase it starts (the machine is shared)."""
    current = os.nice(0)
    if current < NICENESS:
        os.nice(NICENESS - current)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python benchmarks/bench_ablation_seeds.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    evidence = Path(args.evidence_dir).resolve()
    if not args.report_only:
        lower_priority()
        check_config_keys(
            [*RECIPE, *TEACHER_RECIPE, "grpo.temperature", "grpo.num_samples_per_prompt", "grpo.max_new_tokens"]
            + [f"dual_source.{k}" for arm in ARMS.values() for k in arm.weights]
            + ["teacher.logprob_source", "teacher.local_adapter", "teacher.model_name", "training.seed"]
        )
        check_evidence_recipe(evidence, recipe_of(args))
        work = claim_work_folder(args, RECIPE_FLAGS)
        runner = Runner(args, work, evidence, command)
        runner.prepass()
        runner.references()
        plan = [(seed, arm) for seed in args.seeds for arm in [*args.arms, BASE]]
        print(f"ablation: {len(plan)} runs ({len(args.seeds)} seeds x {len(args.arms)} arms + base); work {work}")
        for i, (seed, arm) in enumerate(plan, start=1):
            runner.one_run(arm, seed, f"[{i}/{len(plan)}]")
    from ablation_seeds_report import build_report, write_report

    report = build_report(evidence, command)
    paths = write_report(report, Path(args.results_dir))
    print("\n" + paths[1].read_text())
    print("results: " + ", ".join(str(p) for p in paths))
    return report


if __name__ == "__main__":
    main()
