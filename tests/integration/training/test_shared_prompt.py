"""The shared-prompt forward (`training.shared_prompt`): each prompt read once for the rows that share it gives
today's full-row log-probs and gradients, in the policy passes, the reference and old forwards and the local
teacher; and it steps aside, saying so, where it cannot be used."""

from __future__ import annotations

import logging

import pytest
import torch

from rollouts.completion import RolloutCompletion
from tests.trainer_helpers import scripted_trainer
from training.batching import (
    chunked_completion_logprobs,
    completion_logprobs,
    pad_rollout_batch,
    row_chunks,
    slice_rollout_batch,
)
from training.shared_prompt import SharedPromptForward, shared_chunked_completion_logprobs
from training.teacher_logprobs import LocalTeacherScorer
from utils.sft_data import encode_prompt
from utils.student_model import EMBEDDED_MODELS, attach_lora, load_student

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _samples(tokenizer) -> list[RolloutCompletion]:
    """Two groups with prompts of different lengths (left padding), interleaved as micro-batch slots mix them,
    completions of different lengths, and multi-turn rows whose environment tokens are masked out."""
    long = tuple(encode_prompt(tokenizer, "a much longer prompt with quite a few more words in it"))
    short = tuple(encode_prompt(tokenizer, "short"))
    third = tuple(encode_prompt(tokenizer, "a third prompt, alone"))

    def row(prompt, tokens, action=None):
        return RolloutCompletion("", tuple(tokens), prompt, "stop", action_mask=action)

    return [
        row(long, [8, 9]),
        row(short, [5, 6, 7, 11, 12, 13]),
        row(long, [4, 5, 6, 7, 8, 30, 31], (1, 1, 0, 0, 0, 1, 1)),  # turn, tool result, turn
        row(short, [3]),
        row(third, [40, 41, 42, 43]),
        row(long, [10, 11, 12]),
        row(short, [20, 21, 22, 23], (1, 0, 0, 1)),
    ]


def _lora_tiny(seed: int = 0):
    model, tokenizer = load_student(EMBEDDED_MODELS[1], "float32", device="cpu")
    torch.manual_seed(seed)
    model = attach_lora(model, 8, 16, 0.0, TARGETS)
    for name, p in model.named_parameters():  # LoRA B starts at 0: give the adapter a real effect
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    return model, tokenizer


def _slice(batch, rows):
    return slice_rollout_batch(batch, rows)[0]


def _real(batch) -> torch.Tensor:
    """(B, T) 1 on every real completion token, environment tokens included (they are predicted too)."""
    width = batch["completion_ids"].shape[1]
    return batch["attention_mask"][:, -width:].float()


@pytest.mark.parametrize("chunk", [1, 2, 3, 0])
def test_shared_prompt_logprobs_equal_full_row_logprobs(tiny_model_name, chunk):
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    batch = pad_rollout_batch(_samples(tokenizer), tokenizer.pad_token_id)
    real = _real(batch)
    with torch.no_grad():
        whole = completion_logprobs(model, batch)  # (B, T) today's full-row forward
        shared = shared_chunked_completion_logprobs(model, batch, chunk)
    assert torch.allclose(shared * real, whole * real, atol=1e-5), (shared - whole).mul(real).abs().max()
    assert real.sum() > batch["completion_mask"].sum()  # environment tokens were compared too


@pytest.mark.slow
def test_shared_prompt_logprobs_equal_on_the_embedded_smollm2():
    model, tokenizer = load_student(EMBEDDED_MODELS[0], "float32", device="cpu")
    batch = pad_rollout_batch(_samples(tokenizer)[:4], tokenizer.pad_token_id)
    real = _real(batch)
    with torch.no_grad():
        whole = completion_logprobs(model, batch)
        shared = shared_chunked_completion_logprobs(model, batch, 2)
    assert torch.allclose(shared * real, whole * real, atol=1e-4), (shared - whole).mul(real).abs().max()


@pytest.mark.parametrize("chunk", [1, 2, 0])
def test_shared_prompt_gradients_equal_full_row_gradients(chunk):
    """One backward per chunk through the shared prefix (the prompt forward backpropagated once, after its
    group's last chunk) gives the LoRA gradient of today's per-chunk full-row forwards."""
    model, tokenizer = _lora_tiny()
    batch = pad_rollout_batch(_samples(tokenizer), tokenizer.pad_token_id)
    weights = torch.randn(batch["completion_ids"].shape, generator=torch.Generator().manual_seed(1))  # (B, T)
    weights = weights * batch["completion_mask"]
    chunks = row_chunks(batch["completion_ids"].shape[0], chunk)

    def grads(shared: bool) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        runner = SharedPromptForward(model, batch, chunks) if shared else None
        assert runner is None or runner.enabled
        for rows in chunks:
            if runner is not None:
                logp = runner.logprobs(rows, 0.7)
            else:
                logp = completion_logprobs(model, _slice(batch, rows), 0.7)
            (logp * weights[rows, : logp.shape[1]]).sum().backward()
            if runner is not None:
                runner.release(rows)
        assert runner is None or not runner.live  # every prompt graph was backpropagated and freed
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    today, shared = grads(False), grads(True)
    assert today.keys() == shared.keys() and len(today) > 0
    for name in today:
        assert torch.allclose(shared[name], today[name], rtol=1e-4, atol=1e-6), name
    assert any(today[n].abs().sum() > 0 for n in today if "layers.0." in n)  # nothing trivially zero


