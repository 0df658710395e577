"""The trainer honours a rollout's per-token action mask.

A completion may carry `action_mask` over its `token_ids` (1 = sampled by the policy, 0 = inserted by
the environment: a `<result>` block, a feedback turn). Environment tokens are never trained on and
never counted: not by the surrogate, the KL, the aggregation's denominators, the importance-sampling
correction, nor self-SFT labels. No mask means all ones, and gives exactly today's loss.
"""

from __future__ import annotations

import copy
import dataclasses
import types

import pytest
import torch

from rollouts.completion import RolloutCompletion
from tests.trainer_helpers import ScriptedRollout, scripted_trainer, small_tasks, teacher_examples
from training import passes
from training.batching import completion_logprobs, pad_rollout_batch, slice_rollout_batch
from training.losses import IGNORE_INDEX, aggregation_units, grpo_loss, kl_loss, step_denominator
from training.shared_prompt import SharedPromptForward
from utils.sft_data import encode_prompt, end_of_turn_id
from utils.student_model import load_student

RESULT = "\n<result>\n3\n</result>\n"  # what a tool environment inserts after a program


class ScriptedToolRollout(ScriptedRollout):
    """ScriptedRollout's completions with a tool call: policy tokens, an environment `<result>` block
    (action mask 0), then the policy's answer. Optionally with sampler log-probs (vLLM's convention:
    0.0 at environment positions), set later by the test."""

    def sample(self, prompts, num_samples, *, seed=None):
        eot = end_of_turn_id(self.tokenizer)
        groups = super().sample(prompts, num_samples)
        out = []
        for group in groups:
            out.append([])
            for sample in group:
                code = sample.text.split("```python\n", 1)[1].rsplit("\n```", 1)[0]
                first = self.tokenizer("<think>\nplan\n<program>print(1 + 2)</program>", add_special_tokens=False)[
                    "input_ids"
                ]
                result = self.tokenizer(RESULT, add_special_tokens=False)["input_ids"]
                answer = self.tokenizer(f"</think>\n\n```python\n{code}\n```", add_special_tokens=False)[
                    "input_ids"
                ] + [eot]
                out[-1].append(
                    dataclasses.replace(
                        sample,
                        token_ids=tuple(first + result + answer),
                        action_mask=(1,) * len(first) + (0,) * len(result) + (1,) * len(answer),
                    )
                )
        return out


def make_trainer(tmp_path, pool, rollout_class=ScriptedToolRollout, **overrides):
    return scripted_trainer(tmp_path / "out", pool, rollout_class, **overrides)


def _samples(groups):
    return [s for g in groups for s in g]


def _completion(prompt_ids, token_ids, action_mask=None):
    return RolloutCompletion("", tuple(token_ids), tuple(prompt_ids), "stop", action_mask=action_mask)


def _replaced(groups, change):
    """The scored groups with `change(sample) -> dict` applied to each sample's completion."""
    return [
        [dataclasses.replace(s, completion=dataclasses.replace(s.completion, **change(s))) for s in g] for g in groups
    ]


def test_the_padded_batch_masks_environment_tokens_and_keeps_their_width():
    samples = [
        _completion([1, 2], [5, 6, 7, 8], (1, 0, 0, 1)),
        _completion([3], [9, 10, 11], (1, 1, 0)),  # ends on environment tokens
        _completion([4], [12, 13]),
    ]  # no mask: all policy tokens
    batch = pad_rollout_batch(samples, 0)
    assert batch["completion_mask"].tolist() == [[1, 0, 0, 1], [1, 1, 0, 0], [1, 1, 0, 0]]
    part, width = slice_rollout_batch(batch, [1])
    assert width == 3  # the environment token at the end is still part of the sequence the model reads
    assert part["completion_ids"].tolist() == [[9, 10, 11]] and part["completion_mask"].tolist() == [[1, 1, 0]]
    with pytest.raises(ValueError, match="action_mask"):  # the record refuses a mask of another length
        pad_rollout_batch([_completion([1], [5, 6], (1,))], 0)


def test_loss_and_denominators_by_hand_with_environment_tokens():
    # two sequences of 5 completion tokens; row 0 has 3 policy tokens, row 1 has 2
    mask = torch.tensor([[1, 0, 0, 1, 1], [1, 1, 0, 0, 0]])
    logp = torch.randn(2, 5)
    advantages = torch.tensor([1.0, -0.5])
    # ratio 1, no KL: each policy token's loss is -A; environment tokens count nowhere
    token_mean = -(1.0 * 3 - 0.5 * 2) / 5
    seq_mean = -(1.0 - 0.5) / 2
    sum_norm = -(1.0 * 3 - 0.5 * 2) / (2 * 8)
    for mode, expected, units in (
        ("token-mean", token_mean, 5.0),
        ("micro-token-mean", token_mean, 5.0),
        ("seq-mean-token-mean", seq_mean, 2.0),
        ("seq-mean-token-sum-norm", sum_norm, 2.0),
    ):
        assert aggregation_units(mask, mode) == units
        denominator = step_denominator(units, mode, 8)
        loss, _ = grpo_loss(
            logp, logp.detach(), advantages, mask, aggregation=mode, norm_length=8, denominator=denominator
        )
        assert float(loss) == pytest.approx(expected, abs=1e-6), mode
        kl, metrics = kl_loss(
            logp, logp.detach() - 0.3 * (1 - mask), mask, aggregation=mode, norm_length=8, denominator=denominator
        )
        assert float(kl) == 0.0 and metrics["kl"] == 0.0  # the reference differs only on environment tokens


