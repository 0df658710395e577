"""Phase 3: rewards, losses and the GRPO + teacher-SFT + self-SFT trainer.

The package knows the student, the loss terms and the run's files.
It does not know how a sampler works inside (it calls `rollouts/`), and it never imports `evaluation/`.

The modules, from the loop down:
- `grpo_trainer`: the loop, read as named steps.
  It takes a batch from its source, plans the update, applies it, logs and checkpoints.
  It runs unchanged under `accelerate launch`; each process trains on its own prompts.
- `setup`: the composition root. `build_run` makes a run's `RunParts` (accelerator, teacher-SFT set, OPD teacher,
  sandbox pool, episodes, sinks, rewards, curriculum, rollout source), one named builder per part;
  `GRPOTrainer(parts)` receives them (with the `grpo`, `training` and `dual_source` sections it reads) and builds
  only its optimizer, schedule, passes and state.
- `rollout_sources`: where the loop's batches come from, chosen once by `setup`.
  `SyncRollouts` makes this rank's share now; `AsyncRollouts` takes it from the producer and scatters the shares.
- `rollout_batches`: what a batch is (`BatchMaker`): the data order, the curriculum's draw and observation,
  dynamic sampling's rounds, one round sampled and scored, and the revision step after scoring.
  It makes the shares of the ranks it is asked for; what crosses to the loop is a `RolloutShare`.
- `scoring`: one rollout batch scored (parse, sandbox with one retry of a harness failure, rewards, the batch's
  metrics) into groups of `rewards.ScoredSample`.
- `passes`: the backward passes of one optimizer step (`PassRunner`), in the order they run.
- `update_plan`: `plan_update` once per rollout batch (advantages, dynamic filtering, the truncation mask,
  micro-batches, reference and old log-probs).
  `plan_step` once per optimizer step (teacher-SFT slots, the step-wide normalizers, whether the step has signal).
  `step_loss_metrics` names the step's loss metrics.
- `async_rollouts`: the producer thread of `grpo.async_rollouts` (the next batches made while the trainer updates,
  at most `grpo.max_staleness` steps old); it imports nothing from the project.
- `teacher_logprobs`: on-policy distillation's teacher scores.
- `shared_prompt`: each group's prompt forwarded once for all its completions.
- `sft_sources`: the teacher traces and the self-SFT `SuccessBuffer`.
- `batching`: rollout samples as padded tensors, chunked completion log-probs, `dropout_disabled`.
- `curriculum`: the difficulty filter.
- `sampler_guard`: the run stops, before the optimizer step, on sampler log-probs that are not finite or are far
  from the trainer's (`grpo.max_logp_abs_diff`).
- `guidance`: teacher-guided rollouts (all-fail groups partly drawn again from a teacher's answer prefix), the
  batch maker's revision step (`Guide.revise`).
- `losses`: the pure math. `schedules`: the learning rate and the SFT weights by step. `rewards`: verdicts to rewards.
- `checkpointing`, `metric_sinks`, `launch`, `memory_model`, `plot`, `export`, `run_summary`: the run around the loop.
Imports go one way: `grpo_trainer` → `setup` → `rollout_sources` → `rollout_batches` → `scoring` → … → `losses`.

The loop (`grpo_trainer`):
- Collect: `collect_rollouts` takes this rank's `RolloutShare` from the source.
  The maker samples, then `scoring.score_rollouts` scores.
  The plan's no-grad reference/old forwards (`update_plan.rollout_forwards`) run in a thread beside the scoring
  when the micro-batches do not depend on the rewards.
  With `grpo.dynamic_sampling` the maker samples more rounds until the batch is full of groups with spread.
  No source is built when no loss term uses rollouts: nothing is sampled.
  With `grpo.async_rollouts` (server backend) a producer thread makes the batches ahead of the trainer, with the
  same maker; the source publishes the adapter after each batch and takes the next batch from the queue.
  Under several processes the producer runs on the main process only and makes every rank's share (each as that
  rank would make it); the training thread scatters the shares each step.
- Teacher-guided rollouts (`guidance.enabled`) are the maker's revision step (`BatchMaker.revise_round`, the
  `guidance.Guide` reviser): after a round is scored, part of each all-fail group is drawn again from a teacher's
  answer prefix and rescored with `BatchMaker.score`, before the curriculum and dynamic sampling read the rewards.
- Plan: `update_plan.plan_update`.
- Apply: μ optimizer steps.
  Each step is a list of passes: the rollout terms (GRPO, KL, OPD: those with a nonzero weight) per row chunk,
  teacher-SFT per slot, self-SFT, and under DDP the one synchronizing pass.
  A step whose only signal would be the format bonus or the KL is not taken.
- The learning-rate schedule and the SFT weights are pure functions of the step (`schedules`).
  The LR scheduler is not passed through `accelerator.prepare`: its wrapper would step it once per process.

`losses` is the pure math (no configs, no models):
- Group advantages: z-score or mean-only of the correctness reward; NaN means unscorable.
  The shaping bonus (format and user rewards, weighted) is centred but never std-scaled.
  A spread below a small epsilon (in `losses`) counts as none.
- A chunked selective log-softmax, with the temperature applied in float32.
- The clipped surrogate with separate low and high clip (`grpo_loss`).
- The KL as its own term (`kl_loss`).
  It is the k3 estimate: its value ≈ KL(π‖ref), its gradient that of KL(ref‖π), bounded per token as verl's
  low_var_kl.
  It is weighted by `kl_coef` alone, not by the GRPO weight.
- `aggregate_loss` with named modes, and `step_denominator`.
  The step-wide normalizer is a count summed over micro-batches and ranks, divided by the number of ranks
  (DDP averages gradients).
- The masked SFT NLL and the weighted combination.
- On-policy distillation: `opd_token_advantages` is the per-token reverse-KL advantage (teacher − student
  log-prob of the sampled token), clipped, masked, with its p01/p99 tails as metrics.
  `opd_loss` is the clipped surrogate with those advantages, aggregated like GRPO's.

One mean per loss term over the whole optimizer step:
- Before the passes, the trainer all-reduces one vector of counts (GRPO tokens or sequences, teacher-SFT tokens,
  self-SFT tokens, examples and groups).
- Every chunk's loss is divided by its term's step-wide normalizer (`losses.step_denominator`).
- Only `micro-token-mean` divides by its micro-batch's own `aggregation_denominator` and averages micro-batches.
- Self-SFT's normalizer weighs each example as one group of the step.

Chunks and masks:
- Each loss term is backpropagated on its own, in row chunks of `training.forward_chunk_size` sequences.
  Padding is trimmed per chunk.
  The gradient is the unchunked one, and only one chunk's activations are alive at a time.
- A rollout sample may carry an `action_mask` over its completion tokens: 1 = sampled by the policy,
  0 = inserted by the environment (a tool's `<result>` block, a feedback turn), None = all ones.
  `batching` makes it the batch's `completion_mask`.
  That one mask serves the surrogate, the KL, the importance weights, every count and normalizer, and the metrics.
  Where it is 0, old and reference log-probs are replaced by the current ones, so an unlikely environment token
  cannot overflow into NaN.
  Self-SFT labels are -100 on its zeros; environment tokens stay in the forward as context.
- The RL forwards (reference, old and current log-probs, and their backward) run with every dropout at p = 0
  (`dropout_disabled`); SFT passes keep the configured dropout.
- `shared_prompt.shared_prompt_forward` forwards each group's prompt once with a KV cache and the completions
  against it (policy, reference/old and local-teacher forwards).
  With gradients, the prompt forward is backpropagated once per group with the KV gradient its chunks accumulated,
  so the gradient equals the full-row one.

Rewards (`rewards`):
- Execution results and parsed responses become rewards through a name registry: `binary`, `fraction` (the share
  of the tests the prompt does not show) and `format`.
- `None` means unverifiable; a program on which the harness fails twice scores as a failure.
- The user's reward functions (`grpo.reward_funcs`) have TRL's signature `fn(prompts, completions, **columns)`.
  They load by `module:function` or `file.py:function` and are weighted by `grpo.reward_weights`.
  A user `None` adds nothing (TRL's convention); only the built-in correctness can make a sample unscorable.
- `shaping_reward` owns the multi-turn tool-use bonus (capped at `tool_reward_cap`) and the per-extra-turn cost.
  It enters `compute_rewards(shaping=)` as `Reward.shaping`, which the advantage centres but does not scale.

Multi-turn rollouts: `rollout_batches.BatchMaker` builds prompts with `get_unified_prompt(task, n, mode=)`.
The final answer (`text`) is scored by the unchanged reward functions on all tests.
The record's `action_mask` reaches the batch as its `completion_mask` unchanged.
Metrics add `multi_turn/*` (`scoring.multi_turn_metrics`), and `tokens_per_s` counts policy tokens only.
Multi-turn teacher traces are tokenized by `utils.sft_data.encode_conversation`.

SFT examples (`sft_sources`): teacher traces are tokenized once at start.
Those that do not fit `sft_max_length` are dropped and counted.
Self-SFT examples come from a `SuccessBuffer`: distinct successes that ended their turn, each replayed a bounded
number of times.

On-policy distillation (`teacher_logprobs`, `dual_source.opd_weight` > 0):
- The teacher's log-prob of every completion token of each rollout, teacher-forced on the same ids.
- From the served teacher: vLLM's `prompt_logprobs` on `/v1/completions` with a token-id prompt, over phase 2's
  `TeacherClient` transport and its retries.
- Or from a model + adapter loaded in the process.
- A teacher whose vocabulary or special tokens differ from the student's is refused.
- The trainer scores each rollout batch before planning it and keeps zero-spread groups.
  Each GRPO pass adds the OPD term on the same forward.

The curriculum (`curriculum`, `curriculum.enabled`, off by default):
- It keeps each training task's newest `window` correctness rewards from the rollouts already made.
  The reward is the one in use, so partial credit is spread as the advantage sees it.
- A pre-pass file of phase 4 samples may seed it.
- The draw walks the plain seeded epoch order from a cursor.
  It skips a task whose kept rewards are all equal, until that task has been skipped `revisit_after` times.
- Every process's groups are gathered, so every rank holds the same state and draws the same batch.
- Its state rides in each `rank-N.pt`.
- It is pure Python; the maker draws from it (`batch_indices`) and feeds it (`observe_curriculum`).
- With asynchronous rollouts the producer thread draws and observes (the main process's, under several
  processes); the checkpoint saves the state it had after the last trained batch
  (`rollout_sources.AsyncRollouts.curriculum_state`), sent to every rank.

The run around the loop:
- `launch` decides what a launch may be before anything loads.
  DeepSpeed and FSDP are refused: accelerate's DeepSpeed engine steps on every backward, and this trainer runs one
  per chunk and loss term.
  Each process takes `cpu_count // processes per machine` sandbox workers.
  `unshared_output_dir` checks at start that every process reads the token the main process wrote in the output
  folder: several machines need one shared folder at one path.
- `checkpointing`: save, load, prune, resolve `latest`, the final model; the last step is always checkpointed.
  Checkpoints keep their own format instead of `Accelerator.save_state`.
  `save_state` would write the whole model's state dict, the frozen base too (3.4 GB per checkpoint for
  Qwen3-1.7B); ours writes only the LoRA adapter, loadable by peft and vLLM as it is.
  Ours also carries the trainer's own state: step, rollout batches, and per process a `rank-N.pt` with its RNG
  states, teacher-sampling RNG and self-SFT buffer.
  A checkpoint folder appears by a single rename.
- `metric_sinks`: `metrics.jsonl` (its keys are listed there), accelerate's trackers, the per-process average.
  `make_accelerator` passes `training.logging_backends` as `log_with`.
  The trainer calls `init_trackers(tracker_project, …)`, `log` and `end_training`.
- `memory_model`: phase 3's peak GPU memory from the student's shapes and the config.
  Each term is counted from `benchmarks/bench_memory.py`'s CPU measurement.
  The GPU preflight reads it, and so does phase 3's check that a local OPD teacher does not share the trainer's
  GPU.
  It imports nothing of the project at module level.
- `plot`: `training_curves.png` (titled with the run name) and `evaluation_pass_at_k.png`.
- `export`: merges an adapter into a standalone folder and prints the `vllm serve` lines.
  Its `--max-lora-rank` is one vLLM accepts, from `rollouts.vllm_engine`'s one rank table.
- `run_summary`: the end of `make run`.
  It reads the files phases 2–4 wrote, prints whether the run was healthy, and exits 3 when a phase degraded.
"""
