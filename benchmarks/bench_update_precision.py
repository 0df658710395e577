"""The update in bfloat16 autocast against float32, on the cpu preset's student (`make run`'s phase 3), on CPU.

    python -m benchmarks.bench_update_precision [--steps 4]

The cpu preset's phase 3 (the embedded SmolLM2-135M-Instruct in float32, LoRA r=8 on every projection, 2 prompts
x 4 completions, up to 128 new tokens, forward chunks of 2 rows, KL 0.05, self-SFT on; teacher-SFT off: no traces
here) with its own trainer. Each rollout batch is sampled once (transformers generate), then its update
(`train_on_rollouts`: the reference forward, the backward passes, the optimizer step) is timed twice from the same
weights, once with every forward of the policy in float32 and once under `torch.autocast("cpu", bfloat16)` (the
forward as accelerate's `mixed_precision="bf16"` wraps it), in alternating order; the first is undone. Timed in
wall seconds and in process CPU seconds (all threads), which other jobs on a shared machine hardly change: the
paired ratios are what carries over. Fidelity, on every batch: the per-token completion log-probs under both
(mean and max |difference| in nats over the completion tokens) and the GRPO loss of each update. The first step
is a warm-up and is not counted. Writes benchmarks/results/bench_update_precision.json with the load average.
Run with OMP_WAIT_POLICY=PASSIVE on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
from pathlib import Path
from typing import Any

from benchmarks.bench_grpo_step import tasks_for, timed_update

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "benchmarks" / "results"


def precision_switch(model: Any) -> dict[str, bool]:
    """Wrap `model.forward` so that every forward (the trainer's, its no-grad threads') runs under bfloat16
    autocast while the returned flag says so; logits come back in float32, as accelerate's wrapper returns them."""
    import torch

    forward, flag = model.forward, {"bf16": False}

    def switched(*args: Any, **kwargs: Any) -> Any:
        if not flag["bf16"]:
            return forward(*args, **kwargs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward(*args, **kwargs)
        out.logits = out.logits.float()
        return out

    model.forward = switched
    return flag


def logprob_gap(trainer: Any, groups: list, flag: dict[str, bool]) -> dict[str, float]:
    """Per-token |log p_bf16 - log p_fp32| over the completion tokens of the batch (no grad)."""
    import torch

    from training.batching import completion_logprobs, pad_rollout_batch

    samples = [s.completion for g in groups for s in g]
    batch = pad_rollout_batch(samples, trainer.tokenizer.pad_token_id)
    mask = batch["completion_mask"].bool()
    out = {}
    with torch.no_grad():
        for bf16 in (False, True):
            flag["bf16"] = bf16
            out[bf16] = completion_logprobs(trainer.model, batch, trainer.grpo.temperature)[mask]
    flag["bf16"] = False
    gap = (out[True] - out[False]).abs()
    return {"mean_abs_nats": float(gap.mean()), "max_abs_nats": float(gap.max()), "tokens": int(mask.sum())}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_update_precision",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=4, help="Rollout batches (the first is a warm-up; default 4).")
    args = parser.parse_args(argv)
    import torch

    from config import build_config
    from rollouts.hf import HFRollout
    from rollouts.sampling import SamplingSettings
    from sandbox.executor import SandboxPool
    from training.grpo_trainer import GRPOTrainer
    from training.setup import build_run
    from utils.student_model import EMBEDDED_MODELS, attach_lora, load_student

    torch.manual_seed(0)
    config = build_config("cpu", overrides=[f"training.max_steps={2 * args.steps}", "dual_source.teacher_sft_weight=0"])
    lora = config.lora
    model, tokenizer = load_student(EMBEDDED_MODELS[0], "float32", device="cpu")
    model = attach_lora(model, lora.r, lora.lora_alpha, lora.lora_dropout, list(lora.target_modules))
    g = config.grpo
    rollout = HFRollout(tokenizer, g.max_new_tokens, SamplingSettings(g.temperature, 1.0), {"enable_thinking": True})
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with SandboxPool(2) as pool:
        parts = build_run(
            config,
            tasks=tasks_for(args.steps),
            teacher_examples=[],
            output_dir="/tmp/bench_update_precision",
            model=model,
            tokenizer=tokenizer,
            rollout=rollout,
            pool=pool,
        )
        trainer = GRPOTrainer(parts)
        flag = precision_switch(trainer.model)
        for step in range(args.steps):
            groups, metrics = trainer.collect_rollouts()
            gap = logprob_gap(trainer, groups, flag)
            timed = {}
            order = (True, False) if step % 2 else (False, True)
            for i, bf16 in enumerate(order):  # the first of the two is undone; training follows the second
                flag["bf16"] = bf16
                timed[bf16] = timed_update(trainer, groups, metrics, trainer.training.shared_prompt_forward,
                                           undo=i == 0)  # fmt: skip
            flag["bf16"] = False
            trainer.state.rollout_batches += 1
            row: dict[str, Any] = {
                "step": step,
                "tokens": sum(s.completion.num_tokens for grp in groups for s in grp),
                "update_s": {"fp32": timed[False][0], "bf16": timed[True][0]},
                "update_cpu_s": {"fp32": timed[False][1], "bf16": timed[True][1]},
                "loss_grpo": {"fp32": timed[False][2].get("loss/grpo"), "bf16": timed[True][2].get("loss/grpo")},
                "kl": {"fp32": timed[False][2].get("kl"), "bf16": timed[True][2].get("kl")},
                "logprob_gap": gap,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    counted = rows[1:]

    def median_ratio(key: str) -> float:
        return statistics.median(r[key]["fp32"] / r[key]["bf16"] for r in counted)

    report = {
        "what": "update (train_on_rollouts) fp32 vs bf16 autocast, cpu preset, paired on the same rollouts",
        "steps_counted": len(counted),
        "speedup_wall_median": median_ratio("update_s"),
        "speedup_cpu_median": median_ratio("update_cpu_s"),
        "logprob_gap_mean_abs_nats": statistics.mean(r["logprob_gap"]["mean_abs_nats"] for r in counted),
        "logprob_gap_max_abs_nats": max(r["logprob_gap"]["max_abs_nats"] for r in counted),
        "rows": rows,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_update_precision.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=2))
    return report


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
