"""The training loop: rollouts -> sandbox rewards -> group advantages -> combined loss -> step.

One optimizer step consumes `per_device_train_batch_size x gradient_accumulation_steps` prompts per
process (TRL's convention): all of them are rolled out first (G completions each), scored in the
sandbox, turned into advantages within each group, then split into `gradient_accumulation_steps`
micro-batches for the update. With `num_iterations` (mu) > 1 the same rollouts serve mu optimizer
steps, and old log-probs are computed once before the first pass; with mu = 1 the ratio is exactly
1 and clipping is inert. Log-probs cover the whole completion, thinking and code together.

The reference policy is the same model with its LoRA adapter disabled (no second copy of the base
weights). Teacher-SFT draws a batch of verified traces per micro-batch; self-SFT trains on each
group's best passing sample (ties: the shortest), with a bounded buffer of recent successes for
steps that have none. Both use `utils.sft_data`'s masking.

Memory: each micro-batch goes through forward/backward in chunks of `forward_chunk_size` sequences
(padding trimmed per chunk), and each loss term is backpropagated on its own. Every chunk's loss is
divided by its whole micro-batch's normalizer, so the gradient equals the unchunked one while only
one chunk's activations are alive at a time.

Runs under `accelerate launch` unchanged: each process rolls out its own share of the prompts
(groups never straddle processes, so advantages need no communication) and DDP averages the
gradients. Checkpoints (adapter, optimizer, scheduler, RNG states, trainer state, config) are
written to a temporary folder and renamed, so a crash mid-save leaves the previous one intact.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import shutil
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from config import Config, config_to_dict, save_config
from evaluation.code_executor import SandboxLimits, SandboxPool, execute_many, plan_tests, task_secret_paths
from training.launch import check_accelerator, local_world_size, sandbox_workers
from training.losses import (
    IGNORE_INDEX,
    STEP_AGGREGATIONS,
    aggregation_denominator,
    aggregation_units,
    combine_losses,
    group_advantages,
    grpo_loss,
    masked_sft_nll,
    scheduled_weight,
    selective_log_softmax,
    step_denominator,
    truncated_importance_weights,
)
from training.rewards import compute_rewards, load_reward_functions, reward_columns
from utils.dataset_loader import Task
from utils.jsonl import read_jsonl, write_jsonl_atomic
from utils.prompts import get_unified_prompt
from utils.sft_data import (
    build_sft_example,
    build_sft_target,
    check_thinking_targets,
    collate_sft,
    encode_prompt,
    encode_response,
    end_of_turn_id,
)
from utils.student_model import save_adapter
from utils.thinking_extraction import extract_thinking_and_code_unified

CHECKPOINT_PREFIX = "checkpoint-"


# --------------------------------------------------------------------------------------------
# Data helpers
# --------------------------------------------------------------------------------------------


def _mean(values: list[float | None]) -> float:
    """Mean of the values that are not None (NaN when all are)."""
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else float("nan")


def best_passing_sample(group: list[dict]) -> dict | None:
    """Self-SFT pick: a sample that passed every test and ended its turn itself (finish_reason "stop":
    a completion cut at max_new_tokens is not a whole answer to imitate); ties go to the shortest."""
    passing = [s for s in group if s["result"].passed and s.get("finish_reason") == "stop"]
    return min(passing, key=lambda s: len(s["token_ids"])) if passing else None


def pad_rollout_batch(samples: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad prompts to a common width P and right-pad completions to T.

    Returns input_ids, attention_mask, position_ids (B, P + T), completion_ids and
    completion_mask (B, T). Position ids count real tokens only, as generation does with left padding.
    """
    width = max(len(s["prompt_ids"]) for s in samples)
    length = max(max(len(s["token_ids"]) for s in samples), 1)
    rows, masks, comp, comp_mask = [], [], [], []
    for s in samples:
        p, c = s["prompt_ids"], s["token_ids"]
        rows.append([pad_id] * (width - len(p)) + p + c + [pad_id] * (length - len(c)))
        masks.append([0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (length - len(c)))
        comp.append(c + [pad_id] * (length - len(c)))
        comp_mask.append([1] * len(c) + [0] * (length - len(c)))
    attention = torch.tensor(masks)
    batch = {"input_ids": torch.tensor(rows), "attention_mask": attention,
             "position_ids": (attention.cumsum(-1) - 1).clamp(min=0), "completion_ids": torch.tensor(comp),
             "completion_mask": torch.tensor(comp_mask)}
    if all(s.get("logprobs") is not None for s in samples):  # the sampler's own log-probs (vLLM backends)
        batch["sampling_logps"] = torch.tensor([list(s["logprobs"]) + [0.0] * (length - len(s["logprobs"]))
                                                for s in samples], dtype=torch.float32)
    return batch


def completion_logprobs(model: Any, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs (B, T) of the completion tokens under `model`.

    Only the last T + 1 positions go through the LM head (`logits_to_keep`); the logit at position
    P - 1 + j predicts completion token j. Logits are divided by the sampling temperature, so the
    log-probs are those of the distribution the completions were drawn from.
    """
    length = batch["completion_ids"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"],
                logits_to_keep=length + 1)
    logits = out.logits[:, :-1]  # (B, T, V), in the model's dtype: divided by T only after the float32 cast
    return selective_log_softmax(logits, batch["completion_ids"], temperature=temperature)


@contextlib.contextmanager
def dropout_disabled(model: Any):
    """Every `torch.nn.Dropout` of `model` (LoRA's dropout among them) has p = 0 inside the block.

    The RL terms need the log-probs of the policy that sampled, not of a randomly thinned copy: with
    dropout on, old and current log-probs of the same tokens differ (the first pass's ratio is not 1),
    the KL carries dropout noise, and the gradient belongs to a sub-network. Forward and backward must
    both run inside (gradient checkpointing recomputes the forward during backward). SFT terms keep
    the configured dropout.
    """
    saved = [(module, module.p) for module in model.modules() if isinstance(module, torch.nn.Dropout)]
    for module, _ in saved:
        module.p = 0.0
    try:
        yield
    finally:
        for module, p in saved:
            module.p = p


def sft_tokens(batch: dict[str, torch.Tensor]) -> float:
    """Supervised (shifted) label tokens of a `collate_sft` batch: what `masked_sft_nll` averages over."""
    return float((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def row_chunks(num_rows: int, chunk_size: int) -> list[list[int]]:
    """Consecutive groups of at most `chunk_size` row indices (0: one group with every row)."""
    size = chunk_size if chunk_size > 0 else max(num_rows, 1)
    return [list(range(start, min(start + size, num_rows))) for start in range(0, num_rows, size)]


def slice_rollout_batch(batch: dict[str, torch.Tensor], rows: list[int]) -> tuple[dict[str, torch.Tensor], int]:
    """The rows of a `pad_rollout_batch` batch, without the padding columns none of them need.

    Left-padding columns that every chosen row pads are cut (position ids are explicit, so nothing
    shifts), and completions are cut to the longest chosen one. Returns the batch and its completion
    width T' (per-token tensors of the full batch are cut to [rows, :T'] to match).
    """
    index = torch.tensor(rows, device=batch["input_ids"].device)
    full_width = batch["completion_ids"].shape[1]
    width = max(int(batch["completion_mask"][index].sum(dim=1).max()), 1) if rows else 1
    prompt_width = batch["input_ids"].shape[1] - full_width
    longest_prompt = int(batch["attention_mask"][index, :prompt_width].sum(dim=1).max())
    start = prompt_width - longest_prompt
    end = prompt_width + width
    out = {k: batch[k][index, start:end] for k in ("input_ids", "attention_mask", "position_ids")}
    for key in ("completion_ids", "completion_mask", "sampling_logps"):
        if key in batch:
            out[key] = batch[key][index, :width]
    return out, width


def chunked_completion_logprobs(model: Any, batch: dict[str, torch.Tensor], chunk_size: int,
                                temperature: float = 1.0) -> torch.Tensor:
    """`completion_logprobs` (B, T) computed `chunk_size` rows at a time (for no-grad passes)."""
    out = torch.zeros(batch["completion_ids"].shape, dtype=torch.float32, device=batch["completion_ids"].device)
    for rows in row_chunks(batch["completion_ids"].shape[0], chunk_size):
        part, width = slice_rollout_batch(batch, rows)
        out[rows, :width] = completion_logprobs(model, part, temperature)
    return out


# --------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------


@dataclass
class TrainerState:
    global_step: int = 0  # optimizer steps done
    rollout_batches: int = 0  # rollout batches consumed (the position in the data order)


class SuccessBuffer:
    """Recent self-SFT successes of this process, for steps without a fresh one.

    One entry per distinct (prompt ids, completion ids), most recent last, each with the number of
    replays it has left: an entry is replayed at most `max_replays` times after the step that found
    it (a fresh success of the same completion renews it), then dropped, so a few lucky samples are
    not imitated on every step until the next success.
    """

    def __init__(self, size: int, max_replays: int) -> None:
        self.size, self.max_replays = size, max_replays
        self.entries: OrderedDict[tuple[tuple[int, ...], tuple[int, ...]], int] = OrderedDict()

    def add(self, items: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
        for key in items:
            self.entries.pop(key, None)
            if self.size > 0 and self.max_replays > 0:
                self.entries[key] = self.max_replays
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def replay(self, count: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Up to `count` of the most recent entries; each use spends one of its replays."""
        chosen = list(self.entries)[-count:] if count > 0 else []
        for key in chosen:
            self.entries[key] -= 1
            if self.entries[key] <= 0:
                del self.entries[key]
        return chosen

    def __len__(self) -> int:
        return len(self.entries)

    def state(self) -> list:
        return [[list(p), list(c), left] for (p, c), left in self.entries.items()]

    def load(self, state: list) -> None:
        self.entries = OrderedDict(((tuple(p), tuple(c)), left) for p, c, left in state)


def tracker_run_name(config: Config, output_dir: str | Path) -> str:
    """training.run_name, or the output folder's name (one folder = one run)."""
    return config.training.run_name or Path(output_dir).resolve().name


def make_accelerator(config: Config, output_dir: str | Path, cpu: bool | None = None) -> Any:
    """The Accelerator a run uses, with training.logging_backends as its trackers (tensorboard files go to
    <output_dir>/tensorboard/<run name>/<tracker_project>)."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    output_dir = Path(output_dir)
    project = ProjectConfiguration(project_dir=str(output_dir),
                                   logging_dir=str(output_dir / "tensorboard" / tracker_run_name(config, output_dir)))
    return Accelerator(cpu=not torch.cuda.is_available() if cpu is None else cpu,
                       log_with=list(config.training.logging_backends) or None, project_config=project)


class GRPOTrainer:
    def __init__(self, config: Config, model: Any, tokenizer: Any, tasks: list[Task], teacher_examples: list[dict],
                 output_dir: str | Path, accelerator: Any = None, rollout: Any = None, pool: SandboxPool | None = None) -> None:
        self.config = config
        self.accelerator = accelerator or make_accelerator(config, output_dir)
        check_accelerator(self.accelerator)  # DeepSpeed/FSDP: refused (training.launch says why)
        self.tokenizer = tokenizer
        self.tasks = tasks
        self.plans = {t.task_id: plan_tests(t, config.sandbox.include_challenge_tests) for t in tasks}
        self.teacher_examples = teacher_examples
        self.teacher_sft, self.teacher_stats = self._build_teacher_sft(teacher_examples, tokenizer)
        self.output_dir = Path(output_dir)
        self.g = config.grpo.num_samples_per_prompt
        t = config.training
        self.prompts_per_micro = t.per_device_train_batch_size
        self.micro_batches = t.gradient_accumulation_steps
        self.prompts_per_rollout = self.prompts_per_micro * self.micro_batches  # per process
        world = self.accelerator.num_processes
        batches_per_epoch = max(1, len(tasks) // (self.prompts_per_rollout * world))
        mu = config.grpo.num_iterations
        self.total_steps = t.max_steps if t.max_steps > 0 else max(1, t.num_train_epochs * batches_per_epoch * mu)
        if t.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=t.learning_rate, weight_decay=t.weight_decay)
        # The scheduler is deliberately not `prepare`d: accelerate's wrapper steps it once per process on
        # every step (it assumes each process's batch shrank with the process count), which would run the
        # schedule num_processes times too fast. One optimizer step here is one schedule step.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self._lr_factor)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.limits = SandboxLimits.from_config(config.sandbox)
        self._own_pool = pool is None
        # each process on this machine takes its share of the cores (see training.launch)
        workers = sandbox_workers(config.sandbox.max_workers, local_world_size(self.accelerator))
        self.pool = pool or SandboxPool(workers, self.limits, config.sandbox.isolate,
                                        secret_paths=task_secret_paths(config))
        self.rollout = rollout
        self.state = TrainerState()
        self.buffer = SuccessBuffer(config.dual_source.self_sft_buffer_size, config.dual_source.self_sft_max_replays)
        self.teacher_rng = random.Random(t.seed + 1 + self.accelerator.process_index)
        self.eot = end_of_turn_id(tokenizer)
        self.metrics_path = self.output_dir / "metrics.jsonl"
        self.user_rewards = load_reward_functions(config.grpo.reward_funcs, config.grpo.reward_weights)
        self._trackers: list = []

    # ---------------------------------------------------------------- schedules and data order

    def _lr_factor(self, step: int) -> float:
        t = self.config.training
        if t.warmup_steps and step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        if t.lr_scheduler == "constant":
            return 1.0
        progress = min(1.0, (step - t.warmup_steps) / max(1, self.total_steps - t.warmup_steps))
        return 1.0 - progress if t.lr_scheduler == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    def _prompt_indices(self, rollout_batch: int) -> list[int]:
        """This process's task indices for a rollout batch: epoch permutations seeded by (seed, epoch)."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        per_batch = self.prompts_per_rollout * world
        n = len(self.tasks)
        start = rollout_batch * per_batch
        indices = []
        for position in range(start, start + per_batch):
            epoch, offset = divmod(position, n)
            order = np.random.default_rng([self.config.training.seed, epoch]).permutation(n)
            indices.append(int(order[offset]))
        return indices[rank * self.prompts_per_rollout:(rank + 1) * self.prompts_per_rollout]

    def sft_weights(self, step: int) -> tuple[float, float]:
        d = self.config.dual_source
        decay = d.sft_decay_steps or self.total_steps
        return (scheduled_weight(step, d.teacher_sft_weight, d.teacher_sft_final_weight, decay, d.sft_weight_schedule),
                scheduled_weight(step, d.self_sft_weight, d.self_sft_final_weight, decay, d.sft_weight_schedule))

    # ---------------------------------------------------------------- one rollout batch

    def collect_rollouts(self) -> tuple[list[list[dict]], dict]:
        """Sample, execute and score G completions for each prompt of the next rollout batch."""
        cfg = self.config
        tasks = [self.tasks[i] for i in self._prompt_indices(self.state.rollout_batches)]
        prompts = [get_unified_prompt(t, cfg.prompt.num_visible_tests) for t in tasks]
        start = time.monotonic()
        unwrapped = self.accelerator.unwrap_model(self.model)
        with torch.no_grad():
            generations = self.rollout.generate(unwrapped, prompts, self.g, self.state.global_step)
        rollout_time = time.monotonic() - start
        flat = [(task, sample) for task, group in zip(tasks, generations, strict=True) for sample in group]
        parsed = [extract_thinking_and_code_unified(s["text"]) for _, s in flat]
        start = time.monotonic()
        jobs = [(p["code"], t) for (t, _), p in zip(flat, parsed, strict=True)]
        results = execute_many(jobs, self.pool, self.limits, include_challenge=cfg.sandbox.include_challenge_tests)
        # a harness failure gets one more try; twice on the same program, and it counts as a failure
        retry = [i for i, r in enumerate(results) if r.status == "sandbox_error"]
        if retry:
            again = execute_many([jobs[i] for i in retry], self.pool, self.limits,
                                 include_challenge=cfg.sandbox.include_challenge_tests)
            for i, result in zip(retry, again, strict=True):
                results[i] = result
        confirmed = {i for i in retry if results[i].status == "sandbox_error"}
        rewards = compute_rewards(results, parsed, cfg.grpo.correctness_reward, cfg.grpo.format_reward_weight,
                                  self.user_rewards, [prompts[k // self.g] for k in range(len(flat))],
                                  [s["text"] for _, s in flat], reward_columns([t for t, _ in flat], parsed, results),
                                  confirmed_failures=confirmed)
        reward_time = time.monotonic() - start
        groups = []
        for i, task in enumerate(tasks):
            group = []
            for j in range(self.g):
                k = i * self.g + j
                group.append({**flat[k][1], "task": task, "parsed": parsed[k], "result": results[k], "reward": rewards[k]})
            groups.append(group)
        generated = sum(s["num_tokens"] for _, s in flat)
        metrics = {"time/rollout_s": rollout_time, "time/reward_s": reward_time,
                   "tokens_per_s": generated / max(rollout_time, 1e-9),
                   "completion/mean_length": generated / max(len(flat), 1),
                   "completion/clipped_ratio": sum(s["finish_reason"] == "length" for _, s in flat) / max(len(flat), 1),
                   "pass_rate": sum(r.passed for r in results) / max(len(results), 1),
                   "pass_fraction/mean": sum(r.pass_fraction for r in results) / max(len(results), 1),
                   "reward/format_mean": sum(r.format for r in rewards) / max(len(rewards), 1),
                   **{f"reward/{r.name.rpartition(':')[2]}_mean": _mean([rw.user[r.name] for rw in rewards]) for r in self.user_rewards},
                   "sandbox/error_retried": len(retry) / max(len(results), 1),
                   "sandbox/error_confirmed": len(confirmed) / max(len(results), 1),
                   "format/closed_think": sum(p["think_closed"] for p in parsed) / max(len(parsed), 1)}
        return groups, metrics

    def _self_sft_examples(self, groups: list[list[dict]]) -> list[dict]:
        """This step's self-SFT examples: each group's best passing sample (de-duplicated), or, when no
        group has one, the most recent buffered successes that still have replays left."""
        fresh = []
        for group in groups:
            best = best_passing_sample(group)
            key = (tuple(best["prompt_ids"]), tuple(best["token_ids"])) if best is not None else None
            if key is not None and key not in fresh:
                fresh.append(key)
        self.buffer.add(fresh)
        chosen = fresh if fresh else self.buffer.replay(len(groups))
        return [e for e in (build_sft_example(p, c, self.config.dual_source.sft_max_length) for p, c in chosen) if e]

    def _build_teacher_sft(self, examples: list[dict], tokenizer: Any) -> tuple[list[dict], dict]:
        """Tokenize every usable teacher trace once. A trace whose prompt + target does not fit
        `sft_max_length` is dropped and counted, never cut. Returns the examples and their statistics:
        the share dropped, and the share of kept targets longer than the rollout budget (a student
        imitating them could not finish within grpo.max_new_tokens)."""
        d, cfg = self.config.dual_source, self.config
        template = {"enable_thinking": cfg.student.enable_thinking}
        if not examples or d.teacher_sft_batch_size <= 0 or d.teacher_sft_weight <= 0:
            return [], {"teacher_sft/dropped_too_long": 0.0, "teacher_sft/over_rollout_budget": 0.0}
        check_thinking_targets(tokenizer, d.include_thinking, template)
        built, over_budget = [], 0
        for example in examples:
            target = build_sft_target(example.get("thinking"), example["code"], d.include_thinking)
            prompt_ids = encode_prompt(tokenizer, example["prompt"], chat_template_kwargs=template)
            response_ids = encode_response(tokenizer, target)
            sft = build_sft_example(prompt_ids, response_ids, d.sft_max_length)
            if sft is not None:
                built.append(sft)
                over_budget += len(response_ids) > cfg.grpo.max_new_tokens
        stats = {"teacher_sft/dropped_too_long": 1.0 - len(built) / len(examples),
                 "teacher_sft/over_rollout_budget": over_budget / max(len(built), 1)}
        if self.accelerator.is_main_process and len(built) < len(examples):
            print(f"teacher-SFT: {len(examples) - len(built)} of {len(examples)} traces do not fit "
                  f"dual_source.sft_max_length={d.sft_max_length} and are left out (never cut)", flush=True)
        return built, stats

    def _teacher_batch(self) -> dict | None:
        d = self.config.dual_source
        if not self.teacher_sft or d.teacher_sft_batch_size <= 0:
            return None
        picked = [self.teacher_rng.choice(self.teacher_sft) for _ in range(d.teacher_sft_batch_size)]
        return collate_sft(picked, self.tokenizer.pad_token_id)

    def _grpo_pass(self, batch: dict, rows: list[int], old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
                   advantages: torch.Tensor, scale: float, denominator: float, metric_tokens: float) -> dict[str, float]:
        """Forward + backward of the GRPO term for `rows` of one micro-batch.

        The loss is divided by `denominator` (the step's, or for micro-token-mean the micro-batch's), so
        the chunks' losses and gradients sum to the step's objective (times `scale`: 1, or for
        micro-token-mean 1 / micro-batches). Returned values are sums: the scaled loss, and chunk metric means times the chunk's share of `metric_tokens`
        (this step's tokens over all ranks, divided by the number of ranks), so that summing the passes
        and averaging over ranks gives the step's token means.
        """
        g = self.config.grpo
        part, width = slice_rollout_batch(batch, rows)
        index = torch.tensor(rows, device=part["input_ids"].device)
        with dropout_disabled(self.model):  # forward and backward: see `dropout_disabled`
            logp = completion_logprobs(self.model, part, g.temperature)
            old = old_logp[index, :width] if old_logp is not None else logp.detach()
            ref = ref_logp[index, :width] if ref_logp is not None else None
            weights, is_metrics = None, {}
            if "sampling_logps" in part and g.importance_sampling != "off":  # sampled by vLLM, trained here
                weights, is_metrics = truncated_importance_weights(old, part["sampling_logps"], part["completion_mask"],
                                                                   g.importance_sampling, g.importance_sampling_cap)
            loss, metrics = grpo_loss(logp, old, ref, advantages[index], part["completion_mask"], g.clip_range,
                                      g.clip_range_high if g.clip_range_high >= 0 else None, g.kl_coef,
                                      g.loss_aggregation, g.max_new_tokens, denominator, token_weights=weights)
            metrics.update(is_metrics)
            self.accelerator.backward(self.config.dual_source.grpo_weight * scale * loss)
        share = float(part["completion_mask"].sum()) / metric_tokens
        sums = {key: value * share for key, value in metrics.items() if key != "loss/grpo"}
        sums["loss/grpo"] = metrics["loss/grpo"] * scale
        return sums

    def _sft_pass(self, batch: dict, weight: float, name: str, denominator: float) -> dict[str, float]:
        """Forward + backward of one SFT batch (teacher or self) in row chunks; returns its share of the loss.

        The NLL is summed over supervised tokens and divided by `denominator` (the term's supervised
        tokens of the whole step over all ranks, divided by the number of ranks), so the batches of a
        step add up to one token-mean per term.
        """
        device = self.accelerator.device
        if sft_tokens(batch) == 0:  # no rows, or nothing supervised
            return {}
        total = 0.0
        for rows in row_chunks(batch["input_ids"].shape[0], self.config.training.forward_chunk_size):
            ids, attention, labels = (batch[k][rows].to(device) for k in ("input_ids", "attention_mask", "labels"))
            width = int(attention.sum(dim=1).max())  # right-padded: cut the shared padding
            out = self.model(input_ids=ids[:, :width], attention_mask=attention[:, :width])
            loss, _ = masked_sft_nll(out.logits, labels[:, :width], denominator)
            self.accelerator.backward(weight * loss)
            total += float(loss.detach())
        return {f"loss/{name}": total}

    def _synchronizing_pass(self) -> None:
        """A zero-weighted one-token forward/backward outside `no_sync`: DDP all-reduces the gradients
        accumulated by the real passes. Every rank runs exactly one, however many real passes it
        had (a rank whose groups were all filtered out, or whose SFT batch was empty, has fewer or
        none), so no rank waits for a collective the others never start."""
        token = torch.full((1, 1), self.tokenizer.pad_token_id, dtype=torch.long, device=self.accelerator.device)
        out = self.model(input_ids=token, attention_mask=torch.ones_like(token))
        self.accelerator.backward(out.logits.sum() * 0.0)

    def _global_sums(self, values: list[float]) -> list[float]:
        """`values` summed over all processes (one all-reduce; itself when there is one process)."""
        if self.accelerator.num_processes == 1:
            return list(values)
        reduced = self.accelerator.reduce(torch.tensor(values, dtype=torch.float64, device=self.accelerator.device),
                                          reduction="sum")
        return [float(v) for v in reduced.cpu()]

    def _step_loss_metrics(self, sums: dict[str, float], present: dict[str, bool], w_teacher: float,
                           w_self: float) -> dict:
        """Per-step loss metrics from the passes' sums. Every pass already divided by the step's global
        normalizer, so the sums are this rank's shares: averaged over ranks (`_reduce`) they are the
        step's values. A term that has data on some rank is reported by every rank (0 where it had
        none), so that the average is right; `loss/total` is the objective actually optimized."""
        out = {k: v for k, v in sums.items() if not k.startswith(("loss/teacher_sft", "loss/self_sft", "loss/grpo"))}
        terms = {name: torch.tensor(sums.get(f"loss/{name}", 0.0)) if present[name] else None
                 for name in ("grpo", "teacher_sft", "self_sft")}
        if all(v is None for v in terms.values()):
            return out
        _, combined = combine_losses(terms["grpo"], terms["teacher_sft"], terms["self_sft"],
                                     self.config.dual_source.grpo_weight, w_teacher, w_self)
        return {**out, **combined}

    def train_on_rollouts(self, groups: list[list[dict]], rollout_metrics: dict) -> list[dict]:
        """mu optimizer steps on one rollout batch; returns one metrics dict per step."""
        cfg = self.config
        device = self.accelerator.device
        correctness = torch.tensor([[s["reward"].correctness if s["reward"].correctness is not None else float("nan")
                                     for s in g] for g in groups], dtype=torch.float32)  # (P, G)
        # (P, G) the shaping part of the reward (weighted format bonus + weighted user rewards): added to
        # the advantage centred, not z-scored
        bonus = torch.tensor([[s["reward"].total - s["reward"].correctness if s["reward"].total is not None else 0.0
                               for s in g] for g in groups], dtype=torch.float32)
        advantages, adv_metrics = group_advantages(correctness, scale=cfg.grpo.scale_rewards, bonus=bonus)
        samples = [s for g in groups for s in g]
        keep = list(range(len(samples)))
        if cfg.grpo.dynamic_filtering:
            zero = [i for i, g in enumerate(groups) if float(advantages[i].abs().sum()) == 0.0]
            keep = [k for k in keep if k // self.g not in zero]
        flat_adv = advantages.reshape(-1)
        pad = self.tokenizer.pad_token_id
        micro = [keep[i::self.micro_batches] for i in range(self.micro_batches)]
        micro = [m for m in micro if m]
        batches = [pad_rollout_batch([samples[k] for k in m], pad) for m in micro]
        batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
        unwrapped = self.accelerator.unwrap_model(self.model)
        temperature = cfg.grpo.temperature
        chunk = cfg.training.forward_chunk_size
        ref_logps, old_logps = [], []
        with torch.no_grad(), dropout_disabled(unwrapped):
            for batch in batches:
                if cfg.grpo.kl_coef > 0:
                    with unwrapped.disable_adapter():  # the frozen base model is the reference
                        ref_logps.append(chunked_completion_logprobs(unwrapped, batch, chunk, temperature))
                if cfg.grpo.num_iterations > 1:
                    old_logps.append(chunked_completion_logprobs(unwrapped, batch, chunk, temperature))
        mode, world = cfg.grpo.loss_aggregation, self.accelerator.num_processes
        self_examples = self._self_sft_examples(groups)
        self_batch = collate_sft(self_examples, pad) if self_examples else None
        # Teacher-SFT draws one batch per configured micro-batch slot, whether or not filtering left GRPO
        # samples for it: a step (or a rank) whose groups were all dropped still learns from SFT.
        # `micro` never has more lists than slots, so slot i holds micro-batch i when it exists.
        # Self-SFT is one batch per step (row-chunked like the others).
        slots = self.micro_batches
        step_metrics = []
        self.model.train()
        for _ in range(cfg.grpo.num_iterations):
            start = time.monotonic()
            w_teacher, w_self = self.sft_weights(self.state.global_step)
            teacher_batches = [self._teacher_batch() for _ in range(slots)] if w_teacher > 0 else []
            teacher_batches = [b if b is not None and sft_tokens(b) > 0 else None for b in teacher_batches]
            # One normalizer per term for the whole optimizer step, summed over micro-batches and ranks
            # (one all-reduce): every token (or sequence) of the step weighs the same, wherever it fell.
            grpo_units = sum(aggregation_units(b["completion_mask"], mode) for b in batches) if mode in STEP_AGGREGATIONS \
                else 0.0
            grpo_tokens, grpo_units, teacher_tokens, self_tokens = self._global_sums([
                sum(float(b["completion_mask"].sum()) for b in batches), grpo_units,
                sum(sft_tokens(b) for b in teacher_batches if b is not None),
                sft_tokens(self_batch) if self_batch is not None and w_self > 0 else 0.0])
            metric_tokens = max(grpo_tokens, 1.0) / world
            if mode in STEP_AGGREGATIONS:
                denominators = [step_denominator(grpo_units, mode, cfg.grpo.max_new_tokens, world)] * len(batches)
                grpo_scale = 1.0
            else:  # micro-token-mean: each micro-batch its own token mean, micro-batches averaged
                denominators = [aggregation_denominator(b["completion_mask"], mode) for b in batches]
                grpo_scale = 1.0 / max(len(batches), 1)
            passes: list = []  # every backward pass of this optimizer step, in order
            for i in range(slots):
                if i < len(batches):
                    old = old_logps[i] if old_logps else None
                    ref = ref_logps[i] if ref_logps else None
                    adv = flat_adv[micro[i]].to(device)
                    for rows in row_chunks(len(micro[i]), chunk):
                        passes.append(functools.partial(self._grpo_pass, batches[i], rows, old, ref, adv, grpo_scale,
                                                        denominators[i], metric_tokens))
                if teacher_batches and teacher_batches[i] is not None:
                    passes.append(functools.partial(self._sft_pass, teacher_batches[i], w_teacher, "teacher_sft",
                                                    teacher_tokens / world))
            if self_batch is not None and w_self > 0:
                passes.append(functools.partial(self._sft_pass, self_batch, w_self, "self_sft", self_tokens / world))
            sums: dict[str, float] = {}
            distributed = world > 1
            for run_pass in passes:  # under DDP: accumulate locally, synchronize once below
                with self.accelerator.no_sync(self.model) if distributed else contextlib.nullcontext():
                    for key, value in run_pass().items():
                        sums[key] = sums.get(key, 0.0) + value
            if distributed:
                self._synchronizing_pass()
            if grpo_tokens > 0:  # a rank without GRPO samples contributes zeros to the step's means
                for key in ("kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "ratio/mean"):
                    sums.setdefault(key, 0.0)
            present = {"grpo": grpo_tokens > 0, "teacher_sft": teacher_tokens > 0, "self_sft": self_tokens > 0}
            totals = self._step_loss_metrics(sums, present, w_teacher, w_self)
            grad_norm = 0.0
            if cfg.training.max_grad_norm > 0:
                grad_norm = float(self.accelerator.clip_grad_norm_(self.model.parameters(), cfg.training.max_grad_norm))
            self.optimizer.step()
            if not getattr(self.optimizer, "step_was_skipped", False):  # fp16 overflow: no step, no schedule step
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.state.global_step += 1
            metrics = {"step": self.state.global_step, "epoch": self.state.rollout_batches * self.prompts_per_rollout
                       * self.accelerator.num_processes / max(len(self.tasks), 1),
                       "lr": self.scheduler.get_last_lr()[0], "grad_norm": grad_norm, **rollout_metrics, **adv_metrics,
                       **totals, "weight/teacher_sft": w_teacher, "weight/self_sft": w_self,
                       "self_sft/samples": len(self_examples), "teacher_sft/pool": len(self.teacher_sft),
                       **self.teacher_stats,
                       "time/update_s": time.monotonic() - start}
            step_metrics.append(metrics)
            if self.state.global_step >= self.total_steps:
                break
        return step_metrics

    # ---------------------------------------------------------------- the loop

    def train(self, resume_from: str | None = None) -> dict:
        from tqdm import tqdm

        if resume_from:
            self.load_checkpoint(self._resolve_checkpoint(resume_from))
        main = self.accelerator.is_main_process
        if main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            save_config(self.config, self.output_dir / "config.json")
            self._trim_metrics()
            self._open_trackers()
        bar = tqdm(total=self.total_steps, initial=self.state.global_step, desc="GRPO", unit="step", disable=not main,
                   dynamic_ncols=True)
        last: dict = {}
        while self.state.global_step < self.total_steps:
            groups, rollout_metrics = self.collect_rollouts()
            for metrics in self.train_on_rollouts(groups, rollout_metrics):
                metrics = self._reduce(metrics)
                last = metrics
                if main:
                    self._log(metrics)
                    bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", loss=f"{metrics.get('loss/total', float('nan')):.3f}",
                                    pass_rate=f"{metrics['pass_rate']:.2f}", refresh=False)
                    bar.update(1)
            self.state.rollout_batches += 1
            save_every = self.config.training.save_steps
            due = bool(save_every) and self.state.global_step % save_every < self.config.grpo.num_iterations
            if due or self.state.global_step >= self.total_steps:  # the last step always: a run can be extended
                self.save_checkpoint()
        bar.close()
        self.save_final()
        self._close_trackers()
        if self._own_pool:
            self.pool.close()
        return last

    # ---------------------------------------------------------------- logging

    def _reduce(self, metrics: dict) -> dict:
        """Average numeric metrics over processes (each process saw different prompts).

        Ranks may report different keys (one whose groups were all filtered out has no GRPO loss),
        so the dicts are gathered as objects and each key is averaged over the ranks that have it.
        """
        if self.accelerator.num_processes == 1:
            return metrics
        from accelerate.utils import gather_object

        everyone = gather_object([metrics])
        out = dict(metrics)
        for key in {k for m in everyone for k, v in m.items() if isinstance(v, (int, float))}:
            values = [float(m[key]) for m in everyone if isinstance(m.get(key), (int, float))]
            out[key] = sum(values) / len(values)
        out["step"] = metrics["step"]
        return out

    def _trim_metrics(self) -> None:
        """A fresh run starts a new metrics file; a resumed one keeps the lines up to its step."""
        if not self.metrics_path.exists():
            return
        kept = [] if self.state.global_step == 0 else [
            row for row in read_jsonl(self.metrics_path, tolerate_torn_tail=True)
            if row.get("step", self.state.global_step + 1) <= self.state.global_step]
        write_jsonl_atomic(self.metrics_path, kept)

    def _open_trackers(self) -> None:
        """Sinks besides metrics.jsonl are accelerate's trackers (the Accelerator's `log_with`, see
        `make_accelerator`): they run on the main process only, under training.tracker_project / run_name."""
        if not self.accelerator.log_with:
            return
        flat = {f"{section}.{key}": value if isinstance(value, (int, float, str, bool)) else str(value)
                for section, values in config_to_dict(self.config).items() if isinstance(values, dict)
                for key, value in values.items()}
        self.accelerator.init_trackers(self.config.training.tracker_project, config=flat,
                                       init_kwargs={"wandb": {"name": tracker_run_name(self.config, self.output_dir)}})
        self._trackers = list(self.accelerator.trackers)

    def _log(self, metrics: dict) -> None:
        with self.metrics_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()}) + "\n")
        if self._trackers:
            scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "step"}
            self.accelerator.log(scalars, step=metrics["step"])

    def _close_trackers(self) -> None:
        if self._trackers:
            self.accelerator.end_training()
            self._trackers = []

    # ---------------------------------------------------------------- checkpoints

    def _resolve_checkpoint(self, spec: str) -> Path:
        if spec != "latest":
            path = Path(spec)
            if not (path / "trainer_state.json").is_file():
                raise FileNotFoundError(f"{path} is not a checkpoint folder (no trainer_state.json).")
            return path
        found = sorted(self.output_dir.glob(f"{CHECKPOINT_PREFIX}*"), key=lambda p: int(p.name[len(CHECKPOINT_PREFIX):]))
        if not found:
            raise FileNotFoundError(
                f"no {CHECKPOINT_PREFIX}* folder in {self.output_dir} to resume from. Start a new run without "
                f"--resume_from_checkpoint, pass the --output_dir of the run to continue, or name a checkpoint "
                f"folder: --resume_from_checkpoint {self.output_dir}/{CHECKPOINT_PREFIX}N.")
        return found[-1]

    def _rank_state_name(self) -> str:
        return f"rank-{self.accelerator.process_index}.pt"

    def save_checkpoint(self) -> Path | None:
        """adapter, optimizer, scheduler, trainer state and config (rank 0), plus one `rank-N.pt` per
        process with what differs between processes: its RNG states, its teacher-sampling RNG and its
        self-SFT buffer (each rank samples and succeeds on its own prompts)."""
        self.accelerator.wait_for_everyone()
        final = self.output_dir / f"{CHECKPOINT_PREFIX}{self.state.global_step}"
        tmp = self.output_dir / f".{final.name}.tmp"
        if self.accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                    "teacher": self.teacher_rng.getstate(), "self_sft_buffer": self.buffer.state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                   tmp / self._rank_state_name())
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self.accelerator.unwrap_model(self.model).save_pretrained(tmp / "adapter")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            state = {"global_step": self.state.global_step, "rollout_batches": self.state.rollout_batches,
                     "total_steps": self.total_steps, "num_processes": self.accelerator.num_processes}
            (tmp / "trainer_state.json").write_text(json.dumps(state))
            save_config(self.config, tmp / "config.json")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)  # the checkpoint appears whole or not at all
            self._prune_checkpoints()
        self.accelerator.wait_for_everyone()
        return final

    def _prune_checkpoints(self) -> None:
        limit = self.config.training.save_total_limit
        found = sorted(self.output_dir.glob(f"{CHECKPOINT_PREFIX}*"), key=lambda p: int(p.name[len(CHECKPOINT_PREFIX):]))
        for old in found[:-limit] if limit > 0 else []:
            shutil.rmtree(old, ignore_errors=True)

    def load_checkpoint(self, path: Path) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        unwrapped = self.accelerator.unwrap_model(self.model)
        set_peft_model_state_dict(unwrapped, load_file(str(path / "adapter" / "adapter_model.safetensors")))
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
        self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
        state = json.loads((path / "trainer_state.json").read_text())
        rank_file = path / self._rank_state_name()
        if not rank_file.is_file():
            raise FileNotFoundError(
                f"{rank_file} is missing: {path} was saved by {state.get('num_processes', '?')} process(es); resume "
                f"with the same number (accelerate launch --num_processes N).")
        rng = torch.load(rank_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        self.teacher_rng.setstate(rng["teacher"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.buffer.load(rng["self_sft_buffer"])
        self.state.global_step = state["global_step"]
        self.state.rollout_batches = state["rollout_batches"]
        if self.accelerator.is_main_process:
            print(f"resumed from {path} at step {self.state.global_step}", flush=True)

    def save_final(self) -> Path:
        final = self.output_dir / "final_model"
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            save_adapter(self.accelerator.unwrap_model(self.model), self.tokenizer, final)
            save_config(self.config, final / "tgrpo_config.json")
        self.accelerator.wait_for_everyone()
        return final


