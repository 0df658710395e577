"""Guided samples on the transformers samplers (hf, kv): each continues the prompt *and* the teacher's prefix, within
what the prefix leaves of the budget, and the kv sampler's log-probs are the trainer's in the guided context. (The
vLLM backends: tests/vllm_cpu/test_guided_engine.py, on the real engine.)"""

from __future__ import annotations

import pytest
import torch

from rollouts.groups import sample_from_prefixes
from rollouts.hf import HFRollout
from rollouts.kv_sampler import KVCacheRollout
from rollouts.sampling import SamplingSettings
from training.batching import chunked_completion_logprobs, pad_rollout_batch
from utils.dataset_loader import EMBEDDED_MBPP, load_mbpp
from utils.prompts import get_unified_prompt
from utils.sft_data import build_sft_target, encode_prompt, encode_response
from utils.student_model import EMBEDDED_MODELS, attach_lora, load_student

BUDGET = 16
PREFIX = 6


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model, tokenizer = load_student(EMBEDDED_MODELS[1], "float32", device="cpu")
    model = attach_lora(model, 8, 16, 0.0, ["q_proj", "v_proj"])
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0.0, 0.05)
    model.eval()
    return model, tokenizer


def prompts_and_prefixes(tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    tasks = load_mbpp(EMBEDDED_MBPP)[0][:2]
    prompts = [encode_prompt(tokenizer, get_unified_prompt(t, 1)) for t in tasks]
    answers = [encode_response(tokenizer, build_sft_target("Think.", t.reference_solutions[0])) for t in tasks]
    return prompts, [a[:PREFIX] for a in answers]


def check_records(groups, prompts, prefixes, num_samples):
    assert len(groups) == len(prompts) and all(len(g) == num_samples for g in groups)
    for group, prompt, prefix in zip(groups, prompts, prefixes, strict=True):
        for record in group:
            assert record.prompt_ids == tuple(prompt) and record.token_ids[:PREFIX] == tuple(prefix)
            assert record.action_mask == (0,) * PREFIX + (1,) * (record.num_tokens - PREFIX)
            assert record.teacher_prefix_tokens == PREFIX and PREFIX < record.num_tokens <= BUDGET


def greedy_chain(model, ids: list[int], steps: int) -> list[int]:
    out = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            out.append(int(model(input_ids=torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids) :]


def test_hf_continues_prompt_and_prefix_greedily_as_the_model_would(tiny):
    model, tokenizer = tiny
    rollout = HFRollout(tokenizer, BUDGET, SamplingSettings(temperature=0.0), batch_size=2)
    prompts, prefixes = prompts_and_prefixes(tokenizer)
    groups = sample_from_prefixes(rollout, model, prompts, prefixes, 2)
    check_records(groups, prompts, prefixes, 2)
    for group, prompt, prefix in zip(groups, prompts, prefixes, strict=True):
        own = list(group[0].token_ids[PREFIX:])
        assert own == greedy_chain(model, prompt + prefix, len(own))  # the continuation of prompt + prefix
        assert own[:3] != greedy_chain(model, prompt, 3)  # not of the prompt alone


def test_kv_continues_prompt_and_prefix_with_the_trainers_log_probs_in_the_guided_context(tiny):
    model, tokenizer = tiny
    settings = SamplingSettings(temperature=0.7)
    rollout = KVCacheRollout(tokenizer, BUDGET, settings, dtype="float32")
    prompts, prefixes = prompts_and_prefixes(tokenizer)
    torch.manual_seed(1)
    groups = sample_from_prefixes(rollout, model, prompts, prefixes, 3)
    check_records(groups, prompts, prefixes, 3)
    samples = [s for g in groups for s in g]
    assert all(s.logprobs[:PREFIX] == (0.0,) * PREFIX for s in samples)
    batch = pad_rollout_batch(samples, tokenizer.pad_token_id)
    with torch.no_grad():
        trainer = chunked_completion_logprobs(model, batch, 2, settings.temperature)
    mask = batch["completion_mask"].bool()
    assert int(mask.sum()) == sum(s.num_tokens - PREFIX for s in samples)
    assert (trainer - batch["sampling_logps"])[mask].abs().max() < 2e-4


def test_the_colocated_vllm_sampler_sends_prompt_and_prefix_as_token_ids(tmp_path, monkeypatch):
    """The fake engine (tests/fake_vllm.py) sees each guided request as prompt + prefix ids with what the prefix
    leaves of the budget; the real engine's answer to them: tests/vllm_cpu/test_guided_engine.py."""
    from rollouts.from_config import build_sampler
    from tests import fake_vllm
    from tests.trainer_helpers import tiny_config

    fake_vllm.ENGINES.clear()
    fake_vllm.install(monkeypatch)
    seen: list[list[int]] = []

    def responder(ids, index, rng):
        seen.append(list(ids))
        return "abc", [101, 102, 103]

    monkeypatch.setattr(fake_vllm.FakeLLM, "responder", staticmethod(responder))
    config = tiny_config(tmp_path, **{"grpo.rollout_backend": "vllm", "grpo.vllm_weight_sync": "adapter"})
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    model = attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules)
    rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
    prompts, prefixes = prompts_and_prefixes(tokenizer)
    groups = sample_from_prefixes(rollout, model, prompts, prefixes, 2)
    assert seen == [p + x for p, x in zip(prompts, prefixes, strict=True) for _ in range(2)]
    [engine] = fake_vllm.ENGINES
    assert [params.max_tokens for params in engine.call_params[-1]] == [64 - PREFIX] * 4
    for group, prefix in zip(groups, prefixes, strict=True):
        for record in group:
            assert record.token_ids[:PREFIX] == tuple(prefix) and record.token_ids[PREFIX : PREFIX + 3] == (
                101,
                102,
                103,
            )
            assert record.logprobs[:PREFIX] == (0.0,) * PREFIX and record.teacher_prefix_tokens == PREFIX
