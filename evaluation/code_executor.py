"""The one sandbox: run untrusted model code against a task's tests and return a structured verdict.

Phases 2, 3 and 4 and the preflight all call `execute_program` / `execute_many` here.

How a verdict is made (see `evaluation/sandbox_worker.py` for the isolation itself):
1. The tests of a task are *planned* in this (trusted) process. Expected values stay here:
   - stdin tests: the worker gets only the input text; stdout comes back and is compared here;
   - call tests (APPS ``fn_name``): the worker gets the arguments; the return value comes back
     encoded as plain data and is compared here (tuples become lists, a one-element-list
     expected value is also accepted, as the APPS harness does);
   - assert tests (MBPP): ``assert f(x) == EXPECTED`` is split; the worker evaluates ``f(x)``
     and returns its value, and EXPECTED is evaluated here by a literal-only evaluator. Forms
     handled this way: ``==``, ``!=``, ``in``, ``not in``, ``is True/False/None``, ``not X``,
     a bare ``X`` (truthiness) and ``math.isclose(X, EXPECTED, ...)``. An assert whose expected
     side is not a literal (e.g. it builds objects of the solution's own classes) runs whole
     inside the child, whose report a hostile program could forge: `plan_assert` marks these
     ``trusted=False`` and the share on real MBPP is measured in tests/test_code_executor.py.
2. Programs run in pre-started worker processes that never see expected values and fork a fresh
   child per program (per test for stdin), so a child has no secret to read and nothing it prints,
   returns or patches can turn into a pass by itself.
3. Statuses: passed, wrong_answer, runtime_error, syntax_error, timeout, memory_limit,
   output_limit, no_code, sandbox_error. `sandbox_error` means the harness failed, not the
   program; rewards treat it as "no signal" (None), never as wrong.

Output comparison for stdin tests (`stdout_matches`): both texts are split into whitespace-
separated tokens; the token sequences must have the same length and each pair must be equal as
strings or, when both parse as numbers, equal within rel 1e-5 / abs 1e-8 (numpy.allclose's
defaults, as the APPS harness uses). This ignores trailing spaces, trailing newlines, blank lines
and line breaks, like the APPS harness. It is **stricter** than the APPS harness in one place: the
APPS harness finally compares *sets* of tokens, which ignores order and duplicates and so accepts
some wrong answers (e.g. "2 1" for "1 2"); here order and multiplicity count.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import json
import math
import os
import queue
import selectors
import site
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evaluation import sandbox_worker as protocol
from utils.code_parser import check_syntax, parse_quietly
from utils.dataset_loader import Task
from utils.thinking_extraction import extract_thinking_and_code_unified

PROJECT_ROOT = Path(__file__).resolve().parent.parent
WORKER_SCRIPT = Path(protocol.__file__).resolve()
STATUSES = ("passed", "wrong_answer", "runtime_error", "syntax_error", "timeout", "memory_limit", "output_limit",
            "no_code", "sandbox_error")
PRELOAD = ("collections", "itertools", "functools", "heapq", "bisect", "math", "re", "string", "typing", "fractions",
           "decimal", "random", "statistics", "operator", "copy", "datetime", "array", "queue", "json", "ctypes",
           "cmath", "textwrap", "unicodedata", "calendar", "enum", "dataclasses", "threading", "io", "shutil",
           "subprocess", "traceback", "base64", "struct", "hashlib", "time")
MAX_CODE_BYTES = 200_000


def extract_function_from_code(response: str | None, reasoning: str | None = None) -> str | None:
    """Clean code from a full response: thinking and fences removed (the unified extraction).

    Returns None when the response has no code outside its thinking.
    """
    return extract_thinking_and_code_unified(response, reasoning)["code"]


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class TestOutcome:
    passed: bool
    status: str  # a STATUSES value other than syntax_error/no_code
    error: str | None = None
    time: float = 0.0


@dataclass
class ExecutionResult:
    passed: bool
    tests_passed: int
    tests_total: int
    status: str
    error: str | None = None
    wall_time: float = 0.0
    test_outcomes: list[TestOutcome] = field(default_factory=list)
    sample_id: str | None = None  # the caller's id, for matching results of a batch

    @property
    def pass_fraction(self) -> float:
        return self.tests_passed / self.tests_total if self.tests_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pass_fraction"] = self.pass_fraction
        return out


@dataclass(frozen=True)
class SandboxLimits:
    test_timeout: float = 4.0  # seconds per test (APPS harness: 4)
    program_timeout: float | None = None  # seconds for the whole program; None: tests * test_timeout + 2, capped at 60
    memory_mb: int = 1024  # address space added on top of the interpreter's own
    file_size_mb: int = 16
    max_processes: int = 32  # threads count too
    output_bytes: int = 1 << 22  # cap on captured stdout/stderr per test

    @classmethod
    def from_config(cls, sandbox: Any) -> SandboxLimits:
        """From a config.SandboxConfig section."""
        return cls(test_timeout=sandbox.timeout_per_test, memory_mb=sandbox.memory_limit_mb)

    def total_for(self, n_tests: int) -> float:
        if self.program_timeout is not None:
            return self.program_timeout
        return min(n_tests * self.test_timeout + 2.0, 60.0)


# --------------------------------------------------------------------------------------------
# Planning tests (trusted side)
# --------------------------------------------------------------------------------------------

_SAFE_CALLS = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "dict": dict, "float": float,
               "int": int, "str": str, "sorted": sorted, "abs": abs, "bool": bool}


class NotLiteral(ValueError):
    pass


def safe_literal(node: ast.AST) -> Any:
    """Evaluate an expected-value expression made only of literals and a few pure constructors."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _SAFE_CALLS and not node.keywords:
        args = [safe_literal(a) for a in node.args]
        try:
            return _SAFE_CALLS[node.func.id](*args)
        except (TypeError, ValueError) as exc:
            raise NotLiteral(str(exc)) from None
    raise NotLiteral(ast.dump(node)[:80])


