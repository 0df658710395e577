"""How the objective's terms act together: each term weighted on its own, no update from the format bonus alone,
partial credit that cannot be earned from the shown test, self-SFT weighted by how many groups succeeded, the
truncation mask, the curriculum's spread, bounded KL and OPD advantages, no cost for a switched-off term, and the
kv sampler's log-probs under truncation."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import types

import pytest
import torch

from config import ConfigError, build_config
from rollouts.completion import RolloutCompletion
from tests.trainer_helpers import ScriptedRollout, lora_state, plan_one_slot, scripted_trainer, small_tasks
from training.losses import k3_kl, masked_sft_nll, opd_token_advantages
from training.rewards import Reward
from training.rollout_batches import RoundShare
from training.scoring import score_rollouts
from training.setup import scoring_sections
from utils.sft_data import build_sft_example, collate_sft

QUIET = {"dual_source.teacher_sft_weight": 0.0, "dual_source.self_sft_weight": 0.0, "training.max_grad_norm": 0.0}


def perturbed(trainer, seed: int = 3):
    """Give the adapter a random B, so the policy differs from the reference (the KL has a gradient)."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in trainer.model.named_parameters():
        if "lora_B" in name:
            param.data = torch.randn(param.shape, generator=generator) * 0.05
    return trainer


def step_gradient(trainer, groups) -> tuple[dict[str, torch.Tensor], dict]:
    """The LoRA gradient of one optimizer step on `groups` (the step itself is not taken) and its metrics."""
    captured: dict[str, torch.Tensor] = {}

    def record(*args, **kwargs):
        captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.optimizer.step = record
    metrics = trainer.train_on_rollouts(groups, {})[0]
    return captured, metrics


def with_spread(groups):
    """Rewards 1, 0, 1, 0, ... in every group: correctness spread everywhere."""
    return [
        [
            dataclasses.replace(
                s,
                result=types.SimpleNamespace(passed=j % 2 == 0),
                reward=Reward(float(j % 2 == 0), float(j % 2 == 0), 1.0),
            )
            for j, s in enumerate(group)
        ]
        for group in groups
    ]


# ------------------------------------------------------------------------------------------------ KL


@pytest.mark.slow
def test_the_kl_penalty_is_its_own_term_and_acts_when_grpo_weight_is_zero(tmp_path, pool):
    first = perturbed(scripted_trainer(tmp_path / "a", pool, **QUIET, **{"grpo.kl_coef": 0.5}))
    groups = with_spread(first.collect_rollouts()[0])
    full, _ = step_gradient(first, groups)  # surrogate + 0.5 KL
    surrogate, _ = step_gradient(
        perturbed(scripted_trainer(tmp_path / "b", pool, **QUIET, **{"grpo.kl_coef": 0.0})), groups
    )
    kl_only, metrics = step_gradient(
        perturbed(
            scripted_trainer(tmp_path / "c", pool, **QUIET, **{"grpo.kl_coef": 0.5, "dual_source.grpo_weight": 0.0})
        ),
        groups,
    )
    assert metrics["weight/kl"] == 0.5 and metrics["loss/kl"] > 0
    assert "loss/grpo" not in metrics  # the GRPO term was not computed at weight 0
    assert max(float(g.abs().max()) for g in kl_only.values()) > 1e-6
    for name, grad in full.items():  # linear in the terms: full = surrogate + KL
        assert torch.allclose(grad, surrogate[name] + kl_only[name], rtol=1e-4, atol=1e-7), name


def test_the_k3_penalty_is_bounded_in_value_and_gradient():
    logp = torch.tensor([-25.0, -1.0, -1.0, 0.0], requires_grad=True)
    ref = torch.tensor([-1.0, -25.0, -1.0, -40.0])
    kl = k3_kl(logp, ref)
    assert float(kl.detach().max()) <= 10.0 and float(kl.detach().min()) >= 0.0
    kl.sum().backward()
    assert float(logp.grad.abs().max()) <= 12.0
    assert float(kl[2]) == 0.0  # unchanged where nothing is clamped
    small = k3_kl(torch.tensor([-1.2]), torch.tensor([-1.0]))
    delta = 0.2
    assert float(small) == pytest.approx(math.exp(delta) - delta - 1.0, rel=1e-5)


