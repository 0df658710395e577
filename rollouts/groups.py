"""The one function that samples: `sample_groups`, G samples per prompt from any `Sampler`, one turn or whole
episodes, for phase 3, phase 4, `evaluation.solve` and the preflight.

A single-turn sample is an episode with no environment: the sampler's first turn is the sample. In a tool or
feedback mode (`Episodes`, built by `rollouts.from_config.episodes_for`) every sample goes on through
`rollouts.episodes.run_episodes` until its environment or a limit ends it; its record carries the action
mask and `MultiTurnInfo`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollouts.completion import RolloutCompletion
from rollouts.episodes import Environment, run_episodes
from rollouts.protocol import Sampler
from utils.dataset_loader import Task


@dataclass(frozen=True)
class Episodes:
    """How a multi-turn sample goes on after its first turn."""

    environment: Environment  # runs the programs and shown tests (`environments.code_env.make_environment`)
    mode: str  # "tool" or "feedback"
    max_new_tokens: int  # one policy turn
    max_total_tokens: int  # everything after the prompt
    chat_template_kwargs: dict | None = None  # how a feedback turn is framed


def sample_groups(
    sampler: Sampler,
    policy: Any,
    prompts: list[str],
    num_samples: int,
    *,
    step: int = 0,
    tasks: Sequence[Task] | None = None,
    episodes: Episodes | None = None,
    seed: int | None = None,
) -> list[list[RolloutCompletion]]:
    """`num_samples` samples of each prompt from `policy` (see `Sampler.sync`) at optimizer `step`, one list per
    prompt. `episodes`: multi-turn, with the task of every prompt (its environment runs the task's tests).
    `seed`: per-prompt request seeds of a single turn where the engine keeps its own random stream (vLLM); the
    torch samplers draw from the process's seeded generator."""
    if episodes is not None and (tasks is None or len(tasks) != len(prompts)):
        raise ValueError("multi-turn sampling needs the task of every prompt (the environment runs its tests)")
    sampler.sync(policy, step)
    try:
        return sample_from_synced(sampler, prompts, num_samples, tasks=tasks, episodes=episodes, seed=seed)
    finally:
        sampler.release()


def sample_from_synced(
    sampler: Sampler,
    prompts: list[str],
    num_samples: int,
    *,
    tasks: Sequence[Task] | None = None,
    episodes: Episodes | None = None,
    seed: int | None = None,
) -> list[list[RolloutCompletion]]:
    """`sample_groups` from whatever the sampler samples now, without syncing it with a policy: the asynchronous
    producer's call, whose server already loaded the adapter it samples from."""
    if episodes is None:
        return sampler.sample(prompts, num_samples, seed=seed)
    assert tasks is not None and len(tasks) == len(prompts), "multi-turn sampling needs the task of every prompt"
    prompt_ids = [sampler.encode(p) for p in prompts]
    records = run_episodes(
        sampler,
        episodes.environment,
        sampler.tokenizer,
        [ids for ids in prompt_ids for _ in range(num_samples)],
        [task for task in tasks for _ in range(num_samples)],
        mode=episodes.mode,
        max_new_tokens=episodes.max_new_tokens,
        max_total_tokens=episodes.max_total_tokens,
        chat_template_kwargs=episodes.chat_template_kwargs,
    )
    return [records[k * num_samples : (k + 1) * num_samples] for k in range(len(prompts))]


def sample_from_prefixes(
    sampler: Sampler,
    policy: Any,
    prompt_ids: Sequence[Sequence[int]],
    prefixes: Sequence[Sequence[int]],
    num_samples: int,
    *,
    step: int = 0,
) -> list[list[RolloutCompletion]]:
    """Guided samples: `num_samples` continuations of each templated prompt's answer begun with `prefixes[i]`
    (a teacher trace's first answer tokens), from `policy` at optimizer `step`; see `continue_prefixes`."""
    sampler.sync(policy, step)
    try:
        return continue_prefixes(sampler, prompt_ids, prefixes, num_samples)
    finally:
        sampler.release()


def continue_prefixes(
    sampler: Sampler, prompt_ids: Sequence[Sequence[int]], prefixes: Sequence[Sequence[int]], num_samples: int
) -> list[list[RolloutCompletion]]:
    """`sample_from_prefixes` from whatever the sampler samples now (the asynchronous producer's call).

    Each sample is one `continue_sequences` row, prompt + prefix, whose budget is what the prefix leaves of the
    sampler's `max_new_tokens`: a guided completion, prefix included, is never longer than an unguided one (the
    engines' context and the update's memory are sized for that). Its record holds the prefix as its first token
    ids, marked 0 in `action_mask` (context the policy reads, never trained on), with log-prob 0.0 there where the
    sampler reports log-probs, and `teacher_prefix_tokens`; `text` (what the reward scores) decodes prefix and
    continuation together."""
    budget = sampler.max_new_tokens
    for prefix in prefixes:
        if not 0 < len(prefix) < budget:
            raise ValueError(f"a teacher prefix of {len(prefix)} tokens leaves no room in a {budget}-token budget")
    rows = [(k, list(prompt_ids[k]), list(prefixes[k])) for k in range(len(prefixes)) for _ in range(num_samples)]
    continued = sampler.continue_sequences(
        [prompt + prefix for _, prompt, prefix in rows], [budget - len(prefix) for _, _, prefix in rows], ()
    )
    out: list[list[RolloutCompletion]] = [[] for _ in prefixes]
    for (k, prompt, prefix), cont in zip(rows, continued, strict=True):
        ids = prefix + list(cont.token_ids)
        out[k].append(
            RolloutCompletion(
                text=sampler.tokenizer.decode(ids, skip_special_tokens=True),
                token_ids=tuple(ids),
                prompt_ids=tuple(prompt),
                finish_reason="stop" if cont.finish_reason != "length" else "length",
                logprobs=None if cont.logprobs is None else (0.0,) * len(prefix) + tuple(cont.logprobs),
                action_mask=(0,) * len(prefix) + (1,) * len(cont.token_ids),
                teacher_prefix_tokens=len(prefix),
            )
        )
    return out
