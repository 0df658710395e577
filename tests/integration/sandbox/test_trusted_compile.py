"""No model-written source is compiled or parsed in a trusted process: the response parser, the tool
environment and the feedback environment leave every compile to the sandbox (a 200 KB program holds
the compiler, and so the interpreter lock of the whole trainer, for seconds)."""

from __future__ import annotations

import builtins

import pytest

from environments.code_env import FeedbackEnvironment, Turn, run_tool_program
from tests.task_factory import stdin_task
from utils.thinking_extraction import extract_thinking_and_code_unified

MARK = "untrusted_marker_7f3a"


@pytest.fixture
def compiles(monkeypatch):
    """Every source this process compiles or parses (ast.parse goes through builtins.compile)."""
    seen: list[str] = []
    real = builtins.compile

    def spy(source, *args, **kwargs):
        seen.append(source if isinstance(source, str) else repr(source))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(builtins, "compile", spy)
    return seen


def _untrusted(seen: list[str]) -> list[str]:
    return [s[:80] for s in seen if MARK in s]


def test_the_response_parser_compiles_nothing(compiles):
    block = extract_thinking_and_code_unified(f"<think>x</think>\n```python\n{MARK} = 1\ndef f(:\n```")
    raw = extract_thinking_and_code_unified(f"<think>x</think>\nimport sys\n{MARK} = sys.argv\nprint({MARK})")
    assert block.code is not None and raw.code is not None and raw.code_source == "raw_answer"
    assert _untrusted(compiles) == []


def test_the_tool_environment_leaves_the_syntax_check_to_the_sandbox(compiles, pool):
    output, ok = run_tool_program(f"{MARK} = (\n", pool)
    assert not ok and "SyntaxError" in output
    output, ok = run_tool_program(f"{MARK} = 6 * 7\nprint({MARK})", pool)
    assert ok and output.strip() == "42"
    assert _untrusted(compiles) == []


def test_the_feedback_environment_without_a_shown_test_compiles_in_the_sandbox(compiles, pool):
    task = stdin_task("t/none", ("1\n", "2\n"), problem="Print n + 1.")  # the statement shows no example
    env = FeedbackEnvironment(pool, max_turns=2, num_visible_tests=1, feedback_max_chars=300)
    state = env.start(task)
    assert state.visible is None
    broken = env.step([state], [Turn(f"<think>x</think>\n```python\n{MARK} = (\n```", "stop")])[0]
    assert not broken.done and "does not compile" in (broken.observation or "")
    fine = env.step([state], [Turn(f"<think>x</think>\n```python\n{MARK} = 1\nprint(2)\n```", "stop")])[0]
    assert fine.done
    assert _untrusted(compiles) == []
