"""Teacher traces: prompt -> teacher -> parse -> sandbox (which also says if the code compiles) -> JSONL record.

Knows tasks, prompts, parsing, verification and resumption; knows nothing about HTTP (that is
`clients.openai_compat`).

Crash safety. Records are appended to the output file and flushed as each sample completes, so a
Ctrl-C or `kill -9` loses only the requests in flight. A rerun reads the file, repairs a torn last
line (a kill during a write; a bad line anywhere else is an error naming file and line, see
`utils.jsonl`), and skips every `(task_id, sample_idx)` whose newest record is an answer. A sample
whose newest record is an `api_error` is asked again: the new record is appended (the error row
stays, so the file keeps the full history) and carries the earlier errors in `previous_errors`;
readers take the newest record per sample (`latest_records`). An exclusive `flock` on the file
stops two runs from writing it at once. `--overwrite` empties the file only when the first good
answer arrives, so a run whose every request fails leaves the old traces as they were. A full disk
stops the run with one `DiskFullError` naming the file and how many traces are intact.

Record: `TeacherTrace` (one line each, `TeacherTrace.to_row`). This module is the format's one owner:
`latest_records` and `load_teacher_examples` are its readers, so phase 3 receives `TeacherTrace`s and
never parses the file itself.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clients.openai_compat import TeacherClient, TeacherFatalError, TeacherResponse
from environments.code_env import Turn
from sandbox.executor import ExecutionResult, SandboxPool, execute_program, plan_tests
from utils.dataset_loader import Task, read_tasks
from utils.disk import DiskFullError, out_of_space
from utils.jsonl import FileBusyError, JsonlAppender, iter_records
from utils.prompts import PROGRAM_CLOSE, build_chat_messages, get_unified_prompt
from utils.thinking_extraction import ParsedResponse, extract_thinking_and_code_unified, split_thinking


@dataclass(frozen=True)
class TraceTurn:
    """One teacher turn of a multi-turn exchange and what the environment answered.

    feedback mode: an answer and the user message it got; tool mode: the text up to and including a
    `</program>` (or the final text) and the `<result>` block appended after it, inside the same
    assistant message. `feedback` is None for the last turn."""

    response: str | None
    reasoning: str | None
    feedback: str | None  # what the environment answered (feedback: a user message; tool: a result block)
    truncated: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TraceTurn:
        return cls(row.get("response"), row.get("reasoning"), row.get("feedback"), bool(row.get("truncated")))


@dataclass(frozen=True)
class TeacherTrace:
    """One line of the trace file: one teacher answer, or one failed request, for one sample of a task.

    Field order is the file's key order. A row written before a field existed reads as its default;
    keys this version does not know are ignored. The multi-turn fields are written only when set, so a
    single-turn row is what it always was.
    """

    task_id: str
    sample_idx: int
    prompt: str  # the unified user prompt
    teacher_model: str = ""
    timestamp: str = ""
    latency: float = 0.0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    previous_errors: tuple[str, ...] = ()  # the API errors of earlier attempts at this sample
    thinking: str = ""
    code: str | None = None
    response: str | None = None  # the raw content
    reasoning: str | None = None  # the server's separate reasoning field, if any
    syntax_ok: bool = False
    passed: bool = False
    pass_fraction: float = 0.0
    tests_passed: int = 0
    tests_total: int = 0
    status: str = ""  # a sandbox status, or "api_error"
    error: str | None = None
    # multi-turn modes (phase 2 --mode feedback|tool): each turn and what the environment answered
    mode: str | None = None
    num_turns: int | None = None
    turns: tuple[TraceTurn, ...] | None = None
    # a trace that carries its exchange after the prompt as chat messages (written by other tools)
    messages: tuple[dict[str, str], ...] | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TeacherTrace:
        """A row as read from the file; KeyError/TypeError/ValueError when task_id or sample_idx is missing or bad."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in known}
        values["task_id"], values["sample_idx"] = str(row["task_id"]), int(row["sample_idx"])
        values["prompt"] = values.get("prompt") or ""
        values["thinking"] = values.get("thinking") or ""
        values["previous_errors"] = tuple(values.get("previous_errors") or ())
        if values.get("turns") is not None:
            values["turns"] = tuple(TraceTurn.from_row(t) for t in values["turns"])
        if values.get("messages") is not None:
            values["messages"] = tuple(values["messages"])
        return cls(**values)

    def to_row(self) -> dict[str, Any]:
        """The row as written: every single-turn field in order, then the multi-turn ones that are set."""
        row = asdict(self)
        row["previous_errors"] = list(self.previous_errors)
        for name in ("mode", "num_turns", "turns", "messages"):
            if row[name] is None:
                del row[name]
        if self.turns is not None:
            row["turns"] = [asdict(turn) for turn in self.turns]
        if self.messages is not None:
            row["messages"] = list(self.messages)
        return row

    def conversation(self) -> list[dict[str, str]] | None:
        """The exchange after the prompt as chat messages: what teacher-SFT trains on for a multi-turn trace
        (feedback: each answer, then the feedback it got as a user turn; tool: one assistant message with
        its `<result>` blocks, which teacher-SFT masks). None for a single-turn trace."""
        if self.messages:
            return list(self.messages)
        if not self.turns:
            return None
        if self.mode == "tool":
            return [
                {"role": "assistant", "content": "".join((t.response or "") + (t.feedback or "") for t in self.turns)}
            ]
        messages = []
        for turn in self.turns:
            messages.append({"role": "assistant", "content": turn.response or ""})
            if turn.feedback:
                messages.append({"role": "user", "content": turn.feedback})
        return messages


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
    # cut after the thinking had closed: the answer ran out of teacher.max_tokens. With teacher.thinking_token_budget
    # the server closes a long thinking itself, so these are mostly answers whose </think> it forced at the budget
    cut_after_thinking: int = 0
    skipped_existing: int = 0  # already in the file from an earlier run
    retried: int = 0  # samples that had failed with an API error in an earlier run and were asked again
    kept_old_file: bool = False  # --overwrite without a single good answer: the old file was left as it was
    elapsed_s: float = 0.0
    errors: dict = field(default_factory=dict)  # first few API error messages, by message

    def add(self, record: TeacherTrace) -> None:
        self.total += 1
        if record.status == "api_error":
            self.api_errors += 1
            message = (record.error or "")[:120]
            if len(self.errors) < 5:
                self.errors[message] = self.errors.get(message, 0) + 1
            return
        self.with_thinking += bool(record.thinking)
        self.code_extracted += record.code is not None
        self.valid_python += bool(record.syntax_ok)
        self.passed_tests += bool(record.passed)
        self.truncated += record.finish_reason == "length"
        if record.finish_reason == "length" and record.turns is None:  # single mode: one answer, one thinking
            self.cut_after_thinking += split_thinking(record.response, record.reasoning).think_closed

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
            ("cut after </think>", self.cut_after_thinking),
        ]
        lines = count_lines(rows[:1], 20) + count_lines(rows[1:], 20, share_of=n)
        if self.cut_after_thinking:
            lines.append(
                f"{'':20s} answers cut after the thinking closed (with the thinking budget, mostly at the forced "
                "</think>): no code, dropped; raise teacher.max_tokens if this is more than a few percent"
            )
        lines.append(f"{'already present:':20s} {self.skipped_existing:7d}  (skipped, from earlier runs)")
        if self.retried:
            lines.append(f"{'retried:':20s} {self.retried:7d}  (had failed with an API error before)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict_fields(result: ExecutionResult) -> dict[str, Any]:
    """The sandbox's verdict on a trace's code, as TeacherTrace's fields."""
    names = ("passed", "pass_fraction", "tests_passed", "tests_total", "status", "error")
    return {name: getattr(result, name) for name in names}


def count_lines(rows: Sequence[tuple[str, int]], width: int, share_of: int = 0) -> list[str]:
    """`name:  count` lines, names padded to `width`; with `share_of`, each count's share of it after it."""
    return [
        f"{name + ':':{width}s} {count:7d}" + (f"  ({count / share_of:6.1%})" if share_of else "")
        for name, count in rows
    ]


def build_record(
    task: Task,
    sample_idx: int,
    prompt: str,
    response: TeacherResponse,
    result: ExecutionResult | None,
    parsed: ParsedResponse | None,
    teacher_model: str,
    previous_errors: Sequence[str] = (),
) -> TeacherTrace:
    base = TeacherTrace(
        task_id=task.task_id,
        sample_idx=sample_idx,
        prompt=prompt,
        teacher_model=teacher_model,
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        latency=round(response.latency, 3),
        finish_reason=response.finish_reason,
        usage=response.usage,
        previous_errors=tuple(previous_errors),
    )
    if not response.ok:
        return replace(base, status="api_error", error=response.error)
    assert parsed is not None and result is not None
    return replace(
        base,
        thinking=parsed.thinking,
        code=parsed.code,
        response=response.text,
        reasoning=response.reasoning,
        syntax_ok=result.compiles,  # compiled in the sandbox, never here
        **verdict_fields(result),
    )


@dataclass(frozen=True)
class TextPrompter:
    """Tool mode's view of the teacher's tokenizer: the chat prompt rendered as text (the server continues
    text, `TeacherClient.complete_text`) and the token count of text, for the sample's token budget."""

    tokenizer: Any
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def _specials(self) -> list[str]:  # longest first, so no shorter token splits a longer one first
        return sorted({t for t in self.tokenizer.all_special_tokens if len(t) > 1}, key=len, reverse=True)

    def render(self, messages: Sequence[Mapping[str, str | None]]) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def escape(self, text: str) -> str:
        """`text` with every special-token string broken by a zero-width space: the server tokenizes a text
        prompt with special tokens on, so a program that prints `<|im_end|>` would otherwise end the teacher's
        turn in the prompt. The trace keeps the raw text (teacher-SFT encodes results as plain characters)."""
        for special in self._specials:
            text = text.replace(special, special[0] + "\u200b" + special[1:])
        return text


async def feedback_exchange(
    client: TeacherClient, environment: Any, task: Task, messages: Sequence[Mapping[str, str | None]]
) -> tuple[TeacherResponse, list[TraceTurn]]:
    """Feedback mode: answer, run the shown tests, send a failure back as a user message, answer again (up to
    the environment's `max_turns`). Returns the last response (a failed request ends the exchange with it)
    and the turns."""
    response = await client.complete(messages)
    turns: list[TraceTurn] = []
    state = environment.start(task)
    while response.ok:
        [step] = await asyncio.to_thread(environment.step, [state], [Turn(response.text or "", _finish(response))])
        turns.append(
            TraceTurn(
                response=response.text,
                reasoning=response.reasoning,
                feedback=None if step.done else step.observation,
                truncated=step.truncated,
            )
        )
        if step.done:
            break
        messages = [
            *messages,
            {"role": "assistant", "content": response.text},
            {"role": "user", "content": step.observation},
        ]
        response = await client.complete(messages)
    return response, turns


def _finish(response: TeacherResponse) -> str:
    """ "stop" when the teacher ended its turn (a server may leave finish_reason out), else "length"."""
    return "stop" if response.finish_reason in (None, "stop") else "length"


def _program_turn(response: TeacherResponse) -> Turn:
    """A text completion as the tool environment sees it: stopped at `</program>` (the text cut just after the
    first one: a server may run a token past it), ended by the teacher, or cut by `max_tokens`."""
    text = response.text or ""
    end = text.find(PROGRAM_CLOSE)
    if end >= 0 and (response.stop_string == PROGRAM_CLOSE or _finish(response) == "stop"):
        return Turn(text[: end + len(PROGRAM_CLOSE)], "stop_string")
    return Turn(text, _finish(response))


async def tool_exchange(
    client: TeacherClient, environment: Any, task: Task, prompt_text: str, prompter: TextPrompter, budget: int
) -> tuple[TeacherResponse, list[TraceTurn]]:
    """Tool mode: the teacher writes until `</program>`, the program runs in the sandbox (`environment`, a
    `environments.code_env.ToolEnvironment`), its `<result>` block is appended to the teacher's own text and
    the teacher continues, until it ends its answer. `budget` bounds the sample's tokens, results included.

    Returns one response for the whole exchange (its text is the full assistant message, results included;
    latency, attempts and usage summed; finish "length" when the budget ran out) and the turns. A failed
    request ends the exchange with that failure."""
    state = environment.start(task)
    turns: list[TraceTurn] = []
    transcript, used, latency, attempts = "", 0, 0.0, 0
    sent = prompt_text  # the prompt so far as the server gets it: each piece escaped once, when appended
    usage: dict[str, int] = {}
    while True:
        response = await client.complete_text(sent, [PROGRAM_CLOSE], max(budget - used, 1))
        latency, attempts = latency + response.latency, attempts + response.attempts
        if not response.ok:
            return replace(response, latency=latency, attempts=attempts), turns
        for key, value in response.usage.items():
            usage[key] = usage.get(key, 0) + value
        turn = _program_turn(response)
        used += prompter.count(turn.text)
        [step] = await asyncio.to_thread(environment.step, [state], [turn])
        transcript += turn.text
        sent += prompter.escape(turn.text)
        observation = step.observation or ""
        observation_tokens = 0 if step.done else prompter.count(observation)
        done, truncated = step.done, step.truncated
        if not done and used + observation_tokens >= budget:  # no room left to read the result
            done, truncated = True, True
        turns.append(TraceTurn(turn.text, None, None if done else observation, truncated))
        if done:
            finish = "length" if truncated else (response.finish_reason or "stop")
            return (
                TeacherResponse(transcript, finish_reason=finish, usage=usage, latency=latency, attempts=attempts),
                turns,
            )
        transcript += observation
        sent += prompter.escape(observation)
        used += observation_tokens


def latest_records(path: Path) -> dict[tuple[str, int], TeacherTrace]:
    """The newest record of each (task_id, sample_idx) in a trace file (a retried sample has an older api_error row).

    The one reader of the trace format: phase 2 resumes from it and phase 3's teacher-SFT reads it (through
    `load_teacher_examples`). Torn-line policy of `utils.jsonl`: a torn last line is skipped, a bad middle line
    is an error naming file and line.
    """
    latest: dict[tuple[str, int], TeacherTrace] = {}
    fix = (
        "not a trace record (needs task_id and sample_idx); fix or remove that line, or start a fresh file with "
        "--overwrite."
    )
    for record in iter_records(path, TeacherTrace.from_row, fix):
        latest[(record.task_id, record.sample_idx)] = record
    return latest


def error_history(records: dict[tuple[str, int], TeacherTrace]) -> dict[tuple[str, int], list[str]]:
    """For each sample whose newest record is an API error: every error it has had so far (oldest first)."""
    return {
        key: [*record.previous_errors, record.error or "unknown error"]
        for key, record in records.items()
        if record.status == "api_error"
    }


def open_trace_file(path: Path, overwrite: bool) -> tuple[JsonlAppender, dict[tuple[str, int], TeacherTrace]]:
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


def load_teacher_examples(
    path: Path, train_task_ids: set[str], only_passed: bool, held_out: set[str] | None = None
) -> list[TeacherTrace]:
    """Teacher traces usable for SFT: the newest record per sample, with code, passed if asked, of the training
    tasks; given the evaluation split's task ids (`held_out`), of every task outside it. GRPO's task file may be
    a subset of the training split (the tasks with reward spread): the teacher's traces of the others are what
    teacher-SFT is for, and only a held-out task's trace would leak."""

    def usable_task(task_id: str) -> bool:
        return task_id in train_task_ids or (held_out is not None and task_id not in held_out)

    if not path.is_file():
        return []  # whether that is acceptable (teacher-SFT off) is the caller's decision
    return [
        record
        for record in latest_records(path).values()
        if usable_task(record.task_id) and record.code and (record.passed or not only_passed)
    ]


def held_out_task_ids(val_file: Path) -> set[str] | None:
    """The evaluation split's task ids (phase 1's val file), None when there is no such file."""
    return {t.task_id for t in read_tasks(val_file)} if val_file.is_file() else None


def teacher_data_record(examples: Sequence[TeacherTrace], traces: Path, rollout_task_ids: set[str]) -> dict:
    """What phase 3's teacher-SFT term trains on (`teacher_data.json` beside its metrics): the traces file, how
    many usable traces of how many tasks, and how many of those tasks are outside GRPO's task file."""
    tasks = sorted({e.task_id for e in examples})
    return {
        "traces_file": str(traces),
        "usable_traces": len(examples),
        "tasks": tasks,
        "tasks_outside_the_rollout_file": sum(t not in rollout_task_ids for t in tasks),
    }


def disk_full_error(path: Path, written: int, earlier: int) -> DiskFullError:
    """The one line a full disk gives while traces are written: the file, and how many lines are intact."""
    before = f" and the {earlier} from earlier runs" if earlier else ""
    return DiskFullError(
        errno.ENOSPC,
        f"no space left on device in {path.parent} while writing {path}: the {written} traces this run wrote "
        f"before{before} are intact (each line is flushed; a torn last line is cut on the next run); free space "
        "and rerun the same command to continue",
    )


async def generate_traces(
    tasks: Sequence[Task],
    client: TeacherClient,
    output_path: str | Path,
    *,
    num_samples: int,
    pool: SandboxPool,
    num_visible_tests: int = 1,
    overwrite: bool = False,
    progress: bool = True,
    teacher_model: str | None = None,
    on_fresh_start: Callable[[], object] | None = None,
    mode: str = "single",
    environment: Any = None,
    prompter: TextPrompter | None = None,
    tool_budget: int = 4096,
) -> TraceStats:
    """Query the teacher for every missing (task, sample) pair, verify each answer, append records.

    `on_fresh_start` is called when an `overwrite` run empties the old file (at its first good answer).
    `mode="feedback"` with a `environments.code_env.FeedbackEnvironment` (`feedback_exchange`): after each
    answer the task's shown tests run; a failure goes back to the teacher as a user message and it answers
    again, up to the environment's `max_turns`. `mode="tool"` with a `ToolEnvironment` and the teacher's
    `prompter` (`tool_exchange`): each `<program>` runs in the sandbox and its result is appended to the
    teacher's text, within `tool_budget` tokens. The record is the final answer's (tool: the whole message),
    plus `mode`, `num_turns` and `turns`.
    """
    if mode != "single" and environment is None:
        raise ValueError(f"mode={mode} needs its environment (environments.code_env.make_environment)")
    stats = TraceStats()
    out, existing = open_trace_file(Path(output_path), overwrite)
    history = error_history(existing)  # samples that failed before: asked again, their errors kept in the new record
    done = {key for key in existing if key not in history}
    jobs = [(task, i) for task in tasks for i in range(num_samples) if (task.task_id, i) not in done]
    stats.skipped_existing = sum(1 for task in tasks for i in range(num_samples) if (task.task_id, i) in done)
    stats.retried = sum(1 for task, i in jobs if (task.task_id, i) in history)
    # --overwrite: the old file is cut only when the first good answer arrives; error rows wait in memory until then
    pending: list[TeacherTrace] | None = [] if overwrite else None
    plans = {task.task_id: plan_tests(task) for task in tasks}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc="teacher traces", unit="req", dynamic_ncols=True)
    start = time.monotonic()
    queue: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)

    written = 0  # records this run appended

    async def worker() -> None:
        nonlocal pending, written
        while True:
            try:
                task, sample_idx = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            prompt = get_unified_prompt(task, num_visible_tests, mode=mode)
            messages: Sequence[Mapping[str, str | None]] = build_chat_messages(prompt)
            turns: list[TraceTurn] = []
            if mode == "tool":
                assert prompter is not None, "tool mode needs the teacher's tokenizer (a TextPrompter)"
                response, turns = await tool_exchange(
                    client, environment, task, prompter.render(messages), prompter, tool_budget
                )
            elif mode == "feedback":
                response, turns = await feedback_exchange(client, environment, task, messages)
            else:
                response = await client.complete(messages)
            parsed = result = None
            if response.ok:
                # graded: only what the teacher wrote (tool mode: its own turns, never a <result> block)
                graded = "\n".join(t.response or "" for t in turns) if mode == "tool" else response.text
                parsed = extract_thinking_and_code_unified(graded, response.reasoning, entry_point=task.fn_name)
                # the sandbox blocks; run it in a thread so other requests keep flowing
                result = await asyncio.to_thread(
                    execute_program, parsed.code, task, pool=pool, planned=plans[task.task_id]
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
            if mode != "single" and record.status != "api_error":
                record = replace(record, mode=mode, num_turns=len(turns), turns=tuple(turns))
            if pending is not None and record.status == "api_error":
                pending.append(record)
            else:
                try:
                    if pending is not None:  # the first good answer of an --overwrite run: now the old file goes
                        out.truncate_now()
                        if on_fresh_start is not None:
                            on_fresh_start()
                        for held in pending:
                            out.write(held.to_row())
                            written += 1
                        pending = None
                    out.write(record.to_row())  # flushed: survives a kill of this process
                    written += 1
                except Exception as error:
                    if not out_of_space(error):
                        raise
                    raise disk_full_error(Path(output_path), written, len(existing)) from None
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
        fatal = [e for e in errors.exceptions if isinstance(e, (TeacherFatalError, DiskFullError))]
        if fatal:
            raise fatal[0] from None
        raise
    finally:
        stats.elapsed_s = round(time.monotonic() - start, 2)
        if bar is not None:
            bar.close()
        try:
            out.close()
        except Exception as error:  # a full disk fails the close's flush again; it is reported above
            if not out_of_space(error):
                raise
        stats.kept_old_file = pending is not None and bool(jobs)
    return stats
