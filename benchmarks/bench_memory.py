"""What one phase-3 update of the Qwen3-1.7B student keeps in memory, measured on CPU, and the peak it predicts.

    python -m benchmarks.bench_memory [--layers 2] [--rows 2] [--prompt 32] [--completion 64]

The student's real architecture is built from Qwen3-1.7B's published config written out below (no hub, random
weights, bf16 like the GPU) with only `--layers` decoder layers, and the `gpu` preset's LoRA is attached through
the project's own `utils.student_model.attach_lora`. Measured, at small token counts:

1. bytes autograd keeps per token and decoder layer (`torch.autograd.graph.saved_tensors_hooks`, unique storages
   that are not parameters; a 2-layer model minus a 1-layer one, so the per-model tensors cancel), with the
   LoRA (frozen base) and without it (every weight trainable);
2. the peak of one GRPO pass (the project's `completion_logprobs`: forward, fp32 log-softmax over the completion
   logits, backward), with and without gradient checkpointing, of the no-grad reference forward (adapter
   disabled), and of a teacher-SFT pass (LoRA dropout on). The peak is the most bytes alive at once above what
   existed before the pass, from the profiler's record of every allocation and free; LoRA gradients exist
   beforehand, as in every pass but a step's first. CPU's `bmm` makes a contiguous copy of the tied embedding
   for each row of the LM head (a CUDA batched GEMM reads the stride-0 batch in place); those copies are
   reported apart and left out.

Each measurement is compared with `training.memory_model` (the formula the preflight uses), and the formula then
predicts the full model's peaks for the `gpu` preset and the recipes. Writes benchmarks/results/bench_memory.json
and .md. About 2 minutes and 4.3 GB of RSS on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from training import memory_model as mm

ROOT = Path(__file__).resolve().parent.parent

# Qwen/Qwen3-1.7B's config.json (the fields that shape memory; rope and norm values as published)
QWEN3_1_7B = {
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "hidden_act": "silu",
}


CPU_DROPOUT_MASK = 4  # CPU dropout keeps an fp32 noise tensor per element (CUDA: a 1-byte bool mask)


def qwen3_config(layers: int, vocab: int | None = None, **changes: Any) -> Any:
    """Qwen3-1.7B's config with `layers` decoder layers (and optionally another vocabulary or other shapes)."""
    from transformers import Qwen3Config

    values = {**QWEN3_1_7B, "num_hidden_layers": layers, **changes}
    if vocab is not None:
        values["vocab_size"] = vocab
    return Qwen3Config(**values)


def build_student(cfg: Any, lora: Any | None, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Any:
    """Random weights of `cfg` in `dtype`, with the config's LoRA (`config.lora`) attached the project's way."""
    from transformers import Qwen3ForCausalLM

    from utils.student_model import attach_lora

    torch.manual_seed(seed)
    model: Any = Qwen3ForCausalLM(cfg)  # transformers' stubs type .to oddly
    model = model.to(dtype)
    if lora is not None:
        model = attach_lora(model, lora.r, lora.lora_alpha, lora.lora_dropout, lora.target_modules)
    return model.train()


def rollout_batch(vocab: int, rows: int, prompt: int, completion: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A `pad_rollout_batch`-shaped batch: the first row's prompt left-padded by 4 tokens (a padding mask, as
    training always has)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, prompt + completion), generator=generator)
    attention = torch.ones_like(ids)
    attention[0, : min(4, prompt)] = 0
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "completion_ids": ids[:, prompt:],
        "completion_mask": torch.ones_like(ids[:, prompt:]),
    }


def saved_bytes(model: Any, tokens: int) -> int:
    """Bytes of the unique non-parameter storages autograd saves in one forward of `tokens` tokens (dropout off,
    as in the RL passes)."""
    vocab = model.config.vocab_size
    batch = rollout_batch(vocab, 1, tokens // 2, tokens - tokens // 2)
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    from training.batching import dropout_disabled

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), dropout_disabled(model):
        model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            logits_to_keep=1,
        )
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(size for ptr, size in seen.items() if ptr not in params)


def kept_per_token_layer(lora: Any | None, tokens: int = 256, **shape: Any) -> float:
    """Measured bytes kept per token per decoder layer: (2 layers - 1 layer) / tokens, vocabulary 1,024."""
    sizes = []
    for layers in (1, 2):
        model = build_student(qwen3_config(layers, vocab=1024, **shape), lora)
        sizes.append(saved_bytes(model, tokens))
        del model
    return (sizes[1] - sizes[0]) / tokens


