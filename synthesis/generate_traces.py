"""Teacher traces: prompt -> teacher -> parse -> syntax check -> sandbox -> one JSONL record.

Knows tasks, prompts, parsing, verification and resumption; knows nothing about HTTP (that is
`synthesis.teacher_query`).

Crash safety. Records are appended to the output file and flushed as each sample completes, so a
Ctrl-C or `kill -9` loses only the requests in flight. A rerun reads the file, repairs a torn last
line (a kill during a write; a bad line anywhere else is an error naming file and line, see
`utils.jsonl`), and skips every `(task_id, sample_idx)` whose newest record is an answer. A sample
whose newest record is an `api_error` is asked again: the new record is appended (the error row
stays, so the file keeps the full history) and carries the earlier errors in `previous_errors`;
readers take the newest record per sample (`latest_records`). An exclusive `flock` on the file
stops two runs from writing it at once. `--overwrite` empties the file only when the first good
answer arrives, so a run whose every request fails leaves the old traces as they were.

Record fields: task_id, sample_idx, prompt, thinking, code, response (the raw content), reasoning
(the server's separate reasoning field, if any), finish_reason, usage, latency, syntax_ok, passed,
pass_fraction, tests_passed, tests_total, status (a sandbox status, or "api_error"), error,
previous_errors (the API errors of earlier attempts at this sample), teacher_model, timestamp.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evaluation.code_executor import ExecutionResult, SandboxLimits, SandboxPool, execute_program, plan_tests
from multiturn.environments import Turn
from synthesis.teacher_query import TeacherClient, TeacherFatalError, TeacherResponse
from utils.dataset_loader import Task
from utils.jsonl import DataFormatError, FileBusyError, JsonlAppender, iter_jsonl
from utils.prompts import build_chat_messages, get_unified_prompt
from utils.thinking_extraction import extract_thinking_and_code_unified


class TraceFileBusy(RuntimeError):  # noqa: N818 - a busy file, named for the situation
    """Another process holds the trace file."""


@dataclass
class TraceStats:
    total: int = 0  # responses handled in this run (API errors included)
    with_thinking: int = 0
    code_extracted: int = 0
    valid_python: int = 0
    passed_tests: int = 0
    api_errors: int = 0
    truncated: int = 0  # finish_reason == "length"
    skipped_existing: int = 0  # already in the file from an earlier run
    retried: int = 0  # samples that had failed with an API error in an earlier run and were asked again
    kept_old_file: bool = False  # --overwrite without a single good answer: the old file was left as it was
    elapsed_s: float = 0.0
    errors: dict = field(default_factory=dict)  # first few API error messages, by message

    def add(self, record: dict[str, Any]) -> None:
        self.total += 1
        if record["status"] == "api_error":
            self.api_errors += 1
            if len(self.errors) < 5:
                self.errors[record["error"][:120]] = self.errors.get(record["error"][:120], 0) + 1
            return
        self.with_thinking += bool(record["thinking"])
        self.code_extracted += record["code"] is not None
        self.valid_python += bool(record["syntax_ok"])
        self.passed_tests += bool(record["passed"])
        self.truncated += record["finish_reason"] == "length"

    def table(self) -> str:
        n = max(self.total, 1)
        rows = [
            ("total responses", self.total),
            ("with thinking", self.with_thinking),
            ("code extracted", self.code_extracted),
            ("valid Python", self.valid_python),
            ("passed tests", self.passed_tests),
            ("API errors", self.api_errors),
            ("truncated (length)", self.truncated),
        ]
        lines = [
            f"{name + ':':20s} {count:7d}" + (f"  ({count / n:6.1%})" if name != "total responses" else "")
            for name, count in rows
        ]
        lines.append(f"{'already present:':20s} {self.skipped_existing:7d}  (skipped, from earlier runs)")
        if self.retried:
            lines.append(f"{'retried:':20s} {self.retried:7d}  (had failed with an API error before)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_record(
    task: Task,
    sample_idx: int,
    prompt: str,
    response: TeacherResponse,
    result: ExecutionResult | None,
    parsed: dict | None,
    teacher_model: str,
    previous_errors: Sequence[str] = (),
) -> dict[str, Any]:
    base = {
        "task_id": task.task_id,
        "sample_idx": sample_idx,
        "prompt": prompt,
        "teacher_model": teacher_model,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "latency": round(response.latency, 3),
        "finish_reason": response.finish_reason,
        "usage": response.usage,
        "previous_errors": list(previous_errors),
    }
    if not response.ok:
        return {
            **base,
            "thinking": "",
            "code": None,
            "response": None,
            "reasoning": None,
            "syntax_ok": False,
            "passed": False,
            "pass_fraction": 0.0,
            "tests_passed": 0,
            "tests_total": 0,
            "status": "api_error",
            "error": response.error,
        }
    assert parsed is not None and result is not None
    return {
        **base,
        "thinking": parsed["thinking"],
        "code": parsed["code"],
        "response": response.text,
        "reasoning": response.reasoning,
        "syntax_ok": parsed["syntax_ok"],
        "passed": result.passed,
        "pass_fraction": result.pass_fraction,
        "tests_passed": result.tests_passed,
        "tests_total": result.tests_total,
        "status": result.status,
        "error": result.error,
    }


def latest_records(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The newest record of each (task_id, sample_idx) in a trace file (a retried sample has an older api_error row).

    The one reader of the trace format: phase 2 resumes from it and phase 3's teacher-SFT reads it (through
    `load_teacher_examples`). Torn-line policy of `utils.jsonl`: a torn last line is skipped, a bad middle line
    is an error naming file and line.
    """
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for line_no, record in iter_jsonl(path, tolerate_torn_tail=True):
        try:
            key = (str(record["task_id"]), int(record["sample_idx"]))
        except (KeyError, TypeError, ValueError):
            raise DataFormatError(
                f"{path}:{line_no}: not a trace record (needs task_id and sample_idx); fix or remove "
                "that line, or start a fresh file with --overwrite."
            ) from None
        latest[key] = record
    return latest


