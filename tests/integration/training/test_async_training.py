"""Asynchronous rollouts through the trainer on the tiny model: max_staleness 0 is the synchronous run, the
version a batch was sampled with reaches the importance ratio, and a producer failure or Ctrl-C ends the run
with no thread left."""

from __future__ import annotations

import copy
import dataclasses
import json
import threading

import numpy as np
import pytest
import torch

from rollouts.completion import RolloutCompletion
from tests.canned_responses import WRONG_CODE, student_answer
from tests.integration.training.test_multi_turn_training import (
    ScriptedMultiTurnRollout,
    SequencePolicy,
    feedback_script,
    tool_script,
)
from tests.trainer_helpers import (
    ScriptedRollout,
    lora_state,
    scripted_trainer,
    small_tasks,
    tiny_config,
    tiny_lora_student,
)
from training.async_rollouts import ProducerError
from training.batching import completion_logprobs, pad_rollout_batch
from training.grpo_trainer import GRPOTrainer
from training.setup import build_run
from utils.prompts import get_unified_prompt
from utils.sft_data import encode_prompt, end_of_turn_id

SERVER = {"grpo.rollout_backend": "vllm_server", "training.max_steps": 4, "training.save_steps": 0}


class VersionedRollout(ScriptedRollout):
    """A stand-in for the server sampler: `publish_adapter` keeps a copy of the policy at that step, `load_adapter`
    makes it the one sampled, and every sample carries that copy's log-probs (as vLLM returns them)."""

    def __init__(self, tokenizer, tasks_by_problem) -> None:
        super().__init__(tokenizer, tasks_by_problem)
        self.snapshots: dict[int, torch.nn.Module] = {}
        self.loaded: int | None = None
        self.fail_at_call: int | None = None
        self.calls = 0

    def publish_adapter(self, model, step: int) -> None:
        self.snapshots[step] = copy.deepcopy(model).eval()

    def load_adapter(self, step: int) -> None:
        self.loaded = step

    def sample(self, prompts, num_samples, *, seed=None):
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise ConnectionError("the rollout server went away")
        assert self.loaded is not None, "sampled before an adapter was loaded"
        policy = self.snapshots[self.loaded]
        out = []
        for group in super().sample(prompts, num_samples):
            batch = pad_rollout_batch(group, self.tokenizer.pad_token_id)
            with torch.no_grad():
                logp = completion_logprobs(policy, batch)  # (G, T)
            out.append(
                [
                    dataclasses.replace(c, logprobs=tuple(logp[i, : len(c.token_ids)].tolist()))
                    for i, c in enumerate(group)
                ]
            )
        return out


def rows(trainer) -> list[dict]:
    return [json.loads(line) for line in (trainer.output_dir / "metrics.jsonl").read_text().splitlines()]


def no_producer_thread() -> bool:
    return not [t for t in threading.enumerate() if t.name == "rollout-producer"]


