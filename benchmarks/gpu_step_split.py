"""Where a `--preset gpu` step's time goes on one GPU: the pieces of a step, timed one by one on the student's shape.

    python -m benchmarks.gpu_step_split [--out DIR]        # a GPU: Qwen3-1.7B's shape, ~5-5.5 min (estimate)
    python -m benchmarks.gpu_step_split --tiny [--out DIR]  # CPU: a 2-layer toy with the same code (CI)

Needs only torch, transformers and peft besides the project (no vLLM, no hub, no tokenizer: random weights and
random token ids). Qwen3-1.7B's architecture (`bench_memory.qwen3_config`) in bfloat16 with the `gpu` preset's LoRA
(`config.lora`, attached with `utils.student_model.attach_lora`), then:

A. decode rate of hf `generate` (the hf rollout backend): prompts of --prompt tokens, --decode new tokens each
   (min_new_tokens = max_new_tokens, sampling at temperature 1), at 8 / 32 / 64 sequences per call with the LoRA
   unmerged (as `HFRollout` samples), then merged (`merge_adapter`) at 8 and 64; tokens/s, ms per decode step,
   peak memory. 64 sequences are the preset's whole rollout batch (2 x 8 prompts x G 4).
B. the update's pieces, gradient checkpointing on (the preset's): one GRPO chunk (dropout off, 4 rows of --prompt +
   --completion tokens; `training.batching.completion_logprobs`, forward + backward), the reference forward of the
   same rows (adapter disabled, no grad), and one teacher-SFT pass of 2 x --sft tokens (`masked_sft_nll`, LoRA
   dropout on as phase 3 runs it); seconds and peak memory of each, with `training.memory_model`'s prediction beside
   the peak.
C. the adapter save of the vLLM hand-off (`save_adapter` in bfloat16).

Each measurement is a warm-up and the median of --repeats runs. Writes DIR/gpu_step_split.json (default: $OUT when
set, else benchmarks/results) and prints one line per measurement, then the step-time estimate the pieces give for
the preset (rollout per step with hf, update = 2 x 8 GRPO chunks + 8 SFT passes + 2 x 8 reference chunks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent

# The full shape (a GPU) and the toy (CPU, CI): layers, vocabulary, token counts, sequences per generate call.
SHAPES: dict[str, dict[str, Any]] = {
    "full": {"layers": 28, "vocab": None, "prompt": 512, "completion": 1024, "sft": 3072, "decode": 128,
             "decode_prompt": 228, "sequences": (8, 32, 64), "merged_sequences": (8, 64), "repeats": 3},
    "tiny": {"layers": 2, "vocab": 2048, "prompt": 16, "completion": 32, "sft": 64, "decode": 8,
             "decode_prompt": 12, "sequences": (8, 32, 64), "merged_sequences": (8, 64), "repeats": 1},
}  # fmt: skip
TINY_WIDTHS = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16}  # fmt: skip
GRPO_CHUNK_ROWS = 4  # training.forward_chunk_size of the preset
SFT_ROWS = 2  # dual_source.teacher_sft_batch_size of the preset


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_step_split",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tiny", action="store_true", help="A 2-layer toy shape on the CPU (the CI check).")
    parser.add_argument(
        "--out", type=Path, help="Folder for gpu_step_split.json (default $OUT, else benchmarks/results)."
    )
    parser.add_argument("--repeats", type=int, help="Timed runs per measurement after the warm-up (default 3; tiny 1).")
    return parser.parse_args(argv)


class Clock:
    """Seconds and peak device memory of a callable: a warm-up, then the median of `repeats` runs."""

    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device, self.repeats = device, repeats

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, int | None]:
        fn()  # warm-up: kernels, allocator
        self.sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        times = []
        for _ in range(self.repeats):
            start = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        return statistics.median(times), peak


def sample_fixed_length(model: Any, ids: torch.Tensor, new_tokens: int) -> None:
    """hf `generate` of exactly `new_tokens` sampled tokens after `ids` (temperature 1, no top-p/top-k cut): a
    decode step's cost, whatever the random weights would stop on."""
    with torch.no_grad():
        model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            pad_token_id=0,
        )


