"""Phase 4's library: sample completions (cached, resumable), execute them, summarize pass@k.

Generation goes through the same rollout classes as the trainer (the `rollouts` layer), so the
evaluated prompts, templates and decoding are exactly the trained ones. Completions are appended to
a cache file as they are produced (one JSON line per sample), so an interrupted large run (e.g. 200
samples per task) resumes instead of starting over. The cache file is named by a fingerprint of
the *contents* of the base model and adapter folders (weights, tokenizer, chat template:
`content_digest`) and the decoding settings; each record carries a digest of the chat messages it
answered, so a task whose text changed is generated again. Execution is cheap and always redone from
the cache, so verdicts follow the current sandbox.

Records (frozen, one line each, `to_row`/`from_row`; the field order is the file's key order, and a
multi-turn field is written only when set, so single-turn rows are what they always were):
`CachedCompletion`, a line of the completion cache (`read_cache` reads it, `generate_cached` writes it),
and `EvalSample`, a sample with its parse and verdict (`execute_samples` makes it, phase 4 writes
`eval_samples.jsonl`, `read_samples` reads it back).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from evaluation.bootstrap import DEFAULT_RESAMPLES, bootstrap_interval, paired_bootstrap_interval
from evaluation.pass_at_k import estimate_pass_at_k, pass_at_k_table
from rollouts.completion import RolloutCompletion
from sandbox.executor import SandboxPool, execute_many
from utils.dataset_loader import Task
from utils.jsonl import DataFormatError, JsonlAppender, iter_jsonl, iter_records, write_json_atomic, write_jsonl_atomic
from utils.prompts import build_chat_messages, get_unified_prompt
from utils.thinking_extraction import extract_thinking_and_code_unified, lenient_code, sanitized_code


def _row(record: Any, optional: Sequence[str]) -> dict[str, Any]:
    """A record's row: its fields in order, without the `optional` ones that are None; tuples as lists."""
    row = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(record).items()}
    for name in optional:
        if row[name] is None:
            del row[name]
    return row


@dataclass(frozen=True)
class CachedCompletion:
    """One line of the completion cache: one sampled completion of a task's prompt."""

    task_id: str
    sample_idx: int
    completion: str  # the text the sample is judged on (multi-turn: what the reward scores)
    num_tokens: int
    finish_reason: str | None
    prompt_sha256: str | None  # `prompt_digest` of the messages it answered (a mismatch: generated again)
    # multi-turn modes: copied from the rollout record (`rollouts.episodes`)
    mode: str | None = None
    num_turns: int | None = None
    num_policy_tokens: int | None = None
    answers: tuple[str, ...] | None = None  # each answer the sample gave, the last one is `completion`
    tool_calls: int | None = None
    tool_successes: int | None = None
    truncated: bool | None = None
    transcript: str | None = None
    turns: tuple[dict[str, Any], ...] | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> CachedCompletion:
        """A cache line; KeyError/TypeError/ValueError when a required field is missing or bad."""
        values: dict[str, Any] = {f.name: row.get(f.name) for f in fields(cls)}
        values.update(task_id=str(row["task_id"]), sample_idx=int(row["sample_idx"]), completion=row["completion"])
        values.update(num_tokens=row["num_tokens"], finish_reason=row["finish_reason"])
        for name in ("answers", "turns"):
            if values[name] is not None:
                values[name] = tuple(values[name])
        return cls(**values)

    @classmethod
    def from_sample(
        cls, task_id: str, sample_idx: int, sample: RolloutCompletion, prompt_sha256: str
    ) -> CachedCompletion:
        """A rollout completion as cached (a multi-turn one with its `MultiTurnInfo`, see `MULTI_TURN_FIELDS`)."""
        info = sample.multi_turn
        extra: dict[str, Any] = {}
        if info is not None:
            extra = dict(
                mode=info.mode,
                num_turns=info.num_turns,
                num_policy_tokens=sample.num_policy_tokens,
                answers=info.answers,
                tool_calls=info.tool_calls,
                tool_successes=info.tool_successes,
                truncated=info.truncated,
                transcript=info.transcript,
                turns=info.turns,
            )
        return cls(task_id, sample_idx, sample.text, sample.num_tokens, sample.finish_reason, prompt_sha256, **extra)

    def to_row(self) -> dict[str, Any]:
        return _row(self, MULTI_TURN_FIELDS)


