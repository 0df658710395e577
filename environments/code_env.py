"""The two multi-turn environments: what happens between the policy's turns.

An environment sees each sample's latest policy turn (its text and why it stopped) and answers with
a `Step`: stop here (done, maybe truncated), or an observation to append before the policy goes on.
It never sees or produces token ids; `rollouts.episodes` owns tokens and the action mask.

- `ToolEnvironment` (`multi_turn.mode=tool`): the policy stops at `</program>`; the program between
  the tags runs in the sandbox exactly as a graded program does (same pool, isolation and limits),
  with an empty stdin and no test: it sees no task test or task file (the pool hides them). Its
  stdout and then its error line come back, cut at `result_max_bytes`, as a `<result>` block.
- `FeedbackEnvironment` (`multi_turn.mode=feedback`): after an answer, the program runs on the tests
  the prompt shows (`visible_tests`) and never on another: a failure comes back as a user message
  with that test, what was expected and what happened.

Both are batched: `step` gets every active sample of a round, so the sandbox runs their programs in
parallel on the pool's workers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sandbox.executor import MAX_CODE_BYTES, SandboxError, SandboxPool, compile_error, execute_program
from utils.dataset_loader import Task
from utils.prompts import PROGRAM_CLOSE, PROGRAM_OPEN, RESULT_CLOSE, RESULT_OPEN
from utils.shown_tests import shown_tests_task
from utils.thinking_extraction import extract_thinking_and_code_unified


@dataclass
class Turn:
    """One policy turn as the environment sees it."""

    text: str  # the decoded continuation
    finish_reason: str  # "stop" (end of turn), "stop_string" (a stop string of the environment), "length"


@dataclass
class Step:
    """The environment's answer to one turn."""

    done: bool
    truncated: bool = False  # ended by a limit, not by the policy
    observation: str | None = None  # appended before the next turn
    as_user_message: bool = False  # feedback: a user turn of the chat template; tool: raw text in the same turn
    info: dict = field(default_factory=dict)  # what happened (tool call status, test verdict), for statistics


@dataclass
class EpisodeState:
    """What an environment remembers of one sample between turns."""

    task: Task
    answers: int = 0  # feedback: answers given
    tool_calls: int = 0  # tool: programs asked for
    tool_successes: int = 0  # tool: programs that ran without an error
    visible: Task | None = None  # feedback: the shown tests, computed once


