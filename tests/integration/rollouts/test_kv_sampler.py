"""rollouts.kv_sampler: same model, same distribution, same stopping as the transformers path."""

from __future__ import annotations

import contextlib

import pytest
import torch

from rollouts.groups import sample_groups
from rollouts.hf import generate_completions
from rollouts.kv_sampler import (
    DecoderWeights,
    KVCache,
    KVCacheRollout,
    choose_tokens,
    forward,
    sample_token_ids,
    sampler_stop_ids,
    warp_logits,
)
from rollouts.sampling import SamplingSettings
from training.batching import chunked_completion_logprobs, pad_rollout_batch
from utils.dataset_loader import EMBEDDED_MBPP, load_mbpp
from utils.prompts import get_unified_prompt
from utils.sft_data import encode_prompt
from utils.student_model import EMBEDDED_MODELS, attach_lora, load_student

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Stated tolerance of the distribution test: float32 sampling copy vs the trainer's float32 log-probs.
FP32_LOGP_TOLERANCE = 2e-4  # nats per token, max over every sampled token
BF16_MEAN_GAP = 0.08  # nats per token, mean |gap| of the bfloat16 copy (measured ~0.03 on SmolLM2)


def adapted(model_name: str, seed: int = 0):
    """The model with a LoRA adapter whose B is random (so the merge changes the weights)."""
    torch.manual_seed(seed)
    model, tokenizer = load_student(model_name, "float32", device="cpu")
    model = attach_lora(model, 8, 16, 0.0, TARGETS)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0.0, 0.05)
    model.eval()
    return model, tokenizer


@pytest.fixture(scope="module")
def smollm2():
    return adapted(EMBEDDED_MODELS[0])


@pytest.fixture(scope="module")
def tiny():
    return adapted(EMBEDDED_MODELS[1])


def fixture_texts(count: int) -> list[str]:
    return [get_unified_prompt(t, 1) for t in load_mbpp(EMBEDDED_MBPP)[0][:count]]


def fixture_prompts(tokenizer, count: int = 3) -> list[list[int]]:
    return [
        encode_prompt(tokenizer, text, chat_template_kwargs={"enable_thinking": True}) for text in fixture_texts(count)
    ]


# ------------------------------------------------------------------ sampling knobs vs transformers' processors


@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(temperature=0.7),
        SamplingSettings(temperature=1.3, top_k=7),
        SamplingSettings(temperature=0.9, top_p=0.6),
        SamplingSettings(temperature=1.0, min_p=0.05),
        SamplingSettings(temperature=0.8, top_p=0.9, top_k=20, min_p=0.02, repetition_penalty=1.3),
        SamplingSettings(temperature=0.0, repetition_penalty=1.2),
    ],
)
def test_knobs_equal_the_transformers_processors(settings):
    from transformers import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(1)
    logits = torch.randn(4, 300) * 3
    history = torch.randint(0, 300, (4, 25))
    seen = torch.zeros(4, 300, dtype=torch.bool).scatter_(1, history, True)
    expected = logits.clone()
    if settings.repetition_penalty != 1.0:
        expected = RepetitionPenaltyLogitsProcessor(settings.repetition_penalty)(history, expected)
    if not settings.greedy:  # generate's order: temperature, top-k, top-p, min-p
        for warper, on in (
            (TemperatureLogitsWarper(settings.temperature), settings.temperature != 1.0),
            (TopKLogitsWarper(max(settings.top_k, 1)), settings.top_k > 0),
            (TopPLogitsWarper(settings.top_p), settings.top_p < 1.0),
            (MinPLogitsWarper(settings.min_p if settings.min_p > 0 else 0.1), settings.min_p > 0),
        ):
            if on:
                expected = warper(history, expected)
    got = warp_logits(logits, settings, seen)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert torch.allclose(got[finite], expected[finite], atol=1e-6)
    assert torch.isinf(got).any() == (settings.top_k > 0 or settings.top_p < 1 or settings.min_p > 0)


