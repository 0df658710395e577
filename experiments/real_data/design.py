"""The teacher-guidance arms on real data: does the teacher's content add to GRPO on MBPP and HumanEval? The
design, fixed before any outcome. (A GPU job: on 2 CPU cores it takes days; `remaining_hours` says how many.)

Data. MBPP (`--mbpp_path`, default ../shared/data/mbpp.jsonl; else the hub) by its published ids: training
601–974 (374 tasks), validation 511–600 (90) for the pre-pass budget rule and the pool gates, test 11–510 (500).
This is not phase 1's `standard` split, which trains on 1–10 and 511–974 (MBPP's prompt and validation ids
included): the runner writes its own task files by id. HumanEval (164, the pinned wheel) is evaluated, never trained.

Budget. `BUDGETS` tried in order on the base's validation pre-pass (90 × `POOL_SAMPLES`): the first at which at
most `MAX_AT_BUDGET` of its answers end at the budget (else the last), for every rollout and evaluation; then one
pass of the base on the training tasks (374 × `POOL_SAMPLES`) at that budget chooses A's pool.

Teacher data. The verified reference solutions of every training task, code-only targets (phase 3 keeps every
trace outside the evaluation split; the evidence records phase 3's usable-trace count, expected 374 less the
references that fail their own tests).

Arms, as the fixture rerun's (experiments/teacher_guidance/design.py) with real sizes: S = `SFT_STEPS` × 8 traces
(one epoch of 374), N = `GRPO_STEPS`. base; E teacher-SFT S steps; A GRPO S + N steps on the base's pool (training
tasks with 1..7 of 8 base passes; at the base's ~1–3% pass rate expect 20–30 tasks); B E merged, then GRPO N steps
on a pool re-selected on the SFT'd model; F B with deranged references (same calling style: all are functions);
G guided rollouts, declared. A GRPO stage with a pool under `MIN_POOL` tasks is stopped (recorded, no score).

Evaluation. MBPP test 500 × `SAMPLES` and HumanEval 164 × `SAMPLES`, T 0.7, top-p 1, sampled; strict and
sanitized grades (docs/output-format.md), the share ended by the budget.

Contrasts (paired t over seeds, 95%; per benchmark, strict and sanitized): B − A, B − F, E − base, A − base, G − A,
G − B. Seeds 1..3, extended to 5 for a contrast whose interval straddles 0.

Cost on 2 CPU cores (`remaining_hours`, from the fixture rerun's measured rates, `RATES`): each budget try samples
the 90 validation tasks 8 times (~0.4 h), the training pass 374 × 8 (~1.7 h); each run evaluates 664 tasks × 4
(~1.5 h); A trains 79 GRPO steps (~0.9 h); B and F each re-select their pool on 374 × 8 samples (~1.7 h) and train 32
steps; G trains 79 guided steps (~1.8 h). Base, A, B and F over 3 seeds with all three budget tries: ~37 h; every
arm: ~51 h.
"""

from __future__ import annotations

from experiments.frame import RESULTS_DIR

# everything else is the fixture rerun's (experiments/teacher_guidance/design.py), at the sizes below
from experiments.teacher_guidance.design import (
    BASE,
    CONTRASTS,
    GRPO_ONLY,
    MAX_FLAT_SHARE,
    PASS_RATE_BAND,
    RECIPE,
    RECIPE_FLAGS,
    STRATA,
    arms,
    derange,
    duplicated_heldout,
    evidence_path,
)

NAME = "real_data"
EVIDENCE_DIR = RESULTS_DIR / NAME
TRAIN_IDS, VALIDATION_IDS, TEST_IDS = range(601, 975), range(511, 601), range(11, 511)
EVAL_SETS = ("mbpp_test", "humaneval")
HUMANEVAL_TASKS = 164
SAMPLES = 4
DEFAULT_SEEDS = (1, 2, 3)
BUDGETS = (256, 384, 512)
MAX_AT_BUDGET = 0.05
SFT_STEPS, SFT_BATCH = 47, 8
GRPO_STEPS = 32
MIN_POOL = 2
PREPASS_SEED = 42
# Phase 4's cost per sample on these sets (kv sampler, and vLLM's CPU engine with VLLM=1) is measured by
# experiments/real_data/throughput.sh in CPU seconds per sample, so a shared machine still gives the figure.
THROUGHPUT_SCRIPT = "experiments/real_data/throughput.sh"

