"""One rollout batch scored: parse every completion, run it in the sandbox, compute its reward.

`score_rollouts` is the step between sampling and planning an update: it turns the G completions per
task that `rollouts.groups.sample_groups` returned into `training.rewards.ScoredSample`
groups, and reports what the batch looked like (pass rate, format, sandbox retries, the per-function
reward means, the multi-turn statistics). The sandbox is the only process that sees the tests.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from config import GRPOConfig, MultiTurnConfig, PromptConfig, SandboxConfig
from rollouts.completion import RolloutCompletion
from sandbox.executor import SandboxPool, execute_many
from training.rewards import ScoredSample, UserReward, compute_rewards, reward_columns, shaping_reward
from utils.dataset_loader import Task
from utils.shown_tests import hidden_tests_task
from utils.thinking_extraction import extract_thinking_and_code_unified


def mean_of_present(values: Sequence[float | None]) -> float:
    """Mean of the values that are not None (NaN when all are)."""
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else float("nan")


def score_rollouts(
    tasks: Sequence[Task],
    prompts: Sequence[str],
    generations: Sequence[Sequence[RolloutCompletion]],
    pool: SandboxPool,
    *,
    grpo: GRPOConfig,
    sandbox: SandboxConfig,
    prompt: PromptConfig,
    multi_turn: MultiTurnConfig,
    user_rewards: Sequence[UserReward] = (),
) -> tuple[list[list[ScoredSample]], dict[str, float]]:
    """(groups, metrics) for one rollout batch: `generations[i]` are task i's samples, prompted by `prompts[i]`.
    The sections give the reward (`grpo`), the tests run (`sandbox`, `prompt`) and the multi-turn terms.

    Each program runs on its task's hidden tests only (`utils.shown_tests`: the tests the prompt does not
    show); a task with none runs on all its tests for the metrics, and its samples get no correctness signal.
    Under the binary reward a program's run stops at its first failing test; `fraction` runs them all.
    A sample whose run hit a harness failure (`sandbox_error`) is run once more; failing twice on the same
    program it counts as a failure, not as unverifiable (`compute_rewards(confirmed_failures=)`), unless the
    task's own expected side could not be computed (`ExecutionResult.unjudgeable`): that stays None. The
    optional multi-turn terms (`training.rewards.shaping_reward`) enter the reward's shaping part.
    """
    start = time.monotonic()
    include_challenge = sandbox.include_challenge_tests
    stop_early = grpo.correctness_reward == "binary"
    hidden = [hidden_tests_task(task, prompt.num_visible_tests) for task in tasks]
    graded = [h or task for h, task in zip(hidden, tasks, strict=True)]  # G samples share one Task (one plan)
    flat = [(task, sample) for task, group in zip(tasks, generations, strict=True) for sample in group]
    group_of = [k for k, group in enumerate(generations) for _ in group]
    parsed = [extract_thinking_and_code_unified(s.text) for _, s in flat]
    jobs = [(p.code, graded[k]) for k, p in zip(group_of, parsed, strict=True)]
    results = execute_many(jobs, pool, include_challenge=include_challenge, stop_at_first_failure=stop_early)
    retry = [i for i, r in enumerate(results) if r.status == "sandbox_error"]
    if retry:
        again = execute_many(
            [jobs[i] for i in retry], pool, include_challenge=include_challenge, stop_at_first_failure=stop_early
        )
        for i, result in zip(retry, again, strict=True):
            results[i] = result
    # a task whose expected side cannot be computed is no program's failure: it stays unscored (None)
    confirmed = {i for i in retry if results[i].status == "sandbox_error" and not results[i].unjudgeable}
    m = multi_turn
    shaping = [shaping_reward(s, m.tool_call_reward, m.tool_reward_cap, m.turn_cost) for _, s in flat]
    rewards = compute_rewards(
        results,
        parsed,
        correctness=grpo.correctness_reward,
        format_weight=grpo.format_reward_weight,
        user_rewards=user_rewards,
        prompts=[prompts[k] for k in group_of],
        completions=[s.text for _, s in flat],
        columns=reward_columns([t for t, _ in flat], parsed, results),
        confirmed_failures=confirmed,
        shaping=shaping,
        ungraded={i for i, k in enumerate(group_of) if hidden[k] is None},
    )
    samples = [ScoredSample(t, s, p, r, w) for (t, s), p, r, w in zip(flat, parsed, results, rewards, strict=True)]
    groups: list[list[ScoredSample]] = [[] for _ in generations]
    for k, sample in zip(group_of, samples, strict=True):
        groups[k].append(sample)
    count = max(len(flat), 1)
    generated = sum(s.num_policy_tokens for _, s in flat)  # sampled, not inserted by an environment
    metrics = {
        "time/reward_s": time.monotonic() - start,
        "completion/mean_length": generated / count,
        "completion/clipped_ratio": sum(s.finish_reason == "length" for _, s in flat) / count,
        "pass_rate": sum(r.passed for r in results) / count,
        "pass_fraction/mean": sum(r.pass_fraction for r in results) / count,
        "reward/format_mean": sum(r.format for r in rewards) / count,
        **{
            f"reward/{u.name.rpartition(':')[2]}_mean": mean_of_present([r.user[u.name] for r in rewards])
            for u in user_rewards
        },
        "sandbox/error_retried": len(retry) / count,
        "sandbox/error_confirmed": len(confirmed) / count,
        "format/closed_think": sum(p.think_closed for p in parsed) / count,
    }
    sampled = [
        lp
        for _, s in flat
        if s.logprobs is not None
        for lp, sampled_by_policy in zip(s.logprobs, s.action_mask or (1,) * len(s.logprobs), strict=True)
        if sampled_by_policy
    ]
    if sampled:  # kv / vLLM samplers report each sampled token's log-prob at the sampling temperature
        # E[-log p(token)] under the sampling distribution is its per-token entropy: a Monte Carlo estimate of how
        # diverse the policy's samples are (a collapsing entropy is what takes pass@k down with it)
        metrics["entropy/token_mean"] = -sum(sampled) / len(sampled)
    if multi_turn.mode != "single":
        metrics.update(multi_turn_metrics([s for _, s in flat], [r.passed for r in results], shaping))
    return groups, metrics


def multi_turn_metrics(
    records: Sequence[RolloutCompletion], passed: Sequence[bool], shaping: Sequence[float]
) -> dict[str, float]:
    """Phase 3's per-step multi-turn metrics: turns per sample, the share truncated by a limit (scored on
    their last answer), the share of passing samples that needed more than one turn, the share of the
    sequence the environment inserted, tool use, and the mean shaping term (single-turn records count
    as one turn, no tool call, nothing inserted)."""
    n = max(len(records), 1)
    tokens = max(sum(r.num_tokens for r in records), 1)
    infos = [r.multi_turn for r in records if r.multi_turn is not None]
    tool_calls = sum(i.tool_calls for i in infos)
    return {
        "multi_turn/turns_mean": sum(r.num_turns for r in records) / n,
        "multi_turn/truncated": sum(i.truncated for i in infos) / n,
        "multi_turn/passed_after_first_turn": sum(ok and r.num_turns > 1 for r, ok in zip(records, passed, strict=True))
        / n,
        "multi_turn/environment_token_share": 1.0
        - sum(sum(r.action_mask) for r in records if r.action_mask is not None) / tokens,
        "multi_turn/tool_calls_mean": tool_calls / n,
        "multi_turn/tool_success_share": sum(i.tool_successes for i in infos) / max(tool_calls, 1),
        "multi_turn/shaping_mean": sum(shaping) / n,
    }
