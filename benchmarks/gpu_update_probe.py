"""Where the `gpu` preset's update time goes in steady state on one GPU, and the hf fallback's decode rate at 8 vs
64 sequences: the short GPU run's probe.

    python -m benchmarks.gpu_update_probe [--repeats 5] [--out DIR]   # a GPU: Qwen3-1.7B's shape (~3-4 min, estimate)
    python -m benchmarks.gpu_update_probe --tiny [--out DIR]          # CPU: a 2-layer toy through the same code (CI)

Needs only torch, transformers and peft besides the project: Qwen3-1.7B's architecture written out
(`bench_memory.qwen3_config`), random bfloat16 weights, random token ids, the `gpu` preset's LoRA attached the
project's way; no tokenizer, no hub, no vLLM. Each timed measurement is a warm-up, then the median of --repeats runs
(`gpu_step_split.Clock`), with `torch.cuda.max_memory_allocated` as its peak and `training.memory_model`'s
prediction beside it. DIR/gpu_update_probe.json (DIR: --out, else $OUT, else benchmarks/results) is rewritten after
every leg, so a run stopped by a time limit keeps what it measured. The legs, in order:

1. merged_weights: `rollouts.vllm_colocated.merged_lora_weights` over the whole model in bfloat16, the trainer's
   half of each merged vLLM sync (every adapted projection's W + scale x B @ A in float32, cast).
2. update pieces, gradient checkpointing on (the preset's), as phase 3 runs them: the GRPO chunk of 4 rows of
   512 + 1,024 tokens (forward + backward, dropout off: `completion_logprobs`), the same with 8 rows (a
   `training.forward_chunk_size` of 8), the reference forward of 4 rows (adapter off, no grad), the teacher-SFT pass
   of 2 x 3,072 tokens with LoRA dropout **on** (phase 3's SFT terms keep it: the pass that sets the preset's
   predicted peak), then the 4-row GRPO chunk without checkpointing (the knob's price).
3. grpo_chunk_profile: `torch.profiler` over one 4-row chunk: wall time against the summed device time of its
   kernels (launch-bound when far below) and the 15 kernels that take the most.
4. hf_generate: one call of 8 and one of 64 sequences x 128 new tokens, LoRA unmerged (as `HFRollout` samples):
   ms per decode step (the fallback's time per step assumes the 8-sequence rate holds at 64).

`update_estimate` puts the preset's update together from leg 2: 8 micro-batches x (2 GRPO chunks + 1 SFT pass), and
says which of the decision rules in docs/gpu.md ("The next GPU run") the figures trigger.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_step_split import SHAPES, TINY_WIDTHS, Clock, random_ids, sample_fixed_length

ROOT = Path(__file__).resolve().parent.parent

GRPO_ROWS = (4, 8)  # the preset's training.forward_chunk_size, and twice it
SFT_ROWS = 2  # dual_source.teacher_sft_batch_size
DECODE_SEQUENCES = (8, 64)  # one micro-batch's samples, and the preset's whole rollout batch (2 x 8 prompts x G 4)
TOP_KERNELS = 15


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_update_probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tiny", action="store_true", help="A 2-layer toy shape on the CPU (the CI check).")
    parser.add_argument("--repeats", type=int, help="Timed runs per measurement after the warm-up (default 5; tiny 1).")
    parser.add_argument(
        "--out", type=Path, help="Folder for gpu_update_probe.json (default $OUT, else benchmarks/results)."
    )
    return parser.parse_args(argv)


class Record:
    """The probe's JSON, written whole after every leg (a time limit keeps the legs that finished)."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {**header, "legs": {}}
        path.parent.mkdir(parents=True, exist_ok=True)

    def leg(self, name: str, value: Any) -> None:
        self.data["legs"][name] = value
        self.save()
        print(f"{name}: {json.dumps(value)[:400]}", flush=True)

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)


def gigabytes(value: float | None) -> float | None:
    return None if value is None else round(value / 1e9, 3)


def merged_weights_leg(model: Any, clock: Clock, dtype: torch.dtype) -> dict:
    """Leg 1: the trainer's half of a merged sync, every tensor it yields built (what `reload_weights` receives)."""
    from rollouts.vllm_colocated import merged_lora_weights

    def build() -> int:
        return sum(tensor.numel() for _, tensor in merged_lora_weights(model, dtype))

    seconds, peak = clock(build)
    return {"seconds": seconds, "elements": build(), "peak_gb": gigabytes(peak)}


