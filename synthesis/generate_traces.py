"""Teacher traces: prompt -> teacher -> parse -> syntax check -> sandbox -> one JSONL record.

Knows tasks, prompts, parsing, verification and resumption; knows nothing about HTTP (that is
`synthesis.teacher_query`).

Crash safety. Records are appended to the output file and flushed as each sample completes, so a
Ctrl-C or `kill -9` loses only the requests in flight. A rerun reads the file, repairs a torn last
line (a kill during a write), and skips every `(task_id, sample_idx)` already present, so there
are never duplicates. An exclusive `flock` on the file stops two runs from writing it at once.

Record fields: task_id, sample_idx, prompt, thinking, code, response (the raw content), reasoning
(the server's separate reasoning field, if any), finish_reason, usage, latency, syntax_ok, passed,
pass_fraction, tests_passed, tests_total, status (a sandbox status, or "api_error"), error,
teacher_model, timestamp.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from evaluation.code_executor import ExecutionResult, SandboxLimits, SandboxPool, execute_program, plan_tests
from synthesis.teacher_query import TeacherClient, TeacherFatalError, TeacherResponse
from utils.dataset_loader import Task
from utils.prompts import build_chat_messages, get_unified_prompt
from utils.thinking_extraction import extract_thinking_and_code_unified


class TraceFileBusy(RuntimeError):
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
        rows = [("total responses", self.total), ("with thinking", self.with_thinking), ("code extracted", self.code_extracted),
                ("valid Python", self.valid_python), ("passed tests", self.passed_tests), ("API errors", self.api_errors),
                ("truncated (length)", self.truncated)]
        lines = [f"{name + ':':20s} {count:7d}" + (f"  ({count / n:6.1%})" if name != "total responses" else "")
                 for name, count in rows]
        lines.append(f"{'already present:':20s} {self.skipped_existing:7d}  (skipped, from earlier runs)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_record(task: Task, sample_idx: int, prompt: str, response: TeacherResponse, result: ExecutionResult | None,
                 parsed: dict | None, teacher_model: str) -> dict[str, Any]:
    base = {"task_id": task.task_id, "sample_idx": sample_idx, "prompt": prompt, "teacher_model": teacher_model,
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"), "latency": round(response.latency, 3),
            "finish_reason": response.finish_reason, "usage": response.usage}
    if not response.ok:
        return {**base, "thinking": "", "code": None, "response": None, "reasoning": None, "syntax_ok": False, "passed": False,
                "pass_fraction": 0.0, "tests_passed": 0, "tests_total": 0, "status": "api_error", "error": response.error}
    assert parsed is not None and result is not None
    return {**base, "thinking": parsed["thinking"], "code": parsed["code"], "response": response.text,
            "reasoning": response.reasoning, "syntax_ok": parsed["syntax_ok"], "passed": result.passed,
            "pass_fraction": result.pass_fraction, "tests_passed": result.tests_passed, "tests_total": result.tests_total,
            "status": result.status, "error": result.error}


def open_trace_file(path: Path, overwrite: bool) -> tuple[IO[str], set[tuple[str, int]]]:
    """Open (and lock) the trace file for appending; return it with the keys already present.

    A torn last line (the process was killed while writing it) is cut off so appends stay valid.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - returned to the caller, closed there
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise TraceFileBusy(f"{path} is being written by another phase 2 run; wait for it or use another --output.") from None
    if overwrite:
        handle.truncate(0)
        return handle, set()
    handle.seek(0)
    data = handle.read()
    done: set[tuple[str, int]] = set()
    good_end = 0
    for line in data.splitlines(keepends=True):
        if not line.endswith("\n"):
            break  # torn final line
        try:
            record = json.loads(line)
            done.add((record["task_id"], int(record["sample_idx"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            break  # everything from a corrupt line on is dropped and regenerated
        good_end += len(line.encode("utf-8"))
    if good_end != len(data.encode("utf-8")):
        handle.truncate(good_end)
    handle.seek(0, os.SEEK_END)
    return handle, done


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
) -> TraceStats:
    """Query the teacher for every missing (task, sample) pair, verify each answer, append records."""
    stats = TraceStats()
    handle, done = open_trace_file(Path(output_path), overwrite)
    jobs = [(task, i) for task in tasks for i in range(num_samples) if (task.task_id, i) not in done]
    stats.skipped_existing = sum(1 for task in tasks for i in range(num_samples) if (task.task_id, i) in done)
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
        while True:
            try:
                task, sample_idx = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            prompt = get_unified_prompt(task, num_visible_tests)
            response = await client.complete(build_chat_messages(prompt))
            parsed = result = None
            if response.ok:
                parsed = extract_thinking_and_code_unified(response.text, response.reasoning)
                # the sandbox blocks; run it in a thread so other requests keep flowing
                result = await asyncio.to_thread(execute_program, parsed["code"], task, limits, pool, None, False,
                                                 plans[task.task_id])
            record = build_record(task, sample_idx, prompt, response, result, parsed, teacher_model or client.model)
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()  # in the OS's hands now: survives a kill of this process
            stats.add(record)
            if bar is not None:
                elapsed = max(time.monotonic() - start, 1e-9)
                bar.set_postfix(req_s=f"{stats.total / elapsed:.2f}", pass_rate=f"{stats.passed_tests / max(stats.total, 1):.1%}",
                                errors=stats.api_errors, refresh=False)
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
        handle.close()
    return stats
