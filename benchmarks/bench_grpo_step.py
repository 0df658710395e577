"""GRPO step time and peak memory: this trainer vs TRL's GRPOTrainer, configured the same way, on CPU.

    pip install trl==1.16.0        # for this benchmark only (make bench does it)
    python benchmarks/bench_grpo_step.py [--steps 4] [--max_new_tokens 64]

Both systems, each in a fresh subprocess (so peak RSS is its own): the embedded SmolLM2-135M-Instruct
in float32, LoRA r=8 / alpha=16 / dropout 0 on all attention and MLP projections, 2 prompts x G=4
completions per optimizer step (one micro-batch), up to `--max_new_tokens` new tokens at temperature
1.0, beta (KL coefficient) 0.05, learning rate 1e-4, no vLLM, the same fixture tasks with the same
unified prompt, and the same reward: this project's sandbox, share of tests passed. Teacher- and
self-SFT are switched off in ours so both do plain GRPO. The first step of each is a warm-up and is
not timed. Generation lengths differ run to run (sampling), so the report also gives tokens/s.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARED: dict[str, Any] = {"r": 8, "alpha": 16, "G": 4, "prompts": 2, "beta": 0.05, "lr": 1e-4, "temperature": 1.0}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tasks_for(steps: int):
    from utils.dataset_loader import EMBEDDED_MBPP, load_mbpp

    return load_mbpp(EMBEDDED_MBPP)[0][: SHARED["prompts"] * steps]


def run_ours(steps: int, max_new_tokens: int) -> dict:
    import torch

    from config import build_config
    from rollouts.hf import HFRollout
    from rollouts.sampling import SamplingSettings
    from sandbox.executor import SandboxPool
    from training.grpo_trainer import GRPOTrainer
    from utils.student_model import EMBEDDED_MODELS, attach_lora, load_student

    torch.manual_seed(0)
    config = build_config(
        "cpu",
        overrides=[
            f"grpo.num_samples_per_prompt={SHARED['G']}",
            f"grpo.max_new_tokens={max_new_tokens}",
            f"grpo.kl_coef={SHARED['beta']}",
            f"grpo.temperature={SHARED['temperature']}",
            "training.per_device_train_batch_size=2",
            "training.gradient_accumulation_steps=1",
            f"training.learning_rate={SHARED['lr']}",
            "training.lr_scheduler=constant",
            f"training.max_steps={steps}",
            "dual_source.teacher_sft_weight=0",
            "dual_source.self_sft_weight=0",
            f"lora.r={SHARED['r']}",
            f"lora.lora_alpha={SHARED['alpha']}",
            "lora.lora_dropout=0",
            "grpo.correctness_reward=fraction",
            "grpo.format_reward_weight=0",
            "grpo.loss_aggregation=token-mean",
        ],
    )
    model, tokenizer = load_student(EMBEDDED_MODELS[0], "float32", device="cpu")
    model = attach_lora(model, SHARED["r"], SHARED["alpha"], 0.0, TARGETS)
    tasks = tasks_for(steps)
    rollout = HFRollout(
        tokenizer, max_new_tokens, SamplingSettings(SHARED["temperature"], 1.0), {"enable_thinking": True}, batch_size=8
    )
    with SandboxPool(2) as pool:
        trainer = GRPOTrainer(config, model, tokenizer, tasks, [], "/tmp/bench_grpo_ours", rollout=rollout, pool=pool)
        times, tokens, splits = [], [], []
        for _ in range(steps):
            start = time.perf_counter()
            groups, metrics = trainer.collect_rollouts()
            step_metrics = trainer.train_on_rollouts(groups, metrics)[0]
            trainer.state.rollout_batches += 1
            times.append(time.perf_counter() - start)
            tokens.append(sum(s.completion.num_tokens for g in groups for s in g))
            splits.append(
                (step_metrics["time/rollout_s"], step_metrics["time/reward_s"], step_metrics["time/update_s"])
            )
    return {"step_s": times[1:], "tokens": tokens[1:], "splits": splits[1:], "peak_rss_mb": peak_rss_mb()}


def run_trl(steps: int, max_new_tokens: int) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from sandbox.executor import SandboxPool, execute_many
    from utils.prompts import build_chat_messages, get_unified_prompt
    from utils.student_model import EMBEDDED_MODELS, load_student
    from utils.thinking_extraction import extract_thinking_and_code_unified

    torch.manual_seed(0)
    model, tokenizer = load_student(EMBEDDED_MODELS[0], "float32", device="cpu")
    tasks = tasks_for(steps)
    by_id = {t.task_id: t for t in tasks}
    data = Dataset.from_list(
        [{"prompt": build_chat_messages(get_unified_prompt(t)), "task_id": t.task_id} for t in tasks]
    )
    pool = SandboxPool(2)
    tokens: list[int] = []

    def sandbox_reward(completions, task_id, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        codes = [extract_thinking_and_code_unified(t).code for t in texts]
        tokens.append(sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts))
        return [r.pass_fraction for r in execute_many(list(zip(codes, [by_id[i] for i in task_id], strict=True)), pool)]

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self._start = [], 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._start)

    config = GRPOConfig(
        output_dir="/tmp/bench_grpo_trl",
        per_device_train_batch_size=SHARED["prompts"] * SHARED["G"],
        gradient_accumulation_steps=1,
        num_generations=SHARED["G"],
        max_completion_length=max_new_tokens,
        beta=SHARED["beta"],
        learning_rate=SHARED["lr"],
        lr_scheduler_type="constant",
        temperature=SHARED["temperature"],
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_vllm=False,
        bf16=False,
        use_cpu=True,
        shuffle_dataset=False,
        seed=0,
        num_iterations=1,
        loss_type="dapo",
        scale_rewards="group",
    )
    timer = Timer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=sandbox_reward,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=SHARED["r"], lora_alpha=SHARED["alpha"], lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"
        ),
        callbacks=[timer],
    )
    trainer.train()
    pool.close()
    return {"step_s": timer.times[1:], "tokens": tokens[1:], "splits": None, "peak_rss_mb": peak_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="Optimizer steps per system (the first is a warm-up).")
    parser.add_argument("--max_new_tokens", type=int, default=64, help="Completion budget for both.")
    parser.add_argument("--system", choices=("ours", "trl"), help=argparse.SUPPRESS)  # one system, in a subprocess
    args = parser.parse_args()
    if args.system:
        result = (run_ours if args.system == "ours" else run_trl)(args.steps, args.max_new_tokens)
        print("RESULT " + json.dumps(result))
        return
    results = {}
    for system in ("ours", "trl"):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--system",
                system,
                "--steps",
                str(args.steps),
                "--max_new_tokens",
                str(args.max_new_tokens),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{system} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        results[system] = json.loads(line[len("RESULT ") :])
    print(
        f"{args.steps - 1} timed steps each; {SHARED['prompts']} prompts x G={SHARED['G']}, "
        f"<= {args.max_new_tokens} new tokens\n"
    )
    print(f"{'system':8s} {'s/step':>8s} {'tokens/step':>12s} {'ms/token':>9s} {'peak RSS MB':>12s}")
    for system, r in results.items():
        step = sum(r["step_s"]) / len(r["step_s"])
        tok = sum(r["tokens"]) / max(len(r["tokens"]), 1)
        print(f"{system:8s} {step:8.2f} {tok:12.0f} {1000 * step / max(tok, 1):9.1f} {r['peak_rss_mb']:12.0f}")
    ours, trl = results["ours"], results["trl"]
    step_ratio = (sum(ours["step_s"]) / len(ours["step_s"])) / (sum(trl["step_s"]) / len(trl["step_s"]))
    per_token = (sum(ours["step_s"]) / max(sum(ours["tokens"]), 1)) / (sum(trl["step_s"]) / max(sum(trl["tokens"]), 1))
    print(
        f"\nstep time ours/TRL: {step_ratio:.2f}x; per generated token: {per_token:.2f}x; "
        f"peak memory ours/TRL: {ours['peak_rss_mb'] / trl['peak_rss_mb']:.2f}x"
    )
    if ours["splits"]:
        rollout, reward, update = (sum(s[i] for s in ours["splits"]) / len(ours["splits"]) for i in range(3))
        print(f"ours, per step: rollout {rollout:.1f} s, reward {reward:.2f} s, update {update:.1f} s")


if __name__ == "__main__":
    main()
