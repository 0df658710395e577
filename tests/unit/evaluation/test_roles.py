"""Phase 4's roles: each samples its own policy from the one sampler (the baseline with the adapter switched off),
seeded, with the mode's episodes; the batching each backend gets."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import pytest

from evaluation.evaluate import DEFAULT_BATCH_SAMPLES, DEFAULT_CHUNK
from evaluation.roles import (
    KV_EVAL_BATCH,
    VLLM_CPU_EVAL_BATCH,
    VLLM_EVAL_BATCH,
    EvalBatching,
    EvalRoles,
    eval_batching,
)
from rollouts.completion import RolloutCompletion
from rollouts.protocol import SamplerBase


class RecordingSampler(SamplerBase):
    """Records what each rollout was synced with, whether the adapter was off then, and the seed it was given."""

    def __init__(self, switch: dict) -> None:
        super().__init__(None, 8)
        self.switch = switch
        self.rollouts: list[tuple[object, bool, int | None]] = []
        self.released = 0

    def sync(self, policy, step):
        self.policy = policy

    def sample(self, prompts, num_samples, *, seed=None):
        self.rollouts.append((self.policy, self.switch["off"], seed))
        return [[RolloutCompletion(p, (1,), (), "stop")] * num_samples for p in prompts]

    def continue_sequences(self, sequences, max_new_tokens, stop_strings):
        raise AssertionError("single-turn roles only")

    def release(self):
        self.released += 1


def roles_with(trained="adapted", base="base") -> tuple[EvalRoles, RecordingSampler]:
    switch = {"off": False}

    @contextmanager
    def adapter_off():
        switch["off"] = True
        try:
            yield
        finally:
            switch["off"] = False

    sampler = RecordingSampler(switch)
    roles = EvalRoles(
        sampler=sampler,
        trained=trained,
        base=base,
        adapter_off=adapter_off,
        batching=EvalBatching(),
        episodes=None,
        seed=42,
    )
    return roles, sampler


def test_each_role_samples_its_own_policy_and_the_baseline_with_the_adapter_off():
    roles, sampler = roles_with()
    out = roles.sample("trained", ["p1", "p2"], 3, [])
    roles.sample("model", ["p1"], 1, [])
    roles.sample("baseline", ["p1"], 1, [])
    assert [len(group) for group in out] == [3, 3] and out[1][0].text == "p2"
    assert sampler.rollouts == [("adapted", False, 42), ("base", False, 42), ("base", True, 42)]
    assert sampler.released == 3  # every rollout released its sampler, the baseline's inside its scope too


def test_an_unknown_role_is_refused_by_name():
    roles, sampler = roles_with()
    with pytest.raises(ValueError, match="'teacher'"):
        roles.sample("teacher", ["p"], 1, [])
    assert sampler.rollouts == []


def test_the_roles_are_one_frozen_typed_record():
    roles, _ = roles_with()
    assert {f.name: f.type for f in dataclasses.fields(EvalRoles)} == {
        "sampler": "Sampler",
        "trained": "Any",  # what the sampler's `sync` takes: a model or a LoRA request
        "base": "Any",
        "adapter_off": "Callable[[], AbstractContextManager[Any]]",
        "batching": "EvalBatching",
        "episodes": "Episodes | None",
        "seed": "int",
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        roles.episodes = object()


@pytest.mark.parametrize(
    ("backend", "mode", "expected"),
    [
        ("vllm", "single", (5, VLLM_EVAL_BATCH)),  # whole tasks, thousands of sequences per call
        ("vllm", "feedback", (5, VLLM_EVAL_BATCH)),
        ("kv", "single", (DEFAULT_CHUNK, KV_EVAL_BATCH)),  # wider decode batches
        ("kv", "tool", (DEFAULT_CHUNK, DEFAULT_BATCH_SAMPLES)),
        ("hf", "single", (DEFAULT_CHUNK, DEFAULT_BATCH_SAMPLES)),
    ],
)
def test_each_backend_gets_its_batching(backend, mode, expected):
    batching = eval_batching(backend, mode, num_samples=5)
    assert (batching.chunk, batching.batch_samples) == expected
    assert (VLLM_EVAL_BATCH, KV_EVAL_BATCH, DEFAULT_CHUNK, DEFAULT_BATCH_SAMPLES) == (4096, 32, 8, 16)


def test_vllms_cpu_engine_gets_one_running_batch_per_call():
    """On vLLM's CPU platform a phase-4 call is one engine batch (256, its default max_num_seqs), whole tasks: 568
    samples are three calls with progress between them, not one silent call; GPU engines keep thousands."""
    batching = eval_batching("vllm", "single", num_samples=8, cpu_engine=True)
    assert (batching.chunk, batching.batch_samples) == (8, VLLM_CPU_EVAL_BATCH) and VLLM_CPU_EVAL_BATCH == 256
    assert eval_batching("kv", "single", num_samples=8, cpu_engine=True).batch_samples == KV_EVAL_BATCH
