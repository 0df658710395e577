"""The training loop, as named steps: `collect_rollouts` (sample, then `training.scoring.score_rollouts`:
sandbox and rewards) -> `train_on_rollouts` (`training.update_plan.plan_update`: advantages, filtering,
micro-batches, old/reference log-probs) -> `_optimizer_step` (`plan_step`: SFT slots and step-wide
normalizers; the passes of `training.passes.PassRunner`; clip, step, schedule) -> metric sinks and
checkpoints.

One optimizer step consumes `per_device_train_batch_size x gradient_accumulation_steps` prompts per
process (TRL's convention): all of them are rolled out first (G completions each), scored in the
sandbox, then planned and applied, one backward pass per row chunk and loss term. The no-grad forwards
of the plan (reference, old log-probs) need only the token ids: they run in a thread while the sandbox scores
(`time/score_s` is that stage; `time/logprobs_s` the forwards' own time). With
`num_iterations` (mu) > 1 the same rollouts serve mu optimizer steps; with mu = 1 the ratio is exactly
1 and clipping is inert. Log-probs cover the whole completion, thinking and code.

The reference policy is the same model with its LoRA adapter disabled (no second copy of the base
weights). With `dual_source.opd_weight` > 0 (on-policy distillation) the teacher scores every rollout's
tokens (`training.teacher_logprobs`) before the update is planned, and each GRPO pass adds the OPD term on
the same forward (`training.losses.opd_loss`). Teacher-SFT draws a batch of verified traces per
micro-batch slot; self-SFT trains on each group's best passing sample (`training.sft_sources`).

Runs under `accelerate launch` unchanged: each process rolls out its own share of the prompts
(groups never straddle processes, so advantages need no communication) and DDP averages the
gradients. With asynchronous rollouts one producer, on the main process, samples and scores every
process's share, and each step the training thread scatters the shares (`_take_rollouts`).
Checkpoints: `training.checkpointing`; metrics.jsonl and trackers: `training.metric_sinks`.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from config import Config
from rollouts.groups import continue_prefixes, sample_from_prefixes, sample_from_synced, sample_groups
from training import checkpointing
from training.async_rollouts import ProducerError, RolloutProducer
from training.checkpointing import TrainerState, resolve_checkpoint, save_config
from training.curriculum import zero_spread_share
from training.guidance import unguided_correctness
from training.launch import check_accelerator
from training.losses import group_has_spread, lr_factor, scheduled_weight
from training.metric_sinks import progress_loss, reduce_over_processes
from training.passes import PassRunner
from training.rewards import ScoredSample
from training.scoring import score_rollouts
from training.setup import RunParts
from training.sft_sources import SuccessBuffer, max_scheduled_weight, self_sft_examples
from training.update_plan import (
    RolloutForwards,
    UpdatePlan,
    correctness_rewards,
    plan_step,
    plan_update,
    rollout_forwards,
    step_loss_metrics,
)
from utils.prompts import get_unified_prompt
from utils.sft_data import collate_sft, end_of_turn_id

T = TypeVar("T")


class GRPOTrainer:
    """The loop over the parts `training.setup.build_run` made; it builds only its own optimizer, schedule, passes
    and state."""

    def __init__(self, config: Config, parts: RunParts) -> None:
        self.config = config
        self.parts = parts
        self.accelerator = parts.accelerator
        check_accelerator(self.accelerator)  # DeepSpeed/FSDP: refused (training.launch says why)
        self.tokenizer = tokenizer = parts.tokenizer
        self.tasks = parts.tasks
        self.teacher_sft, self.teacher_stats = parts.teacher_sft, parts.teacher_sft_stats
        self.output_dir = parts.output_dir
        self.rollout = parts.rollout
        self.pool = parts.pool
        self.teacher_scorer = parts.teacher_scorer
        self.episodes = parts.episodes  # None: single-turn samples
        self.sinks = parts.sinks
        self.user_rewards = parts.user_rewards
        self.curriculum = parts.curriculum  # the difficulty filter (training.curriculum); None when off
        self.guide = parts.guide  # teacher-guided rollouts on all-fail groups (training.guidance); None when off
        self.group_size = config.grpo.num_samples_per_prompt
        training = config.training
        self.micro_batches = training.gradient_accumulation_steps  # micro-batch slots per optimizer step
        self.prompts_per_rollout = training.per_device_train_batch_size * self.micro_batches  # per process
        batches_per_epoch = max(1, len(self.tasks) // (self.prompts_per_rollout * self.accelerator.num_processes))
        self.total_steps = (
            training.max_steps
            if training.max_steps > 0
            else max(1, training.num_train_epochs * batches_per_epoch * config.grpo.num_iterations)
        )
        model = parts.model
        if training.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=training.learning_rate, weight_decay=training.weight_decay)
        # The scheduler is deliberately not `prepare`d: accelerate's wrapper steps it once per process on
        # every step (it assumes each process's batch shrank with the process count), which would run the
        # schedule num_processes times too fast. One optimizer step here is one schedule step.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self._lr_factor)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.passes = PassRunner(
            model=self.model,
            accelerator=self.accelerator,
            grpo=config.grpo,
            grpo_weight=config.dual_source.grpo_weight,
            chunk_size=training.forward_chunk_size,
            pad_token_id=tokenizer.pad_token_id,
            opd_weight=config.dual_source.opd_weight,
            opd_advantage_clip=config.dual_source.opd_advantage_clip,
            opd_max_ratio=config.dual_source.opd_max_ratio,
            shared_prompt=training.shared_prompt_forward,
        )
        # on-policy distillation: the teacher's log-probs of every rollout's tokens (training.teacher_logprobs)
        self.opd = config.dual_source.opd_weight > 0
        self._forwards: RolloutForwards | None = None  # the last rollout batch's, computed while it was scored
        self.state = TrainerState()
        self.buffer = SuccessBuffer(config.dual_source.self_sft_buffer_size, config.dual_source.self_sft_max_replays)
        self.teacher_rng = random.Random(training.seed + 1 + self.accelerator.process_index)
        self.eot = end_of_turn_id(tokenizer)
        self._curriculum_metrics: dict[str, float] = {}
        # asynchronous rollouts: the curriculum's state after each produced batch, by its last data-order position
        # (written on the producer's thread, read on the trainer's), and the one after the last trained batch
        self._curriculum_lock = threading.Lock()
        self._curriculum_after: dict[int, dict] = {}
        self._trained_curriculum: dict | None = None
        # a term that is off costs nothing: without GRPO, KL, OPD, self-SFT and the curriculum no rollout is sampled
        self.needs_rollouts = (
            self.passes.rollout_terms
            or max_scheduled_weight(config.dual_source, "self_sft") > 0
            or self.curriculum is not None
        )

    # ---------------------------------------------------------------- schedules and data order

    def _lr_factor(self, step: int) -> float:
        training = self.config.training
        warmup = training.warmup_steps_for(self.total_steps)
        return lr_factor(step, warmup, self.total_steps, training.lr_scheduler, min_lr_rate=training.min_lr_rate)

    def _prompt_indices(self, rollout_batch: int) -> list[int]:
        """This process's task indices for a rollout batch (its share of `_batch_indices`)."""
        return self._batch_indices(rollout_batch)[self.accelerator.process_index]

    def _batch_indices(self, rollout_batch: int) -> list[list[int]]:
        """Every process's task indices for a rollout batch, in rank order: epoch permutations seeded by
        (seed, epoch), or the curriculum's draw (which moves the curriculum: one call per batch)."""
        world = self.accelerator.num_processes
        per_batch = self.prompts_per_rollout * world
        if self.curriculum is not None:  # the filtered draw: the same on every process (identical state)
            indices, self._curriculum_metrics = self.curriculum.draw(per_batch)
            return split_by_rank(indices, world)
        start = rollout_batch * per_batch
        indices = []
        for position in range(start, start + per_batch):
            epoch, offset = divmod(position, len(self.tasks))
            order = np.random.default_rng([self.config.training.seed, epoch]).permutation(len(self.tasks))
            indices.append(int(order[offset]))
        return split_by_rank(indices, world)

    def sft_weights(self, step: int) -> tuple[float, float]:
        d = self.config.dual_source
        decay = d.sft_decay_steps or self.total_steps
        return (
            scheduled_weight(step, d.teacher_sft_weight, d.teacher_sft_final_weight, decay, d.sft_weight_schedule),
            scheduled_weight(step, d.self_sft_weight, d.self_sft_final_weight, decay, d.sft_weight_schedule),
        )

    # ---------------------------------------------------------------- one rollout batch

    def collect_rollouts(self) -> tuple[list[list[ScoredSample]], dict]:
        """Sample, execute and score G completions for each prompt of the next rollout batch.

        With `grpo.dynamic_sampling`, only groups with correctness spread are kept and the next prompts are
        sampled until the batch is full of them or `dynamic_sampling_max_rounds` rounds were sampled (every
        process runs the same number of rounds: the decision is all-reduced). Returns no groups when nothing
        in the objective trains on rollouts."""
        if not self.needs_rollouts:
            return [], {}
        [(groups, metrics)], last_index = self._fill_batch(self.state.rollout_batches)
        self.state.rollout_batches = last_index  # a refill round consumed the next prompts of the data order
        return groups, metrics

    def _fill_batch(self, first_index: int, produced: bool = False) -> tuple[list[Share], int]:
        """One rollout batch starting at data-order position `first_index`: one round, or with dynamic sampling
        rounds at `first_index`, `first_index + 1`, ... until it is full of groups with spread. Returns its
        (groups, metrics) shares and the position of the last round sampled: this process's share, or with
        `produced` (the asynchronous producer's batch) every process's, in rank order. Each share is filled as
        its rank fills it synchronously, and the rounds stop when every share is full: the synchronous loop
        all-reduces that decision, the producer sees every share (and runs no collective on its thread)."""
        grpo = self.config.grpo
        if not grpo.dynamic_sampling:
            return self._sample_round(first_index, produced), first_index
        wanted = self.prompts_per_rollout
        kept: list[list[list[ScoredSample]]] = []
        rounds: list[list[tuple[dict, int]]] = []
        sampled: list[int] = []
        index = first_index
        for round_index in range(grpo.dynamic_sampling_max_rounds):
            index = first_index + round_index
            shares = self._sample_round(index, produced)
            if not kept:
                kept, rounds, sampled = [[] for _ in shares], [[] for _ in shares], [0] * len(shares)
            for k, (groups, metrics) in enumerate(shares):
                rounds[k].append((metrics, sum(len(g) for g in groups)))
                sampled[k] += len(groups)
                kept[k] += keep_with_spread(groups, wanted - len(kept[k]))
            short = float(sum(len(share) < wanted for share in kept))
            if (short if produced else self._global_sums([short])[0]) == 0:  # every process is full
                break
        out = []
        for k, share in enumerate(kept):
            merged = merge_round_metrics(rounds[k])
            merged.update(
                {
                    "sampling/rounds": float(len(rounds[k])),
                    "sampling/groups_sampled": float(sampled[k]),
                    "sampling/groups_kept": float(len(share)),
                }
            )
            out.append((share, merged))
        return out, index

    def _sample_round(self, index: int, produced: bool = False) -> list[Share]:
        """One rollout round: the prompts at data-order position `index`, G samples each, scored; one (groups,
        metrics) share: this process's. `produced`: the asynchronous producer's round (`training.async_rollouts`),
        one share per process (every rank's prompts, sampled in one burst of requests and scored side by side),
        sampled from the adapter the producer had the server load, without touching the model (the trainer is
        updating it)."""
        cfg = self.config
        by_rank = self._batch_indices(index)
        chosen = by_rank if produced else [by_rank[self.accelerator.process_index]]
        tasks = [[self.tasks[i] for i in share] for share in chosen]
        mode = cfg.multi_turn.mode
        prompts = [[get_unified_prompt(t, cfg.prompt.num_visible_tests, mode=mode) for t in share] for share in tasks]
        assert self.rollout is not None, "GRPOTrainer needs a rollout backend (phase 3 builds one)"
        start = time.monotonic()
        if produced:  # the server already samples from the adapter the producer loaded; the model is being trained
            every = sample_from_synced(
                self.rollout,
                [p for share in prompts for p in share],
                self.group_size,
                tasks=[t for share in tasks for t in share],
                episodes=self.episodes,
            )
            generations = split_by_rank(every, len(chosen))
        else:
            unwrapped = self.accelerator.unwrap_model(self.model)
            with torch.no_grad():
                step, size = self.state.global_step, self.group_size
                generations = [
                    sample_groups(
                        self.rollout, unwrapped, prompts[0], size, step=step, tasks=tasks[0], episodes=self.episodes
                    )
                ]
        rollout_time = time.monotonic() - start
        if self.forwards_while_scoring:  # (never in async mode) the no-grad log-probs computed while the sandbox scores
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="no-grad-forwards") as forward_thread:
                future = forward_thread.submit(self._rollout_forwards, [s for group in generations[0] for s in group])
                scored = [score_rollouts(tasks[0], prompts[0], generations[0], cfg, self.pool, self.user_rewards)]
                self._forwards, forward_time = future.result()
            scored[0][1]["time/logprobs_s"] = forward_time
        elif len(chosen) == 1:
            scored = [score_rollouts(tasks[0], prompts[0], generations[0], cfg, self.pool, self.user_rewards)]
        else:  # every share on the sandbox pool at once, each scored (and its metrics taken) as its rank would
            with ThreadPoolExecutor(max_workers=len(chosen), thread_name_prefix="score-share") as scorers:
                scored = list(
                    scorers.map(
                        lambda k: score_rollouts(
                            tasks[k], prompts[k], generations[k], cfg, self.pool, self.user_rewards
                        ),
                        range(len(chosen)),
                    )
                )
        score_time = time.monotonic() - start - rollout_time
        shares: list[Share] = []
        for (groups, metrics), share_generations in zip(scored, generations, strict=True):
            generated = sum(s.num_policy_tokens for group in share_generations for s in group)  # not inserted ones
            metrics = {
                "time/rollout_s": rollout_time,
                "time/score_s": score_time,
                "tokens_per_s": generated / max(rollout_time, 1e-9),
                **metrics,
            }
            shares.append((groups, metrics))
        if self.guide is not None:  # all-fail groups: part of each drawn again from a teacher prefix
            shares = [
                self._guide_share(groups, metrics, share_tasks, share_prompts, produced)
                for (groups, metrics), share_tasks, share_prompts in zip(shares, tasks, prompts, strict=True)
            ]
        if self.curriculum is not None:
            observed = self._observe_curriculum(chosen, [groups for groups, _ in shares], gather=not produced)
            for (_, metrics), curriculum_metrics in zip(shares, observed, strict=True):
                metrics.update(curriculum_metrics)
        return shares

    def _guide_share(
        self, groups: list[list[ScoredSample]], metrics: dict, tasks: list, prompts: list[str], produced: bool
    ) -> Share:
        """One share's all-fail groups guided (`training.guidance`): the guided samples are drawn from the policy
        being trained (the producer's: from the adapter its server loaded) and scored like every sample."""
        assert self.guide is not None and self.rollout is not None
        start = time.monotonic()
        prompt_of = {t.task_id: p for t, p in zip(tasks, prompts, strict=True)}

        def sample(prompt_ids: list[list[int]], prefixes: list[list[int]], k: int) -> list:
            if produced:
                return continue_prefixes(self.rollout, prompt_ids, prefixes, k)
            with torch.no_grad():
                policy = self.accelerator.unwrap_model(self.model)
                return sample_from_prefixes(self.rollout, policy, prompt_ids, prefixes, k, step=self.state.global_step)

        def score(guided_tasks: list, drawn: list) -> list[list[ScoredSample]]:
            guided_prompts = [prompt_of[t.task_id] for t in guided_tasks]
            return score_rollouts(guided_tasks, guided_prompts, drawn, self.config, self.pool, self.user_rewards)[0]

        groups, guided_metrics = self.guide.apply(groups, sample, score)
        return groups, {**metrics, **guided_metrics, "time/guidance_s": time.monotonic() - start}

    @property
    def forwards_while_scoring(self) -> bool:
        """Whether a rollout batch's reference/old log-probs are computed while the sandbox scores it: when some
        no-grad forward is needed and the batch is trained as sampled (dynamic filtering or dynamic sampling choose
        the groups from their rewards, so the micro-batches are known only after scoring; guidance replaces samples
        after scoring)."""
        grpo = self.config.grpo
        needed = self.passes.rollout_terms and (grpo.kl_coef > 0 or grpo.num_iterations > 1)
        filtered = grpo.dynamic_filtering and not self.opd  # with OPD every group keeps its per-token signal
        later = grpo.dynamic_sampling or self.async_mode or self.guide is not None
        return needed and not filtered and not later

    @property
    def async_mode(self) -> bool:
        """Whether a producer thread samples the next batches while the trainer updates (`grpo.async_rollouts`
        with max_staleness > 0 and something to sample); otherwise the loop is the synchronous one."""
        grpo = self.config.grpo
        return grpo.async_rollouts and grpo.max_staleness > 0 and self.needs_rollouts

    def _start_producer(self) -> RolloutProducer | None:
        """Publish the current adapter (every process) and start the producer: on the main process only, which
        samples and scores every process's share of each batch (`_fill_batch(produced=True)`); the other processes
        get theirs from `_take_rollouts`. None on the other processes. One producer keeps the server's adapters
        single-owner (one process loads each and unloads the previous one, which no other rank can still be
        sampling with) and every collective on the training thread (the producer needs none)."""
        rollout: Any = self.rollout
        if not (hasattr(rollout, "publish_adapter") and hasattr(rollout, "load_adapter")):
            raise ValueError(
                f"grpo.async_rollouts needs a sampler that loads published adapters (vllm_server); "
                f"{type(rollout).__name__} does not"
            )
        if not self.accelerator.is_main_process:
            self._publish(None)
            return None
        producer = RolloutProducer(
            self._produce_batch,
            rollout.load_adapter,
            max_staleness=self.config.grpo.max_staleness,
            first_index=self.state.rollout_batches,
            first_step=self.state.global_step,
            steps_per_batch=self.config.grpo.num_iterations,
        )
        self._publish(producer)
        producer.start()
        return producer

    def _produce_batch(self, index: int) -> tuple[list[Share], int]:
        """The producer's batch at data-order position `index` (on its thread), every process's share. With the
        curriculum, the draw sees
        the estimates up to the batches the producer scored so far (those not yet trained included: up to
        max_staleness + 1 batches ahead of the trainer, their rewards from adapters up to max_staleness steps
        old), and the curriculum's state after this batch is kept for the checkpoint of the step that trains it:
        the curriculum itself runs ahead of the trainer, a resumed run must not skip the batches in flight."""
        shares, last_index = self._fill_batch(index, produced=True)
        if self.curriculum is not None:
            with self._curriculum_lock:
                self._curriculum_after[last_index] = self.curriculum.state()
        return shares, last_index

    def _publish(self, producer: RolloutProducer | None) -> None:
        """Write the adapter of the current step (on the training thread, which owns the weights; the main process
        writes, every process waits for it) and tell the producer (the main process's)."""
        rollout: Any = self.rollout  # a sampler `_start_producer` checked: it publishes adapters
        rollout.publish_adapter(self.accelerator.unwrap_model(self.model), self.state.global_step)
        if producer is not None:
            producer.publish(self.state.global_step)

    def _take_rollouts(self, producer: RolloutProducer | None) -> tuple[list[list[ScoredSample]], dict]:
        """This process's share of the producer's next batch fresh enough for this step, with its async metrics;
        the data order moves to the batch's last round (the loop then counts past it; dropped batches consumed
        their prompts). The main process takes the batch (`producer`; None on the others) and hands every process
        its share in one scatter, on this thread. When taking fails there (the producer's error, Ctrl-C), every
        process gets the error instead of a share and raises it: none is left waiting for the main process."""
        world = self.accelerator.num_processes
        shares: list | None = None
        if producer is not None:
            try:
                batch, async_metrics = producer.take(self.state.global_step)
            except BaseException as error:
                if world > 1:
                    message = str(error) if isinstance(error, ProducerError) else f"the main process stopped: {error!r}"
                    self._scatter([TakeFailed(message)] * world)
                raise
            shares = [(batch.last_index, groups, {**metrics, **async_metrics}) for groups, metrics in batch.shares]
            if self.curriculum is not None:  # the curriculum as it stood after this batch (and before the next)
                with self._curriculum_lock:
                    self._trained_curriculum = self._curriculum_after.pop(batch.last_index)
                    for older in [k for k in self._curriculum_after if k < batch.last_index]:  # dropped batches
                        del self._curriculum_after[older]
        mine = self._scatter(shares) if world > 1 else shares[0] if shares else None
        if isinstance(mine, TakeFailed):
            raise ProducerError(mine.message)
        assert mine is not None, "the main process takes the batches"
        last_index, groups, metrics = mine
        self.state.rollout_batches = last_index
        return groups, metrics

    def _scatter(self, shares: list | None) -> Any:
        """The main process's `shares[rank]` on every process (`shares`: the main process's list, one per rank;
        None elsewhere): one scatter of Python objects, on the training thread."""
        import torch.distributed as dist

        received: list[Any] = [None]
        dist.scatter_object_list(received, shares if self.accelerator.is_main_process else None, src=0)
        return received[0]

    def _rollout_forwards(self, completions: list) -> tuple[RolloutForwards, float]:
        """`rollout_forwards` of this rollout batch and its seconds, run in a thread beside the scoring."""
        start = time.monotonic()
        device = torch.device(self.accelerator.device)
        if device.type == "cuda":  # a new thread starts on the default device, not this process's
            torch.cuda.set_device(device)
        forwards = rollout_forwards(
            completions,
            self.accelerator.unwrap_model(self.model),
            pad_id=self.tokenizer.pad_token_id,
            device=device,
            grpo=self.config.grpo,
            num_slots=self.micro_batches,
            forward_chunk_size=self.config.training.forward_chunk_size,
            shared_prompt=self.config.training.shared_prompt_forward,
        )
        return forwards, time.monotonic() - start

    def _observe_curriculum(
        self, chosen: list[list[int]], groups: list[list[list[ScoredSample]]], gather: bool
    ) -> list[dict[str, float]]:
        """Add this round's correctness rewards (the reward in use: partial credit is spread, as the advantage
        sees it) to the curriculum: every process's groups in rank order, so all hold the same estimates; with
        `gather` this process's share (`chosen`, `groups`: one share) is gathered from every process, otherwise
        the shares are every process's already (the producer's). Returns each share's filter metrics, with its
        zero-spread share."""
        assert self.curriculum is not None
        # (P, G) per share, NaN = unscorable or guided (a guided sample says nothing of the task's own pass rate)
        rewards = [unguided_correctness(share) for share in groups]
        indices = [torch.tensor(share, dtype=torch.float64).reshape(-1, 1) for share in chosen]  # (P, 1) per share
        rows = torch.cat([torch.cat([i, r.to(torch.float64)], dim=1) for i, r in zip(indices, rewards, strict=True)])
        if gather and self.accelerator.num_processes > 1:  # every process draws the same number of prompts
            rows = self.accelerator.gather(rows.to(self.accelerator.device)).cpu()
        for row in rows.tolist():  # (P x processes, 1 + G)
            values = [v for v in row[1:] if v == v]  # NaN (unscorable) says nothing about the task
            if values:
                self.curriculum.observe(int(row[0]), values)
        summary = {**self._curriculum_metrics, **self.curriculum.summary()}
        return [
            {
                **summary,
                "curriculum/zero_spread_share": zero_spread_share([[v for v in row if v == v] for row in r.tolist()]),
            }
            for r in rewards
        ]

    def _self_sft_examples(self, groups: list[list[ScoredSample]]) -> list[dict]:
        return self_sft_examples(groups, self.buffer, self.config.dual_source.sft_max_length)

    def _teacher_batch(self) -> dict | None:
        """One teacher-SFT batch drawn (with replacement) from the tokenized traces by this rank's RNG."""
        d = self.config.dual_source
        if not self.teacher_sft or d.teacher_sft_batch_size <= 0:
            return None
        picked = [self.teacher_rng.choice(self.teacher_sft) for _ in range(d.teacher_sft_batch_size)]
        return collate_sft(picked, self.tokenizer.pad_token_id)

    # ---------------------------------------------------------------- applying a planned update

    def _global_sums(self, values: list[float]) -> list[float]:
        """`values` summed over all processes (one all-reduce; itself when there is one process)."""
        if self.accelerator.num_processes == 1:
            return list(values)
        reduced = self.accelerator.reduce(
            torch.tensor(values, dtype=torch.float64, device=self.accelerator.device), reduction="sum"
        )
        return [float(v) for v in reduced.cpu()]

    def _optimizer_step(self, plan: UpdatePlan, rollout_metrics: dict) -> dict:
        """Plan one optimizer step's SFT slots and normalizers, run its passes, step; returns its metrics."""
        start = time.monotonic()
        w_teacher, w_self = self.sft_weights(self.state.global_step)
        teacher_batches = [self._teacher_batch() for _ in range(self.micro_batches)] if w_teacher > 0 else []
        world = self.accelerator.num_processes
        step = plan_step(plan, teacher_batches, w_self > 0, self.config.grpo, world, self._global_sums)
        sums: dict[str, float] = {}
        d, grpo = self.config.dual_source, self.config.grpo
        totals: dict = {}
        grad_norm = 0.0
        if step.has_signal:
            for run_pass in self.passes.passes(plan, step, self.micro_batches, w_teacher, w_self):  # DDP: sync once
                with self.accelerator.no_sync(self.model) if world > 1 else contextlib.nullcontext():
                    for key, value in run_pass().items():
                        sums[key] = sums.get(key, 0.0) + value
            if world > 1:
                self.passes.synchronizing_pass()
            rollout_terms = step.grpo_tokens > 0 and self.passes.rollout_terms
            if rollout_terms:  # a rank without GRPO samples contributes zeros to the step's means
                for key in step_metric_keys(d.grpo_weight > 0, grpo.kl_coef > 0, self.opd):
                    sums.setdefault(key, 0.0)
            present = {
                "grpo": rollout_terms and d.grpo_weight > 0,
                "teacher_sft": step.teacher_tokens > 0,
                "self_sft": step.self_tokens > 0,
                "opd": self.opd and rollout_terms,
                "kl": rollout_terms and grpo.kl_coef > 0,
            }
            totals = step_loss_metrics(sums, present, d.grpo_weight, w_teacher, w_self, d.opd_weight, grpo.kl_coef)
            if self.config.training.max_grad_norm > 0:
                grad_norm = float(
                    self.accelerator.clip_grad_norm_(self.model.parameters(), self.config.training.max_grad_norm)
                )
            self.optimizer.step()
        elif self.passes.rollout_terms:  # the sampler/trainer gap is still worth knowing
            totals = self.passes.sampler_agreement(plan)
        # No signal beyond the format bonus (or the KL alone): no optimizer step, so Adam cannot scale the bonus
        # to a full-size update; the schedule still advances with the step count.
        if not step.has_signal:
            with warnings.catch_warnings():  # torch warns about a schedule step without an optimizer step
                warnings.simplefilter("ignore", UserWarning)
                self.scheduler.step()
        elif not getattr(self.optimizer, "step_was_skipped", False):  # fp16 overflow: no step, no schedule step
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.global_step += 1
        epoch = self.state.rollout_batches * self.prompts_per_rollout * world / max(len(self.tasks), 1)
        return {
            "step": self.state.global_step,
            "epoch": epoch,
            "lr": self.scheduler.get_last_lr()[0],
            "grad_norm": grad_norm,
            **rollout_metrics,
            **plan.advantage_metrics,
            **totals,
            "weight/teacher_sft": w_teacher,
            "weight/self_sft": w_self,
            "self_sft/samples": plan.num_self_examples,
            "teacher_sft/pool": len(self.teacher_sft),
            **self.teacher_stats,
            "update/skipped": 0.0 if step.has_signal else 1.0,
            "time/update_s": time.monotonic() - start,
        }

    def train_on_rollouts(self, groups: list[list[ScoredSample]], rollout_metrics: dict) -> list[dict]:
        """mu optimizer steps on one rollout batch; returns one metrics dict per step."""
        self_examples = self._self_sft_examples(groups)
        self_batch = collate_sft(self_examples, self.tokenizer.pad_token_id) if self_examples else None
        teacher_logps = None
        if self.opd and groups:
            assert self.teacher_scorer is not None  # built in __init__ when the term is on
            scores = self.teacher_scorer.score([s.completion for group in groups for s in group])
            teacher_logps = scores.logprobs
            rollout_metrics = {**rollout_metrics, **scores.metrics()}
        plan = plan_update(
            groups,
            self.accelerator.unwrap_model(self.model),
            pad_id=self.tokenizer.pad_token_id,
            device=self.accelerator.device,
            grpo=self.config.grpo,
            num_slots=self.micro_batches,
            forward_chunk_size=self.config.training.forward_chunk_size,
            self_batch=self_batch,
            num_self_examples=len(self_examples),
            teacher_logps=teacher_logps,
            shared_prompt=self.config.training.shared_prompt_forward,
            rollout_terms=self.passes.rollout_terms,
            forwards=self._forwards,
        )
        self._forwards = None
        self.model.train()
        step_metrics = []
        for _ in range(self.config.grpo.num_iterations):
            step_metrics.append(self._optimizer_step(plan, rollout_metrics))
            if self.state.global_step >= self.total_steps:
                break
        return step_metrics

    # ---------------------------------------------------------------- the loop

    def train(self, resume_from: str | None = None) -> dict:
        from tqdm import tqdm

        if resume_from:
            self.load_checkpoint(resolve_checkpoint(self.output_dir, resume_from))
        main = self.accelerator.is_main_process
        if main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            save_config(self.config, self.output_dir / "config.json")
            self.sinks.open(self.state.global_step)
        # closed before an error or Ctrl-C propagates, so its message is not written into the bar
        with tqdm(
            total=self.total_steps,
            initial=self.state.global_step,
            desc="GRPO",
            unit="step",
            disable=not main,
            dynamic_ncols=True,
        ) as bar:
            last: dict = {}
            producer = self._start_producer() if self.async_mode else None  # the main process's; None elsewhere
            try:
                last = self._train_loop(bar, main, producer)
            finally:  # an error, a producer failure or Ctrl-C: the producer ends before it propagates
                if producer is not None:
                    producer.stop()
        checkpointing.save_final(self.output_dir, self.accelerator, self.model, self.tokenizer, self.config)
        self.sinks.close()
        if self.parts.owns_pool:  # a pool passed to build_run is its caller's to close
            self.pool.close()
        if self.teacher_scorer is not None:
            self.teacher_scorer.close()
        return last

    def _train_loop(self, bar: Any, main: bool, producer: RolloutProducer | None) -> dict:
        """Rollout batches and their optimizer steps until the last step; returns the last step's metrics. With
        asynchronous rollouts, batches come from the producer and the adapter is published after each batch's
        steps; a checkpoint saves the trainer only (the producer's batches in flight are discarded: a resumed run
        samples them again)."""
        last: dict = {}
        while self.state.global_step < self.total_steps:
            if self.async_mode:
                groups, rollout_metrics = self._take_rollouts(producer)
            else:
                groups, rollout_metrics = self.collect_rollouts()
            for metrics in self.train_on_rollouts(groups, rollout_metrics):
                last = metrics = reduce_over_processes(metrics, self.accelerator)
                if main:
                    self.sinks.write(metrics)
                    bar.set_postfix(
                        reward=f"{metrics.get('reward/mean', float('nan')):.3f}",
                        loss=progress_loss(metrics),
                        pass_rate=f"{metrics.get('pass_rate', float('nan')):.2f}",
                        refresh=False,
                    )
                    bar.update(1)
            self.state.rollout_batches += 1
            if self.async_mode and self.state.global_step < self.total_steps:
                self._publish(producer)
            save_every = self.config.training.save_steps
            due = bool(save_every) and self.state.global_step % save_every < self.config.grpo.num_iterations
            if due or self.state.global_step >= self.total_steps:  # the last step always: a run can be extended
                self.save_checkpoint()
        return last

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> Path:
        """`training.checkpointing.save_checkpoint`, with this rank's teacher-sampling RNG and self-SFT buffer
        (each rank samples and succeeds on its own prompts)."""
        return checkpointing.save_checkpoint(
            self.output_dir,
            accelerator=self.accelerator,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            config=self.config,
            state=self.state,
            total_steps=self.total_steps,
            rank_state={
                "teacher": self.teacher_rng.getstate(),
                "self_sft_buffer": self.buffer.state(),
                **({"curriculum": self._curriculum_state()} if self.curriculum is not None else {}),
                **({"guidance": self.guide.state.state()} if self.guide is not None else {}),
            },
        )

    def _curriculum_state(self) -> dict:
        """The curriculum's state after the last trained batch: the asynchronous producer's, as it stood after
        that batch (it has drawn and observed the batches in flight since; under several processes the main
        process's, sent to every process, so every rank saves the same); otherwise the curriculum's own."""
        assert self.curriculum is not None
        if self.async_mode and self.accelerator.num_processes > 1:  # only the main process has a producer
            from accelerate.utils import broadcast_object_list

            return broadcast_object_list([self._trained_curriculum], from_process=0)[0]
        if self._trained_curriculum is not None:
            return self._trained_curriculum
        return self.curriculum.state()

    def load_checkpoint(self, path: Path) -> None:
        rank_state = checkpointing.load_checkpoint(
            path, self.accelerator, self.model, self.optimizer, self.scheduler, self.state
        )
        self.teacher_rng.setstate(rank_state["teacher"])
        self.buffer.load(rank_state["self_sft_buffer"])
        if self.curriculum is not None:
            if "curriculum" not in rank_state:
                raise ValueError(f"{path} was saved without curriculum.enabled; resume it with the filter off")
            self.curriculum.load(rank_state["curriculum"])
        if self.guide is not None and "guidance" in rank_state:  # a run saved without guidance starts it fresh
            self.guide.state.load(rank_state["guidance"])