# Measured on the fixture rerun (2-core AMD EPYC, nice 19, nothing else running; docs/log.md, its evidence): seconds
# per sample on vLLM's CPU engine at 384-512 tokens, per GRPO step (2 prompts x G 8, rollouts, scoring and the
# update), per guided GRPO step, per teacher-SFT step (8 traces).
RATES = {"sample_s": 2.0, "grpo_step_s": 41.0, "guided_step_s": 84.0, "sft_step_s": 15.0}
POOL_SAMPLES = 8  # a pre-pass or pool re-selection samples each task this many times (evaluations: SAMPLES)
# budget tries expected: all three (a 4-task check of the runner on real MBPP cut 25% of the base's answers at each
# of 256, 384 and 512 tokens, every one a loop that a larger budget does not end)
PREPASS_TRIES = 3

EVIDENCE_LABEL = "real data"
DATA_SEED, VAL_RATIO = 42, 0.5  # unused: the split is MBPP's own ids
DUPLICATES_FILE = None
REVIEWED_DUPLICATES: dict[str, str] = {}
ARMS = arms(SFT_STEPS, GRPO_STEPS)
DEFAULT_ARMS = tuple(ARMS)
SFT_ONLY = {
    "dual_source.grpo_weight": 0.0,
    "dual_source.self_sft_weight": 0.0,
    "dual_source.teacher_sft_weight": 1.0,
    "dual_source.teacher_sft_batch_size": SFT_BATCH,
    "grpo.max_new_tokens": 8,
    "grpo.num_samples_per_prompt": 2,
}
__all__ = [
    "BASE", "CONTRASTS", "GRPO_ONLY", "MAX_FLAT_SHARE", "PASS_RATE_BAND", "RECIPE", "RECIPE_FLAGS", "STRATA",
    "derange", "duplicated_heldout", "evidence_path",
]  # fmt: skip


def run_hours(arm_name: str, sft_done: bool = False, rates: dict[str, float] = RATES) -> float:
    """Idle 2-core hours of one (arm, seed) run: its SFT stage (unless `sft_done`: E made it), its pool re-selection,
    its GRPO steps and its two evaluations."""
    evaluation = (len(TEST_IDS) + HUMANEVAL_TASKS) * SAMPLES * rates["sample_s"]
    arm = ARMS.get(arm_name)
    if arm is None:  # the base: evaluated only
        return evaluation / 3600
    step_s = rates["guided_step_s"] if arm.overrides.get("guidance.enabled") else rates["grpo_step_s"]
    seconds = evaluation + arm.grpo_steps * step_s
    if arm.sft and not sft_done:
        seconds += SFT_STEPS * rates["sft_step_s"]
    if arm.pool == "reselected":
        seconds += len(TRAIN_IDS) * POOL_SAMPLES * rates["sample_s"]
    return seconds / 3600


def remaining_hours(
    done: set[tuple[str, int]],
    plan: list[tuple[int, str]],
    prepass_done: bool,
    rates: dict[str, float] = RATES,
) -> float:
    """Idle 2-core hours left of `plan` ((seed, arm) in run order) with the runs in `done` ((arm, seed)) landed: the
    pre-pass's expected budget tries unless `prepass_done`, then each run not done (B and F reuse an SFT stage E made
    earlier in the same seed)."""
    hours = (
        0.0
        if prepass_done
        else (PREPASS_TRIES * len(VALIDATION_IDS) + len(TRAIN_IDS)) * POOL_SAMPLES * rates["sample_s"] / 3600
    )
    made: set[tuple[str, int]] = set()  # (SFT data, seed) stages made by an earlier run
    for seed, arm_name in plan:
        arm = ARMS.get(arm_name)
        sft = arm.sft if arm is not None else None
        if (arm_name, seed) not in done:
            hours += run_hours(arm_name, sft_done=(sft, seed) in made, rates=rates)
        if sft:
            made.add((sft, seed))
    return hours