# ------------------------------------------------------------------------------------------------ format-only steps


def format_only(groups):
    """Every sample fails; format scores alternate 1 / 0.5: the bonus is the step's only signal."""
    return [
        [
            dataclasses.replace(
                s,
                result=types.SimpleNamespace(passed=False),
                reward=Reward(0.1 * (1.0 - 0.5 * (j % 2)), 0.0, 1.0 - 0.5 * (j % 2)),
            )
            for j, s in enumerate(group)
        ]
        for group in groups
    ]


def test_a_step_whose_only_signal_is_the_format_bonus_is_not_taken(tmp_path, pool):
    trainer = scripted_trainer(tmp_path / "out", pool, **QUIET, **{"grpo.kl_coef": 0.0})
    groups = format_only(trainer.collect_rollouts()[0])
    before = lora_state(trainer.model)
    metrics = trainer.train_on_rollouts(groups, {})[0]
    assert metrics["frac_format_only_spread"] == 1.0
    assert metrics["update/skipped"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in lora_state(trainer.model).items())
    assert not trainer.optimizer.state  # Adam's moments were never touched
    assert trainer.state.global_step == 1  # the step counts: the run still ends


def test_a_skipped_step_still_reports_the_sampler_trainer_gap(tmp_path, pool):
    trainer = scripted_trainer(tmp_path / "out", pool, **QUIET, **{"grpo.kl_coef": 0.0})
    groups = format_only(trainer.collect_rollouts()[0])
    groups = [  # as a vLLM or kv sampler returns them: with the sampler's own log-prob of every token
        [
            dataclasses.replace(
                s, completion=dataclasses.replace(s.completion, logprobs=(-1.0,) * s.completion.num_tokens)
            )
            for s in g
        ]
        for g in groups
    ]
    metrics = trainer.train_on_rollouts(groups, {})[0]
    assert metrics["update/skipped"] == 1.0
    assert metrics["rollout/logp_abs_diff"] > 0 and "rollout/is_weight_mean" in metrics


@pytest.mark.slow
def test_format_only_groups_still_train_beside_teacher_sft(tmp_path, pool):
    trainer = scripted_trainer(tmp_path / "out", pool, **{"dual_source.self_sft_weight": 0.0, "grpo.kl_coef": 0.0})
    groups = format_only(trainer.collect_rollouts()[0])
    before = lora_state(trainer.model)
    metrics = trainer.train_on_rollouts(groups, {})[0]
    assert metrics["update/skipped"] == 0.0 and metrics["loss/teacher_sft"] > 0
    assert any(not torch.equal(before[k], v) for k, v in lora_state(trainer.model).items())


def test_dynamic_sampling_refills_the_batch_with_groups_that_have_spread(tmp_path, pool):
    class Alternating(ScriptedRollout):
        """The first call samples only wrong answers (no spread); later calls draw right and wrong at random."""

        calls = 0

        def sample(self, prompts, num_samples, *, seed=None):
            self.always_wrong = type(self).calls == 0
            type(self).calls += 1
            return super().sample(prompts, num_samples)

    trainer = scripted_trainer(
        tmp_path / "out",
        pool,
        Alternating,
        **{"grpo.dynamic_sampling": True, "grpo.dynamic_sampling_max_rounds": 4, "grpo.kl_coef": 0.0},
    )
    torch.manual_seed(11)
    groups, metrics = trainer.collect_rollouts()
    assert len(groups) == trainer.prompts_per_rollout
    assert all(len({s.reward.correctness for s in g}) > 1 for g in groups)  # every kept group has spread
    assert metrics["sampling/rounds"] >= 2
    assert metrics["sampling/groups_sampled"] >= 2 * trainer.prompts_per_rollout


