"""Teacher-guided rollouts: on a group whose samples all failed, some samples are drawn again continuing from a prefix
of a verified teacher answer, so GRPO gets a signal on the tasks the student cannot reach alone.

The rule, per rollout batch (`guide_groups`):
- A group is guided when every scorable sample's correctness reward is 0 (`all_failed`) and its task has a passed
  teacher trace. Groups with any success, and unscorable groups, are left as they are.
- k of its G samples (`guided_count`: `guidance.guided_samples`, 0 = half the group) are replaced by k samples that
  continue the task's answer prefix (`rollouts.groups.sample_from_prefixes`); the other G - k stay (failed).
- The prefix is the first L tokens of the teacher's answer as teacher-SFT renders it (thinking + code block, or code
  only with `dual_source.include_thinking` off), tokenized for the student (`answer_ids`). L = round(f x N) over the
  N answer tokens that fit the rollout budget, at least 1 and at most N - 1 (`prefix_length`): the student always
  writes the end of the answer, and a guided completion is never longer than an unguided one.
- f is per task (`GuidanceState.fractions`): it starts at `guidance.initial_fraction` and after each guided group
  moves by `adapt_rate x (target_pass_rate - guided pass rate)` within [min_fraction, max_fraction]
  (`next_fraction`): longer after guided samples that failed, shorter after ones that passed, settling where about
  half of them pass (a binary group's reward variance p(1 - p), the GRPO signal, is largest at p = 1/2).
  Why per task, not G2RPO-A's one length steered by the batch's reward trend: guidance acts only on all-fail groups,
  of tasks whose difficulty differs by far more than the trend of the batch's mean reward says (an MBPP one-liner
  and a stdin program); one global length would be set by whichever tasks dominate the batch. A task's own history
  is what says how much of its answer it needs (SEELE's per-problem hint length, here as a stochastic-approximation
  step instead of a fitted response curve: one float per task, no extra sampling).

What the loss makes of a guided sample: its prefix is the start of its `token_ids`, marked 0 in `action_mask`, so
the prefix is context the policy reads and never a policy-gradient, KL, OPD or self-SFT target (like a tool's output
in a multi-turn sample); its own tokens are scored under the guided context (prompt + prefix), the context they were
sampled in (POPE), and the importance ratio against the sampler's log-probs compares the same context. Advantages
are computed over the whole group, guided and unguided together. docs/phase3-training.md says what this biases.

`GuidanceState` is the run's memory (per-task fractions, the tasks guided so far, the totals for the summary); it is
saved in each checkpoint. Pure functions and the state are tested against hand-computed values
(tests/unit/training/test_guidance.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from config import GuidanceConfig
from rollouts.completion import RolloutCompletion, stop_ids
from rollouts.groups import continue_prefixes, sample_from_prefixes
from training.rewards import ScoredSample
from utils.dataset_loader import Task
from utils.sft_data import build_sft_target, encode_response

if TYPE_CHECKING:  # records only: phase 3 reads the trace file; the batch maker calls `Guide.revise`
    from synthesis.generate_traces import TeacherTrace
    from training.rollout_batches import BatchMaker, RoundShare

# correctness at or below this is a failure (rewards are float sums; a fraction reward of 0 is exactly 0.0)
FAILED = 1e-6


def guided_count(group_size: int, guided_samples: int) -> int:
    """k: the samples of an all-fail group drawn again from a teacher prefix (`guided_samples`; 0: half the group,
    at least 1)."""
    k = guided_samples if guided_samples > 0 else max(1, group_size // 2)
    return min(k, group_size)


def all_failed(correctness: Sequence[float | None]) -> bool:
    """Whether a group is all-fail: it has a scorable sample and none of its scorable samples earned correctness."""
    scored = [c for c in correctness if c is not None]
    return bool(scored) and all(c <= FAILED for c in scored)


def groups_to_guide(correctness: Sequence[Sequence[float | None]], guidable: Sequence[bool]) -> list[int]:
    """Indices of the groups to guide: all-fail groups whose task has a teacher answer (`guidable[i]`)."""
    return [i for i, (group, ok) in enumerate(zip(correctness, guidable, strict=True)) if ok and all_failed(group)]


def prefix_length(fraction: float, answer_tokens: int, budget: int) -> int:
    """L: round(fraction x N) over the N = min(answer_tokens, budget) answer tokens that fit the rollout budget,
    clamped to [1, N - 1]; 0 when N < 2 (no prefix leaves the student a token to write)."""
    usable = min(answer_tokens, budget)
    if usable < 2:
        return 0
    return min(max(round(fraction * usable), 1), usable - 1)


def next_fraction(fraction: float, guided_pass_rate: float, config: GuidanceConfig) -> float:
    """A task's prefix share after one guided group: f + adapt_rate x (target_pass_rate - guided pass rate),
    within [min_fraction, max_fraction]."""
    moved = fraction + config.adapt_rate * (config.target_pass_rate - guided_pass_rate)
    return min(max(moved, config.min_fraction), config.max_fraction)


def answer_ids(tokenizer: Any, trace: TeacherTrace, include_thinking: bool) -> list[int]:
    """The teacher's answer as the student would write it (teacher-SFT's target: thinking and code block, in the
    student's tokenizer), without its end-of-turn: the prefix is cut from these ids. A multi-turn trace gives its
    final, verified answer."""
    ids = encode_response(tokenizer, build_sft_target(trace.thinking, trace.code or "", include_thinking))
    ends = set(stop_ids(tokenizer))
    while ids and ids[-1] in ends:
        ids.pop()
    return ids


def teacher_answers(traces: Sequence[TeacherTrace], tokenizer: Any, include_thinking: bool) -> dict[str, list[int]]:
    """One answer per task that has a passed trace with code: the shortest (most of it fits the budget)."""
    out: dict[str, list[int]] = {}
    for trace in traces:
        if not (trace.passed and trace.code):
            continue
        ids = answer_ids(tokenizer, trace, include_thinking)
        if ids and (trace.task_id not in out or len(ids) < len(out[trace.task_id])):
            out[trace.task_id] = ids
    return out


def missing_traces_line(task_ids: Sequence[str], answers: dict[str, list[int]], source: str) -> str | None:
    """The one line phase 3 says when guidance cannot guide every training task (None: every task can be)."""
    missing = [t for t in task_ids if t not in answers]
    if not missing:
        return None
    shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    return (
        f"guidance: {len(missing)} of {len(task_ids)} training tasks have no passed teacher trace in {source} "
        f"({shown}); their all-fail groups stay unguided"
    )


@dataclass
class GuidanceState:
    """The guidance of one process's run: each guided task's prefix share, the tasks guided so far, and the
    totals the end-of-run summary reports."""

    fractions: dict[str, float] = field(default_factory=dict)
    guided_tasks: set[str] = field(default_factory=set)
    groups: int = 0  # groups seen
    guided_groups: int = 0
    guided_samples: int = 0
    guided_passed: int = 0
    prefix_tokens: int = 0  # summed over guided groups
    prefix_share: float = 0.0  # summed over guided groups: L / the trace's answer tokens

    def state(self) -> dict:
        return {
            "fractions": dict(self.fractions),
            "guided_tasks": sorted(self.guided_tasks),
            "totals": [
                self.groups,
                self.guided_groups,
                self.guided_samples,
                self.guided_passed,
                self.prefix_tokens,
                self.prefix_share,
            ],
        }

    def load(self, state: dict) -> None:
        self.fractions = dict(state["fractions"])
        self.guided_tasks = set(state["guided_tasks"])
        (
            self.groups,
            self.guided_groups,
            self.guided_samples,
            self.guided_passed,
            self.prefix_tokens,
            self.prefix_share,
        ) = state["totals"]

    def summary(self) -> dict[str, float]:
        """The run's guidance so far (this process): `guidance/total_*` metrics."""
        guided = max(self.guided_groups, 1)
        return {
            "guidance/total_guided_groups": float(self.guided_groups),
            "guidance/total_group_share": self.guided_groups / max(self.groups, 1),
            "guidance/total_guided_samples": float(self.guided_samples),
            "guidance/total_tasks_guided": float(len(self.guided_tasks)),
            "guidance/total_prefix_tokens_mean": self.prefix_tokens / guided,
            "guidance/total_prefix_fraction_mean": self.prefix_share / guided,
            "guidance/total_pass_rate_guided": self.guided_passed / max(self.guided_samples, 1),
        }


