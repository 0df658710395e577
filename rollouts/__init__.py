"""Rollouts: how completions are sampled from a policy (settings, backends, model resolution).

A layer below `training/` and `evaluation/` (both use it) and above `sandbox/` and `utils/`.
It knows samplers, token ids and the sampling distribution.
It does not know rewards, losses or evaluation summaries.

The one sampling call:
- `groups.sample_groups(sampler, policy, prompts, n, step=, tasks=, episodes=, seed=)` is the one function that
  samples, for phase 3, phase 4, `evaluation.solve` and the preflight.
- It syncs the sampler, then samples one turn (single mode) or whole episodes (`episodes.run_episodes`), then
  releases the sampler.
- `groups.sample_from_synced` is the same without the sync: the asynchronous producer samples from the adapter
  its server already loaded.
- No caller branches on the mode.
- `seed` gives vLLM per-prompt request seeds (phase 4); the torch samplers draw from the process's seeded generator.

What every backend is (`protocol.Sampler`):
- `sync(policy, step)` points it at the policy: the trainer's model at an optimizer step, an evaluated model, a
  vLLM `LoRARequest`, or None for vLLM's base model.
- `sample(prompts, n, seed=)` draws n first turns per prompt.
- `continue_sequences(sequences, max_new_tokens, stop_strings)` continues token-id sequences by one turn each
  (a `Continuation`).
- `release()` gives back what sampling held (vLLM: prune old adapter folders, sleep).
- `policy_for(adapter, model=, name=)` is what `sync` takes to sample an adapter folder (None: the base model).
  The transformers samplers (and `SamplerBase`) return `model`, which carries the adapter already; phase 4's vLLM
  engine returns a `LoRARequest` named `name` (None for its base weights).
- `close()` ends a sampler's run: the server backend unloads its last adapter and closes its connections; the
  others hold nothing (`SamplerBase`'s no-op).
- `tests/unit/rollouts/test_sampler_protocol.py` holds every backend and scripted sampler to these methods.

Shared definitions:
- `sampling.SamplingSettings` is the one definition of the sampling distribution (temperature, top_p, top_k,
  min_p, repetition_penalty), built by `from_section(config.grpo | config.evaluation)`.
  It renders as `model.generate` arguments (`hf_generate_kwargs`, each overriding the checkpoint's
  generation_config) or as vLLM's (`vllm_kwargs`).
  Its defaults truncate nothing, because the trainer's log-probs are the full softmax at the temperature.
- `completion` owns `RolloutCompletion`, what every backend returns per sample, and the stop rules every backend
  shares (`stop_ids`).
  `completion_record` trusts the sampler's ids and cuts after a first end-of-turn.

The record (`completion.RolloutCompletion`):
- It is never a file row itself; phase 4 caches what it needs of it as a `CachedCompletion`
  (`tests/unit/utils/test_records.py`).
- Its fields: `text` (what the reward scores), `token_ids` (everything after the prompt, ending with the stop token
  when the model stopped), `prompt_ids`, `finish_reason`.
- Where a backend has them: `logprobs` (the sampler's, one per token id), `action_mask` (multi-turn: 0 = inserted
  by the environment; None = all policy tokens), `stop_string` (the kv sampler's `continue_ids`) and `multi_turn`.
- A guided sample (`groups.sample_from_prefixes`: phase 3's teacher-guided rollouts) starts its `token_ids` with a
  teacher's answer prefix, marked 0 in `action_mask` (log-prob 0.0 there), and counts it in `teacher_prefix_tokens`.
  Every backend makes one the same way: `continue_sequences` on prompt + prefix, with what the prefix leaves of the
  budget.
- `num_tokens`, `num_policy_tokens` and `num_turns` are derived.
- The multi-turn fields are one nested `MultiTurnInfo` (mode, turns, answers, transcript, truncated, tool_calls,
  tool_successes), None for a single-turn completion.
  So a consumer checks one field instead of guessing a default per key.
- The kv sampler's own continuations, before they become completions, are `kv_sampler.SampledRow`s.

The builder (`from_config`):
- `build_sampler(config, purpose=...)` is the one builder.
- `purpose="train"` gives phase 3's backend (`Config.rollout_backend`: `grpo.rollout_backend`, where `auto` means
  vLLM when the package is installed, else hf; `auto_backend_note` is the one line that says so).
  vLLM runs over `colocated_engine` with the training share of the GPU.
  hf puts `hf_prompts_per_call` prompts in one `generate` (phase 3 takes it from `memory_model.hf_prompts_per_call`).
- `purpose="eval"` gives the sampler of phase 4 and `evaluation.solve` (`Config.evaluation_backend`, i.e.
  `evaluation.backend`, where `rollout` means the training backend).
  vLLM gets an engine of its own from the same `colocated_engine`, with the evaluation share, sized for the
  evaluation prompts in the mode, reading the evaluated adapter itself.
- The preflight builds the training sampler too.
- Phase 4 asks the sampler's `policy_for` what each role (trained, model, baseline) samples with
  (`evaluation.roles.EvalRoles`).
- `episodes_for(config, pool)` builds the `Episodes` of a multi-turn mode (None in single mode).

The backends:
- `hf`: the transformers sampler.
  `generate_completions` pads left and stops on the end-of-turn, the tokenizer's EOS and every EOS of the
  generation config, as vLLM does.
  `HFRollout.sample` runs in calls of `batch_size` prompts × n.
  Its `continue_sequences` runs in calls of `sequences_per_call` rows.
  Each row is cut at its first end-of-turn id, stop string or own budget by `protocol.cut_continuation`.
- `kv_sampler`: the CPU sampler (`grpo.rollout_backend=kv`, the cpu preset's default; phase 4 too).
  `DecoderWeights` is a sampling copy of a Llama/Qwen2/Qwen3 decoder with q/k/v and gate/up fused.
  Each active LoRA adapter is merged into it (W + B·A·scale), rewritten in place by `refresh` before every
  rollout; inside `disable_adapter()` it is the base model.
  It runs in float32 or bfloat16 (`grpo.sampler_dtype`).
  `sample_token_ids` prefills each distinct prompt once and copies its KV cache to its G rows.
  It decodes every row in one batch with a short hand-written forward (grouped-query attention as two matmuls per
  layer, the residual stream in float32) and drops rows as they finish.
  `warp_logits` applies the `SamplingSettings` knobs in transformers' order and arithmetic (tested against
  transformers' processors).
  Every token comes with its float32 log-prob at the temperature.
  So the trainer applies the same truncated importance sampling to a bf16 copy as to vLLM (`training.batching`
  turns a completion's `logprobs` into `sampling_logps`).
  `continue_ids` continues token-id sequences with stop strings; `continue_sequences` calls it once per distinct
  budget.
  Why this and not `generate` with a static cache, CTranslate2 or ONNX Runtime GenAI:
  `benchmarks/bench_sampling.py` (docs/results.md).
  It refuses a model on a GPU or an architecture it does not implement, naming the backend to use instead.
- `vllm_colocated.VLLMRollout` samples from a colocated `vllm.LLM` (imported lazily).
  It hands the policy over every `grpo.gen_update_steps` steps (`sync`: wake, publish when due; `release`: prune,
  sleep), by `grpo.vllm_weight_sync` (`auto`: `merged` for a float32 student, else `adapter`).
  `merged`: W + scale × B @ A per adapted layer and its siblings as they are, so every fused layer of vLLM is
  whole (`merged_lora_weights`, the trainer's weights untouched), loaded into the in-process engine by vLLM's
  in-place `reload_weights` (`load_merged_weights`); the engine has no LoRA.
  `adapter`: an adapter folder and a new `LoRARequest`.
  Phase 4 syncs it to a fixed LoRA request or none.
  Its `continue_sequences` is one `LLM.generate` with one `SamplingParams` per sequence (`stop` +
  `include_stop_str_in_output`); `stop_reason` tells a stop string from a stop id.
- `vllm_server.VLLMServerRollout` (`grpo.rollout_backend=vllm_server`) samples from a running `vllm serve`.
  At each sync, the main process has the server load the new adapter folder under a name unique to the run and
  step, and unload the previous one (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`); every process waits.
  Then each process requests `/v1/completions` by prompt token ids, with `return_token_ids`, `logprobs=0` and
  every sampling knob explicit.
  A continuation is one request per sequence with the environment's stop strings; vLLM names a stop string in
  `stop_reason`.
  Its transport is phase 2's client, `clients.openai_compat.TeacherClient.post_json`, on one event loop the
  backend owns.
- `scripted.ScriptedBackend`: a policy that says what a script tells it (a whole `Sampler`), for the preflight's
  multi-turn check and the tests.

vLLM (`vllm_engine`): everything the project asks of vLLM, as plain Python tested on CPU.
- The engine arguments: `external_launcher` with the rank's `LOCAL_RANK` under several processes, a seed per rank,
  `max_lora_rank` rounded up to a rank `LoRAConfig` allows, `max_model_len` = longest prompt + budget, processed
  log-probs, sleep mode, and chunked prefill off on vLLM's CPU platform for phase 4's seeded prompts.
- `AdapterHandoff`: the main process saves `step-N` in the training dtype, a barrier follows, then older folders
  are deleted.
  Each sync gets a new LoRA name and id, because vLLM's prefix cache keys LoRA blocks by name.
- vLLM's token ids are kept as sampled (it keeps the stop token).
- `tests/fake_vllm.py` behaves as the pinned vLLM's source says; `tests/unit/rollouts/test_vllm_contract.py` checks
  the arguments against the real classes; `tests/vllm_cpu/` runs the real engine's CPU build.

Multi-turn episodes (`episodes.run_episodes`, the one rollout loop; the environments are `environments.code_env`):
- `sample_groups` with an `Episodes` (environment, mode, per-turn and total budgets) runs G episodes per task,
  grouped per prompt.
- The mode's environment runs on the caller's sandbox pool (phase 4 builds its `Episodes` once its pool runs).
- Each round, every active sample's ids go to the sampler's `continue_sequences` in one call.
  The policy's new ids are appended with mask 1.
- The environment's observation is encoded once and appended with mask 0.
  Tool mode: plain text in the same assistant turn.
  Feedback mode: `utils.sft_data.environment_turn_ids`, the template's own framing between an assistant end-of-turn
  and the next assistant header, rendered from the template with placeholders.
  Teacher-SFT's `encode_conversation` frames environment turns with the same function, so a multi-turn trace
  trains on the ids sampling produced.
  Tests check that both framings agree on a 3-turn exchange, and that `encode_conversation` masks a `<result>`
  block with the line breaks `format_result` puts around it.
  Inserted text is encoded with `split_special_tokens=True`.
- Ids are never re-encoded, so the trainer scores exactly what the policy saw.
- Limits: `max_new_tokens` per turn (`grpo.max_new_tokens` in phase 3; phase 4 and `solve` use their own) and
  `multi_turn.max_total_tokens` after the prompt.
  An observation that would leave no room ends the sample, truncated.
- The record is a `RolloutCompletion`.
  `text` is what the reward scores: the whole generation in tool mode, the last answer in feedback mode.
  `token_ids` is everything after the prompt.
  It carries `action_mask`, `logprobs` from vLLM and kv (0.0 at inserted positions), and its `MultiTurnInfo`.

`models` resolves what a `--model_path` means (`resolve_model`: an adapter folder, a `checkpoint-*` folder or a
base model, into a base name and an adapter; `default_model_path`; `adapter_rank`).
Phase 4, `evaluation.solve` and `training.export` use it.
"""
