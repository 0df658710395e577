"""Does the teacher's *content* add to GRPO, beyond the answer's format? The design, fixed before any outcome.

Population and split. The 71 embedded fixture tasks, phase 1's seeded split (val_ratio 0.5, data.seed 42): 36
training, 35 held out. The held-out set is **de-duplicated** first: a held-out task leaves it when it is a near
duplicate of a training task, by either of two maps, both fixed now:
- measured (`duplicates.py`, in the sandbox): its reference, entry point renamed, passes every test of a training
  task, or a training reference passes every one of its tests (`DUPLICATES_FILE`; one pair: mbpp/9020 ↔ apps/90019);
- reviewed (`REVIEWED_DUPLICATES`): a one-operation change of a training reference, or the same computation in
  another calling style (function ↔ stdin program), which running tests cannot show.
What is left, minus the tasks the base passes 8 of 8 in the pre-pass, is the held-out set, in two strata fixed
now: MBPP-format (mbpp/*) and APPS-format (apps/*).

Token budget. `BUDGETS`, tried in order in the pre-pass (the base on all 71 tasks × 8 samples, T 0.7, seed 42):
the first at which at most `MAX_AT_BUDGET` of the base's answers end at the budget is the experiment's, for every
rollout and evaluation; the pre-pass stores the share at each budget tried.

Sampler. The pre-pass at 256 tokens sampled with the product's kv decoder; from the 384-token pre-pass on, every
pass, rollout and evaluation samples with vLLM's engine (`SAMPLER`; its CPU build in float32; GRPO's rollouts on the
colocated engine, weights merged from the adapter each step, a float32 trainer): the same distribution (its
log-probs equal the trainer's within 1e-3, tests/vllm_cpu) at about a third of the CPU per sample (docs/log.md), so
that the arms fit the machine. Decided before any arm ran. The 224 kv samples of the 384-token pre-pass taken
before the switch (the evidence's `partial/` at commit 18d8d1d) are set against vLLM's on the same tasks, task by
task: the two samplers' parity on this population.

Teacher data. The verified reference solutions of **every** training task (36), code-only targets; phase 3 keeps
the traces of every task outside the evaluation split, and each run's evidence records what it trained on
(`teacher_data_used`: its usable-trace count and tasks).

Arms (one recipe otherwise: LoRA r 8, lr 5e-4, 2 prompts × G 8 at T 0.7, binary z-scored reward, no KL, no
format bonus). S = `SFT_STEPS` teacher-SFT steps of `SFT_BATCH` traces, N = `GRPO_STEPS` GRPO steps.
- base: no training; evaluated for every seed.
- E `tsft`: teacher-SFT on the 36 references, S steps (B's first stage, evaluated on its own; B reuses it).
- A `grpo`: GRPO for S + N steps (B's total update count) on the base's pool (training tasks with 1..7 of 8
  base passes in the pre-pass).
- B `sft_grpo`: E's adapter merged into the weights, then GRPO for N steps on a pool **re-selected on the SFT'd
  model** (its own pre-pass on the 36 training tasks, same rule).
- F `format`: B with **deranged** references: each training prompt paired with another training task's verified
  reference of the same calling style (`derange`: within each style, sorted by task id, each prompt takes the next
  task's reference). Same lengths, fences and end of turn; wrong content. Then B's GRPO on its own re-selected pool.
- G `guided`: GRPO for S + N steps on all 36 training tasks with guided rollouts (`guidance.enabled`), the
  references as its traces. Declared now; it runs once the config has a `guidance` section.

Stops and flags, decided now. A GRPO stage whose (re-)selected pool holds fewer than `MIN_POOL` tasks does not
run: the arm's run is recorded as stopped (no score). A GRPO run whose median flat-group share exceeds
`MAX_FLAT_SHARE` or whose mean training pass rate is outside `PASS_RATE_BAND` is flagged in its evidence and in
the report beside every contrast it enters.

Contrasts (a − b, pass@1 from 8 samples, paired t over the seeds both arms have, 95%), each overall and in both
strata, each for the strict and for the sanitized grade (docs/output-format.md): B − A, **B − F (the teacher's
content)**, E − base, A − base, G − A, G − B. Secondary: the crossed bootstrap and the seed + task interval; the
share of answers ended by the budget per arm; pass@8.

Seeds 1..6 (`DEFAULT_SEEDS`), seed-major (every arm of a seed before the next), extended to 10 for a contrast whose
interval straddles 0. Why this improves on the issue's list: E is B's first stage itself (the same adapter), so
B − E is B's GRPO stage exactly and E costs an evaluation only; F re-selects its pool on its own SFT'd model, as
B does, so B − F differs in the references' content alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from experiments.frame import RESULTS_DIR

NAME = "teacher_guidance"
EVIDENCE_LABEL = "teacher guidance"  # how its evidence commits begin
EVIDENCE_DIR = RESULTS_DIR / NAME
DUPLICATES_FILE = EVIDENCE_DIR / "duplicates.json"
DEFAULT_SEEDS = (1, 2, 3, 4, 5, 6)
PREPASS_SEED, DATA_SEED, VAL_RATIO = 42, 42, 0.5
BUDGETS = (256, 384, 512)
MAX_AT_BUDGET = 0.05
SFT_STEPS, SFT_BATCH = 12, 8  # 96 reference draws, ~2.7 epochs of the 36 references
GRPO_STEPS = 16
MIN_POOL = 2  # one GRPO batch is 2 prompts
MAX_FLAT_SHARE, PASS_RATE_BAND = 0.5, (0.1, 0.9)
BASE = "base"

# held-out task -> the training task it duplicates, by hand (one-operation changes, another calling style)
REVIEWED_DUPLICATES = {
    "mbpp/9005": "mbpp/9017",  # max_of_two ~ min_of_three
    "mbpp/9009": "mbpp/9008",  # last_element ~ first_element
    "mbpp/9020": "apps/90019",  # is_palindrome ~ isPalindrome
    "mbpp/9022": "apps/90022",  # fibonacci ~ climbStairs (the same recurrence)
    "mbpp/9039": "apps/90014",  # transpose ~ transpose (stdin)
    "mbpp/9044": "apps/90017",  # average ~ average (stdin)
    "mbpp/9032": "apps/90018",  # sum_digits ~ addDigits (same words, a different answer)
    "apps/90001": "mbpp/9001",  # a + b (stdin) ~ add_numbers
    "apps/90009": "mbpp/9021",  # n! mod p (stdin) ~ factorial
    "apps/90016": "apps/90022",  # staircase (stdin) ~ climbStairs
}
STRATA = {"mbpp_format": "mbpp/", "apps_format": "apps/"}
# the shared recipe (config keys, checked against the config at start); flags size steps, group and tokens
RECIPE = {
    "grpo.top_p": 1.0,
    "training.per_device_train_batch_size": 2,
    "training.gradient_accumulation_steps": 1,
    "training.learning_rate": 5e-4,
    "grpo.correctness_reward": "binary",
    "grpo.scale_rewards": True,
    "grpo.format_reward_weight": 0.0,
    "grpo.dynamic_filtering": False,
    "grpo.kl_coef": 0.0,
    "training.save_steps": 4,
    "curriculum.enabled": False,
    "evaluation.top_p": 1.0,
    "teacher.reference_thinking": "none",
    "dual_source.include_thinking": False,
}
GRPO_ONLY = {"dual_source.grpo_weight": 1.0, "dual_source.teacher_sft_weight": 0.0, "dual_source.self_sft_weight": 0.0}
# the teacher-SFT stage: GRPO and self-SFT off, so phase 3 samples no rollouts (their settings cut all the same)
SFT_ONLY = {
    "dual_source.grpo_weight": 0.0,
    "dual_source.self_sft_weight": 0.0,
    "dual_source.teacher_sft_weight": 1.0,
    "dual_source.teacher_sft_batch_size": SFT_BATCH,
    "grpo.max_new_tokens": 8,
    "grpo.num_samples_per_prompt": 2,
}
GUIDED = {"guidance.enabled": True, "dual_source.teacher_sft_batch_size": 4}


@dataclass(frozen=True)
class Arm:
    name: str
    letter: str
    label: str
    sft: str | None = None  # "references" or "deranged": a teacher-SFT stage first (merged before GRPO)
    grpo_steps: int = 0  # 0: no GRPO stage
    pool: str = "base"  # the GRPO pool: "base" (the base's pre-pass), "reselected" (on the SFT'd model), "all"
    overrides: dict = field(default_factory=dict)
    needs_section: str | None = None  # a config section the arm needs; declared, and run once it exists


def arms(sft_steps: int, grpo_steps: int) -> dict[str, Arm]:
    """The arms at these sizes (S teacher-SFT steps, N GRPO steps): A and G get S + N GRPO steps."""
    return {
        a.name: a
        for a in (
            Arm("tsft", "E", "teacher-SFT only (B's first stage)", sft="references"),
            Arm("grpo", "A", "GRPO, B's total update count", grpo_steps=sft_steps + grpo_steps),
            Arm(
                "sft_grpo", "B", "teacher-SFT, then GRPO on a re-selected pool", "references", grpo_steps, "reselected"
            ),
            Arm(
                "format",
                "F",
                "deranged-reference SFT, then GRPO (format control)",
                "deranged",
                grpo_steps,
                "reselected",
            ),
            Arm(
                "guided",
                "G",
                "GRPO with guided rollouts, all training tasks",
                grpo_steps=sft_steps + grpo_steps,
                pool="all",
                overrides=GUIDED,
                needs_section="guidance",
            ),
        )
    }


ARMS = arms(SFT_STEPS, GRPO_STEPS)
DEFAULT_ARMS = tuple(ARMS)
CONTRASTS = (
    ("sft_grpo", "grpo"),
    ("sft_grpo", "format"),
    ("tsft", BASE),
    ("grpo", BASE),
    ("guided", "grpo"),
    ("guided", "sft_grpo"),
)
RECIPE_FLAGS = "samples group temperature max_tasks model sampler"
SAMPLER = "vllm"  # the pre-passes from 384 tokens on, the rollouts and every evaluation (see "Sampler" above)


def derange(references: list[dict], style_of: dict[str, str]) -> list[dict]:
    """Each trace with another task's answer of the same calling style: within each style, sorted by task id,
    trace i takes trace i+1's answer (the last takes the first's). A style with one task keeps its own (no
    derangement exists); the caller checks."""
    by_style: dict[str, list[dict]] = {}
    for row in sorted(references, key=lambda r: r["task_id"]):
        by_style.setdefault(style_of[row["task_id"]], []).append(row)
    answer_keys = ("thinking", "code", "response", "reasoning")
    out = []
    for rows in by_style.values():
        for i, row in enumerate(rows):
            partner = rows[(i + 1) % len(rows)]
            out.append(
                {**row, **{k: partner.get(k) for k in answer_keys if k in partner}, "deranged_from": partner["task_id"]}
            )
    return out


def duplicated_heldout(measured: list[dict]) -> dict[str, str]:
    """Held-out task -> a training task it duplicates: the measured map, then the reviewed one."""
    out = {row["heldout"]: row["train"] for row in measured}
    for heldout, train in REVIEWED_DUPLICATES.items():
        out.setdefault(heldout, train)
    return out


def evidence_path(evidence: Path, arm: str, seed: int) -> Path:
    return evidence / "runs" / f"{arm}-s{seed}.json"