def without_times(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/") and k != "tokens_per_s"}


@pytest.mark.slow
def test_max_staleness_zero_is_the_synchronous_run(tmp_path, pool):
    runs = []
    for name, extra in (("sync", {}), ("zero", {"grpo.async_rollouts": "true", "grpo.max_staleness": 0})):
        torch.manual_seed(0)
        trainer = scripted_trainer(tmp_path / name, pool, **SERVER, **extra)
        trainer.train()
        runs.append(trainer)
    sync, zero = runs
    assert [without_times(r) for r in rows(zero)] == [without_times(r) for r in rows(sync)]
    assert not any(k.startswith("async/") for k in rows(zero)[0])
    after_sync, after_zero = lora_state(sync.model), lora_state(zero.model)
    assert all(torch.equal(after_sync[k], after_zero[k]) for k in after_sync)


def test_the_version_a_batch_was_sampled_with_reaches_the_importance_ratio(tmp_path, pool):
    torch.manual_seed(0)
    trainer = scripted_trainer(
        tmp_path, pool, rollout_class=VersionedRollout, **SERVER, **{"grpo.async_rollouts": "true"}
    )
    trainer.train()
    steps = rows(trainer)
    assert [r["async/staleness_max"] for r in steps] == [0.0, 1.0, 1.0, 1.0]  # one step off after the first
    assert [r["async/policy_version"] for r in steps] == [0.0, 0.0, 1.0, 2.0]
    assert all(r["async/dropped_groups"] == 0.0 for r in steps)
    # the first batch came from the policy being trained: its sampler log-probs are the trainer's; every later one
    # from the adapter one step older, and the ratio against that adapter's log-probs is what is corrected
    assert steps[0]["rollout/logp_abs_diff"] < 1e-5
    assert all(r["rollout/logp_abs_diff"] > 1e-4 for r in steps[1:])
    assert all(r["rollout/is_weight_mean"] != 1.0 for r in steps[1:])
    assert all(r["rollout/is_weight_p01"] <= 1.0 <= r["rollout/is_weight_p99"] for r in steps[1:])
    assert no_producer_thread()


@pytest.mark.slow
def test_a_producer_failure_ends_the_run_with_one_error_and_no_thread(tmp_path, pool):
    torch.manual_seed(0)
    trainer = scripted_trainer(
        tmp_path, pool, rollout_class=VersionedRollout, **SERVER, **{"grpo.async_rollouts": "true"}
    )
    trainer.parts.rollout.fail_at_call = 3
    with pytest.raises(ProducerError, match="went away"):
        trainer.train()
    assert no_producer_thread()


def test_ctrl_c_in_the_trainer_stops_the_producer(tmp_path, pool, monkeypatch):
    torch.manual_seed(0)
    trainer = scripted_trainer(
        tmp_path, pool, rollout_class=VersionedRollout, **SERVER, **{"grpo.async_rollouts": "true"}
    )
    original = trainer.train_on_rollouts
    calls = []

    def interrupted(groups, metrics):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(groups, metrics)

    monkeypatch.setattr(trainer, "train_on_rollouts", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert no_producer_thread()


def test_an_async_run_resumes_from_its_checkpoint_and_samples_the_batches_in_flight_again(tmp_path, pool):
    torch.manual_seed(0)
    settings = {**SERVER, "grpo.async_rollouts": "true", "training.max_steps": 2}
    first = scripted_trainer(tmp_path, pool, rollout_class=VersionedRollout, **settings)
    first.train()
    assert first.state.rollout_batches == 2  # batch 2, sampled ahead, was in flight: not counted, not saved
    resumed = scripted_trainer(tmp_path, pool, rollout_class=VersionedRollout, **{**settings, "training.max_steps": 4})
    resumed.train(resume_from="latest")
    steps = rows(resumed)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # after the resume the first batch comes from the resumed adapter (staleness 0), then one step off again
    assert [r["async/staleness_max"] for r in steps[2:]] == [0.0, 1.0]
    assert [r["async/policy_version"] for r in steps[2:]] == [2.0, 2.0]
    assert no_producer_thread()


class VersionedMultiTurnRollout(ScriptedMultiTurnRollout):
    """The server sampler's async surface for multi-turn episodes: `load_adapter` starts a new scripted policy (the
    adapter the server now samples from); `sync` (which would publish the model being trained) is the synchronous
    path's and must not be called."""

    def __init__(self, tokenizer, script) -> None:
        super().__init__(tokenizer, script)
        self.loaded: list[int] = []
        self.published: list[int] = []

    def publish_adapter(self, model, step: int) -> None:
        self.published.append(step)

    def load_adapter(self, step: int) -> None:
        self.loaded.append(step)
        self.policies.append(SequencePolicy(self.tokenizer, self.script))

    def sync(self, policy, step):
        raise AssertionError("the producer synced the model being trained")


@pytest.mark.parametrize("mode", ["feedback", "tool"])
def test_async_rollouts_sample_multi_turn_episodes_from_the_loaded_adapter(tmp_path, pool, mode):
    torch.manual_seed(0)
    model, tokenizer = tiny_lora_student(tiny_config(tmp_path))
    tasks = small_tasks(4)
    script = feedback_script(tasks) if mode == "feedback" else tool_script(tasks)
    settings = {
        **SERVER,
        "grpo.async_rollouts": "true",
        "training.max_steps": 2,
        "multi_turn.mode": mode,
        "multi_turn.max_turns": 2,
        "dual_source.teacher_sft_weight": 0,
        "grpo.max_new_tokens": 256,
        "dual_source.sft_max_length": 1024,
    }
    config = tiny_config(tmp_path, **settings)
    rollout = VersionedMultiTurnRollout(tokenizer, script)
    parts = build_run(
        config,
        tasks=tasks,
        teacher_examples=[],
        output_dir=tmp_path,
        model=model,
        tokenizer=tokenizer,
        rollout=rollout,
        pool=pool,
    )
    trainer = GRPOTrainer(config, parts)
    trainer.train()
    steps = rows(trainer)
    assert [r["async/policy_version"] for r in steps] == [0.0, 0.0]
    assert rollout.loaded[0] == 0 and rollout.published[:2] == [0, 1]
    assert all(r["multi_turn/turns_mean"] > 1.0 for r in steps)  # the episodes went on past the first turn
    first_turns = rollout.policies[0].calls[0]
    mode_prompt = get_unified_prompt(tasks[0], config.prompt.num_visible_tests, mode=mode)
    assert mode_prompt.split("\n")[0] in first_turns[0]
    assert no_producer_thread()


class FirstRoundsWrong(VersionedRollout):
    """Every odd call samples only wrong answers (groups without spread, which dynamic sampling refills)."""

    def sample(self, prompts, num_samples, *, seed=None):
        self.always_wrong = self.calls % 2 == 0  # `calls` counts this call once the parent's sample runs
        return super().sample(prompts, num_samples)


def test_async_dynamic_sampling_refills_in_the_producer_and_moves_the_data_order_past_every_round(tmp_path, pool):
    torch.manual_seed(0)
    settings = {
        **SERVER,
        "grpo.async_rollouts": "true",
        "training.max_steps": 2,
        "grpo.dynamic_sampling": "true",
        "grpo.dynamic_sampling_max_rounds": 4,
    }
    trainer = scripted_trainer(tmp_path, pool, rollout_class=FirstRoundsWrong, **settings)
    trainer.train()
    steps = rows(trainer)
    assert all(r["sampling/rounds"] >= 2 for r in steps)  # the all-wrong round of each batch was refilled
    assert all(r["sampling/groups_kept"] == trainer.prompts_per_rollout for r in steps)
    assert all(r["sampling/groups_sampled"] == r["sampling/rounds"] * trainer.prompts_per_rollout for r in steps)
    # the data order stands after every round the two trained batches consumed (what a checkpoint saves)
    assert trainer.state.rollout_batches == sum(int(r["sampling/rounds"]) for r in steps)
    assert no_producer_thread()


def test_async_curriculum_draws_in_the_producer_and_a_checkpoint_holds_only_the_trained_batches(tmp_path, pool):
    from training.checkpointing import rank_state_name

    torch.manual_seed(0)
    settings = {
        **SERVER,
        "grpo.async_rollouts": "true",
        "training.max_steps": 2,
        "curriculum.enabled": "true",
        "curriculum.window": 64,  # every sample kept, no task settled: the counts below are exact
        "curriculum.min_samples": 64,
    }
    trainer = scripted_trainer(tmp_path, pool, rollout_class=VersionedRollout, **settings)
    per_batch = trainer.prompts_per_rollout * trainer.group_size
    original = trainer.train_on_rollouts

    def after_the_next_batch_was_scored(groups, metrics):
        if trainer.state.global_step == 1:  # the producer has drawn and scored batch 2 (in flight) before the save
            for _ in range(6000):
                if sum(map(len, trainer.curriculum.history)) >= 3 * per_batch:
                    break
                threading.Event().wait(0.01)
            assert sum(map(len, trainer.curriculum.history)) >= 3 * per_batch, "the producer never ran ahead"
        return original(groups, metrics)

    trainer.train_on_rollouts = after_the_next_batch_was_scored
    trainer.train()
    steps = rows(trainer)
    assert all("curriculum/zero_spread_share" in r for r in steps)
    assert trainer.state.rollout_batches == 2
    saved = torch.load(tmp_path / "checkpoint-2" / rank_state_name(0), weights_only=False)["curriculum"]
    # the checkpoint's curriculum is the one after the two trained batches, not the producer's (which ran ahead)
    assert sum(map(len, saved["history"])) == 2 * per_batch
    assert saved["cursor"] == 2 * trainer.prompts_per_rollout  # nothing settled yet: the plain order's positions
    assert no_producer_thread()


@pytest.mark.slow
def test_async_rollouts_with_a_served_teacher_score_each_trained_batch_once(tmp_path, pool):
    """OPD beside asynchronous rollouts: the teacher scores a batch on the trainer's thread when it is trained (the
    batches in flight are not scored), through HTTP to a served teacher."""
    from clients.openai_compat import TeacherClient
    from tests.fake_openai_server import FakeVLLMServer, RunningServer
    from tests.integration.training.test_opd_training import OPD_ONLY
    from training.teacher_logprobs import ServedTeacherScorer

    torch.manual_seed(0)
    state = FakeVLLMServer(base_model="teacher", prompt_logprob=lambda prefix, token: -1.0)
    settings = {**SERVER, **OPD_ONLY, "grpo.async_rollouts": "true", "training.max_steps": 2}
    with RunningServer(state) as server:
        scorer = ServedTeacherScorer(TeacherClient(server.url, model="teacher"), "teacher")
        trainer = scripted_trainer(tmp_path, pool, VersionedRollout, teacher_scorer=scorer, **settings)
        trainer.train()
    steps = rows(trainer)
    assert [r["async/policy_version"] for r in steps] == [0.0, 0.0]
    per_batch = trainer.prompts_per_rollout * trainer.group_size
    assert len(state.calls) == 2 * per_batch  # the two trained batches, every sample once
    assert all(r["opd/teacher_tokens"] > 0 and "loss/opd" in r for r in steps)
    assert no_producer_thread()


class HalfRightOrFlat(VersionedRollout):
    """Deterministic groups: half right, half wrong (spread), except the prompts of the call named in `flat_calls`
    whose position in the request is in `flat_positions` (all wrong: no spread)."""

    def __init__(self, tokenizer, tasks_by_problem) -> None:
        super().__init__(tokenizer, tasks_by_problem)
        self.flat: dict[int, range] = {}  # call number -> positions of its prompts sampled all wrong
        self.asked: list[list[str]] = []  # the task ids of every call's prompts, in order

    def sample(self, prompts, num_samples, *, seed=None):
        self.calls += 1
        eot = end_of_turn_id(self.tokenizer)
        out = []
        self.asked.append([])
        for position, prompt in enumerate(prompts):
            task = next(t for p, t in self.tasks_by_problem.items() if p in prompt)
            self.asked[-1].append(task.task_id)
            ids = encode_prompt(self.tokenizer, prompt)
            flat = position in self.flat.get(self.calls, range(0))
            group = []
            for k in range(num_samples):
                text = student_answer(WRONG_CODE if flat or k % 2 else task.reference_solutions[0])
                token_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [eot]
                group.append(RolloutCompletion(text, tuple(token_ids), tuple(ids), "stop"))
            out.append(group)
        return out


def two_process_trainer(tmp_path, pool, monkeypatch, **overrides):
    """A trainer that believes it is rank 0 of 2 (no process group: the producer's batch needs none), its
    sampler's adapter loaded; `as_rank(r)` makes it believe it is rank r."""
    trainer = scripted_trainer(
        tmp_path, pool, rollout_class=HalfRightOrFlat, **SERVER, **{"grpo.async_rollouts": "true"}, **overrides
    )
    rank = {"index": 0}
    monkeypatch.setattr(type(trainer.accelerator), "num_processes", property(lambda self: 2))
    monkeypatch.setattr(type(trainer.accelerator), "process_index", property(lambda self: rank["index"]))
    trainer.parts.rollout.load_adapter(0)

    def as_rank(r):
        rank["index"] = r

    return trainer, as_rank


def test_the_producer_samples_every_rank_s_share_in_one_burst_and_each_share_is_that_rank_s_synchronous_one(
    tmp_path, pool, monkeypatch
):
    trainer, as_rank = two_process_trainer(tmp_path, pool, monkeypatch)
    maker = trainer.rollouts.maker
    shares = maker.make(1, range(2))  # the producer's batch: every rank's share
    assert [s.last_position for s in shares] == [1, 1]
    # one request burst for both ranks' prompts (the server batches them), rank 0's first
    [asked] = trainer.parts.rollout.asked
    per_rank = trainer.prompts_per_rollout
    # the plain order at data-order position 1 over 6 tasks, 8 prompts a batch: positions 8..15 of the seeded
    # epoch permutations (epoch 1 from offset 2, then epoch 2's first 4)
    order = [np.random.default_rng([trainer.config.training.seed, e]).permutation(6) for e in (1, 2)]
    expected = [trainer.tasks[i].task_id for i in [*order[0][2:6], *order[1][0:4]]]
    assert asked == expected
    for rank, share in enumerate(shares):
        as_rank(rank)
        synchronous = [trainer.tasks[i].task_id for i in maker.batch_indices(1)[maker.peers.rank]]
        groups = share.groups
        assert [g[0].task.task_id for g in groups] == synchronous == expected[rank * per_rank : (rank + 1) * per_rank]
        assert all(s.completion.prompt_ids for g in groups for s in g)
        assert share.metrics["pass_rate"] == pytest.approx(0.5)  # each share's metrics are its own groups'
    # the groups are every rank's own: scored against their own tasks
    assert shares[0].groups[0][0].task.task_id != shares[1].groups[0][0].task.task_id


def test_dynamic_sampling_fills_each_rank_s_share_as_that_rank_would_and_stops_when_every_share_is_full(
    tmp_path, pool, monkeypatch
):
    trainer, _ = two_process_trainer(
        tmp_path, pool, monkeypatch, **{"grpo.dynamic_sampling": "true", "grpo.dynamic_sampling_max_rounds": 4}
    )
    per_rank = trainer.prompts_per_rollout
    trainer.parts.rollout.flat = {1: range(per_rank, 2 * per_rank)}  # the first round: rank 1's groups have no spread
    shares = trainer.rollouts.maker.make(0, range(2))
    asked = trainer.parts.rollout.asked
    assert [s.last_position for s in shares] == [1, 1] and len(asked) == 2  # a second round, for both ranks
    rank0, rank1 = ([g[0].task.task_id for g in share.groups] for share in shares)
    assert rank0 == asked[0][:per_rank]  # full after its first round: the second adds nothing
    assert rank1 == asked[1][per_rank:]  # its own prompts of the second round
    for metrics in (share.metrics for share in shares):
        assert metrics["sampling/rounds"] == 2.0
        assert metrics["sampling/groups_sampled"] == 2.0 * per_rank
        assert metrics["sampling/groups_kept"] == float(per_rank)
    # the round-weighted pass rate: rank 1 sampled one round all wrong, rank 0 none
    assert shares[0].metrics["pass_rate"] == pytest.approx(0.5)
    assert shares[1].metrics["pass_rate"] == pytest.approx(0.25)


def test_the_producer_observes_every_rank_s_groups_in_rank_order_for_the_curriculum(tmp_path, pool, monkeypatch):
    trainer, _ = two_process_trainer(
        tmp_path,
        pool,
        monkeypatch,
        **{"curriculum.enabled": "true", "curriculum.window": 64, "curriculum.min_samples": 64},
    )
    per_rank = trainer.prompts_per_rollout
    trainer.parts.rollout.flat = {1: range(per_rank, 2 * per_rank)}
    shares = trainer.rollouts.maker.make(0, range(2))
    [asked] = trainer.parts.rollout.asked
    observed = sum(map(len, trainer.curriculum.history))
    assert observed == 2 * per_rank * trainer.group_size  # both ranks' rewards, as the gather gives every rank
    assert [g[0].task.task_id for g in shares[1].groups] == asked[per_rank:]
    assert shares[0].metrics["curriculum/zero_spread_share"] == 0.0  # each share's own groups
    assert shares[1].metrics["curriculum/zero_spread_share"] == 1.0