def peak_bytes(fn: Callable[[], Any]) -> tuple[int, int]:
    """(peak, excluded): the most bytes alive at once during `fn` above those alive before it, from the profiler's
    allocation events; `excluded` is the largest CPU-only LM-head weight copy left out (bmm's contiguous clone)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events: list[tuple[int, int, int, bool]] = []

    def walk(nodes: Any, stack: tuple[str, ...]) -> None:
        for node in nodes:
            if node.tag == _EventType.Allocation:
                fields = node.extra_fields
                cpu_only = "aten::bmm" in stack and "aten::contiguous" in stack
                events.append((node.start_time_ns, fields.alloc_size, fields.ptr, cpu_only))
            walk(node.children, (*stack, node.name))

    walk(prof.profiler.kineto_results.experimental_event_tree(), ())
    events.sort(key=lambda e: e[0])
    alive = peak = excluded = 0
    skipped: set[int] = set()
    for _, size, ptr, cpu_only in events:
        if size > 0 and cpu_only:
            skipped.add(ptr)
            excluded = max(excluded, size)
            continue
        if size < 0 and ptr in skipped:
            skipped.discard(ptr)
            continue
        alive += size
        peak = max(peak, alive)
    return peak, excluded


def _ready_gradients(model: Any) -> None:
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)


def policy_pass_peak(model: Any, batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """One GRPO pass's peak: the project's completion log-probs, forward and backward (dropout off, as in RL)."""
    from training.batching import completion_logprobs, dropout_disabled

    _ready_gradients(model)

    def run() -> None:
        with dropout_disabled(model):
            (-completion_logprobs(model, batch).sum()).backward()

    return peak_bytes(run)


def reference_pass_peak(model: Any, batch: dict[str, torch.Tensor], chunk: int) -> tuple[int, int]:
    """The KL reference's no-grad forward (adapter disabled), `chunk` rows at a time."""
    from training.batching import chunked_completion_logprobs

    def run() -> None:
        with torch.no_grad(), model.disable_adapter():
            chunked_completion_logprobs(model, batch, chunk)

    return peak_bytes(run)


def sft_pass_peak(model: Any, rows: int, length: int, vocab: int) -> tuple[int, int]:
    """A teacher-SFT pass (every position scored, LoRA dropout as configured), as `PassRunner.sft_pass` runs it."""
    from training.losses import masked_sft_nll

    ids = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, : length // 4] = -100
    _ready_gradients(model)

    def run() -> None:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
        loss, _ = masked_sft_nll(out.logits, labels)
        loss.backward()

    return peak_bytes(run)


@contextlib.contextmanager
def checkpointing(model: Any, on: bool):
    """The trainer's gradient checkpointing (non-reentrant, inputs requiring grad), on for the block."""
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    try:
        yield
    finally:
        if on:
            model.gradient_checkpointing_disable()


def shape_of(cfg: Any) -> mm.ModelShape:
    return mm.ModelShape.from_hf_config(cfg)


def measure(args: argparse.Namespace, lora: Any) -> dict[str, Any]:
    targets = mm.lora_targets(lora.target_modules)
    tokens = 256
    results: dict[str, Any] = {}
    start = time.monotonic()
    full = shape_of(qwen3_config(28))
    with_lora = kept_per_token_layer(lora, tokens)
    without = kept_per_token_layer(None, tokens)
    results["kept_per_token_layer"] = {
        "tokens_per_sequence": tokens,
        "lora_frozen_base": with_lora,
        "lora_frozen_base_predicted": mm.kept_per_token_layer(full, lora.r, targets, 2, tokens),
        "no_lora_all_weights_trainable": without,
    }
    print(f"kept per token and layer: LoRA {with_lora:,.0f} B, no LoRA (all trainable) {without:,.0f} B", flush=True)

    cfg = qwen3_config(args.layers)
    shape = shape_of(cfg)
    model = build_student(cfg, lora)
    batch = rollout_batch(cfg.vocab_size, args.rows, args.prompt, args.completion)
    passes: dict[str, Any] = {}
    for ckpt in (False, True):
        with checkpointing(model, ckpt):
            peak, excluded = policy_pass_peak(model, batch)
        predicted = mm.policy_pass(shape, lora.r, targets, args.rows, args.prompt, args.completion, ckpt)
        passes["grpo_checkpointing" if ckpt else "grpo"] = {
            "measured": peak,
            "predicted": predicted.activations + predicted.head,
            "cpu_only_weight_copy": excluded,
        }
    peak, excluded = reference_pass_peak(model, batch, args.rows)
    passes["reference"] = {
        "measured": peak,
        "predicted": mm.no_grad_pass(shape, args.rows, args.prompt, args.completion),
        "cpu_only_weight_copy": excluded,
    }
    del model
    sft_lora = dataclasses.replace(lora, lora_dropout=max(lora.lora_dropout, 0.05))
    model = build_student(cfg, sft_lora)
    length = args.prompt + args.completion
    peak, excluded = sft_pass_peak(model, args.rows, length, cfg.vocab_size)
    predicted = mm.policy_pass(
        shape, lora.r, targets, args.rows, 0, length, False, dropout_mask=CPU_DROPOUT_MASK, sft=True
    )
    passes["teacher_sft"] = {
        "measured": peak,
        "predicted": predicted.activations + predicted.head,
        "cpu_only_weight_copy": excluded,
    }
    del model
    for name, entry in passes.items():
        entry["error"] = entry["predicted"] / entry["measured"] - 1
        print(
            f"{name}: measured {entry['measured'] / 1e6:,.1f} MB, formula {entry['predicted'] / 1e6:,.1f} MB",
            flush=True,
        )
    results["passes"] = passes
    results["shape"] = {"layers": args.layers, "rows": args.rows, "prompt": args.prompt, "completion": args.completion}
    results["seconds"] = time.monotonic() - start
    return results