Share = tuple[list[list[ScoredSample]], dict]  # one process's part of a rollout batch: its scored groups, metrics


@dataclass(frozen=True)
class TakeFailed:
    """What every process receives instead of its share when the main process could not take a batch."""

    message: str


def split_by_rank(items: list[T], world: int) -> list[list[T]]:
    """`items` (a rollout batch's prompts, or what was made of them, in data order) cut into `world` equal
    consecutive shares, rank 0's first: the share rank r trains on is items[r x n : (r + 1) x n]."""
    if len(items) % world:
        raise ValueError(f"{len(items)} items do not split into {world} equal shares")
    size = len(items) // world
    return [items[rank * size : (rank + 1) * size] for rank in range(world)]


def keep_with_spread(groups: list[list[ScoredSample]], room: int) -> list[list[ScoredSample]]:
    """Dynamic sampling's keep: the groups whose correctness rewards differ, in order, at most `room` of them."""
    if not groups or room <= 0:
        return []
    spread = group_has_spread(correctness_rewards(groups)).tolist()
    return [g for g, has in zip(groups, spread, strict=True) if has][:room]


def step_metric_keys(grpo: bool, kl: bool, opd: bool) -> tuple[str, ...]:
    """The per-token metrics the rollout terms that are on report (every rank reports them, 0 where it had none)."""
    keys: tuple[str, ...] = ("clip_ratio/low_mean", "clip_ratio/high_mean", "ratio/mean") if grpo else ()
    keys += ("kl",) if kl else ()
    if opd:
        keys += ("opd/kl", "opd/advantage_mean", "opd/clipped_frac", "opd/advantage_p01", "opd/advantage_p99")
    return keys


def merge_round_metrics(rounds: list[tuple[dict, int]]) -> dict:
    """One rollout batch's metrics from several sampling rounds (metrics, samples): times add up, tokens/s is
    the rounds' total over their total time, every other value is a mean weighted by the round's samples."""
    total = max(sum(n for _, n in rounds), 1)
    out: dict = {}
    for key in {k for metrics, _ in rounds for k in metrics}:
        present = [(metrics[key], n) for metrics, n in rounds if key in metrics]
        if key.startswith("time/"):
            out[key] = sum(v for v, _ in present)
        else:
            weight = max(sum(n for _, n in present), 1) if len(present) < len(rounds) else total
            out[key] = sum(v * n for v, n in present) / weight
    rollout_s = out.get("time/rollout_s", 0.0)
    if rollout_s > 0 and all("tokens_per_s" in m for m, _ in rounds):
        out["tokens_per_s"] = sum(m["tokens_per_s"] * m.get("time/rollout_s", 0.0) for m, _ in rounds) / rollout_s
    return out