# ------------------------------------------------------------------------------------------------ partial credit


def test_fraction_rewards_score_the_tests_the_prompt_does_not_show(tmp_path, pool):
    config = build_config("cpu", overrides=[f"paths.output_dir={tmp_path}", "grpo.correctness_reward=fraction"])
    assert config.prompt.num_visible_tests == 1
    task = next(t for t in small_tasks() if len(t.tests) >= 3)
    shown = ast.parse(task.tests[0]).body[0].test  # assert f(x) == expected
    expected = ast.unparse(shown.comparators[0])
    hidden_expected = {ast.unparse(ast.parse(a).body[0].test.comparators[0]) for a in task.tests[1:]}
    assert expected not in hidden_expected
    cheat = f"def {task.fn_name}(*args, **kwargs):\n    return {expected}\n"
    honest = task.reference_solutions[0]
    generations = [[RolloutCompletion(f"```python\n{code}```", (1, 2), (3,), "stop") for code in (cheat, honest)]]
    groups, _ = score_rollouts([task], ["prompt"], generations, pool, **scoring_sections(config))
    cheat_reward, honest_reward = (s.reward.correctness for s in groups[0])
    assert cheat_reward == 0.0  # passing only the shown assert earns nothing
    assert honest_reward == 1.0


def _limits(config):
    from sandbox.executor import SandboxLimits

    return SandboxLimits.from_config(config.sandbox)


def test_fraction_rewards_come_with_mean_centred_advantages():
    assert build_config("cpu").grpo.scale_rewards is False  # the cpu preset's fraction reward
    with pytest.raises(ConfigError, match="scale_rewards"):
        build_config("gpu", overrides=["grpo.correctness_reward=fraction"])
    build_config("gpu", overrides=["grpo.correctness_reward=fraction", "grpo.scale_rewards=false"])


# ------------------------------------------------------------------------------------------------ self-SFT


def _one_success(groups):
    passed, failed = types.SimpleNamespace(passed=True), types.SimpleNamespace(passed=False)
    return [
        [dataclasses.replace(s, result=passed if (g, j) == (0, 0) else failed) for j, s in enumerate(group)]
        for g, group in enumerate(groups)
    ]


def test_self_sft_weighs_each_success_as_one_group_of_the_step(tmp_path, pool):
    self_sft_only = {**QUIET, "dual_source.grpo_weight": 0.0, "dual_source.self_sft_weight": 0.5, "grpo.kl_coef": 0.0}
    trainer = scripted_trainer(tmp_path / "out", pool, **self_sft_only)
    groups = _one_success(trainer.collect_rollouts()[0])
    num_groups = len(groups)
    assert num_groups == 4
    sample = groups[0][0].completion
    batch = collate_sft(
        [build_sft_example(sample.prompt_ids, sample.token_ids, 10_000)], trainer.tokenizer.pad_token_id
    )
    nll, _ = masked_sft_nll(trainer.model(input_ids=batch["input_ids"]).logits, batch["labels"])  # token mean
    (0.5 * nll / num_groups).backward()
    expected = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    captured, metrics = step_gradient(trainer, groups)
    assert metrics["self_sft/samples"] == 1
    for name, grad in expected.items():
        assert torch.allclose(captured[name], grad, rtol=1e-4, atol=1e-8), name
    # a replay of that success on a step without one counts against the same per-group budget
    failed = [[dataclasses.replace(s, result=types.SimpleNamespace(passed=False)) for s in g] for g in groups]
    replay, metrics = step_gradient(trainer, failed)
    assert metrics["self_sft/samples"] == 1
    for name, grad in expected.items():
        assert torch.allclose(replay[name], grad, rtol=1e-4, atol=1e-8), name


# ------------------------------------------------------------------------------------------------ truncation


