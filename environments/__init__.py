"""Environments that answer a policy between its turns: the code environments over the sandbox pool (`code_env`).

A leaf package below every sampler and phase, so phase 2's multi-turn traces and multi-turn sampling both step
the same environments downward.
It may import only `sandbox/`, `utils/` and `config.py` (`tests/unit/project/test_layers.py` checks it).
It knows tasks, programs and the sandbox pool.
It does not know token ids: `rollouts.episodes` owns tokens and the action mask.

The mode and its limits are `multi_turn.*` (`config.MultiTurnConfig`); `utils.prompts` owns the tags and each
mode's instructions.

`code_env`, batched over the active samples of a round:
- `ToolEnvironment` stops the policy at `</program>` and takes the program after the first `<program>` of the turn,
  so a program may print the tag.
  It runs the program as a stdin job with one empty input, through the same `SandboxPool` as grading.
  The pool hides task files, and no test or expected value is ever in the job.
  It returns stdout, then the error line, cut at `result_max_bytes`, as a `<result>` block.
  Past `max_tool_calls` it answers without running.
- `FeedbackEnvironment` runs an answer on `visible_tests(task)` only.
  Those are `utils.shown_tests`' shown tests, the one definition the prompt and the rewards read too.
  So no observation can contain a hidden test, by construction.
  A failure becomes a user message (the test, expected vs got or the error, trimmed).
  After `max_turns` answers the sample ends, truncated.
  A task that shows no test only hears about code that does not compile (checked in the sandbox).
"""