# the multi-turn fields of a rollout completion the cache keeps, in the cache's key order
MULTI_TURN_FIELDS = (
    "mode",
    "num_turns",
    "num_policy_tokens",
    "answers",
    "tool_calls",
    "tool_successes",
    "truncated",
    "transcript",
    "turns",
)


@dataclass(frozen=True)
class EvalSample:
    """One judged sample: what phase 4 writes per sample (`eval_samples.jsonl`) and summarizes."""

    task_id: str
    source: str
    difficulty: str
    sample_idx: int
    completion: str
    num_tokens: int
    finish_reason: str | None
    thinking: str  # the `ParsedResponse` of the completion: what was graded and how it was found
    code: str | None
    think_closed: bool
    has_code: bool
    syntax_ok: bool
    passed: bool  # the sandbox's verdict on `code`
    status: str
    tests_passed: int
    tests_total: int
    pass_fraction: float
    error: str | None
    # multi-turn modes
    mode: str | None = None
    num_turns: int | None = None
    tool_calls: int | None = None
    tool_successes: int | None = None
    truncated: bool | None = None
    answers_passed: tuple[bool, ...] | None = None  # one verdict per answer, on all tests; the last is `passed`
    model: str | None = None  # phase 4's role ("model", "trained", "baseline"); written first
    # the lenient verdict (reporting only): `passed`, or for a sample with no code whose thinking never closed,
    # the verdict on the program inside that thinking (`utils.thinking_extraction.lenient_code`)
    lenient_passed: bool | None = None
    # the sanitized verdict (reporting only): the verdict on the answer's program graded EvalPlus-style
    # (`utils.thinking_extraction.sanitized_code`: the entry point and what it uses, top-level calls dropped)
    sanitized_passed: bool | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> EvalSample:
        values = {f.name: row[f.name] for f in fields(cls) if f.name in row}
        if values.get("answers_passed") is not None:
            values["answers_passed"] = tuple(values["answers_passed"])
        values.setdefault("lenient_passed", row.get("passed"))  # written only where it differs from `passed`
        values.setdefault("sanitized_passed", row.get("passed"))  # likewise
        return cls(**values)

    def to_row(self) -> dict[str, Any]:
        row = _row(self, (*_EVAL_MULTI_TURN, "model", "lenient_passed", "sanitized_passed"))
        for name in ("lenient_passed", "sanitized_passed"):
            if row.get(name) == row["passed"]:
                del row[name]  # so a row whose verdicts agree keeps the bytes it had before the other grades
        return row if self.model is None else {"model": row.pop("model"), **row}


_EVAL_MULTI_TURN = ("mode", "num_turns", "tool_calls", "tool_successes", "truncated", "answers_passed")


def read_samples(path: str | Path) -> list[EvalSample]:
    """Phase 4's per-sample file (strict: every line is a whole sample)."""
    samples = []
    for line_no, row in iter_jsonl(path):
        try:
            samples.append(EvalSample.from_row(row))
        except TypeError:
            raise DataFormatError(f"{path}:{line_no}: not a phase-4 sample row (fields missing).") from None
    return samples


def write_samples(path: str | Path, samples: Sequence[EvalSample]) -> None:
    """Write phase 4's per-sample file at once (atomic: a crash leaves the old file or the new one)."""
    write_jsonl_atomic(path, [s.to_row() for s in samples])


