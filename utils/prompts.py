"""The one prompt contract: every phase that talks to a model builds its prompt here.

Phase 2 (teacher), phase 3 (student rollouts and SFT prompts), phase 4 (evaluation) and the
preflight call `get_unified_prompt` and `build_chat_messages`; nothing else writes prompt text.
The tags and fences of the expected answer are defined once below and imported by the parsers,
so the format asked for and the format parsed cannot drift apart.

Expected answer:

    <think>
    step-by-step reasoning
    </think>

    ```python
    code
    ```

Multi-turn modes (`multi_turn.mode`, see `MODES`) append their instructions and a one-shot example
of their protocol to the same prompt; the single-turn prompt is unchanged by them.

- `tool`: inside the thinking the model may run a program: it writes `<program>` ... `</program>`,
  generation stops at the closing tag, the harness runs the program in the sandbox and appends its
  output as `<result>` ... `</result>`, and the model continues.
- `feedback`: after an answer, the tests shown in the prompt are run; a failing one comes back as a
  user message and the model answers again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from utils.shown_tests import printed_asserts

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CODE_FENCE = "```"
PYTHON_FENCE = CODE_FENCE + "python"
PROGRAM_OPEN = "<program>"
PROGRAM_CLOSE = "</program>"
RESULT_OPEN = "<result>"
RESULT_CLOSE = "</result>"

MODES = ("single", "tool", "feedback")

SYSTEM_PROMPT_UNIFIED = (
    "You are an expert Python programmer. For every problem you first reason step by step "
    f"inside {THINK_OPEN} and {THINK_CLOSE} tags, then give the complete solution as a single "
    "Python code block in markdown."
)

# The format in words, with no code block of its own: a fenced placeholder (`# your code`) in the prompt is
# copied after the answer by small students, and a block a student can copy is a block the grader may read.
FORMAT_EXAMPLE = (
    f"first your step-by-step reasoning between {THINK_OPEN} and {THINK_CLOSE}, then the complete solution in one "
    f"markdown code block that opens with {PYTHON_FENCE} and closes with {CODE_FENCE}, and nothing after it."
)

_INSTRUCTION = (
    f"Think through the solution step by step inside {THINK_OPEN} tags, then provide the Python "
    "code in a single markdown code block."
)


def _field(task: Any, name: str, default: Any = None) -> Any:
    """Read a field from a Task, a task dict, or anything with the same attribute names."""
    if isinstance(task, Mapping):
        return task.get(name, default)
    return getattr(task, name, default)


def _task_requirements(task: Any, num_visible_tests: int) -> str:
    """The task-style-specific sentence(s): function name, I/O convention or starter code."""
    test_type = _field(task, "test_type")
    fn_name = _field(task, "fn_name")
    if test_type == "assert":
        lines = []
        if fn_name:
            lines.append(f"Write a Python function named `{fn_name}`.")
        shown = printed_asserts(_field(task, "tests", ()) or (), num_visible_tests)
        if shown:
            lines.append("Your code should pass tests like:")
            lines.extend(shown)
        return "\n".join(lines)
    if test_type == "stdin":
        return "Your program must read its input from standard input and print the answer to standard output."
    if test_type == "call":
        starter = (_field(task, "starter_code", "") or "").strip("\n")
        where = "a method of class `Solution`" if "class Solution" in starter else "a function"
        text = f"Your solution will be called as {where} named `{fn_name}`; do not read from standard input."
        if starter:
            text += f"\nUse this starter code:\n{PYTHON_FENCE}\n{starter}\n{CODE_FENCE}"
        return text
    return ""


# The one-shot example of the tool protocol (seed 000's system prompt carries one example of the
# same shape). It is a real exchange: the result block is what the sandbox prints for this program.
TOOL_EXAMPLE = (
    f"{THINK_OPEN}\nThe sum 1 + 2 + ... + n should be n * (n + 1) // 2. Let me check it for n = 4.\n"
    f"{PROGRAM_OPEN}\nprint(sum(range(1, 5)), 4 * 5 // 2)\n{PROGRAM_CLOSE}\n"
    f"{RESULT_OPEN}\n10 10\n{RESULT_CLOSE}\n"
    f"Both give 10, so the formula is right.\n{THINK_CLOSE}\n\n"
    f"{PYTHON_FENCE}\ndef sum_to(n):\n    return n * (n + 1) // 2\n{CODE_FENCE}"
)

_TOOL_INSTRUCTION = (
    "While thinking you may run Python code to check an idea: write a complete program between "
    f"{PROGRAM_OPEN} and {PROGRAM_CLOSE} and stop. Its printed output (or its error) is then given to you "
    f"between {RESULT_OPEN} and {RESULT_CLOSE}, and you continue. The program reads no input and cannot "
    "see the tests. Your final answer is still the single Python code block after the thinking. "
    "Example of an answer that runs a program:\n" + TOOL_EXAMPLE
)

_FEEDBACK_INSTRUCTION = (
    "After your answer, your code is run on the tests shown in the problem. If one fails, you are told "
    "which one and what happened, and you answer again in the same format with the corrected code."
)


def mode_instruction(mode: str) -> str:
    """The text a multi-turn mode adds to the prompt ('' for single)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; the modes are {', '.join(MODES)}")
    return {"single": "", "tool": _TOOL_INSTRUCTION, "feedback": _FEEDBACK_INSTRUCTION}[mode]


def get_unified_prompt(task: Any, num_visible_tests: int = 1, mode: str = "single") -> str:
    """The user message for a task: problem, task-specific requirements, the answer format, and
    the instructions of a multi-turn `mode` (config: multi_turn.mode; `single` adds nothing).

    `task` is a `utils.dataset_loader.Task`, a task dict, or a plain problem string.
    `num_visible_tests` is how many MBPP asserts are shown (config: prompt.num_visible_tests);
    showing more lets a policy hard-code the visible outputs.
    """
    extra = mode_instruction(mode)
    if isinstance(task, str):
        problem, requirements = task.strip(), ""
    else:
        problem = (_field(task, "problem", "") or "").strip()
        requirements = _task_requirements(task, num_visible_tests)
    parts = ["Solve the following problem:", problem]
    if requirements:
        parts.append(requirements)
    parts.append(_INSTRUCTION)
    parts.append("Format:\n" + FORMAT_EXAMPLE)
    if extra:
        parts.append(extra)
    return "\n\n".join(parts)


def build_chat_messages(user_prompt: str, system_prompt: str | None = SYSTEM_PROMPT_UNIFIED) -> list[dict[str, str]]:
    """OpenAI/transformers chat messages for a user prompt, with the unified system prompt.

    The system prompt is always sent explicitly: some chat templates (SmolLM2's) insert their
    own default system prompt when none is given.
    """
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": user_prompt})
    return messages