def test_environment_log_probs_far_from_the_reference_stay_finite():
    """An environment token the policy finds very unlikely (log-prob -200 vs the reference's -1) would
    overflow exp() in the ratio or the k3 KL; masked out, it must not turn the loss into NaN."""
    mask = torch.tensor([[1, 0, 1]])
    logp = torch.tensor([[-1.0, -200.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0, -2.0]])
    old = torch.tensor([[-1.0, 50.0, -2.0]])
    surrogate, metrics = grpo_loss(logp, old, torch.tensor([1.0]), mask)
    kl, kl_metrics = kl_loss(logp, ref, mask)
    loss = surrogate + 0.1 * kl
    metrics.update(kl_metrics)
    loss.backward()
    assert torch.isfinite(loss) and all(v == v for v in metrics.values())
    assert logp.grad[0, 1] == 0.0 and logp.grad[0, 0] != 0.0


def test_a_multi_turn_sequence_has_the_same_log_probs_in_one_forward_as_turn_by_turn(tiny_model_name):
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    prompt = encode_prompt(tokenizer, "write add")
    turn1 = tokenizer("<think>\n<program>print(1)</program>", add_special_tokens=False)["input_ids"]
    result = tokenizer(RESULT, add_special_tokens=False)["input_ids"]
    turn2 = tokenizer("</think>\n```python\nx = 1\n```", add_special_tokens=False)["input_ids"]
    whole = _completion(prompt, turn1 + result + turn2, (1,) * len(turn1) + (0,) * len(result) + (1,) * len(turn2))
    other = _completion(encode_prompt(tokenizer, "a longer prompt that pads the others on the left"), [5, 6])
    first = _completion(prompt, turn1)
    second = _completion(prompt + turn1 + result, turn2)  # the second turn's own sampling context
    with torch.no_grad():
        one_forward = completion_logprobs(model, pad_rollout_batch([whole, other], tokenizer.pad_token_id))[0]
        by_turn = completion_logprobs(model, pad_rollout_batch([first, second, other], tokenizer.pad_token_id))
    assert torch.allclose(one_forward[: len(turn1)], by_turn[0, : len(turn1)], atol=1e-5)
    assert torch.allclose(
        one_forward[len(turn1) + len(result) : len(whole.token_ids)], by_turn[1, : len(turn2)], atol=1e-5
    )


@pytest.mark.slow
@pytest.mark.parametrize("shared_prompt", [False, True])
def test_environment_tokens_carry_exactly_zero_gradient(tmp_path, pool, monkeypatch, shared_prompt):
    """Through the trainer's whole GRPO path (KL on, mu = 2, sampler log-probs with importance
    sampling; full-row or shared-prompt forwards): the gradient reaching each completion token's
    log-prob is exactly 0 on environment tokens and not 0 on policy tokens."""
    seen = []
    real = passes.completion_logprobs  # the GRPO pass's forward (training.passes)
    real_shared = SharedPromptForward.logprobs  # its forward with the shared prompt

    def keep_gradient(model, batch, temperature=1.0):
        logp = real(model, batch, temperature)
        if logp.requires_grad:
            logp.retain_grad()
            seen.append((batch["completion_ids"].clone(), logp))
        return logp

    def keep_shared_gradient(self, rows, temperature=1.0):
        logp = real_shared(self, rows, temperature)
        if logp.requires_grad:
            logp.retain_grad()
            seen.append((slice_rollout_batch(self.batch, rows)[0]["completion_ids"].clone(), logp))
        return logp

    monkeypatch.setattr(passes, "completion_logprobs", keep_gradient)
    monkeypatch.setattr(SharedPromptForward, "logprobs", keep_shared_gradient)
    trainer = make_trainer(
        tmp_path,
        pool,
        **{
            "grpo.num_iterations": 2,
            "dual_source.teacher_sft_weight": 0.0,
            "dual_source.self_sft_weight": 0.0,
            "training.shared_prompt_forward": shared_prompt,
        },
    )
    groups, rollout_metrics = trainer.collect_rollouts()
    # vLLM's convention: a log-prob per token, 0.0 at environment positions
    groups = _replaced(groups, lambda s: {"logprobs": tuple(-1.0 if m else 0.0 for m in s.completion.action_mask)})
    trainer.train_on_rollouts(groups, rollout_metrics)
    masks = {s.completion.token_ids: s.completion.action_mask for s in _samples(groups)}
    environment, policy = [], []
    for ids, logp in seen:
        for row in range(ids.shape[0]):
            tokens = next(t for t in masks if ids[row, : len(t)].tolist() == list(t))
            grad = logp.grad[row, : len(tokens)]
            environment += [float(g) for g, m in zip(grad, masks[tokens], strict=True) if m == 0]
            policy += [float(g) for g, m in zip(grad, masks[tokens], strict=True) if m == 1]
    assert environment and all(g == 0.0 for g in environment)
    assert any(g != 0.0 for g in policy)