def test_draws_follow_the_warped_softmax():
    torch.manual_seed(2)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(20000, 1)
    settings = SamplingSettings(temperature=0.8, top_k=3)
    drawn = choose_tokens(warp_logits(logits, settings), settings)
    freq = torch.bincount(drawn, minlength=5).float() / drawn.numel()
    probs = (logits[0, :3] / 0.8).softmax(-1)
    assert freq[3:].sum() == 0  # top-k removed them
    assert torch.allclose(freq[:3], probs, atol=0.015)  # ~4 standard errors at n = 20000


# ------------------------------------------------------------------ the forward pass and the adapter copy


def test_prefill_logits_equal_the_model_with_and_without_the_adapter(tiny):
    model, tokenizer = tiny
    prompts = [[5, 9, 13, 200, 7], [31, 8, 2, 99, 100, 101, 5, 6]]  # two lengths: left padding
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    attention = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    bias = torch.where(attention.bool(), 0.0, float("-inf"))
    seen = []
    for context in (contextlib.nullcontext, model.disable_adapter):
        with context():
            weights = DecoderWeights.from_model(model, torch.float32)
            cache = KVCache(len(weights.layers), 2, weights.num_kv_heads, width, weights.head_dim, torch.float32)
            ours = forward(weights, ids, positions, cache, 0, bias, last_only=False)
            with torch.no_grad():
                theirs = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
        real = attention.bool()
        assert torch.allclose(ours[real], theirs[real], atol=1e-4)
        seen.append(ours[real])
    assert not torch.allclose(seen[0], seen[1], atol=1e-3)  # the adapter really changes the logits


def test_refresh_follows_each_adapter_update(tiny):
    model, _ = tiny
    weights = DecoderWeights.from_model(model, torch.float32)
    ids = torch.tensor([[3, 4, 5, 6]])
    bias, positions = torch.zeros(1, 4), torch.arange(4)[None]

    def logits_now():
        cache = KVCache(len(weights.layers), 1, weights.num_kv_heads, 4, weights.head_dim, torch.float32)
        return forward(weights, ids, positions, cache, 0, bias)

    before = logits_now()
    lora_b = next(p for n, p in model.named_parameters() if "lora_B" in n and "q_proj" in n)
    saved = lora_b.data.clone()
    try:
        lora_b.data.add_(0.5)  # an optimizer step
        assert torch.allclose(logits_now(), before)  # the copy is a copy
        weights.refresh(model)
        with torch.no_grad():
            expected = model(input_ids=ids).logits[:, -1]
        after = logits_now()
        assert not torch.allclose(after, before, atol=1e-3)
        assert torch.allclose(after, expected, atol=1e-4)
    finally:
        lora_b.data.copy_(saved)


# ------------------------------------------------------------------ the distribution test


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampled_logprobs_agree_with_the_trainers(smollm2, dtype):
    """The sampler's per-token log-probs of its own samples vs the trainer's chunked log-prob path on the
    same tokens: equal within FP32_LOGP_TOLERANCE for the float32 copy; for bfloat16 the gap is measured
    (what truncated importance sampling corrects) and bounded."""
    model, tokenizer = smollm2
    settings = SamplingSettings(temperature=0.7)
    rollout = KVCacheRollout(tokenizer, 24, settings, {"enable_thinking": True}, dtype=dtype)
    torch.manual_seed(3)
    groups = rollout.continue_ids(model, fixture_prompts(tokenizer), num_samples=3)
    samples = [s for group in groups for s in group]
    assert all(len(s.logprobs) == len(s.token_ids) > 0 for s in samples)
    batch = pad_rollout_batch(samples, tokenizer.pad_token_id)
    assert "sampling_logps" in batch  # the trainer gets them (importance weights, rollout/logp_abs_diff)
    with torch.no_grad():
        trainer = chunked_completion_logprobs(model, batch, 2, settings.temperature)
    mask = batch["completion_mask"].bool()
    gap = (trainer - batch["sampling_logps"])[mask].abs()
    if dtype == "float32":
        assert gap.max() < FP32_LOGP_TOLERANCE
    else:
        assert 1e-4 < gap.mean() < BF16_MEAN_GAP  # a real gap, and a small one


