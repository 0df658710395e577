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