def _step_gradient(trainer, groups, rollout_metrics):
    captured = {}

    def record(*args, **kwargs):
        captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.optimizer.step = record
    metrics = trainer.train_on_rollouts(groups, rollout_metrics)[0]
    return captured, metrics


@pytest.mark.slow
def test_the_first_step_loss_counts_only_policy_tokens(tmp_path, pool):
    """Step 1 (adapter = identity: ratio 1, KL 0): token-mean GRPO loss = -sum_i A_i n_i / sum_i n_i over
    the policy tokens n_i of each sample; importance sampling is measured over policy tokens only."""
    trainer = make_trainer(
        tmp_path,
        pool,
        **{"dual_source.teacher_sft_weight": 0.0, "dual_source.self_sft_weight": 0.0, "grpo.kl_coef": 0.0},
    )
    groups, rollout_metrics = trainer.collect_rollouts()

    def sampler_logprobs(sample):  # the sampler agrees with the policy on every policy token
        batch = pad_rollout_batch([sample.completion], trainer.tokenizer.pad_token_id)
        with torch.no_grad():
            logp = completion_logprobs(trainer.model, batch)[0]
        mask = sample.completion.action_mask
        return {"logprobs": tuple(float(v) if m else 0.0 for v, m in zip(logp, mask, strict=True))}

    groups = _replaced(groups, sampler_logprobs)
    samples = [s.completion for s in _samples(groups)]
    from training.update_plan import rollout_advantages

    advantages = rollout_advantages(groups, trainer.grpo.scale_rewards)[0].reshape(-1)
    policy_tokens = torch.tensor([float(sum(s.action_mask)) for s in samples])
    assert (policy_tokens < torch.tensor([float(len(s.token_ids)) for s in samples])).all()
    expected = -float((advantages * policy_tokens).sum() / policy_tokens.sum())
    _, metrics = _step_gradient(trainer, groups, rollout_metrics)
    assert metrics["loss/grpo"] == pytest.approx(expected, abs=1e-6)
    assert metrics["rollout/logp_abs_diff"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow
def test_an_all_ones_mask_gives_exactly_todays_loss(tmp_path, pool):
    trainer = make_trainer(tmp_path, pool, rollout_class=ScriptedRollout, **{"grpo.num_iterations": 2})
    groups, rollout_metrics = trainer.collect_rollouts()
    with_mask = _replaced(copy.deepcopy(groups), lambda s: {"action_mask": (1,) * s.completion.num_tokens})
    buffer, teacher_rng = copy.deepcopy(trainer.buffer.state()), trainer.teacher_rng.getstate()
    plain_grads, plain_metrics = _step_gradient(trainer, groups, dict(rollout_metrics))
    trainer.model.zero_grad(set_to_none=True)
    trainer.buffer.load(buffer)  # the same self-SFT and teacher-SFT draws for the second run
    trainer.teacher_rng.setstate(teacher_rng)
    trainer.state.global_step = 0
    masked_grads, masked_metrics = _step_gradient(trainer, with_mask, dict(rollout_metrics))
    assert plain_grads.keys() == masked_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        assert torch.equal(grad, masked_grads[name]), name
    for key, value in plain_metrics.items():
        if not key.startswith("time/"):
            assert masked_metrics[key] == value, key


def test_self_sft_never_trains_on_environment_tokens(tmp_path, pool):
    trainer = make_trainer(tmp_path, pool)
    groups, _ = trainer.collect_rollouts()
    passed, failed = types.SimpleNamespace(passed=True), types.SimpleNamespace(passed=False)
    groups = [
        [dataclasses.replace(s, result=passed if (g, j) == (0, 0) else failed) for j, s in enumerate(group)]
        for g, group in enumerate(groups)
    ]
    sample = groups[0][0].completion
    fresh = trainer._self_sft_examples(groups)
    prompt = len(sample.prompt_ids)
    labels = fresh[0]["labels"][prompt:]
    assert labels == [t if m else IGNORE_INDEX for t, m in zip(sample.token_ids, sample.action_mask, strict=True)]
    assert IGNORE_INDEX in labels
    groups = [[dataclasses.replace(s, result=failed) for s in group] for group in groups]
    trainer.buffer.load(trainer.buffer.state())  # as a resumed run finds it in its checkpoint
    assert trainer._self_sft_examples(groups) == fresh  # a buffered replay keeps the mask


def test_a_multi_turn_teacher_trace_trains_only_on_the_teachers_tokens(tiny_model_name):
    from utils.sft_data import build_sft_example, encode_conversation
    from utils.student_model import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_name)
    turns = [
        {
            "role": "assistant",
            "content": f"<think>\n<program>print(1 + 2)</program>{RESULT}ok\n</think>\n\n"
            "```python\ndef add(a, b):\n    return a - b\n```",
        },
        {"role": "user", "content": "assert add(1, 2) == 3 failed: got -1"},
        {"role": "assistant", "content": "```python\ndef add(a, b):\n    return a + b\n```"},
    ]
    prompt_ids, ids, mask = encode_conversation(tokenizer, "write add", turns)
    # the exchange reads exactly as the chat template renders it (minus what follows the last end of turn)
    rendered = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": __import__("utils.prompts", fromlist=["x"]).SYSTEM_PROMPT_UNIFIED},
            {"role": "user", "content": "write add"},
            *turns,
        ],
        tokenize=False,
    )
    assert rendered.startswith(tokenizer.decode(prompt_ids + ids))
    assert rendered[len(tokenizer.decode(prompt_ids + ids)) :].strip() == ""
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    environment = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "<result>" not in trained and "3" not in trained.split("print(1 + 2)")[1].split("ok")[0]
    assert "failed: got -1" in environment and "<result>" in environment and "return a + b" not in environment
    assert trained.count(tokenizer.convert_ids_to_tokens(end_of_turn_id(tokenizer))) == 2  # each reply ends its turn
    example = build_sft_example(prompt_ids, ids, 10_000, mask)
    labels = example["labels"][len(prompt_ids) :]
    assert labels == [t if m else IGNORE_INDEX for t, m in zip(ids, mask, strict=True)]


