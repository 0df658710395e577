"""Does teacher guidance add to GRPO? A seeded, resumable experiment on the embedded fixtures with the teacher's
data where GRPO is blind too. (Not a CI test: hours of CPU.)

    python benchmarks/bench_teacher_guidance.py [--seeds 1 2 3 4 5 6] [--arms tsft grpo sft_grpo grpo_tsft full]
    python benchmarks/bench_teacher_guidance.py --report_only

Design (fixed before any outcome is seen):

1. Population and split as the seeded ablation's (benchmarks/bench_ablation_seeds.py, whose stored pre-pass is
   reused when present): the 71 fixture tasks, 36 training / 35 held out (phase 1, data.seed 42). Held-out set:
   the held-out tasks below all-pass in the pre-pass, reported in two strata fixed now: MBPP-format (task ids
   mbpp/*, 22) and APPS-format (apps/*: stdin and call-based, 13).
2. Teacher data: the verified reference solutions of ALL training tasks (the zero-pass and stdin ones included,
   where GRPO has no reward), code-only targets (teacher.reference_thinking=none): the 135M student does not
   close a <think> block reliably, and a target it cannot imitate costs it its answers.
3. GRPO pool: the training tasks with 1 .. n-1 of n base passes in the pre-pass (GRPO needs spread).
4. Arms (one recipe otherwise, RECIPE of the seeded ablation: 16 steps, 2 prompts x G 8 at T 0.7, <= 96 tokens,
   lr 5e-4, binary z-scored reward, no KL, no format bonus):
     A grpo       GRPO only
     B sft_grpo   teacher-SFT first (--sft_steps steps x 8 traces, the adapter merged into the weights), then
                  A's GRPO from that model with a fresh adapter: the usual SFT-then-RL recipe
     C grpo_tsft  GRPO + teacher-SFT 0.3, jointly
     D full       C + self-SFT 0.2: the product's objective
     E tsft       teacher-SFT only (--tsft_steps steps x 4 traces). Its weight is inert: AdamW's update does not
                  change when the only loss term is scaled, so E is SFT at lr 5e-4 whatever the weight.
   The base model is evaluated for every seed. The teacher-SFT-only runs (E, B's first stage) sample no
   rollouts (no term uses them); their rollout settings are cut to G 2 x 8 tokens all the same.
   Not run: OPD (its teacher must first pass the gate of point 5 on its own); a CHORD-style arm (D with the SFT
   weight decaying from high to low and each SFT token weighted by p(1 - p)): phase 3 has the decay
   (dual_source.sft_weight_schedule) but not the token weighting.
5. Gate, before any GRPO arm: the first seed's E must leave held-out no_code <= the base's + 5 points on the same
   seed (the code-only target keeps the student's format). A failed gate stops the experiment; the outcome is
   stored in gate.json and in the report either way. (E and the base are runs of the experiment anyway, so the
   gate costs nothing extra.)
6. Pre-registered contrasts (pass@1, each in both strata and overall): B - A and D - A (teacher guidance adds to
   GRPO), A - base (sanity), E - base. Primary: the per-contrast paired t over seeds (evaluation/seed_contrasts.py);
   secondary: the crossed bootstrap, the two-way model with its seed-SD ratio, the task term; strict and lenient
   pass@1 (code inside an unclosed <think> counted), no_code shares, pass@8.
7. Seeds 1 .. 6, seed-major: every arm of a seed (base and E first, for the gate) before the next seed, so an
   interrupted experiment holds whole seeds. Extend with --seeds 7 8 9 10 for the contrasts whose interval
   straddles 0.

Every phase runs as its own process; the script lowers its own priority to nice 10 (children inherit it).
Resumable across machines as the seeded ablation (whose Runner this reuses): each finished run's evidence lands in
--evidence_dir (benchmarks/results/teacher_guidance/) as it finishes, with its training metrics, per-sample
verdicts (strict and lenient), the completions of its no_code samples, its command, the git commit, wall time and
load; a run with evidence is never redone, and a different recipe is refused. The script never commits.
Writes benchmarks/results/teacher_guidance.json, .md and .png (benchmarks/teacher_guidance_report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_ablation_seeds as seeded  # noqa: E402  (benchmarks/ is on sys.path)
from experiment_cli import (  # noqa: E402
    add_seeded_experiment_flags,
    check_seeded_experiment_flags,
    claim_work_folder,
    recipe_values,
)
from teacher_guidance_design import (  # noqa: E402
    ARMS,
    BASE,
    DEFAULT_ARMS,
    DEFAULT_SEEDS,
    EVIDENCE_DIR,
    GATE_ARM,
    GATE_MARGIN,
    RECIPE_FLAGS,
    SFT_ONLY,
    SFT_STAGE_BATCH,
    TSFT_BATCH,
    Arm,
    no_code_share,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_seeded_experiment_flags(
        parser,
        seeds=DEFAULT_SEEDS,
        arms=list(ARMS),
        default_arms=DEFAULT_ARMS,
        arms_note="",
        steps_help="GRPO steps of arms A-D (default 16).",
        group_help="Rollouts per prompt in GRPO, G (default 8).",
        output_dir="outputs/teacher_guidance",
        evidence_dir=EVIDENCE_DIR,
        evidence_help="Evidence of every finished run, the pre-pass and the gate "
        "(default benchmarks/results/teacher_guidance).",
        report_name="teacher_guidance",
    )
    parser.add_argument(
        "--sft_steps", type=int, default=8, help="Teacher-SFT steps of B's first stage, 8 traces each (default 8)."
    )
    parser.add_argument(
        "--tsft_steps", type=int, default=24, help="Teacher-SFT steps of E, 4 traces each (default 24)."
    )
    parser.add_argument(
        "--prepass_from",
        default=str(seeded.EVIDENCE_DIR / "prepass.json"),
        help="A stored pre-pass to reuse when the evidence has none (default: the seeded ablation's; its split "
        "must be the one phase 1 gives now). A missing file: the pre-pass is run.",
    )
    args = parser.parse_args(argv)
    check_seeded_experiment_flags(parser, args, seeded.PREPASS_SEED)
    return args


def recipe_of(args: argparse.Namespace) -> dict:
    """Everything that changes a number."""
    return {
        "flags": recipe_values(args, RECIPE_FLAGS),
        "recipe": seeded.RECIPE,
        "sft_only": SFT_ONLY,
        "sft_batches": {"sft_stage": SFT_STAGE_BATCH, "tsft": TSFT_BATCH},
        "teacher_data": {"tasks": "all training tasks", "reference_thinking": "none"},
        "arms": {name: {"weights": arm.weights, "sft_first": arm.sft_first} for name, arm in ARMS.items()},
        "gate": {"arm": GATE_ARM, "margin": GATE_MARGIN},
        "split": {"val_ratio": seeded.VAL_RATIO, "data_seed": seeded.DATA_SEED, "prepass_seed": seeded.PREPASS_SEED},
    }


def git_commit() -> dict:
    """The commit the runs ran at (read only; this script never commits)."""

    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def gate_outcome(base: dict, gate_run: dict) -> dict:
    """The gate: the teacher-SFT-only run's held-out no_code share <= the base's + GATE_MARGIN (same seed)."""
    base_share, arm_share = no_code_share(base), no_code_share(gate_run)
    return {
        "seed": gate_run["seed"],
        "arm": gate_run["arm"],
        "no_code": arm_share,
        "base_no_code": base_share,
        "margin": GATE_MARGIN,
        "passed": arm_share <= base_share + GATE_MARGIN + 1e-12,
    }


class Runner(seeded.Runner):
    """The seeded ablation's runner with this experiment's teacher data (all training tasks, code-only), its arms
    (B's SFT-then-GRPO stages) and its gate."""

    target_format: dict = {}  # code-only references (its own phase 2 call); the preset's code-only targets

    @property
    def all_train_file(self) -> Path:
        return self.data / "train_all.jsonl"

    @property
    def refs(self) -> Path:
        return self.data / "refs_code_only.jsonl"

    def prepass(self) -> dict:
        """The stored pre-pass, copied from --prepass_from when the evidence has none (same split checked)."""
        source, target = Path(self.args.prepass_from), self.evidence / "prepass.json"
        if not target.is_file() and source.is_file() and not self.args.max_tasks:
            stored = json.loads(source.read_text())
            if stored["samples"] == self.args.samples:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
        return super().prepass()

    def write_task_files(self, prepass: dict) -> None:
        from utils.dataset_loader import read_tasks, write_tasks

        super().write_task_files(prepass)
        tasks = {t.task_id: t for t in read_tasks(self.data / "population.jsonl")}
        write_tasks(self.all_train_file, [tasks[t] for t in prepass["split"]["train"]])

    def references(self) -> None:
        """Phase 2's reference teacher on every training task, code-only targets (deterministic: rebuilt when
        missing); how many tasks have a verified reference goes into the evidence."""
        from utils.jsonl import write_json_atomic

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
                    "--set",
                    "teacher.max_tasks=0",
                    "--set",
                    "teacher.reference_thinking=none",
                ),
            )
        traces = [json.loads(x) for x in self.refs.read_text().splitlines() if x.strip()]
        path = self.evidence / "teacher_data.json"
        if not path.is_file():
            write_json_atomic(
                path,
                {
                    "reference_thinking": "none",
                    "traces": len(traces),
                    "tasks": sorted({t["task_id"] for t in traces}),
                    "with_thinking": sum(bool(t.get("thinking")) for t in traces),
                },
            )

    def sft_overrides(self, seed: int, batch: int) -> dict:
        return {**seeded.RECIPE, **SFT_ONLY, "dual_source.teacher_sft_batch_size": batch, "training.seed": seed}

    def grpo_overrides(self, arm: Arm, seed: int) -> dict:
        return self.arm_overrides(seeded.Arm(arm.name, arm.label, arm.weights), seed)

    def merged_folder(self, name: str) -> Path:
        return self.work / "runs" / f"{name}.sft_merged"

    def merged_model(self, name: str, adapter: Path, target: Path) -> Path:
        """The adapter folded into the base weights (float32, the training dtype here), made once."""
        if not (target / "config.json").is_file():
            self.run(
                f"{name}.merge",
                [
                    sys.executable,
                    "-m",
                    "training.export",
                    *self.common,
                    "--model_path",
                    str(adapter),
                    "--output_dir",
                    str(target),
                    "--dtype",
                    "float32",
                ],
            )
        return target

    def one_run(self, arm_name: str, seed: int, index: str) -> None:
        """Train (unless base) and evaluate one arm on one seed, then write its evidence."""
        import time

        path = self.evidence / "runs" / f"{arm_name}-s{seed}.json"
        if path.is_file():
            print(f"{index} seed {seed} {arm_name}: evidence exists, not redone", flush=True)
            return
        folder = self.work / "runs" / f"{arm_name}-s{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        load_start = os.getloadavg()
        print(f"{index} seed {seed} {arm_name}: starting (load {load_start[0]:.1f})", flush=True)
        name, stages = f"{arm_name}-s{seed}", {}
        overrides: dict[str, object]
        commit = git_commit()  # each phase process reads the working tree: the commit it ran at, per run
        start = time.monotonic()
        if arm_name == BASE:
            overrides, model_path = {"training.seed": seed}, self.model
        elif arm_name == GATE_ARM:
            overrides = self.sft_overrides(seed, TSFT_BATCH)
            stages["tsft_s"] = self.train(name, folder, overrides, self.args.tsft_steps)[0]
            model_path = str(folder / "final_model")
        else:
            arm = ARMS[arm_name]
            overrides = self.grpo_overrides(arm, seed)
            if arm.sft_first:
                sft_folder = self.work / "runs" / f"{name}.sft"
                stages["sft_s"] = self.train(
                    f"{name}.sft", sft_folder, self.sft_overrides(seed, SFT_STAGE_BATCH), self.args.sft_steps
                )[0]
                merged = self.merged_model(name, sft_folder / "final_model", self.merged_folder(name))
                overrides = {**overrides, "student.model_name": str(merged)}
            stages["grpo_s"] = self.train(name, folder, overrides, self.args.steps)[0]
            model_path = str(folder / "final_model")
        train_s = time.monotonic() - start
        eval_s = self.evaluate(name, folder, model_path, seed)
        load_end = os.getloadavg()
        self.write_evidence(
            path,
            folder,
            {
                "arm": arm_name,
                "seed": seed,
                "command": self.command,
                "git": commit,
                "overrides": overrides,
                "train_s": round(train_s, 1),
                "stages_s": {k: round(v, 1) for k, v in stages.items()},
                "eval_s": round(eval_s, 1),
                "load": {"start": list(load_start), "end": list(load_end)},
            },
        )
        shutil.rmtree(self.merged_folder(name), ignore_errors=True)  # 0.5 GB; rebuilt from the SFT adapter if needed
        run = json.loads(path.read_text())
        lenient = sum(r[6] for r in run["samples"]) / max(len(run["samples"]), 1)
        print(
            f"{index} seed {seed} {arm_name}: trained in {train_s:.0f} s, evaluated in {eval_s:.0f} s; held-out "
            f"pass@1 {run['pass_at_k']['1']:.3f} (lenient {lenient:.3f}), no_code {no_code_share(run):.2f}; "
            f"load {load_start[0]:.1f} -> {load_end[0]:.1f}",
            flush=True,
        )

    def gate(self, seed: int) -> dict | None:
        """gate.json from `seed`'s base and gate-arm evidence (once both exist); the stored outcome thereafter."""
        from utils.jsonl import write_json_atomic

        path = self.evidence / "gate.json"
        if path.is_file():
            return json.loads(path.read_text())
        runs = self.evidence / "runs"
        base, arm = runs / f"{BASE}-s{seed}.json", runs / f"{GATE_ARM}-s{seed}.json"
        if not (base.is_file() and arm.is_file()):
            return None
        outcome = gate_outcome(json.loads(base.read_text()), json.loads(arm.read_text()))
        write_json_atomic(path, outcome)
        return outcome


