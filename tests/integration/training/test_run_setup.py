"""`training.setup.build_run` makes a phase 3 run's parts; `GRPOTrainer` receives them and closes only what the run
made."""

from __future__ import annotations

import dataclasses

import pytest

import training.setup as setup
from sandbox.pool import SandboxPool
from tests.trainer_helpers import ScriptedRollout, small_tasks, teacher_examples, tiny_config, tiny_lora_student
from training.grpo_trainer import GRPOTrainer

# teacher-SFT alone: one short step that samples nothing, so the pool is never asked for work
TEACHER_SFT_ONLY = {
    "dual_source.grpo_weight": 0.0,
    "dual_source.self_sft_weight": 0.0,
    "grpo.kl_coef": 0.0,
    "training.max_steps": 1,
    "training.save_steps": 0,
}


class FakePool:
    size, isolation = 1, "fake"

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def no_real_pool(monkeypatch):
    """A SandboxPool constructed anywhere fails the test."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("a SandboxPool was built")

    monkeypatch.setattr(SandboxPool, "__init__", refuse)


def run_parts(config, **parts):
    model, tokenizer = tiny_lora_student(config)
    tasks = small_tasks(4)
    return setup.build_run(
        config,
        tasks=tasks,
        teacher_examples=teacher_examples(tasks),
        output_dir=config.paths.output_dir,
        model=model,
        tokenizer=tokenizer,
        rollout=ScriptedRollout(tokenizer, {t.problem: t for t in tasks}),
        **parts,
    )


def test_build_run_makes_each_part_from_the_config(tmp_path, monkeypatch):
    made = []

    class RecordingPool(FakePool):
        @classmethod
        def from_config(cls, section, **kwargs):  # how build_pool makes the run's pool
            made.append(kwargs)
            return cls()

    monkeypatch.setattr(setup, "SandboxPool", RecordingPool)
    config = tiny_config(tmp_path / "out", **{"curriculum.enabled": "true", "multi_turn.mode": "feedback"})
    parts = run_parts(config)
    assert len(made) == 1 and parts.owns_pool and isinstance(parts.pool, RecordingPool)
    assert parts.episodes is not None and parts.episodes.environment.pool is parts.pool  # feedback runs on that pool
    assert parts.curriculum is not None and parts.teacher_scorer is None  # dual_source.opd_weight is 0
    assert parts.accelerator.device.type == "cpu" and parts.sinks.output_dir == tmp_path / "out"
    assert len(parts.teacher_sft) == 4 and parts.user_rewards == []


def test_the_trainer_builds_no_part_and_leaves_a_passed_pool_open(tmp_path, no_real_pool):
    pool = FakePool()
    config = tiny_config(tmp_path / "out", **TEACHER_SFT_ONLY)
    parts = run_parts(config, pool=pool)
    assert parts.pool is pool and not parts.owns_pool
    trainer = GRPOTrainer(config, parts)
    assert trainer.pool is pool and trainer.rollouts is parts.rollouts and trainer.sinks is parts.sinks
    trainer.train()
    assert not pool.closed  # the caller made it: the caller closes it


def test_the_trainer_closes_the_pool_the_run_made(tmp_path, no_real_pool):
    pool = FakePool()
    config = tiny_config(tmp_path / "out", **TEACHER_SFT_ONLY)
    parts = dataclasses.replace(run_parts(config, pool=pool), owns_pool=True)  # as build_run marks the pool it made
    GRPOTrainer(config, parts).train()
    assert pool.closed


def test_with_async_rollouts_under_several_processes_the_main_process_takes_the_sandbox_cores(tmp_path, monkeypatch):
    """The main process's producer scores every process's rollouts: its pool gets the machine's cores, the other
    processes (which score nothing) one worker each; synchronously each process takes its share."""
    import types

    made = []

    class RecordingPool(FakePool):
        @classmethod
        def from_config(cls, section, **kwargs):
            made.append(kwargs["workers"])
            return cls()

    monkeypatch.setattr(setup, "SandboxPool", RecordingPool)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    server = {"grpo.rollout_backend": "vllm_server", "sandbox.max_workers": 0}
    for async_rollouts in ("false", "true"):
        config = tiny_config(tmp_path, **server, **{"grpo.async_rollouts": async_rollouts})
        for main in (True, False):
            setup.build_pool(config, types.SimpleNamespace(num_processes=2, is_main_process=main))
    assert made == [4, 4, 8, 1]
    made.clear()
    one = types.SimpleNamespace(num_processes=1, is_main_process=True)
    setup.build_pool(tiny_config(tmp_path, **server, **{"grpo.async_rollouts": "true"}), one)
    setup.build_pool(tiny_config(tmp_path, **{**server, "grpo.async_rollouts": "true", "sandbox.max_workers": 3}), one)
    assert made == [8, 3]