def random_ids(vocab: int, rows: int, length: int, device: torch.device, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (rows, length), generator=generator).to(device)


def decode_leg(model: Any, clock: Clock, shape: dict, vocab: int, device: torch.device) -> list[dict]:
    """Leg A: tokens/s of hf generate at several sequences per call, unmerged, then merged."""
    rows = []
    for merged in (False, True):
        if merged:
            model.merge_adapter()
        for sequences in shape["merged_sequences"] if merged else shape["sequences"]:
            ids = random_ids(vocab, sequences, shape["decode_prompt"], device, seed=sequences)

            def generate(ids: torch.Tensor = ids) -> None:
                sample_fixed_length(model, ids, shape["decode"])

            seconds, peak = clock(generate)
            rows.append(
                {
                    "measure": "generate",
                    "lora": "merged" if merged else "unmerged",
                    "sequences": sequences,
                    "seconds": seconds,
                    "tokens_per_s": sequences * shape["decode"] / seconds,
                    "ms_per_decode_step": 1000 * seconds / shape["decode"],
                    "peak_bytes": peak,
                }
            )
        if merged:
            model.unmerge_adapter()
    return rows


def update_leg(model: Any, clock: Clock, shape: dict, vocab: int, device: torch.device, config: Any) -> list[dict]:
    """Leg B: one GRPO chunk, its reference forward, one teacher-SFT pass; with the memory model's peaks."""
    from benchmarks.bench_memory import rollout_batch
    from training import memory_model as mm
    from training.batching import chunked_completion_logprobs, completion_logprobs, dropout_disabled
    from training.losses import masked_sft_nll

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model.train()
    batch = {
        k: v.to(device) for k, v in rollout_batch(vocab, GRPO_CHUNK_ROWS, shape["prompt"], shape["completion"]).items()
    }
    sft_ids = random_ids(vocab, SFT_ROWS, shape["sft"], device, seed=7)
    labels = sft_ids.clone()
    labels[:, : shape["sft"] // 4] = -100

    def grpo_chunk() -> None:
        with dropout_disabled(model):
            (-completion_logprobs(model, batch).sum()).backward()

    def reference() -> None:
        with torch.no_grad(), dropout_disabled(model), model.disable_adapter():
            chunked_completion_logprobs(model, batch, GRPO_CHUNK_ROWS)

    def sft_pass() -> None:  # LoRA dropout on, as phase 3's SFT terms run (the RL passes turn it off)
        out = model(input_ids=sft_ids, attention_mask=torch.ones_like(sft_ids))
        masked_sft_nll(out.logits, labels)[0].backward()

    mshape = mm.ModelShape.from_hf_config(model.config)
    targets = mm.lora_targets(config.lora.target_modules)
    static = mm.static_bytes(mshape, config.lora.r, targets)
    predicted = {
        "grpo_chunk": mm.policy_pass(
            mshape, config.lora.r, targets, GRPO_CHUNK_ROWS, shape["prompt"], shape["completion"], True
        ).total,
        "reference_forward": static + mm.no_grad_pass(mshape, GRPO_CHUNK_ROWS, shape["prompt"], shape["completion"]),
        "teacher_sft_pass": mm.policy_pass(
            mshape,
            config.lora.r,
            targets,
            SFT_ROWS,
            0,
            shape["sft"],
            True,
            dropout_mask=1 if config.lora.lora_dropout > 0 else 0,  # CUDA's 1-byte mask per adapted input element
            sft=True,
        ).total,
    }
    rows = []
    for name, fn in (("grpo_chunk", grpo_chunk), ("reference_forward", reference), ("teacher_sft_pass", sft_pass)):
        model.zero_grad(set_to_none=False)
        seconds, peak = clock(fn)
        rows.append({"measure": name, "seconds": seconds, "peak_bytes": peak, "predicted_peak_bytes": predicted[name]})
    model.gradient_checkpointing_disable()
    return rows


def save_leg(model: Any, clock: Clock) -> dict:
    """Leg C: the trainer's half of the vLLM adapter hand-off."""
    from utils.student_model import save_adapter

    with tempfile.TemporaryDirectory(prefix="gpu_step_split_") as tmp:
        seconds, _ = clock(lambda: save_adapter(model, None, Path(tmp) / "step", torch.bfloat16))
        size = sum(p.stat().st_size for p in (Path(tmp) / "step").rglob("*") if p.is_file())
    return {"measure": "adapter_save", "seconds": seconds, "bytes": size}


def step_estimate(rows: list[dict], config: Any, shape: dict) -> dict:
    """The preset's step from the pieces: hf rollout of one rollout batch per call (the budget's decode steps at the
    64-sequence rate), and the update (2 GRPO chunks per micro-batch x 8, one SFT pass per micro-batch, the
    reference forward of every chunk)."""
    t, g = config.training, config.grpo
    by = {(r["measure"], r.get("lora"), r.get("sequences")): r for r in rows}
    sequences = t.per_device_train_batch_size * t.gradient_accumulation_steps * g.num_samples_per_prompt
    widest = max(s for s in shape["sequences"] if s <= sequences)
    per_step = by[("generate", "unmerged", widest)]["ms_per_decode_step"] / 1000
    chunks = t.gradient_accumulation_steps * -(-t.per_device_train_batch_size * g.num_samples_per_prompt // 4)
    find = {r["measure"]: r for r in rows}
    return {
        "rollout_hf_s": per_step * g.max_new_tokens,
        "rollout_sequences_per_call": widest,
        "update_s": chunks * find["grpo_chunk"]["seconds"]
        + t.gradient_accumulation_steps * find["teacher_sft_pass"]["seconds"],
        "reference_s": chunks * find["reference_forward"]["seconds"],
        "adapter_save_s": find["adapter_save"]["seconds"],
        "note": "hf rollout time assumes every sequence runs to grpo.max_new_tokens at the measured ms per step",
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from benchmarks.bench_memory import build_student, qwen3_config
    from config import build_config

    shape = dict(SHAPES["tiny" if args.tiny else "full"])
    if args.repeats:
        shape["repeats"] = args.repeats
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    config = build_config("gpu")
    cfg = qwen3_config(shape["layers"], vocab=shape["vocab"], **(TINY_WIDTHS if args.tiny else {}))
    with torch.device(device):
        model = build_student(cfg, config.lora, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    model = model.to(device)
    vocab = min(cfg.vocab_size, 40000)
    clock = Clock(device, shape["repeats"])
    rows = decode_leg(model, clock, shape, vocab, device)
    rows += update_leg(model, clock, shape, vocab, device, config)
    rows.append(save_leg(model, clock))
    for row in rows:
        peak = f", peak {row['peak_bytes'] / 1e9:.2f} GB" if row.get("peak_bytes") else ""
        predicted = f" (predicted {row['predicted_peak_bytes'] / 1e9:.2f} GB)" if "predicted_peak_bytes" in row else ""
        rate = f", {row['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in row else ""
        label = " ".join(str(row[k]) for k in ("measure", "lora", "sequences") if row.get(k) is not None)
        print(f"{label}: {row['seconds']:.3f} s{rate}{peak}{predicted}", flush=True)
    result = {
        "shape": "tiny" if args.tiny else "Qwen3-1.7B",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "settings": shape,
        "measurements": rows,
        "preset_step_estimate": step_estimate(rows, config, shape),
    }
    print("preset step estimate: " + json.dumps(result["preset_step_estimate"]), flush=True)
    out = args.out or Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_step_split.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