def plan_runs(seeds: list[int], arms: list[str]) -> list[tuple[int, str]]:
    """Seed-major; within a seed the base and the gate arm first, then the other arms in --arms order."""
    ordered = [a for a in (BASE, GATE_ARM) if a == BASE or a in arms] + [a for a in arms if a != GATE_ARM]
    return [(seed, arm) for seed in seeds for arm in ordered]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python benchmarks/bench_teacher_guidance.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    evidence = Path(args.evidence_dir).resolve()
    stopped = None
    if not args.report_only:
        seeded.lower_priority()
        seeded.check_config_keys(
            [*seeded.RECIPE, *SFT_ONLY, "grpo.temperature", "training.seed", "student.model_name"]
            + [f"dual_source.{k}" for arm in ARMS.values() for k in arm.weights]
        )
        seeded.check_evidence_recipe(evidence, recipe_of(args))
        work = claim_work_folder(args, RECIPE_FLAGS)
        runner = Runner(args, work, evidence, command)
        runner.prepass()
        runner.references()
        plan = plan_runs(args.seeds, args.arms)
        print(
            f"teacher guidance: {len(plan)} runs ({len(args.seeds)} seeds x {len(args.arms)} arms + base), work {work}"
        )
        for i, (seed, arm) in enumerate(plan, start=1):
            gate = runner.gate(args.seeds[0])
            if gate is not None and not gate["passed"] and arm != BASE:
                stopped = (
                    f"the gate failed: seed {gate['seed']}'s {GATE_ARM} run has held-out no_code {gate['no_code']:.2f} "
                    f"> the base's {gate['base_no_code']:.2f} + {GATE_MARGIN} ({evidence / 'gate.json'}); no "
                    "further arm runs"
                )
                break
            runner.one_run(arm, seed, f"[{i}/{len(plan)}]")
        runner.gate(args.seeds[0])
    from teacher_guidance_report import build_report, write_report

    report = build_report(evidence, command)
    paths = write_report(report, Path(args.results_dir))
    print("\n" + paths[1].read_text())
    print("results: " + ", ".join(str(p) for p in paths))
    if stopped:
        raise SystemExit(f"error: {stopped}")
    return report


if __name__ == "__main__":
    main()
