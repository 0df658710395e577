"""GRPO step time and peak memory: this trainer vs TRL's GRPOTrainer, configured the same way, on CPU.

    pip install trl==1.16.0        # for this benchmark only (make bench does it)
    python -m benchmarks.bench_grpo_step [--steps 4] [--max_new_tokens 64] [--group_sizes 4 8]

Both systems, each in a fresh subprocess per group size G (so peak RSS is its own): the embedded
SmolLM2-135M-Instruct in float32, LoRA r=8 / alpha=16 / dropout 0 on all attention and MLP projections,
2 prompts x G completions per optimizer step (one micro-batch), up to `--max_new_tokens` new tokens at
temperature 1.0, beta (KL coefficient) 0.05, learning rate 1e-4, no vLLM, the same fixture tasks with
the same unified prompt, and the same reward: this project's sandbox, share of tests passed. Teacher-
and self-SFT are switched off in ours so both do plain GRPO; ours keeps the cpu preset's
`training.forward_chunk_size=2`. The first step of each is a warm-up and is not timed. Generation
lengths differ run to run (sampling), so the report also gives tokens/s.

Ours times the *update* (`train_on_rollouts`: the reference forward, the backward passes and the
optimizer step; not sampling or rewards) twice on every rollout batch: with the shared-prompt forward
(`training.shared_prompt_forward`, each group's prompt read once) and with full-row forwards, in
alternating order, from the same weights (the full-row update is undone, so training follows the shared
path). The step time of each is the rollout + reward time plus its update. TRL's update is its
`training_step` without generation and rewards (`_prepare_inputs`) but with its no-grad log-prob forwards
(reference, old), so the same work as ours bar the optimizer step. Figures go to
benchmarks/results/bench_grpo_step.{json,md} with the machine load; the ratios are what carries over.
Updates are also timed in process CPU seconds (all threads), which other jobs on a shared machine hardly
change; run with OMP_WAIT_POLICY=PASSIVE there, so threads waiting for a busy core do not spin and count.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SHARED: dict[str, Any] = {"r": 8, "alpha": 16, "prompts": 2, "beta": 0.05, "lr": 1e-4, "temperature": 1.0}
RESULTS = ROOT / "benchmarks" / "results"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tasks_for(steps: int):
    from utils.dataset_loader import EMBEDDED_MBPP, load_mbpp

    return load_mbpp(EMBEDDED_MBPP)[0][: SHARED["prompts"] * steps]


def set_shared_prompt(trainer: Any, on: bool) -> None:
    """Switch the trainer's shared-prompt forward (the config is frozen: replaced, as the pass runner is)."""
    trainer.training = dataclasses.replace(trainer.training, shared_prompt_forward=on)
    trainer.passes = dataclasses.replace(trainer.passes, shared_prompt=on)


def timed_update(trainer: Any, groups: list, metrics: dict, shared: bool, undo: bool) -> tuple[float, float, dict]:
    """Wall and process-CPU seconds of `train_on_rollouts` with the shared prompt on or off; with `undo`, the
    weights, optimizer state and step counter are put back afterwards. The CPU seconds (every thread of this
    process) hardly move with other jobs on the machine, so their ratio holds where wall-clock ratios do not."""
    import torch

    params = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    saved = (
        {n: p.detach().clone() for n, p in params.items()},
        copy.deepcopy(trainer.optimizer.state_dict()),
        copy.deepcopy(trainer.scheduler.state_dict()),
        trainer.state.global_step,
    )
    set_shared_prompt(trainer, shared)
    start, cpu_start = time.perf_counter(), time.process_time()
    step_metrics = trainer.train_on_rollouts(groups, metrics)[0]
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if undo:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(saved[0][name])
        trainer.optimizer.load_state_dict(saved[1])
        trainer.scheduler.load_state_dict(saved[2])
        trainer.state.global_step = saved[3]
    return seconds, cpu_seconds, step_metrics