def update_passes(model: Any, shape: dict, vocab: int, device: torch.device) -> dict[str, Callable[[], None]]:
    """Leg 2's callables, each one pass as phase 3 runs it."""
    from benchmarks.bench_memory import rollout_batch
    from training.batching import chunked_completion_logprobs, completion_logprobs, dropout_disabled
    from training.losses import masked_sft_nll

    batches = {
        rows: {k: v.to(device) for k, v in rollout_batch(vocab, rows, shape["prompt"], shape["completion"]).items()}
        for rows in GRPO_ROWS
    }
    sft_ids = random_ids(vocab, SFT_ROWS, shape["sft"], device, seed=7)
    labels = sft_ids.clone()
    labels[:, : shape["sft"] // 4] = -100  # the prompt's share, masked as teacher-SFT masks it

    def grpo(rows: int) -> Callable[[], None]:
        def run() -> None:
            with dropout_disabled(model):  # the RL passes run without dropout (training.passes)
                (-completion_logprobs(model, batches[rows]).sum()).backward()

        return run

    def reference() -> None:
        with torch.no_grad(), dropout_disabled(model), model.disable_adapter():
            chunked_completion_logprobs(model, batches[GRPO_ROWS[0]], GRPO_ROWS[0])

    def teacher_sft() -> None:  # dropout on, as phase 3's SFT terms run
        out = model(input_ids=sft_ids, attention_mask=torch.ones_like(sft_ids))
        masked_sft_nll(out.logits, labels)[0].backward()

    return {
        "grpo_chunk_4_rows": grpo(4),
        "grpo_chunk_8_rows": grpo(8),
        "reference_4_rows": reference,
        "teacher_sft_2_rows": teacher_sft,
    }


def predicted_peaks(model: Any, shape: dict, config: Any) -> dict[str, float]:
    """`training.memory_model`'s peak for each pass of leg 2 (CUDA's 1-byte dropout mask on the SFT pass)."""
    from training import memory_model as mm

    mshape = mm.ModelShape.from_hf_config(model.config)
    r, targets = config.lora.r, mm.lora_targets(config.lora.target_modules)
    prompt, completion = shape["prompt"], shape["completion"]
    mask = 1 if config.lora.lora_dropout > 0 else 0
    return {
        "grpo_chunk_4_rows": mm.policy_pass(mshape, r, targets, 4, prompt, completion, True).total,
        "grpo_chunk_8_rows": mm.policy_pass(mshape, r, targets, 8, prompt, completion, True).total,
        "reference_4_rows": mm.static_bytes(mshape, r, targets) + mm.no_grad_pass(mshape, 4, prompt, completion),
        "teacher_sft_2_rows": mm.policy_pass(
            mshape, r, targets, SFT_ROWS, 0, shape["sft"], True, dropout_mask=mask, sft=True
        ).total,
        "grpo_chunk_4_rows_no_checkpointing": mm.policy_pass(mshape, r, targets, 4, prompt, completion, False).total,
    }


def update_leg(model: Any, clock: Clock, passes: dict[str, Callable[[], None]], predicted: dict) -> dict:
    """Leg 2: seconds and peak of each pass with checkpointing, then the 4-row chunk without it."""
    found = {}
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model.train()
    for name, run in passes.items():
        model.zero_grad(set_to_none=False)
        seconds, peak = clock(run)
        found[name] = {"seconds": seconds, "peak_gb": gigabytes(peak), "predicted_gb": gigabytes(predicted[name])}
    model.gradient_checkpointing_disable()
    model.zero_grad(set_to_none=False)
    seconds, peak = clock(passes["grpo_chunk_4_rows"])
    name = "grpo_chunk_4_rows_no_checkpointing"
    found[name] = {"seconds": seconds, "peak_gb": gigabytes(peak), "predicted_gb": gigabytes(predicted[name])}
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return found


def profile_leg(model: Any, clock: Clock, chunk: Callable[[], None], device: torch.device) -> dict:
    """Leg 3: one 4-row GRPO chunk (checkpointing on) under the profiler: wall vs summed kernel time, top kernels."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    model.zero_grad(set_to_none=False)
    chunk()  # warm
    clock.sync()
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        chunk()
        clock.sync()
    wall = time.perf_counter() - start
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = list(prof.key_averages())
    busy = sum(float(getattr(e, attribute, 0) or 0) for e in events) / 1e6
    top = sorted(events, key=lambda e: float(getattr(e, attribute, 0) or 0), reverse=True)[:TOP_KERNELS]
    return {
        "wall_s": wall,
        "summed_self_time_s": busy,
        "time_kind": "device (kernels)" if device.type == "cuda" else "cpu (operators)",
        "top": [
            {"name": e.key[:80], "seconds": float(getattr(e, attribute, 0) or 0) / 1e6, "calls": e.count} for e in top
        ],
    }


def decode_leg(model: Any, shape: dict, vocab: int, device: torch.device, record: Record) -> dict:
    """Leg 4: ms per decode step of hf generate at 8 and 64 sequences (a warm-up and one timed call each)."""
    model.gradient_checkpointing_disable()
    model.eval()
    found: dict[str, Any] = {}
    for sequences in DECODE_SEQUENCES:
        ids = random_ids(vocab, sequences, shape["decode_prompt"], device, seed=sequences)

        def generate(ids: torch.Tensor = ids) -> None:
            sample_fixed_length(model, ids, shape["decode"])

        seconds, peak = Clock(device, 1)(generate)
        found[str(sequences)] = {
            "seconds": seconds,
            "ms_per_decode_step": 1000 * seconds / shape["decode"],
            "peak_gb": gigabytes(peak),
        }
        record.leg("hf_generate", found)  # after each call: the 64-sequence one is the longest
    return found


def update_estimate(update: dict, decode: dict | None, config: Any) -> dict:
    """The preset's update from leg 2 (per micro-batch: its GRPO chunks and one teacher-SFT pass; the reference
    forwards run beside the scoring) and the decision rules' verdicts."""
    t, g = config.training, config.grpo
    micro, rows = t.gradient_accumulation_steps, t.per_device_train_batch_size * g.num_samples_per_prompt
    chunks_4 = -(-rows // 4)
    four, eight = update["grpo_chunk_4_rows"], update["grpo_chunk_8_rows"]
    sft = update["teacher_sft_2_rows"]
    out: dict[str, Any] = {
        "update_s": micro * (chunks_4 * four["seconds"] + sft["seconds"]),
        "update_s_with_8_row_chunks": micro * (-(-rows // 8) * eight["seconds"] + sft["seconds"]),
        "update_s_without_checkpointing": micro
        * (chunks_4 * update["grpo_chunk_4_rows_no_checkpointing"]["seconds"] + sft["seconds"]),
        "reference_s": micro * chunks_4 * update["reference_4_rows"]["seconds"],
        "eight_rows_over_four": eight["seconds"] / four["seconds"],
    }
    if sft["peak_gb"] is not None:
        out["sft_peak_plus_allowance_gb"] = sft["peak_gb"] + 5.5  # the preflight's fixed allowance
        out["fits_24_gb"] = out["sft_peak_plus_allowance_gb"] <= 24
    if decode:
        out["decode_64_over_8_ms_per_step"] = decode["64"]["ms_per_decode_step"] / decode["8"]["ms_per_decode_step"]
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from benchmarks.bench_memory import build_student, qwen3_config
    from config import build_config

    shape = dict(SHAPES["tiny" if args.tiny else "full"])
    repeats = args.repeats or (1 if args.tiny else 5)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out = args.out or Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    record = Record(
        out / "gpu_update_probe.json",
        {
            "shape": "tiny" if args.tiny else "Qwen3-1.7B",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "dtype": str(dtype).removeprefix("torch."),
            "repeats": repeats,
            "tokens": {k: shape[k] for k in ("prompt", "completion", "sft", "decode", "decode_prompt")},
        },
    )
    config = build_config("gpu")
    cfg = qwen3_config(shape["layers"], vocab=shape["vocab"], **(TINY_WIDTHS if args.tiny else {}))
    start = time.perf_counter()
    with torch.device(device):
        model = build_student(cfg, config.lora, dtype=dtype)
    model = model.to(device)
    vocab = min(cfg.vocab_size, 40000)
    record.leg("build_s", round(time.perf_counter() - start, 2))
    clock = Clock(device, repeats)
    record.leg("merged_weights", merged_weights_leg(model, clock, dtype))
    passes = update_passes(model, shape, vocab, device)
    update = update_leg(model, clock, passes, predicted_peaks(model, shape, config))
    record.leg("update", update)
    record.leg("grpo_chunk_profile", profile_leg(model, clock, passes["grpo_chunk_4_rows"], device))
    decode = decode_leg(model, shape, vocab, device, record)
    record.leg("update_estimate", update_estimate(update, decode, config))
    record.data["load_average"] = os.getloadavg()
    record.save()
    print("done", flush=True)
    return record.data


if __name__ == "__main__":
    main()
