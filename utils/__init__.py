"""The data and format contract shared by every phase.

Despite the generic name, this package is not a grab-bag: it holds exactly the pieces that all
phases must agree on, so that they are defined once.

- `prompts`: the one prompt format (system prompt, user prompt, tag and fence constants).
- `thinking_extraction`: raw model output -> (thinking, answer) -> code, with well-formedness flags.
- `code_parser`: fenced-block selection, syntax validation, function-name discovery.
- `sft_data`: prompt + response -> token ids and labels masked on the prompt (teacher- and self-SFT).
- `dataset_loader`: the task record schema and JSONL reading/writing with file:line errors.
- `student_model`: loading the student (hub, local folder or embedded GGUF), LoRA, generation.

Nothing here imports from `synthesis/`, `training/` or `evaluation/`.
"""
