"""Phase 4's library and the metrics: pass@k, intervals, the evaluation sets, the one-problem `solve`.

The package knows how samples are judged and summarized.
It runs programs only through `sandbox.executor` and samples only through `rollouts/`.
It does not know training; `training/` does not import it either.

The modules:
- `pass_at_k`: the pure unbiased estimator.
- `evaluate`: phase 4's library.
  Sampling is cached and resumable, through the trainer's rollout classes.
  Every sample runs in the sandbox.
  The summary holds pass@k overall, per source and per difficulty, format and status statistics, and the baseline
  delta.
- `bootstrap`: the pure percentile bootstrap over tasks.
  Each pass@k gets a 95% interval from resampling tasks, each task with its own pass@k estimate from its n samples.
  The trained − baseline delta gets a *paired* interval: the same resampled tasks for both models, so agreement
  between the models narrows it.
  `evaluation.bootstrap_resamples` and `bootstrap_seed` make it reproducible.
- `roles`: `EvalRoles`, what each evaluated role (trained, a base model alone, the baseline with the adapter
  switched off) samples with from the one evaluation sampler, and how its work is batched per backend.
- `run_record`: phase 4's run as a whole (it reads the whole config): the completion cache key, the results
  record (`outputs/evaluation_results.json`) and the report printed from it.
- `eval_sets`: picks the tasks (`val`, `humaneval`, `mbpp_test` = MBPP ids 11–510, `apps_test`, or a file) and the
  label every results record carries.
  HumanEval prompts show no test (its docstrings carry the examples, as in the published protocol).
  The other sets show the configured `prompt.num_visible_tests`.
- `solve`: the one-problem companion for people.
- `power`: the pure sizing of a paired comparison (`paired_design`).
  From two models' pass counts per problem it measures the spread of the per-problem difference.
  It splits that spread into within-problem sampling variance and between-problem variance.
  It says how many problems at m samples each give a paired interval of a chosen half-width.
  `experiments/learning_heldout` reports it for full − base.
- `seed_contrasts`: the pure analysis of arms trained with several seeds.
  It gives per-seed paired differences of per-problem scores.
  The primary interval is each contrast's own paired t over seeds (Student's t in closed form, no scipy).
  The task term (seed + task SE) is reported beside it.
  Secondary checks: the additive arm + seed model on the run means (residual variance pooled over the trained arms,
  with its largest/smallest seed-SD ratio) and a crossed bootstrap (seeds resampled, one problem draw shared by the
  drawn seeds, paired across arms).

The completion cache (`evaluate`; its key `run_record.completion_cache_key`) is keyed by content:
- `content_digest` hashes every file of the base model folder (embedded: its materialized folder; hub: the cached
  snapshot) and of the adapter folder (weights, config, tokenizer, chat template), plus the decoding settings.
- Per-file hashes are memoized by path, size, mtime and inode in `eval_cache/file_hashes.json`, so a large model is
  read once.
- Each cached record carries a digest of the chat messages it answered, so an edited task is regenerated.

Phase 4's two records (`evaluate`):
- A `CachedCompletion` is one line of the completion cache: task_id, sample_idx, completion, num_tokens,
  finish_reason, prompt_sha256.
  In a multi-turn mode it adds the rollout's mode, num_turns, num_policy_tokens, answers, tool_calls,
  tool_successes, truncated, transcript and turns.
- An `EvalSample` is one judged sample, a line of `eval_samples.jsonl`.
  Its keys: the model role first, then task_id, source, difficulty, sample_idx, completion, num_tokens,
  finish_reason; the parse (thinking, code, think_closed, has_code, syntax_ok); the verdict (passed, status,
  tests_passed, tests_total, pass_fraction, error).
  In a multi-turn mode it adds mode, num_turns, tool_calls, tool_successes, truncated and answers_passed.
- Multi-turn keys are written only when set.
- `read_cache`, `read_samples` and `write_samples` are their readers and writer.

Multi-turn evaluation: phase 4 judges every earlier answer of a sample on all tests (`answers_passed`).
Its summary adds `multi_turn`, from `evaluate.pass_rate_by_turn` and `evaluate.tool_statistics` (statistics of its
own record).
"""
