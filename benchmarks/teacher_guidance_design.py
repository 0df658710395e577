"""The teacher-guidance experiment's design, fixed before any outcome was seen: seeds, the gate, the arms, the
pre-registered contrasts and the held-out strata. Read by its runner (bench_teacher_guidance.py) and its report
(teacher_guidance_report.py). Split, pre-pass and the shared recipe are the seeded ablation's."""

from __future__ import annotations

from dataclasses import dataclass

import ablation_seeds_design as seeded
from experiment_cli import RESULTS_DIR

EVIDENCE_DIR = RESULTS_DIR / "teacher_guidance"
DEFAULT_SEEDS = (1, 2, 3, 4, 5, 6)
BASE = seeded.BASE
GATE_ARM = "tsft"
GATE_MARGIN = 0.05  # held-out no_code of the gate arm <= the base's + this
TEACHER_SFT_WEIGHT, SELF_SFT_WEIGHT = 0.3, 0.2
# the teacher-SFT-only runs: GRPO and self-SFT off, so phase 3 samples no rollouts (their settings cut all the same)
SFT_ONLY = {
    "dual_source.grpo_weight": 0.0,
    "dual_source.self_sft_weight": 0.0,
    "dual_source.teacher_sft_weight": 1.0,
    "grpo.max_new_tokens": 8,
    "grpo.num_samples_per_prompt": 2,
}
SFT_STAGE_BATCH, TSFT_BATCH = 8, 4  # teacher traces per step: B's first stage, E


@dataclass(frozen=True)
class Arm:
    name: str
    letter: str
    label: str
    weights: dict[str, float]  # dual_source weights of its GRPO run (E: of its SFT run)
    sft_first: bool = False  # B: a teacher-SFT stage merged into the weights before the GRPO run


ARMS = {
    a.name: a
    for a in (
        Arm("tsft", "E", "teacher-SFT only", {"grpo_weight": 0.0, "teacher_sft_weight": 1.0, "self_sft_weight": 0.0}),
        Arm("grpo", "A", "GRPO only", {"grpo_weight": 1.0, "teacher_sft_weight": 0.0, "self_sft_weight": 0.0}),
        Arm(
            "sft_grpo",
            "B",
            "teacher-SFT, then GRPO",
            {"grpo_weight": 1.0, "teacher_sft_weight": 0.0, "self_sft_weight": 0.0},
            sft_first=True,
        ),
        Arm(
            "grpo_tsft",
            "C",
            "GRPO + teacher-SFT (joint)",
            {"grpo_weight": 1.0, "teacher_sft_weight": TEACHER_SFT_WEIGHT, "self_sft_weight": 0.0},
        ),
        Arm(
            "full",
            "D",
            "GRPO + teacher-SFT + self-SFT (the product's objective)",
            {"grpo_weight": 1.0, "teacher_sft_weight": TEACHER_SFT_WEIGHT, "self_sft_weight": SELF_SFT_WEIGHT},
        ),
    )
}
DEFAULT_ARMS = tuple(ARMS)  # the gate arm first, so every seed starts with base and E
CONTRASTS = (("sft_grpo", "grpo"), ("full", "grpo"), ("grpo", BASE), ("tsft", BASE))
# held-out strata by task-id prefix, fixed before any outcome
STRATA = {"mbpp_format": "mbpp/", "apps_format": "apps/"}
RECIPE_FLAGS = seeded.RECIPE_FLAGS + " sft_steps tsft_steps"


def no_code_share(run: dict) -> float:
    """Share of a run's held-out samples with no gradable code."""
    return sum(r[3] == "no_code" for r in run["samples"]) / max(len(run["samples"]), 1)