@dataclass(frozen=True)
class AssertPlan:
    worker_test: dict  # what the worker runs: {"kind": "expr"|"exec", "src": ...}
    check: str  # eq, ne, in, not_in, is, truthy, falsy, isclose, exec_ok
    expected: Any = None
    tolerance: tuple[float, float] = (1e-9, 0.0)
    trusted: bool = True  # False: the verdict comes from inside the child (forgeable)


def plan_assert(source: str) -> AssertPlan:
    """Split an assert statement into the part the child evaluates and the check done here."""
    fallback = AssertPlan({"kind": "exec", "src": source}, "exec_ok", trusted=False)
    try:
        tree = parse_quietly(source.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return fallback
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return fallback
    test = tree.body[0].test

    def expr(node: ast.AST) -> dict:
        return {"kind": "expr", "src": ast.unparse(node)}

    try:
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if isinstance(op, (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant) and right.value in (True, False, None):
                return AssertPlan(expr(left), "is" if isinstance(op, ast.Is) else "is_not", right.value)
            names = {ast.Eq: "eq", ast.NotEq: "ne", ast.In: "in", ast.NotIn: "not_in"}
            if type(op) in names:
                try:
                    return AssertPlan(expr(left), names[type(op)], safe_literal(right))
                except NotLiteral:
                    if isinstance(op, (ast.Eq, ast.NotEq)):  # `assert 3 == f(x)`
                        return AssertPlan(expr(right), names[type(op)], safe_literal(left))
                    raise
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return AssertPlan(expr(test.operand), "falsy")
        if isinstance(test, ast.Call) and _is_isclose(test.func) and len(test.args) == 2:
            kwargs = {k.arg: safe_literal(k.value) for k in test.keywords}
            rel, abs_ = float(kwargs.pop("rel_tol", 1e-9)), float(kwargs.pop("abs_tol", 0.0))
            if kwargs:
                return fallback
            return AssertPlan(expr(test.args[0]), "isclose", safe_literal(test.args[1]), (rel, abs_))
        if isinstance(test, (ast.Call, ast.Name, ast.Attribute, ast.Subscript, ast.BoolOp)):
            return AssertPlan(expr(test), "truthy")
    except NotLiteral:
        return fallback
    return fallback


def _is_isclose(func: ast.AST) -> bool:
    return (isinstance(func, ast.Name) and func.id == "isclose") or (
        isinstance(func, ast.Attribute) and func.attr == "isclose" and isinstance(func.value, ast.Name)
        and func.value.id in ("math", "cmath"))


def check_value(plan: AssertPlan, actual: Any) -> bool:
    """Apply a planned check to a decoded (plain data) value."""
    c, e = plan.check, plan.expected
    if c == "eq":
        return _equal(actual, e)
    if c == "ne":
        return not isinstance(actual, protocol.Opaque) and not _equal(actual, e)
    if c in ("in", "not_in"):
        try:
            inside = any(_equal(actual, item) for item in e) if not isinstance(e, (str, bytes)) else (
                isinstance(actual, type(e)) and actual in e)
        except TypeError:
            return False
        return inside if c == "in" else not inside and not isinstance(actual, protocol.Opaque)
    if c == "is":
        return actual is e
    if c == "is_not":
        return actual is not e and not isinstance(actual, protocol.Opaque)
    if c == "truthy":
        return bool(actual)
    if c == "falsy":
        return not bool(actual) and not isinstance(actual, protocol.Opaque)
    if c == "isclose":
        numeric = (int, float)
        return (isinstance(actual, numeric) and not isinstance(actual, bool) and isinstance(e, numeric)
                and math.isclose(actual, e, rel_tol=plan.tolerance[0], abs_tol=plan.tolerance[1]))
    if c == "exec_ok":
        return actual is True
    raise ValueError(f"unknown check {c}")


def _equal(actual: Any, expected: Any) -> bool:
    """Python equality on plain decoded data (no user __eq__ can run here)."""
    try:
        return bool(actual == expected)
    except (TypeError, ValueError, RecursionError):
        return False


def _normalize_call_value(value: Any) -> Any:
    """APPS call-mode normalization: tuples become lists, dict keys become strings (JSON)."""
    if isinstance(value, (list, tuple)):
        return [_normalize_call_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: _normalize_call_value(v) for k, v in value.items()}
    return value


def call_output_matches(actual: Any, expected: Any) -> bool:
    """APPS call-based rule: out == exp, or out == exp[0] when exp is a one-element list."""
    actual = _normalize_call_value(actual)
    expected = _normalize_call_value(expected)
    if _equal(actual, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _equal(actual, expected[0])


def _as_number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if not math.isnan(value) else None


def stdout_matches(actual: str, expected: str, rel_tol: float = 1e-5, abs_tol: float = 1e-8) -> bool:
    """Token-wise comparison with numeric tolerance (see the module docstring)."""
    got, want = actual.split(), expected.split()
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if a == b:
            continue
        x, y = _as_number(a), _as_number(b)
        if x is None or y is None or not math.isclose(x, y, rel_tol=rel_tol, abs_tol=abs_tol):
            return False
    return True


@dataclass
class PlannedTests:
    job: dict  # sent to the worker (inputs only)
    expectations: list  # kept here: expected stdout, expected call value, or AssertPlan

    @property
    def total(self) -> int:
        return len(self.expectations)


def plan_tests(task: Task, include_challenge: bool = False) -> PlannedTests:
    if task.test_type == "stdin":
        return PlannedTests({"mode": "stdin", "inputs": [t["input"] for t in task.tests]}, [t["output"] for t in task.tests])
    if task.test_type == "call":
        tests = [{"kind": "call", "args": json.dumps(t["input"])} for t in task.tests]
        return PlannedTests({"mode": "calls", "tests": tests, "fn_name": task.fn_name, "prelude": True},
                            [t["output"] for t in task.tests])
    asserts = list(task.tests) + (list(task.challenge_tests) if include_challenge else [])
    plans = [plan_assert(a) for a in asserts]
    return PlannedTests(
        {"mode": "calls", "tests": [p.worker_test for p in plans], "imports": "\n".join(task.test_imports),
         "setup": task.test_setup_code, "prelude": False},
        plans,
    )


# --------------------------------------------------------------------------------------------
# The worker pool
# --------------------------------------------------------------------------------------------


class SandboxError(RuntimeError):
    """The harness itself failed (not the program)."""


def _secret_paths(extra: Sequence[str | os.PathLike] = ()) -> list[str]:
    """Folders a program must not read: home folders, the project (and its siblings), the caches."""
    system = {"/", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/dev", "/sys", "/var", "/opt"}
    candidates = ["/root", "/home", str(PROJECT_ROOT)]
    if str(PROJECT_ROOT.parent) not in system:
        candidates.append(str(PROJECT_ROOT.parent))
    for var in ("HF_HOME", "TGRPO_CACHE_DIR", "XDG_CACHE_HOME"):
        if os.environ.get(var):
            candidates.append(os.environ[var])
    candidates += [str(p) for p in extra]
    return [c for c in dict.fromkeys(os.path.realpath(c) for c in candidates) if c not in system]


def _python_paths() -> list[str]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(site.getsitepackages())
    return sorted(p for p in paths if p)


class _Worker:
    def __init__(self, init: dict) -> None:
        to_worker_r, self._to_worker = os.pipe()
        self._from_worker, from_worker_w = os.pipe()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", "LANG": "C.UTF-8"}
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(WORKER_SCRIPT), str(to_worker_r), str(from_worker_w)],
            pass_fds=(to_worker_r, from_worker_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
            cwd="/",
        )
        os.close(to_worker_r)
        os.close(from_worker_w)
        protocol.write_message(self._to_worker, init)
        ready = self._receive(60.0)
        if not isinstance(ready, dict) or ready.get("k") != "ready":
            self.close()
            raise SandboxError(f"sandbox worker failed to start: {ready!r}")
        self.info = ready

    def _receive(self, timeout: float) -> Any:
        with selectors.DefaultSelector() as selector:
            selector.register(self._from_worker, selectors.EVENT_READ)
            if not selector.select(timeout):
                raise SandboxError(f"sandbox worker did not answer within {timeout:.0f} s")
        message = protocol.read_message(self._from_worker)
        if message is None:
            raise SandboxError(f"sandbox worker exited (code {self.process.poll()})")
        return message

    def run(self, job: dict, timeout: float) -> dict:
        protocol.write_message(self._to_worker, job)
        return self._receive(timeout)

    def close(self) -> None:
        for fd in (self._to_worker, self._from_worker):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class SandboxPool:
    """A fixed set of sandbox workers; `run` borrows one per program (thread-safe)."""

    def __init__(self, workers: int = 0, limits: SandboxLimits | None = None, isolate: bool = True,
                 secret_paths: Sequence[str | os.PathLike] = ()) -> None:
        self.size = workers or os.cpu_count() or 1
        self.limits = limits or SandboxLimits()
        self._init = {"isolate": isolate, "hide": _secret_paths(secret_paths), "keep": _python_paths(),
                      "preload": list(PRELOAD), "uid_base": 200000, "tmp_size_mb": 512}
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(self.size):
            self._spawn()
        self.isolation = self._all[0].info.get("isolation", "basic")

    def _spawn(self) -> None:
        worker = _Worker(self._init)
        with self._lock:
            self._all.append(worker)
        self._idle.put(worker)

    def run(self, job: dict) -> dict:
        if self._closed:
            raise SandboxError("sandbox pool is closed")
        worker = self._idle.get()
        budget = job["limits"]["total_timeout"] * 1.5 + 30.0  # the worker enforces the real limits
        try:
            result = worker.run(job, budget)
        except (SandboxError, OSError, ValueError) as exc:
            with self._lock:
                self._all.remove(worker)
            worker.close()
            if not self._closed:
                self._spawn()
            raise SandboxError(str(exc)) from exc
        self._idle.put(worker)
        return result

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers, self._all = self._all, []
        for worker in workers:
            worker.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default_pool: SandboxPool | None = None
_default_lock = threading.Lock()


def default_pool() -> SandboxPool:
    """A process-wide pool (one worker per core), started on first use and closed at exit."""
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool._closed:
            _default_pool = SandboxPool()
            atexit.register(_default_pool.close)
        return _default_pool


# --------------------------------------------------------------------------------------------
# Judging
# --------------------------------------------------------------------------------------------


def _classify_error(error_type: str | None, message: str | None) -> str:
    text = f"{error_type or ''} {message or ''}"
    if "MemoryError" in text:
        return "memory_limit"
    if "File too large" in text:  # RLIMIT_FSIZE (Python ignores SIGXFSZ, so the write fails instead)
        return "output_limit"
    return "runtime_error"


def _signal_status(sig: int | None) -> str:
    import signal as _signal

    if sig == _signal.SIGXCPU:
        return "timeout"
    if sig == _signal.SIGXFSZ:
        return "output_limit"
    return "runtime_error"


def _setup_failure(raw: dict, n: int) -> list[TestOutcome] | None:
    """Every test fails the same way when the program could not even start its first test."""
    err = raw.get("setup_error")
    if not err:
        return None
    status = {"Timeout": "timeout", "OutputLimit": "output_limit"}.get(err["type"], _classify_error(err["type"], err["msg"]))
    return [TestOutcome(False, status, f"{err['type']} during {err['phase']}: {err['msg']}") for _ in range(n)]


def _judge_stdin(raw: dict, expected: list[str]) -> list[TestOutcome]:
    failed = _setup_failure(raw, len(expected))
    if failed:
        return failed
    outcomes = []
    for test, want in zip(raw["tests"], expected, strict=True):
        status, t, error = test.get("status"), test.get("time", 0.0), test.get("error")
        if status in ("timeout", "output_limit"):
            outcomes.append(TestOutcome(False, status, error or status.replace("_", " "), t))
        elif status == "not_run":
            outcomes.append(TestOutcome(False, "runtime_error", "test did not run", t))
        elif status == "crashed" and test.get("signal") is not None:
            outcomes.append(TestOutcome(False, _signal_status(test["signal"]), error, t))
        elif test.get("exit_code") != 0:  # includes a crash by os._exit(n != 0) during the test
            outcomes.append(TestOutcome(False, _classify_error(None, error), error or f"exit code {test.get('exit_code')}", t))
        elif stdout_matches(test.get("stdout", ""), want):
            outcomes.append(TestOutcome(True, "passed", None, t))
        else:
            got = test.get("stdout", "")
            outcomes.append(TestOutcome(False, "wrong_answer", f"expected {want[:60]!r}, got {got[:60]!r}", t))
    return outcomes


def _judge_calls(raw: dict, expectations: list, mode_is_call: bool) -> list[TestOutcome]:
    failed = _setup_failure(raw, len(expectations))
    if failed:
        return failed
    outcomes = []
    for test, expectation in zip(raw["tests"], expectations, strict=True):
        t = test.get("time", 0.0)
        status = test.get("status")
        if status == "ok":
            actual = protocol.decode_value(test.get("value"))
            ok = call_output_matches(actual, expectation) if mode_is_call else check_value(expectation, actual)
            outcomes.append(TestOutcome(ok, "passed" if ok else "wrong_answer",
                                        None if ok else f"got {actual!r}"[:200], t))
        elif status == "error":
            kind = test.get("type", "Error")
            is_assert = kind == "AssertionError"
            outcomes.append(TestOutcome(False, "wrong_answer" if is_assert else _classify_error(kind, test.get("error")),
                                        f"{kind}: {test.get('error', '')}"[:300], t))
        elif status in ("timeout", "output_limit"):
            outcomes.append(TestOutcome(False, status, test.get("error"), t))
        elif status == "crashed":
            outcomes.append(TestOutcome(False, _signal_status(test.get("signal")) if test.get("signal") else "runtime_error",
                                        test.get("error"), t))
        else:  # not_run
            outcomes.append(TestOutcome(False, "runtime_error", "test did not run", t))
    return outcomes


def _summarize(outcomes: list[TestOutcome], wall: float, sample_id: str | None) -> ExecutionResult:
    n_pass = sum(o.passed for o in outcomes)
    failed = [o for o in outcomes if not o.passed]
    if not failed:
        return ExecutionResult(True, n_pass, len(outcomes), "passed", None, wall, outcomes, sample_id)
    first = failed[0]
    return ExecutionResult(False, n_pass, len(outcomes), first.status, first.error, wall, outcomes, sample_id)


def execute_program(code: str | None, task: Task, limits: SandboxLimits | None = None, pool: SandboxPool | None = None,
                    sample_id: str | None = None, include_challenge: bool = False,
                    planned: PlannedTests | None = None) -> ExecutionResult:
    """Run one program against one task's tests in the sandbox and judge it.

    `planned` may pass `plan_tests(task, include_challenge)` computed once for many samples.
    """
    start = time.monotonic()
    planned = planned or plan_tests(task, include_challenge)
    n = planned.total
    if not code or not code.strip():
        return ExecutionResult(False, 0, n, "no_code", "no code was extracted", 0.0,
                               [TestOutcome(False, "no_code") for _ in range(n)], sample_id)
    if len(code.encode("utf-8", errors="replace")) > MAX_CODE_BYTES:
        return ExecutionResult(False, 0, n, "syntax_error", f"program longer than {MAX_CODE_BYTES} bytes", 0.0,
                               [TestOutcome(False, "runtime_error") for _ in range(n)], sample_id)
    ok, syntax_error = check_syntax(code)  # compile only: nothing runs here
    if not ok and task.test_type == "stdin" and any(e in (syntax_error or "") for e in _WRAPPABLE_ERRORS):
        wrapped = wrap_like_apps(code)
        if check_syntax(wrapped)[0]:
            code, ok = wrapped, True
    if not ok:
        return ExecutionResult(False, 0, n, "syntax_error", syntax_error, time.monotonic() - start,
                               [TestOutcome(False, "runtime_error", syntax_error) for _ in range(n)], sample_id)
    pool = pool or default_pool()
    limits = limits or pool.limits
    job = dict(planned.job, code=code, id=sample_id, limits={
        "test_timeout": limits.test_timeout, "total_timeout": limits.total_for(n), "memory_mb": limits.memory_mb,
        "file_size_mb": limits.file_size_mb, "max_processes": limits.max_processes, "output_bytes": limits.output_bytes})
    try:
        raw = pool.run(job)
    except SandboxError as exc:
        return _sandbox_failure(str(exc), n, start, sample_id)
    if raw.get("sandbox_error"):
        return _sandbox_failure(raw["sandbox_error"], n, start, sample_id)
    if planned.job["mode"] == "stdin":
        outcomes = _judge_stdin(raw, planned.expectations)
    else:
        outcomes = _judge_calls(raw, planned.expectations, task.test_type == "call")
    return _summarize(outcomes, time.monotonic() - start, sample_id)


_WRAPPABLE_ERRORS = ("'return' outside function", "no binding for nonlocal", "nonlocal declaration not allowed at module level")


def wrap_like_apps(code: str) -> str:
    """Put a stdin program inside a function, as the APPS harness does for every program.

    Only used when the program does not compile as a module because of a construct that is legal
    inside a function (top-level `return`, module-level `nonlocal`); import lines are hoisted,
    since `from x import *` is not allowed inside a function.
    """
    imports, body = [], []
    for line in code.replace("\r\n", "\n").split("\n"):
        if line.startswith(("import ", "from ")) and not line.rstrip().endswith(("(", "\\")):
            imports.append(line)
        else:
            body.append("\t" + line if line.strip() else line)
    return "\n".join(imports + ["def __apps_main__():", *body, "\tpass", "__apps_main__()"])


def _sandbox_failure(message: str, n: int, start: float, sample_id: str | None) -> ExecutionResult:
    return ExecutionResult(False, 0, n, "sandbox_error", message[:500], time.monotonic() - start,
                           [TestOutcome(False, "sandbox_error", message[:200]) for _ in range(n)], sample_id)


def execute_many(items: Iterable[tuple[str | None, Task]], pool: SandboxPool | None = None,
                 limits: SandboxLimits | None = None, sample_ids: Sequence[str] | None = None,
                 progress: bool = False, include_challenge: bool = False) -> list[ExecutionResult]:
    """Execute (code, task) pairs on all workers of the pool; results come back in input order."""
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
        result = execute_program(code, task, limits, pool, ids[index], include_challenge, plans[id(task)])
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


def _main(argv: list[str] | None = None) -> int:
    from utils.dataset_loader import DataFormatError, read_tasks
    from utils.jsonl import iter_jsonl, write_jsonl_atomic

    parser = argparse.ArgumentParser(
        prog="python -m evaluation.code_executor",
        description="Execute model samples against their tasks' tests in the sandbox and write one verdict per sample.",
    )
    parser.add_argument("--tasks", required=True, help="Task file (JSONL task records, e.g. data/val.jsonl).")
    parser.add_argument("--samples", required=True, help="JSONL with task_id and either 'completion' (a raw model "
                        "response; extraction applies) or 'code' per line.")
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
        task = tasks.get(sample.get("task_id"))
        if task is None:
            print(f"error: {args.samples}:{line_no}: task_id {sample.get('task_id')!r} is not in {args.tasks}.", file=sys.stderr)
            return 1
        code = sample["code"] if "code" in sample else extract_function_from_code(sample.get("completion"))
        items.append((code, task))
        ids.append(str(sample.get("sample_id", line_no)))
    limits = SandboxLimits(test_timeout=args.timeout, memory_mb=args.memory_mb)
    with SandboxPool(args.workers, limits, secret_paths=[args.tasks]) as pool:
        print(f"sandbox: {pool.size} workers, isolation={pool.isolation}", file=sys.stderr)
        start = time.monotonic()
        results = execute_many(items, pool, limits, ids, progress=True, include_challenge=args.include_challenge)
        elapsed = time.monotonic() - start
    rows = [{"task_id": sample["task_id"], **result.to_dict()} for (_, sample), result in zip(samples, results, strict=True)]
    write_jsonl_atomic(args.output, rows)
    counts = Counter(r.status for r in results)
    passed = counts.get("passed", 0)
    print(f"{len(results)} samples in {elapsed:.1f} s ({len(results) / max(elapsed, 1e-9):.1f}/s): {passed} passed "
          f"({passed / max(len(results), 1):.1%})")
    for status in STATUSES:
        if counts.get(status):
            print(f"  {status:14s} {counts[status]}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