def error_history(records: dict[tuple[str, int], dict[str, Any]]) -> dict[tuple[str, int], list[str]]:
    """For each sample whose newest record is an API error: every error it has had so far (oldest first)."""
    return {
        key: [*record.get("previous_errors", []), record.get("error") or "unknown error"]
        for key, record in records.items()
        if record.get("status") == "api_error"
    }


def open_trace_file(path: Path, overwrite: bool) -> tuple[JsonlAppender, dict[tuple[str, int], dict[str, Any]]]:
    """Open (and lock) the trace file for appending; return it with the newest record of each sample already there.

    A torn last line (the process was killed while writing it) is cut off so appends stay valid. With
    `overwrite` nothing is read and nothing is cut yet: the caller truncates when its first good answer
    arrives, so a run that gets none (a typo'd model name, a dead server) leaves the old traces alone.
    """
    try:
        appender = JsonlAppender(path)
    except FileBusyError:
        raise TraceFileBusy(
            f"{path} is being written by another phase 2 run; wait for it or use another --output."
        ) from None
    if overwrite:
        return appender, {}
    try:
        return appender, latest_records(path)
    except BaseException:
        appender.close()
        raise


def load_teacher_examples(path: Path, train_task_ids: set[str], only_passed: bool) -> list[dict]:
    """Teacher traces usable for SFT: the newest record per sample, with code, for training tasks only, passed if asked."""
    if not path.is_file():
        return []  # whether that is acceptable (teacher-SFT off) is the caller's decision
    examples = []
    for record in latest_records(path).values():
        if record.get("task_id") not in train_task_ids or not record.get("code"):
            continue
        if only_passed and not record.get("passed"):
            continue
        messages = trace_messages(record)
        examples.append(
            {
                "prompt": record["prompt"],
                "thinking": record.get("thinking") or "",
                "code": record["code"],
                "task_id": record["task_id"],
                **({"messages": messages} if messages else {}),
            }
        )
    return examples


def trace_messages(record: dict[str, Any]) -> list[dict[str, str]] | None:
    """A feedback-mode trace as the chat exchange after its prompt (each answer, then the feedback it got
    as a user turn), what teacher-SFT trains on; None for a single-turn trace."""
    if record.get("messages"):
        return list(record["messages"])
    if not record.get("turns"):
        return None
    messages = []
    for turn in record["turns"]:
        messages.append({"role": "assistant", "content": turn.get("response") or ""})
        if turn.get("feedback"):
            messages.append({"role": "user", "content": turn["feedback"]})
    return messages