# (prompt ids per guided group, prefix per guided group, samples per group) -> new samples, one list per group
SampleFn = Callable[[list[list[int]], list[list[int]], int], list[list[RolloutCompletion]]]
# (the guided groups' tasks, their new samples) -> the same samples scored, one list per group
ScoreFn = Callable[[list[Task], list[list[RolloutCompletion]]], list[list[ScoredSample]]]


def guide_groups(
    groups: list[list[ScoredSample]],
    answers: dict[str, list[int]],
    state: GuidanceState,
    config: GuidanceConfig,
    *,
    budget: int,
    sample: SampleFn,
    score: ScoreFn,
) -> tuple[list[list[ScoredSample]], dict[str, float]]:
    """One rollout batch's scored groups with guidance applied: each all-fail group of a task with a teacher answer
    has its last k samples replaced by k guided ones, sampled (`sample`) and scored (`score`) in one call each.
    Returns the groups (same shapes, the unguided ones untouched) and the step's `guidance/*` metrics; updates
    `state` (the guided tasks' prefix shares, the tasks guided so far, the totals).

    Metrics (a key is left out when it has no sample to average this step): groups (guided groups),
    group_share, prefix_tokens_mean, prefix_fraction_mean (of the trace's answer), pass_rate_guided,
    pass_rate_unguided (every sample as first drawn: the policy's own rate), transfer_pass_rate (the unguided
    pass rate on the tasks guided in an earlier batch: whether what guidance taught carries over) with
    transfer_groups."""
    earlier = set(state.guided_tasks)
    correctness = [[s.reward.correctness for s in group] for group in groups]
    chosen = groups_to_guide(correctness, [bool(g) and g[0].task.task_id in answers for g in groups])
    plans: list[tuple[int, list[int], int]] = []  # (group, prefix ids, answer tokens)
    for i in chosen:
        task_id = groups[i][0].task.task_id
        answer = answers[task_id]
        length = prefix_length(state.fractions.get(task_id, config.initial_fraction), len(answer), budget)
        if length:
            plans.append((i, answer[:length], len(answer)))
    first = [s for group in groups for s in group]
    metrics: dict[str, float] = {
        "guidance/groups": float(len(plans)),
        "guidance/group_share": len(plans) / max(len(groups), 1),
    }
    if first:
        metrics["guidance/pass_rate_unguided"] = sum(s.result.passed for s in first) / len(first)
    transfer = [g for g in groups if g and g[0].task.task_id in earlier]
    if transfer:
        samples = [s for g in transfer for s in g]
        metrics["guidance/transfer_pass_rate"] = sum(s.result.passed for s in samples) / len(samples)
        metrics["guidance/transfer_groups"] = float(len(transfer))
    state.groups += len(groups)
    if not plans:
        return groups, metrics
    k = guided_count(len(groups[plans[0][0]]), config.guided_samples)
    drawn = sample([list(groups[i][0].completion.prompt_ids) for i, _, _ in plans], [p for _, p, _ in plans], k)
    scored = score([groups[i][0].task for i, _, _ in plans], drawn)
    out = list(groups)
    passed = 0
    for (i, prefix, answer_tokens), guided in zip(plans, scored, strict=True):
        task_id = groups[i][0].task.task_id
        out[i] = list(groups[i][: len(groups[i]) - k]) + list(guided)
        group_passed = sum(s.result.passed for s in guided)
        passed += group_passed
        fraction = state.fractions.get(task_id, config.initial_fraction)
        state.fractions[task_id] = next_fraction(fraction, group_passed / max(len(guided), 1), config)
        state.guided_tasks.add(task_id)
        state.prefix_tokens += len(prefix)
        state.prefix_share += len(prefix) / answer_tokens
    n_guided = sum(len(g) for g in scored)
    state.guided_groups += len(plans)
    state.guided_samples += n_guided
    state.guided_passed += passed
    metrics.update(
        {
            "guidance/prefix_tokens_mean": sum(len(p) for _, p, _ in plans) / len(plans),
            "guidance/prefix_fraction_mean": sum(len(p) / n for _, p, n in plans) / len(plans),
            "guidance/pass_rate_guided": passed / max(n_guided, 1),
        }
    )
    return out, metrics


