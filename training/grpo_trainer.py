"""The training loop, as named steps over a rollout source.

1. `collect_rollouts`: this rank's share of the next batch from the run's source (`training.rollout_sources`).
   The batch is sampled and scored by `training.rollout_batches.BatchMaker`.
2. `train_on_rollouts`: `training.update_plan.plan_update` plans the update once per batch.
   It computes advantages, filtering, micro-batches and the old/reference log-probs.
3. `_optimizer_step`, mu times: `plan_step` sets the SFT slots and the step-wide normalizers.
   The passes of `training.passes.PassRunner` run, then clip, step and schedule.
4. Metric sinks (`training.metric_sinks`) and checkpoints (`training.checkpointing`).

One optimizer step consumes `per_device_train_batch_size x gradient_accumulation_steps` prompts per process
(TRL's convention).
All of them are rolled out first (G completions each) and scored, then planned and applied, one backward pass
per row chunk and loss term.
The plan's no-grad forwards (reference, old log-probs) need only the token ids.
When the batch is trained as sampled they run in a thread while the sandbox scores (`time/logprobs_s`).
With `num_iterations` (mu) > 1 the same rollouts serve mu optimizer steps; with mu = 1 the ratio is exactly 1.
Log-probs cover the whole completion, thinking and code.

The reference policy is the same model with its LoRA adapter disabled (no second copy of the base weights).
With `dual_source.opd_weight` > 0 the teacher scores every rollout's tokens before the update is planned
(`training.teacher_logprobs`); each GRPO pass adds the OPD term on the same forward.
Teacher-SFT draws a batch of verified traces per micro-batch slot.
Self-SFT trains on each group's best passing sample (`training.sft_sources`).

Under `accelerate launch` each process trains on its own share of the prompts.
Groups never straddle processes, so advantages need no communication; DDP averages the gradients.
The loop does not know whether its source is synchronous or asynchronous.
"""

from __future__ import annotations

import contextlib
import random
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from training import checkpointing
from training.checkpointing import TrainerState, resolve_checkpoint
from training.launch import Peers, check_accelerator
from training.metric_sinks import progress_loss, reduce_over_processes
from training.passes import PassRunner
from training.rewards import ScoredSample
from training.sampler_guard import check_logp_gap, check_sampler_logprobs
from training.schedules import lr_factor, scheduled_weight
from training.setup import RunParts
from training.sft_sources import SuccessBuffer, self_sft_examples
from training.update_plan import (
    RolloutForwards,
    UpdatePlan,
    plan_step,
    plan_update,
    rollout_forwards,
    step_loss_metrics,
)
from utils.sft_data import collate_sft


