"""How each evaluated role samples, from phase 4's one evaluation sampler: `EvalRoles`, built once the sandbox pool
runs (a multi-turn mode's environment runs there).

The roles: "trained" (the base model with the evaluated adapter), "model" (a base model evaluated alone) and
"baseline" (the trained role's base model with the adapter switched off, for the paired delta). Every role is
sampled through `rollouts.groups.sample_groups`, seeded per prompt where the engine keeps its own random stream
(vLLM), so the same config gives the same completions, cache or not, and the trained and baseline roles draw the
same random numbers for a task (a paired comparison).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

from evaluation.evaluate import DEFAULT_BATCH_SAMPLES, DEFAULT_CHUNK
from rollouts.completion import RolloutCompletion
from rollouts.groups import Episodes, sample_groups
from rollouts.protocol import Sampler
from utils.dataset_loader import Task

Role = Literal["trained", "model", "baseline"]

VLLM_EVAL_BATCH = 4096  # sequences per vLLM call in phase 4
# on vLLM's CPU platform, one call is what its engine runs at once (its default max_num_seqs for the LLM class):
# a 4,096-sequence call there showed no progress for ~20 minutes and a crash would have lost all of it, while
# refilling the running batch between calls costs only each call's tail of long answers
VLLM_CPU_EVAL_BATCH = 256
# sequences per kv-sampler call: its decode reads the weights once per step for every row, so wider is
# faster (bench_sampling.py, kv-bf16, 2 cores: 203 tokens/s at 16 rows, 251 at 32)
KV_EVAL_BATCH = 32


@dataclass(frozen=True)
class EvalBatching:
    """How `evaluate.generate_cached` cuts a role's samples into sampler calls."""

    chunk: int = DEFAULT_CHUNK  # samples of one task per unit of work
    batch_samples: int = DEFAULT_BATCH_SAMPLES  # sequences per sampler call


def eval_batching(backend: str, mode: str, num_samples: int, *, cpu_engine: bool = False) -> EvalBatching:
    """vLLM batches internally: whole tasks, thousands of sequences per call (a crash loses one call at most), and
    on its CPU platform (`cpu_engine`) one running batch per call, so that progress shows and is kept. The kv
    sampler, single-turn, decodes wider batches faster; the rest keep `generate_cached`'s defaults."""
    if backend == "vllm":
        return EvalBatching(chunk=num_samples, batch_samples=VLLM_CPU_EVAL_BATCH if cpu_engine else VLLM_EVAL_BATCH)
    if backend == "kv" and mode == "single":
        return EvalBatching(batch_samples=KV_EVAL_BATCH)
    return EvalBatching()


@dataclass(frozen=True)
class EvalRoles:
    """The evaluation sampler and what each role syncs it with (`Sampler.policy_for`)."""

    sampler: Sampler
    trained: Any  # the evaluated model: transformers, the loaded model carrying the adapter; vLLM, its LoRA request
    base: Any  # the base model: the same transformers model, or None (vLLM's own weights)
    # the scope in which `base` samples without the adapter (a transformers model's `disable_adapter`)
    adapter_off: Callable[[], AbstractContextManager[Any]]
    batching: EvalBatching
    episodes: Episodes | None  # a multi-turn mode's, its environment on the scoring pool; None in single mode
    seed: int  # per-prompt request seeds where the engine keeps its own random stream (vLLM)

    def sample(
        self, role: Role, prompts: list[str], num_samples: int, tasks: Sequence[Task]
    ) -> list[list[RolloutCompletion]]:
        """`num_samples` samples of each prompt as `role`: the `generate(prompts, n, tasks)` of
        `evaluate.generate_cached`, with the role bound."""
        if role == "baseline":
            with self.adapter_off():
                return self._draw(self.base, prompts, num_samples, tasks)
        if role not in ("trained", "model"):
            raise ValueError(f"unknown evaluation role {role!r}: one of trained, model, baseline")
        return self._draw(self.trained if role == "trained" else self.base, prompts, num_samples, tasks)

    def _draw(
        self, policy: Any, prompts: list[str], num_samples: int, tasks: Sequence[Task]
    ) -> list[list[RolloutCompletion]]:
        return sample_groups(
            self.sampler, policy, prompts, num_samples, tasks=tasks, episodes=self.episodes, seed=self.seed
        )