def test_truncated_completions_can_be_masked_out_of_the_loss_but_not_the_group(tmp_path, pool):
    trainer = scripted_trainer(tmp_path / "out", pool, **{"grpo.mask_truncated_completions": True})
    groups = with_spread(trainer.collect_rollouts()[0])
    groups = [
        [
            dataclasses.replace(s, completion=dataclasses.replace(s.completion, finish_reason="length"))
            if j == 1
            else s
            for j, s in enumerate(g)
        ]
        for g in groups
    ]
    config = trainer.config
    model = trainer.accelerator.unwrap_model(trainer.model)
    plan = plan_one_slot(trainer, groups, model)
    samples = plan.samples
    mask = plan.batches[0]["completion_mask"]
    for row, k in enumerate(plan.micro_batches[0]):
        truncated = samples[k].completion.finish_reason == "length"
        assert (int(mask[row].sum()) == 0) == truncated
    # the group statistics still include it: sample 1 of each group failed and keeps a negative advantage
    assert all(float(plan.advantages[g * 4 + 1]) < 0 for g in range(len(groups)))
    off = dataclasses.replace(config.grpo, mask_truncated_completions=False)
    plan_off = plan_one_slot(trainer, groups, model, off)
    assert torch.equal(plan_off.advantages, plan.advantages)
    assert int(plan_off.batches[0]["completion_mask"].sum()) > int(mask.sum())


# ------------------------------------------------------------------------------------------------ curriculum


def test_the_curriculum_judges_spread_with_the_reward_in_use(tmp_path, pool):
    trainer = scripted_trainer(
        tmp_path / "out",
        pool,
        **{"curriculum.enabled": True, "grpo.correctness_reward": "fraction", "grpo.scale_rewards": False},
    )
    groups, _ = trainer.collect_rollouts()
    partial = [
        [
            dataclasses.replace(
                s,
                result=types.SimpleNamespace(passed=False),
                reward=Reward(1 / 3 if j == 1 else 0.0, 1 / 3 if j == 1 else 0.0, 1.0),
            )
            for j, s in enumerate(g)
        ]
        for g in groups
    ]
    maker = trainer.rollouts.maker
    share = RoundShare(list(range(len(partial))), [], [], partial, {})
    [metrics] = maker.observe_curriculum([share], [maker.peers.rank])
    assert all(trainer.curriculum.settled(i) is None for i in range(len(partial)))
    assert metrics["curriculum/zero_spread_share"] == 0.0


# ------------------------------------------------------------------------------------------------ OPD


def test_the_default_opd_clip_bounds_a_ruled_out_token():
    clip = build_config("gpu").dual_source.opd_advantage_clip
    assert clip > 0
    student = torch.full((1, 100), -1.0)
    teacher = torch.full((1, 100), -1.5)
    teacher[0, :3] = -9999.0  # three tokens the teacher rules out (vLLM's -inf)
    advantages, metrics = opd_token_advantages(student, teacher, torch.ones(1, 100), clip)
    assert float(advantages.min()) >= -20.0
    assert metrics["opd/clipped_frac"] == pytest.approx(0.03)
    assert metrics["opd/advantage_p01"] == pytest.approx(-9998.0)  # the tail the mean hides, before the clip
    assert metrics["opd/advantage_p99"] == pytest.approx(-0.5)


# ------------------------------------------------------------------------------------------------ switched-off terms


def test_a_linear_sft_schedule_that_starts_at_zero_turns_on(tmp_path, pool):
    rising = {"dual_source.teacher_sft_weight": 0.0, "dual_source.teacher_sft_final_weight": 0.3}
    linear = {"dual_source.sft_weight_schedule": "linear", "training.max_steps": 4}
    trainer = scripted_trainer(tmp_path / "out", pool, **rising, **linear)
    assert len(trainer.teacher_sft) > 0
    assert trainer.sft_weights(2)[0] == pytest.approx(0.15)


@pytest.mark.parametrize("key", ["dual_source.teacher_sft_final_weight", "dual_source.self_sft_final_weight"])
def test_final_sft_weights_must_not_be_negative(key):
    with pytest.raises(ConfigError, match=key.split(".")[1]):
        build_config("cpu", overrides=[f"{key}=-0.1"])