def unguided(group: Sequence[ScoredSample]) -> list[ScoredSample]:
    """The samples of a group the policy drew without a teacher prefix (what the curriculum's estimate counts)."""
    return [s for s in group if not s.completion.teacher_prefix_tokens]


class Guide:
    """A run's guidance: the tasks' teacher answers and the state; the batch maker's revision step (`revise`, a
    `training.rollout_batches.GroupReviser`)."""

    def __init__(self, config: GuidanceConfig, answers: dict[str, list[int]], budget: int) -> None:
        self.config, self.answers, self.budget = config, answers, budget
        self.state = GuidanceState()

    def revise(self, maker: BatchMaker, shares: list[RoundShare], policy: Any, step: int) -> list[RoundShare]:
        """Guide each share of a scored round in place: its guided samples are drawn from `policy` at `step` (the
        model being trained), or with no policy from what the sampler loaded (the asynchronous producer's adapter),
        and scored by the maker like every sample."""
        sampler = maker.sampler
        assert sampler is not None, "guidance samples: the run needs a sampler"
        for share in shares:
            start = time.monotonic()
            prompt_of = {t.task_id: p for t, p in zip(share.tasks, share.prompts, strict=True)}

            def sample(prompt_ids: list[list[int]], prefixes: list[list[int]], k: int) -> list[list[RolloutCompletion]]:
                if policy is None:
                    return continue_prefixes(sampler, prompt_ids, prefixes, k)
                with torch.no_grad():
                    return sample_from_prefixes(sampler, policy, prompt_ids, prefixes, k, step=step)

            def score(
                tasks: list[Task], drawn: list[list[RolloutCompletion]], prompt_of: dict[str, str] = prompt_of
            ) -> list[list[ScoredSample]]:
                return maker.score(tasks, [prompt_of[t.task_id] for t in tasks], drawn)[0]

            share.groups, metrics = self.apply(share.groups, sample, score)
            share.metrics.update(metrics)
            share.metrics["time/guidance_s"] = time.monotonic() - start
        return shares

    def apply(
        self, groups: list[list[ScoredSample]], sample: SampleFn, score: ScoreFn
    ) -> tuple[list[list[ScoredSample]], dict[str, float]]:
        """`guide_groups` with this run's answers and state; the metrics carry the run's totals so far."""
        out, metrics = guide_groups(
            groups, self.answers, self.state, self.config, budget=self.budget, sample=sample, score=score
        )
        return out, {**metrics, **self.state.summary()}


def build_guide(
    config: GuidanceConfig,
    traces: Sequence[TeacherTrace],
    tokenizer: Any,
    *,
    task_ids: Sequence[str],
    include_thinking: bool,
    budget: int,
    source: str,
    say: Callable[[str], Any] = print,
) -> Guide | None:
    """The run's `Guide` (None when guidance is off). Refuses in one line when no training task has a passed
    teacher trace in `source`; says in one line (`say`) how many tasks cannot be guided."""
    if not config.enabled:
        return None
    answers = teacher_answers(traces, tokenizer, include_thinking)
    answers = {t: ids for t, ids in answers.items() if t in set(task_ids)}
    if not answers:
        raise ValueError(
            f"guidance.enabled needs a passed teacher trace for the training tasks it guides: none of the "
            f"{len(task_ids)} training tasks has one in {source}; run phase 2 (or the reference teacher) first, "
            "or set guidance.enabled=false"
        )
    line = missing_traces_line(task_ids, answers, source)
    if line:
        say(line)
    return Guide(config, answers, budget)