async def generate_traces(
    tasks: Sequence[Task],
    client: TeacherClient,
    output_path: str | Path,
    num_samples: int,
    pool: SandboxPool,
    limits: SandboxLimits | None = None,
    num_visible_tests: int = 1,
    overwrite: bool = False,
    progress: bool = True,
    teacher_model: str | None = None,
    on_fresh_start: Callable[[], None] | None = None,
    mode: str = "single",
    feedback: Any = None,
) -> TraceStats:
    """Query the teacher for every missing (task, sample) pair, verify each answer, append records.

    `on_fresh_start` is called when an `overwrite` run empties the old file (at its first good answer).
    `mode="feedback"` with a `multiturn.environments.FeedbackEnvironment`: after each answer the
    task's shown tests run; a failure goes back to the teacher as a user message (the conversation so
    far as chat messages) and it answers again, up to the environment's `max_turns`. The record is the
    final answer's, plus `mode`, `num_turns` and `turns` (each answer with the feedback it got).
    """
    stats = TraceStats()
    out, existing = open_trace_file(Path(output_path), overwrite)
    history = error_history(existing)  # samples that failed before: asked again, their errors kept in the new record
    done = {key for key in existing if key not in history}
    jobs = [(task, i) for task in tasks for i in range(num_samples) if (task.task_id, i) not in done]
    stats.skipped_existing = sum(1 for task in tasks for i in range(num_samples) if (task.task_id, i) in done)
    stats.retried = sum(1 for task, i in jobs if (task.task_id, i) in history)
    # --overwrite: the old file is cut only when the first good answer arrives; error rows wait in memory until then
    pending: list[dict[str, Any]] | None = [] if overwrite else None
    plans = {task.task_id: plan_tests(task) for task in tasks}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc="teacher traces", unit="req", dynamic_ncols=True)
    start = time.monotonic()
    queue: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)

    async def worker() -> None:
        nonlocal pending
        while True:
            try:
                task, sample_idx = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            prompt = get_unified_prompt(task, num_visible_tests, mode=mode)
            messages = build_chat_messages(prompt)
            response = await client.complete(messages)
            turns: list[dict[str, Any]] = []
            if feedback is not None:
                state = feedback.start(task)
                while response.ok:
                    finish = "stop" if response.finish_reason in (None, "stop") else "length"
                    [step] = await asyncio.to_thread(feedback.step, [state], [Turn(response.text, finish)])
                    turns.append(
                        {
                            "response": response.text,
                            "reasoning": response.reasoning,
                            "feedback": None if step.done else step.observation,
                            "truncated": step.truncated,
                        }
                    )
                    if step.done:
                        break
                    messages = [
                        *messages,
                        {"role": "assistant", "content": response.text},
                        {"role": "user", "content": step.observation},
                    ]
                    response = await client.complete(messages)
            parsed = result = None
            if response.ok:
                parsed = extract_thinking_and_code_unified(response.text, response.reasoning)
                # the sandbox blocks; run it in a thread so other requests keep flowing
                result = await asyncio.to_thread(
                    execute_program, parsed["code"], task, limits, pool, None, False, plans[task.task_id]
                )
            record = build_record(
                task,
                sample_idx,
                prompt,
                response,
                result,
                parsed,
                teacher_model or client.model,
                history.get((task.task_id, sample_idx), []),
            )
            if feedback is not None and record["status"] != "api_error":
                record.update(mode=mode, num_turns=len(turns), turns=turns)
            if pending is not None and record["status"] == "api_error":
                pending.append(record)
            else:
                if pending is not None:  # the first good answer of an --overwrite run: now the old file goes
                    out.truncate_now()
                    if on_fresh_start is not None:
                        on_fresh_start()
                    for held in pending:
                        out.write(held)
                    pending = None
                out.write(record)  # flushed: survives a kill of this process
            stats.add(record)
            if bar is not None:
                elapsed = max(time.monotonic() - start, 1e-9)
                bar.set_postfix(
                    req_s=f"{stats.total / elapsed:.2f}",
                    pass_rate=f"{stats.passed_tests / max(stats.total, 1):.1%}",
                    errors=stats.api_errors,
                    refresh=False,
                )
                bar.update(1)

    n_workers = max(1, min(client.max_concurrency, len(jobs)))  # as many as may be in flight
    try:
        async with asyncio.TaskGroup() as group:  # one fatal error cancels the rest
            for _ in range(n_workers):
                group.create_task(worker())
    except BaseExceptionGroup as errors:
        fatal = [e for e in errors.exceptions if isinstance(e, TeacherFatalError)]
        if fatal:
            raise fatal[0] from None
        raise
    finally:
        stats.elapsed_s = round(time.monotonic() - start, 2)
        if bar is not None:
            bar.close()
        out.close()
        stats.kept_old_file = pending is not None and bool(jobs)
    return stats