def fingerprint(**parts: Any) -> str:
    """A short stable key for (model, adapter, decoding settings): what makes cached samples reusable."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _file_sha256(path: Path, memo: dict[str, str]) -> str:
    """sha256 of one file's bytes; `memo` maps (real path, size, mtime, inode) to it, so a 3 GB base model is
    read once, not on every run. Any rewrite of the file changes its mtime or size and so its memo key."""
    real = path.resolve()
    info = real.stat()
    key = f"{real}|{info.st_size}|{info.st_mtime_ns}|{info.st_ino}"
    if key not in memo:
        digest = hashlib.sha256()
        with real.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        memo[key] = digest.hexdigest()
    return memo[key]


def content_digest(folder: str | Path, memo_path: Path | None = None) -> str:
    """A digest of everything in a model or adapter folder: weights, config, tokenizer, chat template.

    What the completion cache is keyed by, instead of the folder's name: replacing the weights in a folder
    (a retrained `final_model`, a re-downloaded base model) changes the key, so old completions are never
    reused for a different model. Hidden entries (`.cache`, temp files) are skipped.
    """
    folder = Path(folder)
    memo: dict[str, str] = {}
    if memo_path is not None and memo_path.is_file():
        try:
            memo = json.loads(memo_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            memo = {}
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(folder).as_posix()}\0{_file_sha256(path, memo)}\n".encode())
    if memo_path is not None:
        write_json_atomic(memo_path, memo)
    return digest.hexdigest()[:16]


def prompt_digest(prompt: str) -> str:
    """What the model actually reads for a task: the chat messages (system prompt + task prompt)."""
    return hashlib.sha256(json.dumps(build_chat_messages(prompt)).encode()).hexdigest()[:16]


def read_cache(path: Path) -> dict[tuple[str, int], CachedCompletion]:
    """Cached completions by (task_id, sample_idx). `utils.jsonl`'s policy: a torn last line is skipped (and
    regenerated), a bad middle line is an error naming file and line (delete the cache file to start over)."""
    cache: dict[tuple[str, int], CachedCompletion] = {}
    if path.is_file():
        fix = f"not a completion-cache record; delete {path} to regenerate its completions."
        for record in iter_records(path, CachedCompletion.from_row, fix):
            cache[(record.task_id, record.sample_idx)] = record
    return cache


DEFAULT_CHUNK = 8  # samples of one task per unit of work
DEFAULT_BATCH_SAMPLES = 16  # sequences per sampler call


def generate_cached(
    tasks: Sequence[Task],
    generate: Callable[..., list[list[RolloutCompletion]]],
    num_samples: int,
    *,
    cache_path: Path,
    num_visible_tests: int = 1,
    chunk: int = DEFAULT_CHUNK,
    batch_samples: int = DEFAULT_BATCH_SAMPLES,
    progress: bool = True,
    mode: str = "single",
) -> dict[tuple[str, int], CachedCompletion]:
    """Make sure every (task, sample) has a cached completion; returns them all.

    `generate(prompts, n, tasks)` returns n completions per prompt (a sampler bound to a model; the tasks are the
    prompts' own, which a multi-turn `mode`'s environment runs the shown tests of, and a single turn ignores);
    in a multi-turn mode the multi-turn fields of each record (`MULTI_TURN_FIELDS`) are cached too.
    Work is cut into units of at most `chunk` samples of one task; units of equal size (from any
    tasks: `generate` takes one n per call) are batched into one call of up to `batch_samples`
    sequences (several tasks at once keep the CPU/GPU busy; vLLM callers pass whole tasks and
    thousands of sequences), and each call's results are appended and flushed before the next call.
    """
    cache = read_cache(cache_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    prompts = {task.task_id: get_unified_prompt(task, num_visible_tests, mode=mode) for task in tasks}
    digests = {task_id: prompt_digest(prompt) for task_id, prompt in prompts.items()}
    for key in [k for k, record in cache.items() if record.prompt_sha256 != digests.get(k[0])]:
        # the task's text (or the prompt format) changed since: its old completions answer another prompt
        del cache[key]
    units = []  # (task, sample indices), each at most `chunk` long
    for task in tasks:
        indices = [i for i in range(num_samples) if (task.task_id, i) not in cache]
        units += [(task, indices[s : s + chunk]) for s in range(0, len(indices), chunk)]
    by_size: dict[int, list[tuple[Task, list[int]]]] = {}
    for unit in units:
        by_size.setdefault(len(unit[1]), []).append(unit)
    calls: list[list[tuple[Task, list[int]]]] = []
    for size, same in by_size.items():
        per_call = max(batch_samples // size, 1)
        calls += [same[i : i + per_call] for i in range(0, len(same), per_call)]
    from tqdm import tqdm

    total = sum(len(indices) for _, indices in units)
    # the bar closes before an error propagates, so the error line is not written into it
    with (
        tqdm(
            total=total, desc="generating", unit="sample", dynamic_ncols=True, disable=not (progress and units)
        ) as bar,
        JsonlAppender(cache_path) as handle,  # cuts a torn last line; one writer per cache file
    ):
        for call in calls:
            outputs = generate([prompts[task.task_id] for task, _ in call], len(call[0][1]), [task for task, _ in call])
            for (task, indices), samples in zip(call, outputs, strict=True):
                for sample_idx, sample in zip(indices, samples, strict=True):
                    record = CachedCompletion.from_sample(task.task_id, sample_idx, sample, digests[task.task_id])
                    handle.write(record.to_row())
                    cache[(task.task_id, sample_idx)] = record
            bar.update(sum(len(indices) for _, indices in call))
    return cache


def execute_samples(
    tasks: Sequence[Task],
    cache: dict[tuple[str, int], CachedCompletion],
    num_samples: int,
    pool: SandboxPool,
    include_challenge: bool = False,
) -> list[EvalSample]:
    """Parse and execute every sample; one record per sample with its code and verdict."""
    cached = [(task, cache[(task.task_id, i)]) for task in tasks for i in range(num_samples)]
    parsed = [extract_thinking_and_code_unified(record.completion, entry_point=task.fn_name) for task, record in cached]
    results = execute_many(
        [(p.code, task) for (task, _), p in zip(cached, parsed, strict=True)],
        pool,
        progress=True,
        include_challenge=include_challenge,
    )
    samples = [
        EvalSample(
            task_id=task.task_id,
            source=task.source,
            difficulty=task.difficulty,
            sample_idx=record.sample_idx,
            completion=record.completion,
            num_tokens=record.num_tokens,
            finish_reason=record.finish_reason,
            thinking=p.thinking,
            code=p.code,
            think_closed=p.think_closed,
            has_code=p.has_code,
            syntax_ok=result.compiles,  # compiled in the sandbox, never here
            passed=result.passed,
            status=result.status,
            tests_passed=result.tests_passed,
            tests_total=result.tests_total,
            pass_fraction=result.pass_fraction,
            error=result.error,
        )
        for (task, record), p, result in zip(cached, parsed, results, strict=True)
    ]
    samples = _score_leniently(cached, samples, pool, include_challenge)
    samples = _score_sanitized(cached, samples, pool, include_challenge)
    return _score_earlier_answers(tasks, cache, samples, pool, include_challenge)


def _score_leniently(
    cached: Sequence[tuple[Task, CachedCompletion]],
    samples: list[EvalSample],
    pool: SandboxPool,
    include_challenge: bool,
) -> list[EvalSample]:
    """`lenient_passed` for every sample: the strict verdict, except that a sample with no code whose thinking
    never closed is judged on the program inside that thinking (only those run again)."""
    extra = [
        (n, code)
        for n, ((task, record), sample) in enumerate(zip(cached, samples, strict=True))
        if sample.code is None and (code := lenient_code(record.completion, entry_point=task.fn_name)) is not None
    ]
    results = (
        execute_many(
            [(code, cached[n][0]) for n, code in extra],
            pool,
            include_challenge=include_challenge,
            stop_at_first_failure=True,  # only the verdict is kept: a looping program costs one test's time
        )
        if extra
        else []
    )
    lenient = {n: result.passed for (n, _), result in zip(extra, results, strict=True)}
    return [replace(s, lenient_passed=lenient.get(n, s.passed)) for n, s in enumerate(samples)]


def _score_sanitized(
    cached: Sequence[tuple[Task, CachedCompletion]],
    samples: list[EvalSample],
    pool: SandboxPool,
    include_challenge: bool,
) -> list[EvalSample]:
    """`sanitized_passed` for every sample: the verdict on the answer's program graded EvalPlus-style; only the
    samples whose sanitized program differs from the graded one run again."""
    extra = [
        (n, code)
        for n, ((task, record), sample) in enumerate(zip(cached, samples, strict=True))
        if (code := sanitized_code(record.completion, entry_point=task.fn_name)) != sample.code
    ]
    runs = [(n, code) for n, code in extra if code is not None]
    results = (
        execute_many(
            [(code, cached[n][0]) for n, code in runs],
            pool,
            include_challenge=include_challenge,
            stop_at_first_failure=True,  # only the verdict is kept
        )
        if runs
        else []
    )
    sanitized = {n: False for n, _ in extra} | {n: r.passed for (n, _), r in zip(runs, results, strict=True)}
    return [replace(s, sanitized_passed=sanitized.get(n, s.passed)) for n, s in enumerate(samples)]


def _score_earlier_answers(
    tasks: Sequence[Task],
    cache: dict[tuple[str, int], CachedCompletion],
    samples: list[EvalSample],
    pool: SandboxPool,
    include_challenge: bool,
) -> list[EvalSample]:
    """Multi-turn samples: copy the multi-turn fields and judge every answer before the last one on all tests,
    so the pass rate after each turn can be reported (`answers_passed`: one verdict per answer)."""
    by_task = {task.task_id: task for task in tasks}
    earlier = []  # (sample position, answer index, code)
    verdicts: dict[int, list[bool]] = {}
    for n, sample in enumerate(samples):
        cached = cache[(sample.task_id, sample.sample_idx)]
        if cached.num_turns is None:
            continue
        answers = cached.answers or (cached.completion,)
        verdicts[n] = [False] * (len(answers) - 1) + [sample.passed]
        fn_name = by_task[sample.task_id].fn_name
        earlier += [
            (n, i, extract_thinking_and_code_unified(a, entry_point=fn_name).code) for i, a in enumerate(answers[:-1])
        ]
    if earlier:
        results = execute_many(
            [(code, by_task[samples[n].task_id]) for n, _, code in earlier],
            pool,
            include_challenge=include_challenge,
            stop_at_first_failure=True,  # only the verdict is kept
        )
        for (n, i, _), result in zip(earlier, results, strict=True):
            verdicts[n][i] = result.passed
    out = list(samples)
    for n, answers_passed in verdicts.items():
        cached = cache[(samples[n].task_id, samples[n].sample_idx)]
        out[n] = replace(
            samples[n],
            mode=cached.mode,
            num_turns=cached.num_turns,
            tool_calls=cached.tool_calls,
            tool_successes=cached.tool_successes,
            truncated=cached.truncated,
            answers_passed=tuple(answers_passed),
        )
    return out


def _pass_table(rows: Sequence[EvalSample], ks: Sequence[int], grade: str = "strict") -> dict:
    """pass@k from one grade's verdicts: "strict" (`passed`), "lenient" or "sanitized" (each `passed` where unset)."""
    per_task: dict[str, list[bool]] = defaultdict(list)
    for row in rows:
        other = {"strict": None, "lenient": row.lenient_passed, "sanitized": row.sanitized_passed}[grade]
        verdict = row.passed if other is None else other
        per_task[row.task_id].append(bool(verdict))
    n = [len(v) for v in per_task.values()]
    c = [sum(v) for v in per_task.values()]
    return {str(k): v for k, v in pass_at_k_table(n, c, ks).items()}