def run_ours(steps: int, max_new_tokens: int, group_size: int) -> dict:
    import torch

    from config import build_config
    from rollouts.hf import HFRollout
    from rollouts.sampling import SamplingSettings
    from sandbox.executor import SandboxPool
    from training.grpo_trainer import GRPOTrainer
    from training.setup import build_run
    from utils.student_model import EMBEDDED_MODELS, attach_lora, load_student

    torch.manual_seed(0)
    config = build_config(
        "cpu",
        overrides=[
            f"grpo.num_samples_per_prompt={group_size}",
            f"grpo.max_new_tokens={max_new_tokens}",
            f"grpo.kl_coef={SHARED['beta']}",
            f"grpo.temperature={SHARED['temperature']}",
            "training.per_device_train_batch_size=2",
            "training.gradient_accumulation_steps=1",
            f"training.learning_rate={SHARED['lr']}",
            "training.lr_scheduler=constant",
            f"training.max_steps={2 * steps}",
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
        parts = build_run(
            config,
            tasks=tasks,
            teacher_examples=[],
            output_dir="/tmp/bench_grpo_ours",
            model=model,
            tokenizer=tokenizer,
            rollout=rollout,
            pool=pool,
        )
        trainer = GRPOTrainer(parts)
        sample_s, shared_s, full_s, tokens, prompt_tokens, losses = [], [], [], [], [], []
        shared_cpu_s, full_cpu_s = [], []
        for step in range(steps):
            start = time.perf_counter()
            groups, metrics = trainer.collect_rollouts()
            sample_s.append(time.perf_counter() - start)
            updates = {}
            for shared in (step % 2 == 0, step % 2 == 1):  # alternate which goes first; the full-row one is undone
                updates[shared] = timed_update(trainer, groups, metrics, shared, undo=not shared)
            trainer.state.rollout_batches += 1
            shared_s.append(updates[True][0])
            full_s.append(updates[False][0])
            shared_cpu_s.append(updates[True][1])
            full_cpu_s.append(updates[False][1])
            losses.append((updates[True][2].get("loss/grpo"), updates[False][2].get("loss/grpo")))
            tokens.append(sum(s.completion.num_tokens for g in groups for s in g))
            prompt_tokens.append(statistics.mean(len(g[0].completion.prompt_ids) for g in groups))
    step_shared = [a + b for a, b in zip(sample_s, shared_s, strict=True)]
    step_full = [a + b for a, b in zip(sample_s, full_s, strict=True)]
    return {
        "step_s": step_shared[1:],
        "step_full_rows_s": step_full[1:],
        "sample_s": sample_s[1:],  # rollout + reward
        "update_s": shared_s[1:],
        "update_full_rows_s": full_s[1:],
        "update_cpu_s": shared_cpu_s[1:],
        "update_full_rows_cpu_s": full_cpu_s[1:],
        "loss_grpo_shared_vs_full": losses[1:],
        "tokens": tokens[1:],
        "prompt_tokens": prompt_tokens[1:],
        "peak_rss_mb": peak_rss_mb(),
    }


def run_trl(steps: int, max_new_tokens: int, group_size: int) -> dict:
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
        per_device_train_batch_size=SHARED["prompts"] * group_size,
        gradient_accumulation_steps=1,
        num_generations=group_size,
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
    # the update without generation and rewards: training_step minus _prepare_inputs, plus the no-grad
    # log-prob forwards (reference, old) that _prepare_inputs runs
    update, prepare, nograd = [0.0], [0.0], [0.0]
    update_cpu, prepare_cpu, nograd_cpu = [0.0], [0.0], [0.0]
    inner_step, inner_prepare, inner_logps = (
        trainer.training_step,
        trainer._prepare_inputs,
        (trainer._get_per_token_logps_and_entropies),
    )

    def timing(inner, into, into_cpu, only_nograd=False):
        def wrapped(*args, **kwargs):
            start, cpu_start = time.perf_counter(), time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                if not only_nograd or not torch.is_grad_enabled():
                    into[-1] += time.perf_counter() - start
                    into_cpu[-1] += time.process_time() - cpu_start

        return wrapped

    setattr(trainer, "training_step", timing(inner_step, update, update_cpu))  # noqa: B010 (instance attributes, not methods)
    setattr(trainer, "_prepare_inputs", timing(inner_prepare, prepare, prepare_cpu))  # noqa: B010
    setattr(trainer, "_get_per_token_logps_and_entropies", timing(inner_logps, nograd, nograd_cpu, only_nograd=True))  # noqa: B010

    class Splitter(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            for into in (update, prepare, nograd, update_cpu, prepare_cpu, nograd_cpu):
                into.append(0.0)

    trainer.add_callback(Splitter())
    trainer.train()
    pool.close()
    updates = [u - p + n for u, p, n in zip(update[:-1], prepare[:-1], nograd[:-1], strict=True)]
    cpu = [u - p + n for u, p, n in zip(update_cpu[:-1], prepare_cpu[:-1], nograd_cpu[:-1], strict=True)]
    return {
        "step_s": timer.times[1:],
        "update_s": updates[1:],
        "update_cpu_s": cpu[1:],
        "tokens": tokens[1:],
        "peak_rss_mb": peak_rss_mb(),
    }


def mean(values: list[float]) -> float:
    return sum(values) / max(len(values), 1)


def median_ratio(a: list[float], b: list[float]) -> float:
    """The median over steps of a / b (paired: the same rollouts)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def report(results: dict, args: argparse.Namespace, load: dict) -> tuple[dict, str]:
    """The summary (json) and a markdown table of every group size."""
    rows, summary = [], {}
    for group_size, by_system in results.items():
        ours, trl = by_system["ours"], by_system.get("trl")
        entry = {
            "update_s_shared": mean(ours["update_s"]),
            "update_s_full_rows": mean(ours["update_full_rows_s"]),
            "step_s_shared": mean(ours["step_s"]),
            "step_s_full_rows": mean(ours["step_full_rows_s"]),
            "update_speedup_shared_vs_full_rows": median_ratio(ours["update_full_rows_s"], ours["update_s"]),
            "update_cpu_s_shared": mean(ours["update_cpu_s"]),
            "update_cpu_s_full_rows": mean(ours["update_full_rows_cpu_s"]),
            "update_cpu_speedup_shared_vs_full_rows": median_ratio(
                ours["update_full_rows_cpu_s"], ours["update_cpu_s"]
            ),
            "step_speedup_shared_vs_full_rows": median_ratio(ours["step_full_rows_s"], ours["step_s"]),
            "prompt_tokens": mean(ours["prompt_tokens"]),
            "generated_tokens_per_step": mean(ours["tokens"]),
            "peak_rss_mb": ours["peak_rss_mb"],
        }
        if trl is not None:
            entry.update(
                {
                    "trl_update_s": mean(trl["update_s"]),
                    "trl_step_s": mean(trl["step_s"]),
                    "trl_generated_tokens_per_step": mean(trl["tokens"]),
                    "trl_peak_rss_mb": trl["peak_rss_mb"],
                    "update_ratio_trl_vs_shared": mean(trl["update_s"]) / entry["update_s_shared"],
                    "update_ratio_trl_vs_full_rows": mean(trl["update_s"]) / entry["update_s_full_rows"],
                    "trl_update_cpu_s": mean(trl["update_cpu_s"]),
                    "update_cpu_ratio_trl_vs_shared": mean(trl["update_cpu_s"]) / entry["update_cpu_s_shared"],
                    "update_cpu_ratio_trl_vs_full_rows": mean(trl["update_cpu_s"]) / entry["update_cpu_s_full_rows"],
                    "step_ratio_trl_vs_shared": mean(trl["step_s"]) / entry["step_s_shared"],
                }
            )
        summary[str(group_size)] = entry
        trl_cells = (
            f"{entry['trl_update_s']:.1f} | {entry['trl_update_cpu_s']:.1f} | {entry['trl_step_s']:.1f} | "
            f"{entry['trl_peak_rss_mb']:.0f}"
            if trl is not None
            else "- | - | - | -"
        )
        rows.append(
            f"| {group_size} | {entry['prompt_tokens']:.0f} | {entry['generated_tokens_per_step']:.0f} | "
            f"{entry['update_s_full_rows']:.1f} | {entry['update_s_shared']:.1f} | "
            f"{entry['update_speedup_shared_vs_full_rows']:.2f}x | {entry['update_cpu_s_full_rows']:.1f} | "
            f"{entry['update_cpu_s_shared']:.1f} | {entry['update_cpu_speedup_shared_vs_full_rows']:.2f}x | "
            f"{entry['step_s_full_rows']:.1f} | "
            f"{entry['step_s_shared']:.1f} | {entry['step_speedup_shared_vs_full_rows']:.2f}x | "
            f"{entry['peak_rss_mb']:.0f} | {trl_cells} |"
        )
    table = "\n".join(
        [
            f"{args.steps - 1} timed steps per system and G after a warm-up; {SHARED['prompts']} prompts x G, "
            f"<= {args.max_new_tokens} new tokens; load average {load['before']} before, {load['after']} after "
            f"({os.cpu_count()} cores). Speed-ups are medians over steps of paired ratios (same rollouts). CPU s: "
            "the process's CPU seconds over all its threads, which other jobs on the machine hardly change.",
            "",
            "| G | prompt tokens | generated tokens/step | update s, full rows | update s, shared prompt | "
            "update speed-up | update CPU s, full rows | update CPU s, shared | CPU speed-up | "
            "step s, full rows | step s, shared | step speed-up | peak RSS MB | "
            "TRL update s | TRL update CPU s | TRL step s | TRL peak RSS MB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    return summary, table


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_grpo_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=4, help="Optimizer steps per system (the first is a warm-up).")
    parser.add_argument("--max_new_tokens", type=int, default=64, help="Completion budget for both.")
    parser.add_argument("--group_sizes", type=int, nargs="+", default=[4, 8], help="Completions per prompt (G).")
    parser.add_argument("--no_trl", action="store_true", help="Only ours (shared prompt vs full rows).")
    parser.add_argument("--output", default=str(RESULTS / "bench_grpo_step"), help="Results path without suffix.")
    parser.add_argument("--system", choices=("ours", "trl"), help=argparse.SUPPRESS)  # one system, in a subprocess
    args = parser.parse_args()
    if args.system:
        run = run_ours if args.system == "ours" else run_trl
        result = run(args.steps, args.max_new_tokens, args.group_sizes[0])
        print("RESULT " + json.dumps(result))
        return
    systems = ("ours",) if args.no_trl else ("ours", "trl")
    load = {"before": [round(x, 2) for x in os.getloadavg()]}
    results: dict[int, dict] = {}
    for group_size in args.group_sizes:
        for system in systems:
            command = [sys.executable, "-m", "benchmarks.bench_grpo_step", "--system", system]
            command += ["--steps", str(args.steps), "--max_new_tokens", str(args.max_new_tokens)]
            command += ["--group_sizes", str(group_size)]
            proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{system} G={group_size} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
            results.setdefault(group_size, {})[system] = json.loads(line[len("RESULT ") :])
            print(f"G={group_size} {system}: done", flush=True)
    load["after"] = [round(x, 2) for x in os.getloadavg()]
    summary, table = report(results, args, load)
    print(table)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": load,
        "cpu_count": os.cpu_count(),
        "settings": {**SHARED, "steps": args.steps, "max_new_tokens": args.max_new_tokens, "forward_chunk_size": 2},
        "summary": summary,
        "raw": {str(g): r for g, r in results.items()},
    }
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    out.with_suffix(".md").write_text(f"# GRPO step: shared-prompt update vs full rows vs TRL\n\n{table}\n")
    print(f"wrote {out.with_suffix('.json')} and .md")


if __name__ == "__main__":
    main()