class NoRollouts(ScriptedRollout):
    def sample(self, prompts, num_samples, *, seed=None):
        raise AssertionError("nothing in this objective uses rollouts")


def test_teacher_sft_only_pays_for_no_rollouts_and_no_grpo_pass(tmp_path, pool):
    trainer = scripted_trainer(
        tmp_path / "out",
        pool,
        NoRollouts,
        **{
            "dual_source.grpo_weight": 0.0,
            "dual_source.self_sft_weight": 0.0,
            "grpo.kl_coef": 0.0,
            "training.max_steps": 2,
        },
    )
    before = lora_state(trainer.model)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(m["loss/teacher_sft"] > 0 and "loss/grpo" not in m for m in lines)
    assert any(not torch.equal(before[k], v) for k, v in lora_state(trainer.model).items())


def test_grpo_weight_zero_with_kl_off_runs_no_grpo_pass(tmp_path, pool, monkeypatch):
    trainer = scripted_trainer(
        tmp_path / "out",
        pool,
        **{"dual_source.grpo_weight": 0.0, "grpo.kl_coef": 0.0, "dual_source.self_sft_weight": 0.2},
    )
    groups = with_spread(trainer.collect_rollouts()[0])
    calls = []
    monkeypatch.setattr(type(trainer.passes), "grpo_pass", lambda *a, **k: calls.append(1) or {})
    trainer.train_on_rollouts(groups, {})
    assert calls == []


# ------------------------------------------------------------------------------------------------ kv sampler


def test_kv_logprobs_are_those_of_the_truncated_distribution_it_sampled():
    from rollouts.kv_sampler import DecoderWeights, sample_token_ids, warp_logits
    from rollouts.sampling import SamplingSettings
    from utils.student_model import EMBEDDED_MODELS, load_student

    model, tokenizer = load_student(EMBEDDED_MODELS[1], "float32", device="cpu")
    model.eval()
    weights = DecoderWeights.from_model(model, torch.float32)
    knobs = SamplingSettings(temperature=1.0, top_p=0.5)
    torch.manual_seed(0)
    prompt = [5, 6, 7, 8]
    rows = sample_token_ids(weights, [prompt], 3, 6, knobs=knobs, stop_token_ids=set(), pad_id=tokenizer.pad_token_id)[
        0
    ]
    for row in rows:
        ids = torch.tensor([prompt + list(row.token_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]  # (T, V): position t predicts token t
        warped = warp_logits(logits, knobs).log_softmax(-1)
        expected = warped.gather(-1, torch.tensor(row.token_ids).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(torch.tensor(row.logprobs), expected, atol=2e-4), (row.logprobs, expected)


def test_a_single_term_arms_weight_is_inert_under_adamw(tmp_path, pool):
    """With teacher-SFT as the only term, its weight scales the loss and every gradient by one constant, which
    AdamW's update (m / sqrt(v)) divides out: weight 0.3 trains like weight 1 (documented at
    dual_source.teacher_sft_weight; a single-term run is SFT at training.learning_rate)."""
    deltas = {}
    for weight in (0.3, 1.0):
        trainer = scripted_trainer(
            tmp_path / str(weight),
            pool,
            NoRollouts,
            **{
                "dual_source.grpo_weight": 0.0,
                "dual_source.self_sft_weight": 0.0,
                "dual_source.teacher_sft_weight": weight,
                "grpo.kl_coef": 0.0,
                "training.max_steps": 1,
            },
        )
        before = lora_state(trainer.model)
        trainer.train()
        after = lora_state(trainer.model)
        deltas[weight] = math.sqrt(sum(float(((after[k] - before[k]) ** 2).sum()) for k in before))
    assert deltas[1.0] > 0
    assert deltas[1.0] / deltas[0.3] == pytest.approx(1.0, abs=0.05)  # not 1 / 0.3 = 3.3