# ------------------------------------------------------------------ stopping, as the generate path stops


@pytest.mark.slow
def test_greedy_tokens_and_stops_equal_generate(smollm2, monkeypatch):
    model, tokenizer = smollm2
    prompts = fixture_texts(2)
    template = {"enable_thinking": True}
    greedy = SamplingSettings(temperature=0.0)
    hf = generate_completions(
        model, tokenizer, prompts, num_samples=1, max_new_tokens=12, sampling=greedy, chat_template_kwargs=template
    )
    rollout = KVCacheRollout(tokenizer, 12, greedy, template, dtype="float32")
    ours = sample_groups(rollout, model, prompts, 1, step=0)
    for a, b in zip(hf, ours, strict=True):
        assert a[0].token_ids == b[0].token_ids and a[0].finish_reason == b[0].finish_reason == "length"
        assert a[0].text == b[0].text and a[0].prompt_ids == b[0].prompt_ids
    # a generation-config EOS both must stop on: the 5th greedy token of the first prompt
    stop = hf[0][0].token_ids[4]
    monkeypatch.setattr(model.generation_config, "eos_token_id", [stop])
    assert stop in sampler_stop_ids(tokenizer, model)
    hf = generate_completions(
        model, tokenizer, prompts[:1], num_samples=1, max_new_tokens=12, sampling=greedy, chat_template_kwargs=template
    )
    ours = sample_groups(rollout, model, prompts[:1], 1, step=0)
    assert ours[0][0].token_ids == hf[0][0].token_ids and ours[0][0].token_ids[-1] == stop
    assert ours[0][0].finish_reason == hf[0][0].finish_reason == "stop"
    assert ours[0][0].text == hf[0][0].text  # the stop token is not in the text


@pytest.mark.slow
def test_continuation_stops_at_a_stop_string_in_new_text_only(smollm2):
    model, tokenizer = smollm2
    greedy = SamplingSettings(temperature=0.0)
    rollout = KVCacheRollout(tokenizer, 20, greedy, dtype="float32")
    sequence = fixture_prompts(tokenizer, 1)[0]
    free = rollout.continue_ids(model, [sequence])[0][0]
    text = tokenizer.decode(free.token_ids, skip_special_tokens=False)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    in_prompt = tokenizer.decode(sequence[-30:])[:6]  # only in the prompt: must not stop anything
    assert stop and in_prompt not in text
    cut = rollout.continue_ids(model, [sequence], stop_strings=(in_prompt, stop))[0][0]
    kept = cut.token_ids
    assert cut.finish_reason == "stop" and cut.stop_string == stop
    assert kept == free.token_ids[: len(kept)]  # the same sequence, cut
    assert stop in tokenizer.decode(kept) and stop not in tokenizer.decode(kept[:-1])  # the last token completes it
    assert len(cut.logprobs) == len(kept)


def test_samples_are_independent_and_finished_rows_leave_the_batch(tiny):
    model, tokenizer = tiny
    weights = DecoderWeights.from_model(model, torch.float32)
    torch.manual_seed(4)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    groups = sample_token_ids(
        weights,
        prompts,
        4,
        30,
        knobs=SamplingSettings(),
        stop_token_ids={17, 21, 33, 40, 41, 42, 50},
        pad_id=tokenizer.pad_token_id,
        max_batch_rows=3,
    )
    assert [len(g) for g in groups] == [4, 4]
    rows = [s for g in groups for s in g]
    assert len({s.token_ids for s in rows}) > 1  # the copies of a prompt's cache sample on their own
    for s in rows:
        ends = [i for i, t in enumerate(s.token_ids) if t in {17, 21, 33, 40, 41, 42, 50}]
        assert ends in ([], [len(s.token_ids) - 1])  # nothing after a stop
        assert s.finish_reason == ("stop" if ends else "length")
        assert len(s.token_ids) == 30 or ends
