"""Canned answers, written once for every test that scripts a model or a teacher: the fake teacher
server (tests/fake_openai_server.py), the scripted rollouts (tests/trainer_helpers.py) and the fake
vLLM engines and servers. The preflight's parser cases live in test_all.CANNED_RESPONSES (it ships
without tests/)."""

from __future__ import annotations

from typing import Any

TEACHER_THINKING = "I will solve it step by step."  # what the fake teacher thinks, in every shape
WRONG_CODE = "def nothing():\n    return 0"  # a program that passes no fixture task

# The answer shapes a teacher server produces (`teacher_message`); the fake teacher also has malformed
# ones (empty_choices, no_message, garbage, error400), which carry no message at all.
SHAPES = ("inline", "reasoning", "reasoning_content", "template_opened", "truncated", "no_thinking")


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def student_answer(code: str, thinking: str = "plan") -> str:
    """A well-formed student completion: closed thinking, then one python block."""
    return f"<think>\n{thinking}\n</think>\n\n{fenced(code)}"


def teacher_message(code: str, shape: str) -> tuple[dict[str, Any], str]:
    """The chat message and finish_reason a teacher server answers with in `shape` (one of SHAPES)."""
    message: dict[str, Any] = {"role": "assistant"}
    if shape == "inline":
        message["content"] = f"<think>\n{TEACHER_THINKING}\n</think>\n\n{fenced(code)}"
    elif shape == "reasoning":
        message.update(content=fenced(code), reasoning=TEACHER_THINKING)
    elif shape == "reasoning_content":
        message.update(content=fenced(code), reasoning_content=TEACHER_THINKING)
    elif shape == "template_opened":
        message["content"] = f"{TEACHER_THINKING}\n</think>\n\n{fenced(code)}"
    elif shape == "truncated":
        message["content"] = f"<think>\n{TEACHER_THINKING[:-1]}, first"
        return message, "length"
    elif shape == "no_thinking":
        message["content"] = fenced(code)
    else:
        raise ValueError(f"unknown answer shape {shape!r}; one of {', '.join(SHAPES)}")
    return message, "stop"


def half_right_responder(tokenizer: Any, tasks: list) -> Any:
    """A fake vLLM responder (prompt_ids, index, rng) -> (text, token ids): even samples answer the task's
    reference solution, odd ones WRONG_CODE, so rewards differ within each group."""

    def responder(prompt_ids: list[int], index: int, rng: Any) -> tuple[str, list[int]]:
        prompt = tokenizer.decode(prompt_ids)
        task = next(t for t in tasks if t.problem.strip() in prompt)
        text = student_answer(task.reference_solutions[0] if index % 2 == 0 else WRONG_CODE)
        return text, tokenizer(text, add_special_tokens=False)["input_ids"]

    return responder