def predictions(prompt_tokens: int) -> dict[str, Any]:
    """The formula at full size: the issue's GPU shape, the gpu preset and the recipes, each with and without
    gradient checkpointing."""
    from config import build_config

    shape = shape_of(qwen3_config(28))
    lora = build_config("gpu").lora
    targets = mm.lora_targets(lora.target_modules)
    out: dict[str, Any] = {}
    for ckpt in (False, True):
        peak = mm.policy_pass(shape, lora.r, targets, 4, 512, 1024, ckpt)
        out[f"gpu_shape_4x(512+1024){'_checkpointing' if ckpt else ''}"] = {
            "static": peak.static,
            "activations": peak.activations,
            "head": peak.head,
            "total": peak.total,
        }
    setups = {
        "gpu preset": None,
        "recipes/qwen3_1gpu.yaml": ROOT / "recipes" / "qwen3_1gpu.yaml",
        "recipes/qwen3_multigpu.yaml (Qwen3-4B, per GPU)": ROOT / "recipes" / "qwen3_multigpu.yaml",
    }
    for name, path in setups.items():
        for ckpt in (False, True):
            config = build_config("gpu", path, overrides=[f"training.gradient_checkpointing={ckpt}"])
            est = mm.estimate(config, mm.KNOWN_SHAPES.get(config.student.model_name, shape), prompt_tokens)
            out[f"{name}{' checkpointing' if ckpt else ''}"] = {**est.parts, "peak": est.peak, "largest": est.largest}
    return out


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Phase 3 memory: measured on CPU, predicted for the GPU", ""]
    kept = results["measured"]["kept_per_token_layer"]
    lines += [
        f"Kept per token and decoder layer ({kept['tokens_per_sequence']}-token sequences): LoRA on a frozen bf16 base "
        f"{kept['lora_frozen_base']:,.0f} B (formula {kept['lora_frozen_base_predicted']:,.0f} B); without LoRA, "
        f"every weight trainable, {kept['no_lora_all_weights_trainable']:,.0f} B.",
        "",
        "| pass (measured shape) | measured | formula | error |",
        "|---|---|---|---|",
    ]
    for name, entry in results["measured"]["passes"].items():
        measured, predicted = entry["measured"] / 1e6, entry["predicted"] / 1e6
        lines.append(f"| {name} | {measured:,.1f} MB | {predicted:,.1f} MB | {entry['error']:+.1%} |")
    lines += ["", "| predicted (bf16, no CUDA allowance, no vLLM share) | peak | largest part |", "|---|---|---|"]
    for name, entry in results["predicted"].items():
        if "peak" in entry:
            lines.append(f"| {name} | {entry['peak'] / 1e9:.1f} GB | {entry['largest']} |")
        else:
            kept, head = entry["activations"] / 1e9, entry["head"] / 1e9
            parts = f"GRPO pass: activations {kept:.1f} GB, log-prob head {head:.1f} GB"
            lines.append(f"| {name} | {entry['total'] / 1e9:.1f} GB | {parts} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2, help="Decoder layers of the measured model (default 2).")
    parser.add_argument("--rows", type=int, default=2, help="Sequences per pass (default 2).")
    parser.add_argument("--prompt", type=int, default=32, help="Prompt tokens per sequence (default 32).")
    parser.add_argument("--completion", type=int, default=64, help="Completion tokens per sequence (default 64).")
    parser.add_argument(
        "--prompt_tokens", type=int, default=512, help="Prompt length the full-size predictions assume (default 512)."
    )
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "bench_memory.json"))
    args = parser.parse_args(argv)
    from config import build_config

    torch.set_num_threads(min(torch.get_num_threads(), 2))
    results = {
        "torch": torch.__version__,
        "measured": measure(args, build_config("gpu").lora),
        "predicted": predictions(args.prompt_tokens),
    }
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    output.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