def trim_bytes(text: str, limit: int) -> str:
    """At most `limit` UTF-8 bytes of `text` (cut at a character boundary), with a marker when cut."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore") + f"\n... (cut at {limit} bytes)"


def trim_chars(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 14, 0)] + "\n... (cut)"


# ------------------------------------------------------------------------------------------ tool


_FENCED = re.compile(r"^\s*```[A-Za-z0-9_+-]*\n(.*?)\n?```\s*$", re.DOTALL)


def extract_program(turn_text: str) -> str | None:
    """The program of a turn that stopped at `</program>`: the text after the first `<program>` that
    follows the previous closing tag, up to the last one (so a program may print the tag itself; a
    fenced block inside the tags is unwrapped). None without an opening tag."""
    end = turn_text.rfind(PROGRAM_CLOSE)
    if end < 0:
        return None
    previous = turn_text.rfind(PROGRAM_CLOSE, 0, end)
    start = turn_text.find(PROGRAM_OPEN, previous + len(PROGRAM_CLOSE) if previous >= 0 else 0, end)
    if start < 0:
        return None
    body = turn_text[start + len(PROGRAM_OPEN) : end]
    fenced = _FENCED.match(body)
    if fenced:
        body = fenced.group(1)
    return body.strip("\n")


def format_result(output: str, limit: int) -> str:
    """The observation appended after `</program>`: a `<result>` block on its own lines."""
    return f"\n{RESULT_OPEN}\n{trim_bytes(output, limit).rstrip(chr(10))}\n{RESULT_CLOSE}\n"


def run_tool_program(code: str | None, pool: SandboxPool) -> tuple[str, bool]:
    """Run one program in the sandbox with an empty stdin; returns (what it printed, then its error
    line; ran without error). The job is a stdin test with no expected output: nothing of a task
    reaches the program process, and the output is never judged."""
    if code is None:
        return f"no {PROGRAM_OPEN} tag opened this program; nothing was run", False
    if not code.strip():
        return "empty program; nothing was run", False
    if len(code.encode("utf-8", errors="replace")) > MAX_CODE_BYTES:
        return f"program longer than {MAX_CODE_BYTES} bytes; nothing was run", False
    job = {  # compiled only in the program's own process: a compile error comes back as its report
        "mode": "stdin",
        "inputs": [""],
        "code": code,
        "id": None,
        "limits": pool.limits.job_limits(1),
    }
    try:
        raw = pool.run(job)
    except SandboxError as exc:
        return f"the sandbox failed ({exc}); the program may be fine", False
    tests = raw.get("tests") if isinstance(raw, dict) else None
    if raw.get("sandbox_error") or not isinstance(tests, list) or len(tests) != 1 or not isinstance(tests[0], dict):
        return "the sandbox failed; the program may be fine", False
    test = tests[0]
    status = test.get("status")
    raw_stdout, raw_error = test.get("stdout"), test.get("error")
    stdout = raw_stdout if isinstance(raw_stdout, str) else ""
    error = raw_error if isinstance(raw_error, str) else None
    if status == "done":
        failed = bool(test.get("exit_code")) or bool(error)
        return stdout + (("\n" if stdout and not stdout.endswith("\n") else "") + error if error else ""), not failed
    if status == "error":  # it did not compile (the only error reported before a stdin program runs)
        return f"{test.get('type') or 'Error'}: {error or ''}", False
    if status == "timeout":
        return stdout + "TimeoutError: the program ran longer than the time limit", False
    if status == "output_limit":
        return "the program's output exceeded the output limit", False
    if status == "memory_limit":
        return "MemoryError: the program exceeded the memory limit", False
    return f"the program crashed ({error or status})", False


class ToolEnvironment:
    """`<program>` blocks run in the sandbox during the turn; see the module docstring."""

    stop_strings: tuple[str, ...] = (PROGRAM_CLOSE,)

    def __init__(self, pool: SandboxPool, max_tool_calls: int, result_max_bytes: int) -> None:
        self.pool = pool
        self.max_tool_calls, self.result_max_bytes = max_tool_calls, result_max_bytes

    def start(self, task: Task) -> EpisodeState:
        return EpisodeState(task=task)

    def step(self, states: Sequence[EpisodeState], turns: Sequence[Turn]) -> list[Step]:
        steps: list[Step | None] = [None] * len(turns)
        to_run = []
        for i, (state, turn) in enumerate(zip(states, turns, strict=True)):
            if turn.finish_reason == "stop":
                steps[i] = Step(done=True)
            elif turn.finish_reason != "stop_string":
                steps[i] = Step(done=True, truncated=True)
            elif state.tool_calls >= self.max_tool_calls:
                state.tool_calls += 1
                steps[i] = Step(
                    False,
                    observation=format_result(
                        f"not run: the limit of {self.max_tool_calls} programs per answer is reached; give your final "
                        "answer now",
                        self.result_max_bytes,
                    ),
                    info={"tool_status": "over_limit"},
                )
            else:
                state.tool_calls += 1
                to_run.append(i)
        with ThreadPoolExecutor(max_workers=max(1, min(len(to_run), self.pool.size))) as executor:
            outputs = list(executor.map(lambda i: run_tool_program(extract_program(turns[i].text), self.pool), to_run))
        for i, (output, ok) in zip(to_run, outputs, strict=True):
            states[i].tool_successes += ok
            steps[i] = Step(
                False,
                observation=format_result(output, self.result_max_bytes),
                info={"tool_status": "ok" if ok else "error"},
            )
        return steps  # type: ignore[return-value]


# -------------------------------------------------------------------------------------- feedback


def visible_tests(task: Task, num_visible_tests: int) -> Task | None:
    """The task restricted to the tests its prompt shows, or None when it shows none
    (`utils.shown_tests`: the one definition of a shown test, by content). A test that is not
    shown is never run here, so no observation can reveal one."""
    return shown_tests_task(task, num_visible_tests)


def describe_test(task: Task, index: int) -> str:
    """A shown test as the feedback message names it."""
    test = task.tests[index]
    if task.test_type == "assert":
        return f"Test: {test}"
    if task.test_type == "stdin":
        return f"Input:\n{test['input'].rstrip()}\nExpected output:\n{test['output'].rstrip()}"
    args = ", ".join(json.dumps(a) for a in test["input"])
    return f"Call: {task.fn_name}({args})\nExpected return value: {json.dumps(test['output'])}"


_STATUS_WORDS = {
    "wrong_answer": "wrong answer",
    "runtime_error": "error",
    "timeout": "time limit exceeded",
    "memory_limit": "memory limit exceeded",
    "output_limit": "output limit exceeded",
    "syntax_error": "syntax error",
}


def feedback_message(task: Task, result: Any, limit: int) -> str:
    """The user message after a failed answer: the first failing shown test and what happened."""
    if result.status == "no_code":
        text = "No Python code block was found in your answer."
    elif result.status == "syntax_error":
        text = f"Your code does not compile: {result.error}"
    else:
        index = next(i for i, o in enumerate(result.test_outcomes) if not o.passed)
        outcome = result.test_outcomes[index]
        what = _STATUS_WORDS.get(outcome.status, outcome.status.replace("_", " "))
        text = f"Your code failed a test shown in the problem.\n{describe_test(task, index)}\nResult: {what}" + (
            f": {outcome.error}" if outcome.error else ""
        )
    return trim_chars(text, limit - 60) + "\nCorrect the code and answer again in the same format."


class FeedbackEnvironment:
    """After each answer, the shown tests; a failure is a user turn. See the module docstring."""

    stop_strings: tuple[str, ...] = ()

    def __init__(
        self,
        pool: SandboxPool,
        max_turns: int,
        num_visible_tests: int,
        feedback_max_chars: int,
    ) -> None:
        self.pool = pool
        self.max_turns, self.num_visible_tests, self.feedback_max_chars = (
            max_turns,
            num_visible_tests,
            feedback_max_chars,
        )

    def start(self, task: Task) -> EpisodeState:
        return EpisodeState(task=task, visible=visible_tests(task, self.num_visible_tests))

    def _check(self, state: EpisodeState, turn: Turn) -> Step:
        code = extract_thinking_and_code_unified(turn.text, entry_point=state.task.fn_name).code
        if state.visible is None:  # nothing shown to test against: only a program that does not compile is told
            try:  # compiled in the sandbox, never here
                error = compile_error(code, self.pool) if code else None
            except SandboxError:  # the harness, not the program: no feedback to give
                error = None
            if error is None:
                return Step(done=True, info={"visible_passed": None})
            return Step(
                False,
                observation=trim_chars(
                    f"Your code does not compile: {error}\nCorrect the code and answer again in the same format.",
                    self.feedback_max_chars,
                ),
                as_user_message=True,
                info={"visible_passed": False},
            )
        result = execute_program(code, state.visible, pool=self.pool)
        if result.passed:
            return Step(done=True, info={"visible_passed": True})
        if result.status == "sandbox_error":  # the harness, not the program: no feedback to give
            return Step(done=True, info={"visible_passed": None})
        return Step(
            False,
            observation=feedback_message(state.visible, result, self.feedback_max_chars),
            as_user_message=True,
            info={"visible_passed": False},
        )

    def step(self, states: Sequence[EpisodeState], turns: Sequence[Turn]) -> list[Step]:
        for state in states:
            state.answers += 1
        with ThreadPoolExecutor(max_workers=max(1, min(len(turns), self.pool.size))) as executor:
            steps = list(executor.map(self._one, states, turns))
        return steps

    def _one(self, state: EpisodeState, turn: Turn) -> Step:
        if turn.finish_reason != "stop":  # cut by the token limit: no complete answer to test
            return Step(done=True, truncated=True)
        step = self._check(state, turn)
        if not step.done and state.answers >= self.max_turns:  # still failing, and no answer left
            return Step(done=True, truncated=True, info=step.info)
        return step


def make_environment(
    mode: str, pool: SandboxPool, multi_turn: Any, num_visible_tests: int
) -> ToolEnvironment | FeedbackEnvironment:
    """The environment of `multi_turn.mode` (a config.MultiTurnConfig section)."""
    if mode == "tool":
        return ToolEnvironment(pool, multi_turn.max_tool_calls, multi_turn.result_max_bytes)
    if mode == "feedback":
        return FeedbackEnvironment(pool, multi_turn.max_turns, num_visible_tests, multi_turn.feedback_max_chars)
    raise ValueError(f"no environment for mode {mode!r} (tool or feedback)")


__all__ = [
    "EpisodeState",
    "FeedbackEnvironment",
    "Step",
    "ToolEnvironment",
    "Turn",
    "extract_program",
    "feedback_message",
    "format_result",
    "make_environment",
    "run_tool_program",
    "visible_tests",
]
