"""The seeded ablation's design, fixed before any outcome was seen: seeds, split, the shared recipe, the arms and
the contrasts. Read by its runner (`run.py`) and its report (`report.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.frame import RESULTS_DIR

# the recorded run's evidence, where docs/results.md links it (it moves to RESULTS_DIR with those links)
EVIDENCE_DIR = RESULTS_DIR.parent.parent / "benchmarks" / "results" / "ablation_seeds"
DEFAULT_SEEDS = (1, 2, 3)
PREPASS_SEED = 42  # the pre-pass's evaluation seed; no run uses it
DATA_SEED = 42
VAL_RATIO = 0.5
TEACHER_SEED = 1  # the OPD teacher's training seed; its held-out check shares seed 1's evaluation streams
TEACHER_NO_CODE_MARGIN = 0.05  # the OPD teacher's held-out no_code may exceed the base's by this much at most
NICENESS = 10

# The recipe every arm shares (config keys; checked against config.py at start). Values that a flag sizes
# (steps, group, tokens) come from the flags and enter the stored recipe too.
RECIPE = {
    "grpo.top_p": 1.0,
    "training.per_device_train_batch_size": 2,
    "training.gradient_accumulation_steps": 1,
    "training.learning_rate": 5e-4,
    "grpo.correctness_reward": "binary",
    "grpo.scale_rewards": True,  # binary rewards with GRPO's z-scored advantages (the cpu preset centres only)
    "grpo.format_reward_weight": 0.0,
    "grpo.dynamic_filtering": False,
    "grpo.kl_coef": 0.0,
    "dual_source.teacher_sft_batch_size": 4,
    "training.save_steps": 4,
    "curriculum.enabled": False,
    "evaluation.top_p": 1.0,
}
# The teacher-SFT target format of every run here (the cpu preset's defaults when the runs were made): the reference
# traces' one-sentence <think> block, kept in the targets. Pinned, because the cpu preset now trains code-only targets.
TARGET_FORMAT = {"teacher.reference_thinking": "short", "dual_source.include_thinking": True}
# The OPD teacher: teacher-SFT only on the training pool's references; its rollouts train nothing.
TEACHER_RECIPE = {
    "training.max_steps": 12,
    "training.learning_rate": 2e-3,
    "training.save_steps": 12,
    "dual_source.grpo_weight": 0.0,
    "dual_source.self_sft_weight": 0.0,
    "dual_source.teacher_sft_weight": 1.0,
    "dual_source.teacher_sft_batch_size": 8,
    "grpo.max_new_tokens": 8,
    "grpo.num_samples_per_prompt": 2,
    "grpo.kl_coef": 0.0,
}


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    weights: dict[str, float]  # dual_source overrides
    opd: bool = False  # scored by the local OPD teacher


ARMS = {
    a.name: a
    for a in (
        Arm(
            "full",
            "GRPO + teacher-SFT + self-SFT",
            {"grpo_weight": 1.0, "teacher_sft_weight": 0.3, "self_sft_weight": 0.2},
        ),
        Arm("tsft", "teacher-SFT only", {"grpo_weight": 0.0, "teacher_sft_weight": 0.3, "self_sft_weight": 0.0}),
        Arm("grpo", "GRPO only", {"grpo_weight": 1.0, "teacher_sft_weight": 0.0, "self_sft_weight": 0.0}),
        Arm("grpo_tsft", "GRPO + teacher-SFT", {"grpo_weight": 1.0, "teacher_sft_weight": 0.3, "self_sft_weight": 0.0}),
        Arm(
            "grpo_opd",
            "GRPO + on-policy distillation",
            {
                "grpo_weight": 1.0,
                "teacher_sft_weight": 0.0,
                "self_sft_weight": 0.0,
                "opd_weight": 1.0,
                "opd_advantage_clip": 5.0,
            },
            opd=True,
        ),
        Arm(
            "rft",
            "self-SFT only (rejection sampling)",
            {"grpo_weight": 0.0, "teacher_sft_weight": 0.0, "self_sft_weight": 0.2},
        ),
    )
}
DEFAULT_ARMS = ("full", "tsft", "grpo", "grpo_tsft", "grpo_opd")
BASE = "base"
# The contrasts the experiment is for (a - b), then every arm against the base.
CONTRASTS = (("full", "tsft"), ("full", "grpo"), ("full", "grpo_tsft"), ("grpo_opd", "grpo"))
# Recipe flags: every flag that changes a number. --seeds and --arms choose what runs, not how.
RECIPE_FLAGS = "steps samples group max_new_tokens temperature max_tasks model"


def teacher_check(teacher: dict, base: dict) -> dict:
    """The OPD teacher's gate, both runs on the same seed's evaluation streams: held-out pass@1 above the base's and
    no_code at most the base's + TEACHER_NO_CODE_MARGIN (a teacher whose format breaks teaches the break)."""

    def share(run: dict, column: int, value) -> float:
        return sum(r[column] == value for r in run["samples"]) / max(len(run["samples"]), 1)

    out = {
        "teacher_pass@1": share(teacher, 2, 1),
        "base_pass@1": share(base, 2, 1),
        "teacher_no_code": share(teacher, 3, "no_code"),
        "base_no_code": share(base, 3, "no_code"),
    }
    out["passed"] = (
        out["teacher_pass@1"] > out["base_pass@1"]
        and out["teacher_no_code"] <= out["base_no_code"] + TEACHER_NO_CODE_MARGIN + 1e-12
    )
    return out