class GRPOTrainer:
    """The loop over the parts `training.setup.build_run` made; it builds only its own optimizer, schedule, passes
    and state."""

    def __init__(self, parts: RunParts) -> None:
        self.parts = parts
        self.grpo, self.training, self.dual_source = parts.grpo, parts.training, parts.dual_source
        grpo, training, dual = self.grpo, self.training, self.dual_source
        self.accelerator = parts.accelerator
        check_accelerator(self.accelerator)  # DeepSpeed/FSDP: refused (training.launch says why)
        self.tokenizer = tokenizer = parts.tokenizer
        self.peers = Peers(self.accelerator)
        self.tasks = parts.tasks
        self.teacher_sft, self.teacher_stats = parts.teacher_sft, parts.teacher_sft_stats
        self.output_dir = parts.output_dir
        self.rollouts = parts.rollouts  # where batches come from (training.rollout_sources); None: none is sampled
        self.pool = parts.pool
        self.teacher_scorer = parts.teacher_scorer
        self.sinks = parts.sinks
        self.curriculum = parts.curriculum  # the difficulty filter (training.curriculum); None when off
        self.guide = parts.guide  # teacher-guided rollouts (training.guidance), the maker's reviser; None when off
        self.completion_log = parts.completion_log  # every rollout sample's text (training.completion_log); or None
        self.group_size = grpo.num_samples_per_prompt
        self.micro_batches = training.gradient_accumulation_steps  # micro-batch slots per optimizer step
        self.prompts_per_rollout = training.per_device_train_batch_size * self.micro_batches  # per process
        batches_per_epoch = max(1, len(self.tasks) // (self.prompts_per_rollout * self.accelerator.num_processes))
        self.total_steps = (
            training.max_steps
            if training.max_steps > 0
            else max(1, training.num_train_epochs * batches_per_epoch * grpo.num_iterations)
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
            grpo=grpo,
            grpo_weight=dual.grpo_weight,
            chunk_size=training.forward_chunk_size,
            pad_token_id=tokenizer.pad_token_id,
            opd_weight=dual.opd_weight,
            opd_advantage_clip=dual.opd_advantage_clip,
            opd_max_ratio=dual.opd_max_ratio,
            shared_prompt=training.shared_prompt_forward,
        )
        # on-policy distillation: the teacher's log-probs of every rollout's tokens (training.teacher_logprobs)
        self.opd = dual.opd_weight > 0
        self._forwards: RolloutForwards | None = None  # the last rollout batch's, computed while it was scored
        self.state = TrainerState()
        self.buffer = SuccessBuffer(dual.self_sft_buffer_size, dual.self_sft_max_replays)
        self.teacher_rng = random.Random(training.seed + 1 + self.accelerator.process_index)

    # ---------------------------------------------------------------- schedules and data order

    def _lr_factor(self, step: int) -> float:
        training = self.training
        warmup = training.warmup_steps_for(self.total_steps)
        return lr_factor(step, warmup, self.total_steps, training.lr_scheduler, min_lr_rate=training.min_lr_rate)

    def sft_weights(self, step: int) -> tuple[float, float]:
        d = self.dual_source
        decay = d.sft_decay_steps or self.total_steps
        return (
            scheduled_weight(step, d.teacher_sft_weight, d.teacher_sft_final_weight, decay, d.sft_weight_schedule),
            scheduled_weight(step, d.self_sft_weight, d.self_sft_final_weight, decay, d.sft_weight_schedule),
        )

    # ---------------------------------------------------------------- one rollout batch

    def collect_rollouts(self) -> tuple[list[list[ScoredSample]], dict]:
        """This rank's share of the next rollout batch from the run's source (`training.rollout_sources`): G
        completions per prompt, executed and scored; the data order moves past the batch's last round. Returns no
        groups when nothing in the objective trains on rollouts."""
        if self.rollouts is None:
            return [], {}
        policy = self.accelerator.unwrap_model(self.model)
        beside = self._rollout_forwards if self.forwards_while_scoring else None
        share = self.rollouts.next(policy, self.state, beside_scoring=beside)
        self.state.rollout_batches = share.last_position  # a refill round consumed the next prompts of the order
        return share.groups, share.metrics

    @property
    def forwards_while_scoring(self) -> bool:
        """Whether a rollout batch's reference/old log-probs are computed while the sandbox scores it: when some
        no-grad forward is needed and the batch is trained as sampled (dynamic filtering, dynamic sampling and a
        revision step choose or change the groups after scoring). The asynchronous source never runs them."""
        grpo = self.grpo
        needed = self.passes.rollout_terms and (grpo.kl_coef > 0 or grpo.num_iterations > 1)
        filtered = grpo.dynamic_filtering and not self.opd  # with OPD every group keeps its per-token signal
        revised = self.rollouts is not None and self.rollouts.maker.reviser is not None
        return needed and not filtered and not grpo.dynamic_sampling and not revised

    def _rollout_forwards(self, completions: list) -> dict[str, float]:
        """`rollout_forwards` of this rollout batch, kept for its plan, and their seconds; run in a thread beside
        the scoring."""
        start = time.monotonic()
        device = torch.device(self.accelerator.device)
        if device.type == "cuda":  # a new thread starts on the default device, not this process's
            torch.cuda.set_device(device)
        self._forwards = rollout_forwards(
            completions,
            self.accelerator.unwrap_model(self.model),
            pad_id=self.tokenizer.pad_token_id,
            device=device,
            grpo=self.grpo,
            num_slots=self.micro_batches,
            forward_chunk_size=self.training.forward_chunk_size,
            shared_prompt=self.training.shared_prompt_forward,
        )
        return {"time/logprobs_s": time.monotonic() - start}

    def _self_sft_examples(self, groups: list[list[ScoredSample]]) -> list[dict]:
        return self_sft_examples(groups, self.buffer, self.dual_source.sft_max_length)

    def _teacher_batch(self) -> dict | None:
        """One teacher-SFT batch drawn (with replacement) from the tokenized traces by this rank's RNG."""
        d = self.dual_source
        if not self.teacher_sft or d.teacher_sft_batch_size <= 0:
            return None
        picked = [self.teacher_rng.choice(self.teacher_sft) for _ in range(d.teacher_sft_batch_size)]
        return collate_sft(picked, self.tokenizer.pad_token_id)

    # ---------------------------------------------------------------- applying a planned update

    def _optimizer_step(self, plan: UpdatePlan, rollout_metrics: dict) -> dict:
        """Plan one optimizer step's SFT slots and normalizers, run its passes, step; returns its metrics."""
        start = time.monotonic()
        w_teacher, w_self = self.sft_weights(self.state.global_step)
        teacher_batches = [self._teacher_batch() for _ in range(self.micro_batches)] if w_teacher > 0 else []
        world = self.accelerator.num_processes
        step = plan_step(plan, teacher_batches, w_self > 0, self.grpo, world, self.peers.sums)
        sums: dict[str, float] = {}
        d, grpo = self.dual_source, self.grpo
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
            check_logp_gap(totals, grpo.max_logp_abs_diff, self.state.global_step)  # before stepping on its samples
            if self.training.max_grad_norm > 0:
                grad_norm = float(
                    self.accelerator.clip_grad_norm_(self.model.parameters(), self.training.max_grad_norm)
                )
            self.optimizer.step()
        elif self.passes.rollout_terms:  # the sampler/trainer gap is still worth knowing
            totals = self.passes.sampler_agreement(plan)
            check_logp_gap(totals, grpo.max_logp_abs_diff, self.state.global_step)
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
        check_sampler_logprobs((s.completion.logprobs for group in groups for s in group), self.state.global_step)
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
            grpo=self.grpo,
            num_slots=self.micro_batches,
            forward_chunk_size=self.training.forward_chunk_size,
            self_batch=self_batch,
            num_self_examples=len(self_examples),
            teacher_logps=teacher_logps,
            shared_prompt=self.training.shared_prompt_forward,
            rollout_terms=self.passes.rollout_terms,
            forwards=self._forwards,
        )
        self._forwards = None
        self.model.train()
        step_metrics = []
        for _ in range(self.grpo.num_iterations):
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
            self.parts.files.write_config()
            self.sinks.open(self.state.global_step)
        if self.completion_log is not None:  # each process its own file
            self.completion_log.open(self.state.global_step)
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
            if self.rollouts is not None:
                self.rollouts.start(self.accelerator.unwrap_model(self.model), self.state)
            try:
                last = self._train_loop(bar, main)
            finally:  # an error, a producer failure or Ctrl-C: the source's producer ends before it propagates
                if self.rollouts is not None:
                    self.rollouts.stop()
        self.parts.files.save_final(self.accelerator, self.model, self.tokenizer)
        self.sinks.close()
        if self.parts.owns_pool:  # a pool passed to build_run is its caller's to close
            self.pool.close()
        if self.teacher_scorer is not None:
            self.teacher_scorer.close()
        return last

    def _train_loop(self, bar: Any, main: bool) -> dict:
        """Rollout batches and their optimizer steps until the last step; returns the last step's metrics. After
        each batch's steps the source hears of the new policy (the asynchronous one publishes the adapter)."""
        last: dict = {}
        while self.state.global_step < self.total_steps:
            groups, rollout_metrics = self.collect_rollouts()
            if self.completion_log is not None and groups:
                self.completion_log.write(groups, self.state.global_step + 1)
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
            if self.rollouts is not None and self.state.global_step < self.total_steps:
                self.rollouts.after_update(self.accelerator.unwrap_model(self.model), self.state.global_step)
            save_every = self.training.save_steps
            due = bool(save_every) and self.state.global_step % save_every < self.grpo.num_iterations
            if due or self.state.global_step >= self.total_steps:  # the last step always: a run can be extended
                self.save_checkpoint()
        return last

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> Path:
        """A checkpoint (`training.checkpointing`) with this rank's teacher-sampling RNG and self-SFT buffer (each
        rank samples and succeeds on its own prompts) and the curriculum the source kept for the trained batches."""
        return self.parts.files.save_checkpoint(
            accelerator=self.accelerator,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            state=self.state,
            total_steps=self.total_steps,
            rank_state={
                "teacher": self.teacher_rng.getstate(),
                "self_sft_buffer": self.buffer.state(),
                **({"curriculum": self._curriculum_state()} if self.curriculum is not None else {}),
                **({"guidance": self.guide.state.state()} if self.guide is not None else {}),
            },
        )

    def _curriculum_state(self) -> dict | None:
        """The curriculum as it stood after the last trained batch (the asynchronous source's ran ahead)."""
        assert self.rollouts is not None, "a run with the curriculum samples rollouts"
        return self.rollouts.curriculum_state()

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


def step_metric_keys(grpo: bool, kl: bool, opd: bool) -> tuple[str, ...]:
    """The per-token metrics the rollout terms that are on report (every rank reports them, 0 where it had none)."""
    keys: tuple[str, ...] = ("clip_ratio/low_mean", "clip_ratio/high_mean", "ratio/mean") if grpo else ()
    keys += ("kl",) if kl else ()
    if opd:
        keys += ("opd/kl", "opd/advantage_mean", "opd/clipped_frac", "opd/advantage_p01", "opd/advantage_p99")
    return keys