def _step_grads(tmp_path, pool, **overrides):
    trainer = scripted_trainer(tmp_path, pool, **overrides)
    captured: dict[str, torch.Tensor] = {}

    def record(*args, **kwargs):
        captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.optimizer.step = record
    groups, rollout_metrics = trainer.collect_rollouts()
    metrics = trainer.train_on_rollouts(groups, rollout_metrics)
    return captured, metrics


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        {"training.forward_chunk_size": 2},
        {"training.forward_chunk_size": 0, "grpo.num_iterations": 2},  # old log-probs through the shared path
        {"training.forward_chunk_size": 3, "grpo.loss_aggregation": "seq-mean-token-mean"},
    ],
)
def test_a_grpo_step_has_the_same_gradient_and_metrics_with_the_shared_prompt(tmp_path, pool, overrides):
    """Policy (with the KL's reference forward, adapter disabled): the whole step's LoRA gradient and loss
    metrics, shared path on vs off."""
    base = {"dual_source.teacher_sft_weight": 0, "dual_source.self_sft_weight": 0, **overrides}
    off, off_metrics = _step_grads(tmp_path / "off", pool, **base, **{"training.shared_prompt_forward": False})
    on, on_metrics = _step_grads(tmp_path / "on", pool, **base, **{"training.shared_prompt_forward": True})
    assert off.keys() == on.keys() and any(g.abs().sum() > 0 for g in off.values())
    for name in off:
        assert torch.allclose(on[name], off[name], rtol=1e-4, atol=1e-7), name
    assert len(on_metrics) == len(off_metrics)
    for a, b in zip(on_metrics, off_metrics, strict=True):
        for key in ("loss/grpo", "loss/total", "kl", "ratio/mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key


def test_reference_logprobs_equal_with_the_adapter_disabled():
    model, tokenizer = _lora_tiny()
    batch = pad_rollout_batch(_samples(tokenizer), tokenizer.pad_token_id)
    real = _real(batch)
    with torch.no_grad(), model.disable_adapter():
        today = chunked_completion_logprobs(model, batch, 2, 0.7)
        shared = shared_chunked_completion_logprobs(model, batch, 2, 0.7)
    with torch.no_grad():
        policy = chunked_completion_logprobs(model, batch, 2, 0.7)
    assert torch.allclose(shared * real, today * real, atol=1e-5)
    assert not torch.allclose(policy * real, today * real, atol=1e-3)  # the adapter was really off


def test_the_local_teacher_scores_the_same_with_the_shared_prompt(tiny_model_name):
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    samples = _samples(tokenizer)
    today = LocalTeacherScorer(model, tokenizer.pad_token_id, 2).score(samples)
    shared = LocalTeacherScorer(model, tokenizer.pad_token_id, 2, shared_prompt=True).score(samples)
    for a, b in zip(today.logprobs, shared.logprobs, strict=True):
        assert len(a) == len(b) and torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


def test_gradient_checkpointing_falls_back_to_full_rows_and_says_so(caplog):
    model, tokenizer = _lora_tiny()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = pad_rollout_batch(_samples(tokenizer), tokenizer.pad_token_id)
    with caplog.at_level(logging.WARNING, logger="training.shared_prompt"):
        runner = SharedPromptForward(model, batch, row_chunks(7, 2))
    assert not runner.enabled and "gradient checkpointing" in caplog.text
    with torch.no_grad():
        assert torch.allclose(runner.logprobs([0, 1]), completion_logprobs(model, _slice(batch, [0, 1])))


def test_a_model_that_ignores_the_cache_it_is_given_is_refused(tiny_model_name):
    """Never log-probs of completions without their prompt: a forward that does not extend the cache raises."""
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    batch = pad_rollout_batch(_samples(tokenizer), tokenizer.pad_token_id)
    forward = model.forward

    def forgetful(*args, past_key_values=None, **kwargs):
        return forward(
            *args, past_key_values=None if kwargs.get("input_ids").shape[0] > 1 else past_key_values, **kwargs
        )

    model.forward = forgetful
    runner = SharedPromptForward(model, batch, row_chunks(7, 2))
    with torch.no_grad(), pytest.raises(RuntimeError, match="did not extend the prompt cache"):
        runner.logprobs([0, 1])
