"""The reference-solution teacher: a dataset's own reference solutions as verified teacher traces.

    python phase2_generate_teacher_traces.py --teacher references [--input FILE] [--output FILE]

For a user without a 32B teacher, and for every CPU experiment, the training tasks' reference
solutions are the strongest teacher there is. Each one is executed against its task's tests in the
sandbox, exactly as a teacher answer would be; a reference that fails (a wrong or environment-dependent
solution, a timeout) is dropped, so teacher-SFT only ever trains on programs that passed here. Up to
`num_samples` references per task (APPS has many, MBPP one) become samples 0, 1, ...

The thinking block (`teacher.reference_thinking`):
- `short` (the gpu preset's): one sentence built only from facts of the task and the program (the entry point
  the tests call and its signature, or that the program reads standard input). It invents no reasoning the
  reference's author never wrote down; it gives the SFT target the shape the prompt asks for (a closed
  `<think>` block, then one python block), for a student that writes closed blocks itself.
- `none` (the cpu preset's): no thinking; the target is the python block alone (`utils.sft_data.build_sft_target`).
  A student that does not close `<think>` (the 135M one) trained on `short` targets learns to open the block
  and often leaves it open, which leaves no gradable answer; the preflight measures which case a student is.

Records are `synthesis.generate_traces.TeacherTrace`s (phase 2's format, `teacher_model` =
`REFERENCE_TEACHER`), so phase 3 reads them unchanged. Resumable like phase 2: samples already in the
file are skipped; a file written by a model teacher is not mixed with references (refused).
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandbox.executor import ExecutionResult, SandboxPool, execute_many
from synthesis.generate_traces import TeacherTrace, TraceFileBusy, count_lines, latest_records, verdict_fields
from utils.dataset_loader import Task
from utils.jsonl import FileBusyError, JsonlAppender
from utils.prompts import get_unified_prompt
from utils.sft_data import build_sft_target

REFERENCE_TEACHER = "references"
THINKING_MODES = ("short", "none")  # teacher.reference_thinking
TEACHER_SOURCES = ("server", REFERENCE_TEACHER)  # teacher.source: phase 2 asks the server, or uses the references


class MixedTraceFile(ValueError):  # noqa: N818 - a refusal, named for the situation
    """The output file holds traces of a model teacher; references would be mixed into it."""


def signature_of(code: str, name: str | None) -> str | None:
    """`name(arg, ...)` of the top-level function `name` in `code` (or of its first function when `name` is
    None or absent); None when the code does not parse or defines no function."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    chosen = next((f for f in functions if f.name == name), functions[0] if functions else None)
    if chosen is None:
        return None
    args = [a.arg for a in (*chosen.args.posonlyargs, *chosen.args.args)]
    if chosen.args.vararg:
        args.append("*" + chosen.args.vararg.arg)
    return f"{chosen.name}({', '.join(args)})"


def normalize_newlines(code: str) -> str:
    """CRLF -> LF: MBPP's references use Windows line endings (972 of 974), which a student must not learn to
    emit. A CR inside a string literal would change meaning, which is why the normalized text is what the
    sandbox verifies."""
    return code.replace("\r\n", "\n")


def reference_thinking(task: Task, code: str, mode: str) -> str:
    """The thinking block of a reference trace: '' for `none`; for `short`, one sentence of facts only."""
    if mode not in THINKING_MODES:
        raise ValueError(f"reference thinking must be one of {', '.join(THINKING_MODES)}, got {mode!r}")
    if mode == "none":
        return ""
    if task.test_type == "stdin":
        return "The program reads its input from standard input and prints the answer, so I write a script."
    signature = signature_of(code, task.fn_name)
    if signature is None:
        return "I write the solution as one Python program."
    called = f"The tests call `{task.fn_name}`" if task.fn_name else "The task needs a function"
    return f"{called}, so I define `{signature}` and return the result it asks for."


@dataclass
class ReferenceStats:
    tasks: int = 0  # tasks read from the input
    without_reference: int = 0  # tasks with no reference solution at all
    candidates: int = 0  # references executed in this run
    passed: int = 0  # written as traces
    dropped: int = 0  # failed in the sandbox: not written
    skipped_existing: int = 0  # already in the file from an earlier run
    dropped_statuses: dict[str, int] = field(default_factory=dict)  # sandbox status -> count
    dropped_examples: list[str] = field(default_factory=list)  # a few "task_id#i: status" lines

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        names = ("tasks", "without a reference", "references run", "passed (written)", "failed (dropped)")
        counts = (self.tasks, self.without_reference, self.candidates, self.passed, self.dropped)
        lines = count_lines([*zip(names, counts, strict=True), ("already present", self.skipped_existing)], 22)
        if self.dropped_statuses:
            lines.append("dropped by status:     " + ", ".join(f"{k} {v}" for k, v in self.dropped_statuses.items()))
        return "\n".join(lines)


