"""Colocated vLLM: sampling through the adapter's LoRA request vs with the adapter merged into the engine's weights.

    python -m benchmarks.bench_vllm_weight_sync [--lora_r 64] [--prompts 8] [--samples 4] [--max_new_tokens 96]
                                                [--repeats 2] [--target_modules q_proj,v_proj ...] [--out FILE]

Needs vLLM (`make test-vllm`'s .venv-vllm on CPU, with the Makefile's VLLM_CPU_ENV). A fresh LoRA on the embedded
SmolLM2-135M student (all seven projections, or --target_modules) gets lora_B ~ N(0, --scale), so the adapter
changes the model. Each way of syncing runs in its own process (`--leg`), with the project's engine arguments and
`VLLMRollout`, as phase 3 builds them. Several --target_modules sets are synced one after the other into the same
engine (each a fresh adapter, one sync per set, as successive training steps sync), each measured on its own:

- adapter: the engine has LoRA enabled; the adapter is saved as the trainer's hand-off saves it and sampled with its
  `LoRARequest` (vLLM's LoRA kernels on every projection of every decode step);
- merged: the engine has no LoRA; `load_merged_weights` puts W + scale x B @ A into it (`reload_weights`).

Each leg times the sync and `--repeats` sampling calls (after one warm-up call) of --prompts x --samples sequences of
--max_new_tokens tokens (min_tokens: every sequence decodes the whole budget), and scores the sampled tokens with
HF + peft (the trainer's log-probs): mean |logp_vllm - logp_trainer| must stay within the trainer's tolerance
(1e-3 nats in float32). The parent prints one line per leg and the merged/adapter ratio of tokens/s, and writes
the JSON to --out. Ratios are what carry over between machines; the absolute tokens/s of a loaded 2-core CPU do not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDENT = "embedded:SmolLM2-135M-Instruct"
PROMPTS = (
    "Write a python function that returns the sum of a list of numbers.",
    "Write a python function that reverses a string.",
    "Write a python function that checks whether a number is prime.",
    "Write a python function that counts the vowels in a string.",
    "Write a python function that returns the n-th Fibonacci number.",
    "Write a python function that removes duplicates from a list.",
    "Write a python function that merges two sorted lists.",
    "Write a python function that returns the largest element of a list.",
)
FP32_TOLERANCE = 1e-3  # nats per token: the float32 trainer against a float32 engine (tests/vllm_cpu)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_vllm_weight_sync",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--leg", choices=("adapter", "merged"), help="Run one leg in this process (the parent runs both)."
    )
    parser.add_argument("--lora_r", type=int, default=64, help="Adapter rank (default: %(default)s, the gpu preset's).")
    parser.add_argument("--scale", type=float, default=0.02, help="Std of the perturbed lora_B (default: %(default)s).")
    parser.add_argument("--prompts", type=int, default=8, help="Prompts per sampling call (at most 8).")
    parser.add_argument("--samples", type=int, default=4, help="Samples per prompt (default: %(default)s).")
    parser.add_argument("--max_new_tokens", type=int, default=96, help="Tokens every sample decodes.")
    parser.add_argument("--repeats", type=int, default=2, help="Timed sampling calls after the warm-up.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the perturbation and of the sampling.")
    parser.add_argument(
        "--target_modules",
        nargs="+",
        default=["all-linear"],
        help="The LoRA's target modules, comma-separated; several sets are synced in turn into one engine "
        "(default: all-linear; q_proj,v_proj adapts part of vLLM's fused qkv_proj, the case a merged sync must "
        "complete: give it first, so the engine holds only the base's weights when it is loaded).",
    )
    parser.add_argument("--out", type=Path, help="Write the results as JSON here.")
    return parser.parse_args(argv)


def perturbed_student(lora_r: int, scale: float, seed: int, targets: tuple[str, ...] = ("all-linear",)):
    """(peft model, tokenizer): the embedded student in float32 with a LoRA on `targets` whose lora_B is seeded
    noise."""
    import torch

    from utils.student_model import attach_lora, load_student

    torch.manual_seed(seed)
    model, tokenizer = load_student(STUDENT, "float32", device="cpu")
    model = attach_lora(model, lora_r, 2 * lora_r, 0.0, targets)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    model.eval()
    return model, tokenizer


def run_leg(args: argparse.Namespace) -> list[dict]:
    """One way of syncing, in this process: one engine, each --target_modules set's adapter synced and measured in
    turn; one result per set."""
    import torch
    import vllm

    from rollouts.sampling import SamplingSettings
    from rollouts.vllm_colocated import VLLMRollout
    from rollouts.vllm_engine import AdapterHandoff, build_engine, engine_kwargs
    from utils.student_model import load_tokenizer, resolve_model_path, save_adapter

    merged = args.leg == "merged"
    kwargs = engine_kwargs(
        resolve_model_path(STUDENT),
        max_model_len=512,
        gpu_memory_utilization=0.3,
        dtype="float32",
        seed=args.seed,
        lora_rank=None if merged else args.lora_r,
        cpu_platform=True,
    )
    tokenizer = load_tokenizer(STUDENT)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_vllm_weight_sync_") as tmp:
        handoff = (
            None
            if merged
            else AdapterHandoff(
                Path(tmp), lambda m, path: save_adapter(m, None, path, torch.float32), True, lambda: None
            )
        )
        start = time.monotonic()
        llm = build_engine(vllm, kwargs, in_process=merged)
        engine_s = time.monotonic() - start
        rollout = VLLMRollout(
            llm,
            tokenizer,
            args.max_new_tokens,
            SamplingSettings(temperature=1.0),
            handoff=handoff,
            vllm_module=vllm,
            weight_sync="merged" if merged else "adapter",
            engine_dtype=torch.float32,
        )
        real_params = vllm.SamplingParams

        def every_token(**fields):  # the whole budget for every sequence: the same work in both legs
            return real_params(**fields, min_tokens=args.max_new_tokens)

        rollout.vllm = type("vllm_with_min_tokens", (), {"SamplingParams": staticmethod(every_token)})
        for step, targets in enumerate(args.target_modules):
            model, _ = perturbed_student(
                args.lora_r, args.scale, args.seed, tuple(t.strip() for t in targets.split(",") if t.strip())
            )
            result = measure_sync(args, rollout, model, tokenizer, step)
            results.append({"leg": args.leg, "target_modules": targets, "engine_start_s": round(engine_s, 2), **result})
    return results


def measure_sync(args: argparse.Namespace, rollout, model, tokenizer, step: int) -> dict:
    """Sync `model` into the rollout's engine as training step `step` would, time the sampling calls, and score
    the samples with the trainer (HF + peft) and with the base model (the adapter disabled)."""
    import torch

    from training.batching import completion_logprobs, pad_rollout_batch

    prompts = list(PROMPTS[: args.prompts])
    start = time.monotonic()
    rollout.sync(model, step)
    sync_s = time.monotonic() - start  # adapter: the save (vLLM reads the folder at the first request)
    groups = rollout.sample(prompts, args.samples)  # warm-up (adapter: loads the folder)
    timings = []
    for repeat in range(args.repeats):
        start = time.monotonic()
        groups = rollout.sample(prompts, args.samples, seed=args.seed + repeat)
        timings.append(time.monotonic() - start)
    rollout.release()
    samples = [c for group in groups for c in group]
    tokens = sum(len(c.token_ids) for c in samples)
    batch = pad_rollout_batch(samples, tokenizer.pad_token_id or 0)
    mask = batch["completion_mask"].float()
    with torch.no_grad():
        trainer = completion_logprobs(model, batch).float()
        with model.disable_adapter():
            base = completion_logprobs(model, batch).float()
    sampled = batch["sampling_logps"].float()

    def mean_abs(a, b) -> float:
        return float(((a - b).abs() * mask).sum() / mask.sum().clamp(min=1))

    best = min(timings)
    return {
        "sync_s": round(sync_s, 3),
        "sample_s": [round(t, 3) for t in timings],
        "tokens": tokens,
        "tokens_per_s": round(tokens / best, 1),
        "logp_abs_diff_vs_trainer": mean_abs(sampled, trainer),
        "logp_abs_diff_vs_base": mean_abs(sampled, base),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.leg:
        print("RESULT " + json.dumps(run_leg(args)), flush=True)
        return 0
    results: dict = {}
    flags = [f"--{k}={v}" for k, v in vars(args).items() if k not in ("leg", "out", "target_modules") and v is not None]
    for leg in ("adapter", "merged"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_vllm_weight_sync",
                "--leg",
                leg,
                *flags,
                "--target_modules",
                *args.target_modules,
            ],
            capture_output=True,
            text=True,
            env=os.environ.copy(),
            cwd=ROOT,
        )
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not found:
            print(proc.stdout[-3000:] + proc.stderr[-5000:], file=sys.stderr)
            return 1
        results[leg] = json.loads(found[-1][len("RESULT ") :])
        for r in results[leg]:
            within = r["logp_abs_diff_vs_trainer"] < FP32_TOLERANCE
            print(
                f"{leg:8s} {r['target_modules']}: {r['tokens_per_s']:8.1f} tokens/s ({r['tokens']} tokens, best of "
                f"{r['sample_s']} s); sync {r['sync_s']} s; mean |logp_vllm - logp_trainer| "
                f"{r['logp_abs_diff_vs_trainer']:.5f} ({'within' if within else 'OUTSIDE'} {FP32_TOLERANCE}), "
                f"vs the base {r['logp_abs_diff_vs_base']:.4f}",
                flush=True,
            )
    ratios = [m["tokens_per_s"] / a["tokens_per_s"] for a, m in zip(results["adapter"], results["merged"], strict=True)]
    results["merged_over_adapter_tokens_per_s"] = [round(r, 2) for r in ratios]
    results["load"] = os.getloadavg()
    print(
        f"merged / adapter tokens/s: {', '.join(f'{r:.2f}x' for r in ratios)} (load average {results['load'][0]:.1f})"
    )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    ok = all(r["logp_abs_diff_vs_trainer"] < FP32_TOLERANCE for leg in ("adapter", "merged") for r in results[leg])
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
