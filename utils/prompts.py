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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CODE_FENCE = "```"
PYTHON_FENCE = CODE_FENCE + "python"

SYSTEM_PROMPT_UNIFIED = (
    "You are an expert Python programmer. For every problem you first reason step by step "
    f"inside {THINK_OPEN} and {THINK_CLOSE} tags, then give the complete solution as a single "
    "Python code block in markdown."
)

FORMAT_EXAMPLE = (
    f"{THINK_OPEN}\nyour step-by-step reasoning...\n{THINK_CLOSE}\n\n{PYTHON_FENCE}\n# your code\n{CODE_FENCE}"
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
        shown = list(_field(task, "tests", ()) or ())[: max(num_visible_tests, 0)]
        if shown:
            lines.append("Your code should pass tests like:")
            lines.extend(shown)
        return "\n".join(lines)
    if test_type == "stdin":
        return (
            "Your program must read its input from standard input and print the answer to "
            "standard output."
        )
    if test_type == "call":
        starter = (_field(task, "starter_code", "") or "").strip("\n")
        where = "a method of class `Solution`" if "class Solution" in starter else "a function"
        text = f"Your solution will be called as {where} named `{fn_name}`; do not read from standard input."
        if starter:
            text += f"\nUse this starter code:\n{PYTHON_FENCE}\n{starter}\n{CODE_FENCE}"
        return text
    return ""


def get_unified_prompt(task: Any, num_visible_tests: int = 1) -> str:
    """The user message for a task: problem, task-specific requirements, the answer format.

    `task` is a `utils.dataset_loader.Task`, a task dict, or a plain problem string.
    `num_visible_tests` is how many MBPP asserts are shown (config: prompt.num_visible_tests);
    showing more lets a policy hard-code the visible outputs.
    """
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