def reference_trace(
    task: Task, sample_idx: int, code: str, result: ExecutionResult, visible_tests: int, thinking_mode: str
) -> TeacherTrace:
    """One verified reference as phase 2's record: the response is the SFT target's text, so a reader that
    re-parses `response` gets the same thinking and code back."""
    thinking = reference_thinking(task, code, thinking_mode)
    response = build_sft_target(thinking, code, include_thinking=True)
    return TeacherTrace(
        task_id=task.task_id,
        sample_idx=sample_idx,
        prompt=get_unified_prompt(task, visible_tests),
        teacher_model=REFERENCE_TEACHER,
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        finish_reason="stop",
        thinking=thinking,
        code=code,
        response=response,
        syntax_ok=result.compiles,
        **verdict_fields(result),
    )


def verify_references(
    tasks: Sequence[Task],
    num_samples: int,
    pool: SandboxPool,
    visible_tests: int,
    thinking_mode: str = "short",
    skip: set[tuple[str, int]] | frozenset[tuple[str, int]] = frozenset(),
    progress: bool = True,
) -> tuple[list[TeacherTrace], ReferenceStats]:
    """Run up to `num_samples` reference solutions per task in the sandbox; return the passing ones as
    traces (in task order) and the statistics. `skip`: (task_id, sample_idx) pairs already done."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    reference_thinking(tasks[0], "", thinking_mode) if tasks else None  # a bad mode fails before any run
    stats = ReferenceStats(tasks=len(tasks))
    jobs: list[tuple[Task, int, str]] = []
    for task in tasks:
        if not task.reference_solutions:
            stats.without_reference += 1
        for i, code in enumerate(task.reference_solutions[:num_samples]):
            if (task.task_id, i) in skip:
                stats.skipped_existing += 1
            else:  # what runs is what is written: the normalized text
                jobs.append((task, i, normalize_newlines(code)))
    stats.candidates = len(jobs)
    results = execute_many([(code, task) for task, _, code in jobs], pool, progress=progress)
    traces = []
    for (task, i, code), result in zip(jobs, results, strict=True):
        if result.passed:
            traces.append(reference_trace(task, i, code, result, visible_tests, thinking_mode))
            stats.passed += 1
            continue
        stats.dropped += 1
        stats.dropped_statuses[result.status] = stats.dropped_statuses.get(result.status, 0) + 1
        if len(stats.dropped_examples) < 10:
            stats.dropped_examples.append(f"{task.task_id}#{i}: {result.status}")
    return traces, stats


def write_reference_traces(
    tasks: Sequence[Task],
    output_path: str | Path,
    num_samples: int,
    *,
    pool: SandboxPool,
    visible_tests: int,
    thinking_mode: str = "short",
    overwrite: bool = False,
    progress: bool = True,
) -> ReferenceStats:
    """Verify the tasks' references and append the passing ones to `output_path` (resumable: samples already
    in the file are skipped; `overwrite` starts the file afresh). Raises MixedTraceFile when the file holds a
    model teacher's traces, TraceFileBusy when another process writes it."""
    path = Path(output_path)
    new_file = not path.exists()
    try:
        out = JsonlAppender(path)
    except FileBusyError:
        raise TraceFileBusy(
            f"{path} is being written by another process; wait for it or use another --output."
        ) from None
    try:
        existing = {} if overwrite else latest_records(path)
        others = sorted({r.teacher_model for r in existing.values() if r.teacher_model != REFERENCE_TEACHER})
        if others:
            raise MixedTraceFile(
                f"{path} holds traces of teacher {', '.join(others)}; reference traces would be mixed into them. "
                "Write them to another file with --output, or start afresh with --overwrite."
            )
        traces, stats = verify_references(
            tasks, num_samples, pool, visible_tests, thinking_mode, set(existing), progress
        )
        if overwrite:
            out.truncate_now()
        for trace in traces:
            out.write(trace.to_row())
    except OSError:
        with contextlib.suppress(OSError):  # what the full disk did not take is lost either way
            out.close()
        if new_file and path.is_file() and path.stat().st_size == 0:  # a full disk: leave no empty trace file
            path.unlink()
        raise
    finally:
        out.close()
    return stats
