"""The memory model (`training.memory_model`) against what autograd and the allocator do on a small Qwen3, and the
defaults that follow from it: the formula must predict a measured shape, and the gpu preset and the 1-GPU recipe
must fit the cards the docs name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks import bench_memory
from config import build_config
from tests.conftest import ROOT
from training import memory_model as mm

# A Qwen3 with small widths (every term of the formula present: GQA, q/k norms, tied embeddings)
SMALL = {
    "hidden_size": 128,
    "intermediate_size": 320,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
}
GB = 1e9


def small_lora(dropout: float = 0.0):
    return build_config("gpu", overrides=["lora.r=8", "lora.lora_alpha=16", f"lora.lora_dropout={dropout}"]).lora


def small_shape(layers: int, vocab: int = 2048) -> mm.ModelShape:
    return mm.ModelShape.from_hf_config(bench_memory.qwen3_config(layers, vocab=vocab, **SMALL))


def test_kept_bytes_per_token_and_layer_match_the_formula():
    """peft's fp32 copy of every adapted layer's input is counted: seven per layer in bf16."""
    lora = small_lora()
    measured = bench_memory.kept_per_token_layer(lora, tokens=64, **SMALL)
    predicted = mm.kept_per_token_layer(small_shape(2), lora.r, mm.LORA_TARGETS, 2, seq_len=64)
    assert measured == pytest.approx(predicted, rel=0.01)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_formula_predicts_the_measured_peak_of_a_grpo_pass(checkpointing):
    lora = small_lora()
    cfg = bench_memory.qwen3_config(2, vocab=4096, **SMALL)
    model = bench_memory.build_student(cfg, lora)
    rows, prompt, completion = 2, 16, 48
    batch = bench_memory.rollout_batch(cfg.vocab_size, rows, prompt, completion)
    with bench_memory.checkpointing(model, checkpointing):
        measured, _ = bench_memory.policy_pass_peak(model, batch)
    peak = mm.policy_pass(small_shape(2, 4096), lora.r, mm.LORA_TARGETS, rows, prompt, completion, checkpointing)
    assert measured == pytest.approx(peak.activations + peak.head, rel=0.05)


def test_the_formula_predicts_the_measured_peak_of_a_teacher_sft_pass():
    """The SFT pass keeps its bf16 logits alive through the backward, and LoRA dropout adds its masks."""
    lora = small_lora(dropout=0.05)
    cfg = bench_memory.qwen3_config(2, vocab=4096, **SMALL)
    model = bench_memory.build_student(cfg, lora)
    measured, _ = bench_memory.sft_pass_peak(model, 2, 64, cfg.vocab_size)
    peak = mm.policy_pass(
        small_shape(2, 4096),
        lora.r,
        mm.LORA_TARGETS,
        2,
        0,
        64,
        False,
        dropout_mask=bench_memory.CPU_DROPOUT_MASK,
        sft=True,
    )
    assert measured == pytest.approx(peak.activations + peak.head, rel=0.05)


def qwen3_1_7b() -> mm.ModelShape:
    return mm.KNOWN_SHAPES["Qwen/Qwen3-1.7B"]


def test_known_shapes_are_the_written_out_config():
    assert qwen3_1_7b() == mm.ModelShape.from_hf_config(bench_memory.qwen3_config(28))
    assert qwen3_1_7b().parameters() == pytest.approx(1.72e9, rel=0.01)  # Qwen3-1.7B: 1.7 B, embeddings tied
    config = build_config("gpu")
    assert mm.lora_parameters(qwen3_1_7b(), 64, mm.lora_targets(config.lora.target_modules)) == 69_730_304


def required_gb(config, total_gb: float) -> float:
    est = mm.estimate(config, mm.KNOWN_SHAPES[config.student.model_name])
    return mm.required_bytes(config, est, total_gb * GB) / GB


def test_the_gpu_preset_fits_one_24_gb_gpu_with_hf_rollouts():
    config = build_config("gpu", overrides=["grpo.rollout_backend=hf"])
    assert config.rollout_backend == "hf"
    assert required_gb(config, 24) <= 24


def test_the_gpu_preset_with_vllm_fits_a_40_gb_gpu_and_a_24_gb_one_asleep(monkeypatch):
    """With vLLM installed the preset samples with a colocated engine that keeps 0.3 of the GPU through the update:
    a 40 GB card holds both; a 24 GB card needs the engine asleep during the update (docs/gpu.md)."""
    import config as config_module

    monkeypatch.setattr(config_module.sections, "vllm_installed", lambda: True)
    config = build_config("gpu")
    assert config.rollout_backend == "vllm"
    assert required_gb(config, 24) > 24 and required_gb(config, 40) <= 40
    asleep = build_config("gpu", overrides=["grpo.vllm_sleep_mode=true"])
    assert required_gb(asleep, 24) <= 24


def test_the_one_gpu_recipe_fits_a_40_gb_gpu_with_its_colocated_engine():
    config = build_config("gpu", ROOT / "recipes" / "qwen3_1gpu.yaml")
    assert config.grpo.rollout_backend == "vllm"
    assert required_gb(config, 40) <= 40


def test_without_checkpointing_the_preset_needs_more_than_a_40_gb_gpu():
    """The measured activations (~158 KB per token and layer) make an update without checkpointing ~47 GB."""
    config = build_config("gpu", overrides=["training.gradient_checkpointing=false"])
    assert required_gb(config, 80) > 40


def fake_gpu(monkeypatch, total_gb: float) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(total_gb * GB), int(total_gb * GB)))


@pytest.mark.parametrize(
    ("total_gb", "checkpointing", "status"), [(24, False, "WARN"), (24, True, "PASS"), (80, False, "PASS")]
)
def test_the_gpu_preflight_warns_when_the_predicted_peak_exceeds_the_gpu(
    monkeypatch, capsys, total_gb, checkpointing, status
):
    import test_all

    fake_gpu(monkeypatch, total_gb)
    config = build_config("gpu", overrides=[f"training.gradient_checkpointing={checkpointing}"])
    report = test_all.Report()
    test_all.check_gpu_memory(report, config)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "predicted peak" in line]
    assert len(lines) == 1 and status in lines[0], out
    if status == "WARN":
        assert "gradient_checkpointing=true" in out


def test_phase_two_budget_fits_what_phase_three_trains_on(smollm2_tokenizer):
    """Phase 3 drops every teacher trace longer than dual_source.sft_max_length: phase 2's budget, after an APPS
    prompt at the 95th percentile of the real APPS sample (the project's template; the embedded tokenizer stands in
    for Qwen3's, which is not available offline), must fit inside it, or traces are paid for and never trained on;
    and the thinking budget leaves the answer room for its code."""
    import numpy as np

    from rollouts.from_config import prompt_lengths
    from tests.conftest import SHARED_DATA
    from utils.dataset_loader import load_apps

    config = build_config("gpu")
    apps = SHARED_DATA / "apps_sample.jsonl"
    if not apps.is_file():
        pytest.skip(f"{apps} is not beside the repository")
    tasks = load_apps(apps)[0]
    lengths = prompt_lengths(
        smollm2_tokenizer, tasks, config.prompt.num_visible_tests, config.student.chat_template_kwargs
    )
    p95 = int(np.percentile(lengths, 95))
    assert p95 > 1000  # APPS prompts are long: 512 stood for MBPP's
    assert config.teacher.max_tokens + p95 <= config.dual_source.sft_max_length
    assert config.teacher.max_tokens - config.teacher.thinking_token_budget >= 512
    field = {f.name: f for f in dataclasses.fields(config.dual_source)}["sft_max_length"]
    assert "dropped" in field.metadata["help"] and "cut." not in field.metadata["help"].replace("never cut.", "")


def test_the_gpu_preflight_does_not_count_emulated_bfloat16(monkeypatch, capsys):
    """A T4 (compute capability 7.5) can create bf16 tensors, so torch's default check passes, but vLLM refuses
    bf16 there and torch only emulates it: the preflight must fail it and advise float32, not float16."""
    import types

    import test_all

    fake_gpu(monkeypatch, 16)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(major=7, minor=5))
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda *a: True)
    monkeypatch.setattr(torch.version, "hip", None)
    test_all.check_gpu_setup(test_all.Report(), build_config("gpu"), num_processes=1)
    out = capsys.readouterr().out
    assert "✗ FAIL the GPU supports bfloat16 natively" in out
    assert "student.torch_dtype=float32" in out and "torch_dtype=float16" not in out


def test_the_gpu_preflight_warns_that_float16_has_no_loss_scaling(monkeypatch, capsys):
    import test_all

    fake_gpu(monkeypatch, 80)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    test_all.check_gpu_setup(test_all.Report(), build_config("gpu", overrides=["student.torch_dtype=float16"]), 1)
    assert "⚠ WARN student.torch_dtype=float16 trains without a loss scaler" in capsys.readouterr().out


def test_a_local_opd_teacher_counts_in_the_estimate():
    """teacher.logprob_source=local loads the teacher in the trainer's process: its weights sit beside the student
    for the whole run and its no-grad forward is one more peak."""
    config = build_config("gpu", overrides=["dual_source.opd_weight=1", "teacher.logprob_source=local"])
    student, teacher = qwen3_1_7b(), mm.KNOWN_SHAPES["Qwen/Qwen3-4B"]
    alone, beside = mm.estimate(config, student), mm.estimate(config, student, teacher=teacher)
    assert beside.parts["grpo update"] - alone.parts["grpo update"] == teacher.parameters() * 2
    assert "local teacher forward" in beside.parts and "local teacher forward" not in alone.parts


def test_hf_rollouts_sample_a_whole_rollout_batch_per_generate_call(smollm2_tokenizer):
    """The gpu preset's hf rollouts: one generate call for the whole rollout batch (2 x 8 prompts x G 4 = 64
    sequences) at MBPP prompt lengths, since its KV cache stays below the update's predicted peak; a prompt so long
    that 64 sequences would set the peak gets fewer prompts per call, and never a peak above the update's."""
    from rollouts.from_config import build_sampler
    from utils.dataset_loader import EMBEDDED_MBPP, load_mbpp

    config = build_config("gpu", overrides=["grpo.rollout_backend=hf"])
    shape = mm.KNOWN_SHAPES["Qwen/Qwen3-1.7B"]
    assert mm.hf_prompts_per_call(config, shape, 512) == 16
    long_prompt = 4096
    fewer = mm.hf_prompts_per_call(config, shape, long_prompt)
    assert 1 <= fewer < 16
    est = mm.estimate(config, shape, long_prompt)
    assert est.largest != "rollout (hf generate)" and est.parts["rollout (hf generate)"] <= est.peak

    tasks = load_mbpp(EMBEDDED_MBPP)[0][:16]
    prompts = mm.hf_prompts_for_run(config, smollm2_tokenizer, tasks)
    assert prompts == 16
    sampler = build_sampler(config, purpose="train", tokenizer=smollm2_tokenizer, hf_prompts_per_call=prompts)

    class CountingPolicy(torch.nn.Module):
        """A stand-in student whose generate ends every sequence at once with the end-of-sequence token."""

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.calls: list[int] = []

        def generate(self, input_ids, num_return_sequences=1, **kwargs):
            self.calls.append(input_ids.shape[0] * num_return_sequences)
            rows = input_ids.repeat_interleave(num_return_sequences, dim=0)
            eos = torch.full((rows.shape[0], 1), smollm2_tokenizer.eos_token_id)
            return torch.cat([rows, eos], dim=1)

    policy = CountingPolicy()
    sampler.sync(policy, 0)
    from utils.prompts import get_unified_prompt

    groups = sampler.sample([get_unified_prompt(t) for t in tasks], 4)
    sampler.release()
    assert [len(g) for g in groups] == [4] * 16
    assert policy.calls == [64]  # one call for the rollout batch (one micro-batch of 8 sequences per call before)
