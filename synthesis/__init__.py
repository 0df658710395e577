"""Phase 2: trace generation (tasks, parsing, verification) over the teacher client in `clients`.

It knows tasks, prompts, parsing, verification in the sandbox and resumption.
It does not know HTTP (`clients.openai_compat`) or training: phase 3 receives `TeacherTrace`s from it.

- `generate_traces`: the task logic.
  Unified prompt → client → extraction → sandbox verification → one appended, flushed JSONL record per sample.
  It resumes under a file lock with torn-line repair (its module docstring says how).
- `reference_traces`: phase 2's other teacher (`teacher.source=references`, `--teacher references`).
  A task's own reference solutions (CRLF normalized, up to `num_samples_per_problem`) run against its tests in the
  sandbox like a teacher answer.
  The failing ones are dropped and counted.
  The passing ones are written as `TeacherTrace`s: `teacher_model` "references", with a one-sentence factual
  thinking block or none (`teacher.reference_thinking`).
  It resumes, and refuses to mix into a model teacher's file.
- `scripts/serve_local_teacher.py` serves the embedded model on the batched kv-cache sampler (`transformers
  serve` for a model that sampler does not implement), the CPU stand-in for `vllm serve`.

Multi-turn traces: one function per mode, both stepping the same `environments.code_env` as sampling does.
- `feedback_exchange` speaks chat messages; the failing shown test comes back as a user turn.
- `tool_exchange` continues the teacher's own text through `TeacherClient.complete_text` (`/v1/completions`,
  `stop=["</program>"]`).
  The chat prompt is rendered here by `TextPrompter`, with the teacher's tokenizer from `teacher.tokenizer`.
  `TextPrompter` also counts the sample's token budget.
  It breaks special-token strings a program printed before they reach a text prompt.
- A chat request cannot do tool mode: it only continues a finished assistant message, and Qwen3's template puts an
  empty think block before a final one.

The trace record (`data/teacher_traces.jsonl`): one line per `generate_traces.TeacherTrace`.
- It is frozen; its field order is the file's key order; `to_row` and `from_row` write and read it.
- Keys: `task_id`, `sample_idx`, `prompt` (the unified user prompt), `teacher_model`, `timestamp`, `latency`,
  `finish_reason`, `usage`, `previous_errors` (the API errors of earlier attempts at this sample), `thinking`,
  `code`, `response` (raw content), `reasoning` (the server's separate field, if any), `syntax_ok`, `passed`,
  `pass_fraction`, `tests_passed`, `tests_total`, `status` (sandbox status or `api_error`), `error`.
- In a multi-turn mode also `mode`, `num_turns` and `turns`.
  `turns` are `TraceTurn`s: each teacher turn, its reasoning, what the environment answered, and whether a limit
  cut it.
  The environment's answer is the user message in feedback mode, and in tool mode the `<result>` block appended in
  the same message.
  In tool mode `response` is the whole assistant message, results included.
- A row may also carry the exchange itself as chat `messages`.
- The multi-turn keys are written only when set, so single-turn rows keep their bytes
  (`tests/unit/utils/test_records.py` checks golden rows).
- A row from an older writer reads with defaults; unknown keys are ignored.
- Teacher-SFT trains on a multi-turn trace as the whole exchange (`TeacherTrace.conversation()`), on the teacher's
  own tokens only.
  Feedback: each answer, then its feedback as a user turn.
  Tool: one assistant message whose `<result>` blocks are masked.
- A sample may have several records (its failed attempts, then an answer); the newest one counts.
- `generate_traces` owns the format.
  `latest_records` is its one reader (phase 2 resumes from it).
  `load_teacher_examples` hands phase 3 `TeacherTrace`s, so the trainer never parses the file.
- A rerun asks again for every sample whose newest record is an `api_error`.
  Phase 2 exits 3 when any request of a run failed.
- Resuming with other sampling settings than `teacher_traces.config.json` records is refused.
  `--overwrite` truncates the file only at the first good answer.
"""