def test_teacher_sft_on_multi_turn_traces_masks_the_environment(tmp_path, pool):
    trainer = make_trainer(tmp_path, pool)
    tasks = small_tasks()
    code = tasks[0].reference_solutions[0]
    traces = [
        dataclasses.replace(
            teacher_examples(tasks)[0],
            messages=(
                {"role": "assistant", "content": "```python\ndef nothing():\n    return 0\n```"},
                {"role": "user", "content": "assert failed: NameError"},
                {"role": "assistant", "content": f"```python\n{code}\n```"},
            ),
        )
    ]
    from training.sft_sources import build_teacher_sft

    config = trainer.parts.files.config
    built, _ = build_teacher_sft(
        traces,
        trainer.tokenizer,
        config.dual_source,
        chat_template_kwargs=config.student.chat_template_kwargs,
        rollout_budget=config.grpo.max_new_tokens,
    )
    labels = [t for t in built[0]["labels"] if t != IGNORE_INDEX]
    trained = trainer.tokenizer.decode(labels)
    assert "return 0" in trained and code.strip().splitlines()[-1].strip() in trained
    assert "NameError" not in trained and "NameError" in trainer.tokenizer.decode(built[0]["input_ids"])


def test_a_feedback_mode_trace_from_phase_2_becomes_the_exchange_teacher_sft_trains_on(tmp_path):
    import json

    from synthesis.generate_traces import load_teacher_examples

    turns = [
        {
            "response": "```python\nx = 0\n```",
            "reasoning": None,
            "feedback": "assert f() == 1 failed: got 0",
            "truncated": False,
        },
        {"response": "```python\nx = 1\n```", "reasoning": None, "feedback": None, "truncated": False},
    ]
    path = tmp_path / "traces.jsonl"
    row = {
        "task_id": "a/1",
        "sample_idx": 0,
        "prompt": "p",
        "thinking": "",
        "code": "x = 1",
        "passed": True,
        "status": "passed",
        "mode": "feedback",
        "num_turns": 2,
        "turns": turns,
    }
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "task_id": "a/2", "turns": None, "mode": None}) + "\n")
    by_task = {e.task_id: e for e in load_teacher_examples(path, {"a/1", "a/2"}, True)}
    assert by_task["a/1"].conversation() == [
        {"role": "assistant", "content": "```python\nx = 0\n```"},
        {"role": "user", "content": "assert f() == 1 failed: got 0"},
        {"role": "assistant", "content": "```python\nx = 1\n```"},
    ]
    assert by_task["a/2"].conversation() is None  # single-turn: the canonical target, as before