def per_task_pass_at_k(rows: Sequence[EvalSample], k: int) -> dict[str, float] | None:
    """Each task's pass@k estimate from its samples (task_id -> value); None if some task has < k samples."""
    per_task: dict[str, list[bool]] = defaultdict(list)
    for row in rows:
        per_task[row.task_id].append(bool(row.passed))
    if not per_task or min(len(v) for v in per_task.values()) < k:
        return None
    ids = sorted(per_task)
    values = estimate_pass_at_k([len(per_task[t]) for t in ids], [sum(per_task[t]) for t in ids], k)
    return dict(zip(ids, values.tolist(), strict=True))


def pass_at_k_intervals(
    rows: Sequence[EvalSample], ks: Sequence[int], resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> dict[str, list[float] | None]:
    """95% bootstrap interval over tasks of each pass@k (None where pass@k is not computable)."""
    out: dict[str, list[float] | None] = {}
    for k in ks:
        per_task = per_task_pass_at_k(rows, k)
        out[str(k)] = (
            None if per_task is None else list(bootstrap_interval(list(per_task.values()), resamples, seed=seed))
        )
    return out


def summarize(rows: Sequence[EvalSample], ks: Sequence[int], resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict:
    """pass@k overall (with 95% bootstrap intervals over tasks), per source and per APPS difficulty,
    plus format and status statistics."""
    n = max(len(rows), 1)
    by_source: dict[str, list[EvalSample]] = defaultdict(list)
    by_difficulty: dict[str, list[EvalSample]] = defaultdict(list)
    for row in rows:
        by_source[row.source].append(row)
        if row.source == "apps":
            by_difficulty[row.difficulty].append(row)
    table = _pass_table(rows, ks)
    return {
        "num_tasks": len({r.task_id for r in rows}),
        # per task (the fewest any task has: pass@k is computable up to it) and in all
        "num_samples_per_task": min(Counter(r.task_id for r in rows).values(), default=0),
        "num_samples_total": len(rows),
        "pass_at_k": table,
        "pass_at_k_ci95": pass_at_k_intervals(rows, ks, resamples, seed),
        "not_computable_k": [int(k) for k, v in table.items() if v is None],
        # code inside an unclosed thinking counted: beside the strict table, a format failure shows as one
        "pass_at_k_lenient": _pass_table(rows, ks, grade="lenient"),
        # the answer's program graded EvalPlus-style: beside the strict table, what the answer's wrapping costs
        "pass_at_k_sanitized": _pass_table(rows, ks, grade="sanitized"),
        "pass_at_k_by_source": {s: _pass_table(r, ks) for s, r in sorted(by_source.items())},
        "pass_at_k_by_difficulty": {d: _pass_table(r, ks) for d, r in sorted(by_difficulty.items())},
        "mean_pass_fraction": sum(r.pass_fraction for r in rows) / n,
        "format": {
            "closed_thinking": sum(r.think_closed for r in rows) / n,
            "extractable_code": sum(r.has_code for r in rows) / n,
            "valid_python": sum(r.syntax_ok for r in rows) / n,
            "truncated": sum(r.finish_reason == "length" for r in rows) / n,
            "no_code": sum(not r.has_code for r in rows) / n,
        },
        "mean_completion_tokens": sum(r.num_tokens for r in rows) / n,
        "status_counts": dict(Counter(r.status for r in rows).most_common()),
        "multi_turn": _multi_turn_summary(rows),
    }


def _multi_turn_summary(rows: Sequence[EvalSample]) -> dict | None:
    """Pass rate after each turn and tool-call statistics (None for single-turn rows)."""
    turns = [r for r in rows if r.answers_passed is not None]
    if not turns:
        return None
    most = max(len(r.answers_passed or ()) for r in turns)
    return {
        "mode": turns[0].mode,
        "pass_rate_by_turn": pass_rate_by_turn(turns, most),
        "mean_turns": sum(r.num_turns if r.num_turns is not None else 1 for r in turns) / len(turns),
        **tool_statistics(turns),
    }


def pass_rate_by_turn(rows: Sequence[EvalSample], max_turns: int) -> dict[str, float]:
    """Share of phase 4's judged samples whose answer after turn t passes all tests, t = 1..max_turns. A
    sample that stopped earlier keeps its last answer (`answers_passed`: one verdict per answer it gave)."""
    out = {}
    for turn in range(1, max_turns + 1):
        verdicts = [r.answers_passed[min(turn, len(r.answers_passed)) - 1] for r in rows if r.answers_passed]
        out[str(turn)] = sum(verdicts) / len(verdicts) if verdicts else 0.0
    return out


def tool_statistics(rows: Sequence[EvalSample]) -> dict[str, float]:
    """How much the samples use the tool: calls per sample, share of samples with a call, calls that ran
    without error, share of samples truncated by a limit (a field a sample does not have counts as 0)."""
    n = max(len(rows), 1)
    calls = sum(r.tool_calls or 0 for r in rows)
    return {
        "calls_per_sample": calls / n,
        "samples_with_a_call": sum((r.tool_calls or 0) > 0 for r in rows) / n,
        "successful_call_share": sum(r.tool_successes or 0 for r in rows) / max(calls, 1),
        "truncated": sum(bool(r.truncated) for r in rows) / n,
    }


def format_multi_turn(summary: dict) -> str:
    """The multi-turn lines printed under the pass@k table."""
    mt = summary.get("multi_turn")
    if not mt:
        return ""
    by_turn = ", ".join(f"turn {t}: {v:.1%}" for t, v in mt["pass_rate_by_turn"].items())
    text = (
        f"pass rate after each turn: {by_turn}; mean turns {mt['mean_turns']:.2f}; truncated by a limit "
        f"{mt['truncated']:.1%}"
    )
    if mt.get("mode") == "tool":
        text += (
            f"\ntool calls per sample {mt['calls_per_sample']:.2f} (samples with a call "
            f"{mt['samples_with_a_call']:.1%}, calls without error {mt['successful_call_share']:.1%})"
        )
    return text


def delta(trained: dict, baseline: dict) -> dict:
    """trained - baseline per k (None where either is not computable)."""
    out = {}
    for k, value in trained["pass_at_k"].items():
        base = baseline["pass_at_k"].get(k)
        out[k] = None if value is None or base is None else value - base
    return out


def delta_intervals(
    trained_rows: Sequence[EvalSample],
    baseline_rows: Sequence[EvalSample],
    ks: Sequence[int],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, list[float] | None]:
    """Paired 95% bootstrap interval of trained - baseline per k: the same tasks resampled for both."""
    out: dict[str, list[float] | None] = {}
    for k in ks:
        trained, base = per_task_pass_at_k(trained_rows, k), per_task_pass_at_k(baseline_rows, k)
        if trained is None or base is None:
            out[str(k)] = None
            continue
        if set(trained) != set(base):
            raise ValueError("trained and baseline were evaluated on different tasks; a paired interval needs the same")
        ids = sorted(trained)
        out[str(k)] = list(
            paired_bootstrap_interval([trained[t] for t in ids], [base[t] for t in ids], resamples, seed=seed)
        )
    return out


def decoding_label(temperature: float, top_p: float, num_samples: int) -> str:
    """How the samples were drawn, as printed with every table: greedy pass@1 is not sampled pass@1."""
    if temperature == 0:
        return "greedy, 1 sample per task" if num_samples == 1 else f"greedy, {num_samples} identical samples per task"
    return f"sampled at temperature {temperature:g}, top_p {top_p:g}, {num_samples} samples per task"


def _interval_text(interval: list[float] | None) -> str:
    return f"  95% CI [{interval[0]:.4f}, {interval[1]:.4f}]" if interval else ""


def format_table(summary: dict, title: str = "Pass@k Results") -> str:
    lines = ["=" * 70, f"{title}:", "=" * 70]
    intervals = summary.get("pass_at_k_ci95", {})
    for k, value in summary["pass_at_k"].items():
        lines.append(
            f"pass@{int(k):3d}: "
            + (
                f"{value:.4f} ({value:.2%})" + _interval_text(intervals.get(k))
                if value is not None
                else f"not computable (needs >= {k} samples per task)"
            )
        )
    lines.append("=" * 70)
    return "\n".join(lines)


def format_delta(deltas: dict, intervals: dict) -> str:
    """`pass@1 +0.0125  95% CI [-0.01, +0.04] (paired over tasks)` per k."""
    lines = ["Delta (trained - baseline), paired bootstrap over tasks:"]
    for k, value in deltas.items():
        interval = intervals.get(k)
        if value is None:
            lines.append(f"  pass@{int(k):3d}: n/a")
        else:
            ci = f"  95% CI [{interval[0]:+.4f}, {interval[1]:+.4f}]" if interval else ""
            lines.append(f"  pass@{int(k):3d}: {value:+.4f}{ci}")
    return "\n".join(lines)
