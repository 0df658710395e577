"""What each term of the objective is worth, with seeds in the interval: a seeded, resumable ablation on the
embedded fixtures. (Not a CI test: hours of CPU.)

    python -m experiments.ablation_seeds.run [--seeds 1 2 3] [--arms full tsft grpo grpo_tsft grpo_opd]
    python -m experiments.ablation_seeds.run --report_only

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

Writes experiments/results/ablation_seeds.json, .md and .png (the analysis: evaluation/seed_contrasts.py).
The shared frame (processes, pre-pass, training, evaluation, evidence): experiments/frame.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from experiments import frame
from experiments.ablation_seeds.design import (
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
from experiments.frame import (
    add_seeded_experiment_flags,
    check_config_keys,
    check_evidence_recipe,
    check_seeded_experiment_flags,
    claim_work_folder,
    recipe_values,
    set_flags,
)


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
        "(default benchmarks/results/ablation_seeds, the recorded run's).",
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


class Runner(frame.SeededRunner):
    """The shared seeded runner with this experiment's teacher data (the pool's references, in the pinned target
    format), its OPD teacher and its arms."""

    target_format: dict = TARGET_FORMAT  # pinned into every phase 2 and phase 3 command
    prepass_seed, val_ratio, data_seed = PREPASS_SEED, VAL_RATIO, DATA_SEED

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


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python -m experiments.ablation_seeds.run " + shlex.join(argv if argv is not None else sys.argv[1:])
    evidence = Path(args.evidence_dir).resolve()
    if not args.report_only:
        frame.lower_priority(NICENESS)
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
    from experiments.ablation_seeds.report import build_report, write_report

    report = build_report(evidence, command)
    paths = write_report(report, Path(args.results_dir))
    print("\n" + paths[1].read_text())
    print("results: " + ", ".join(str(p) for p in paths))
    return report


if __name__ == "__main__":
    main()
