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
import re
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


def plan_assert(source: str, shadowed: frozenset[str] = frozenset()) -> AssertPlan:
    """Split an assert statement into the part the child evaluates and the check done here.

    The child only ever evaluates expressions that produce the program's values, never a
    comparison: an expression sent to the child that contains a comparison, `and`/`or` or `not`
    would let an object of the program decide the verdict. Simple shapes (`f(x) == LITERAL` ...)
    become one check; compound ones (`A and B`, `(X == Y) is True`, `not (X != Y)`, `sorted(f(x))
    == [...]`) become a "tree": the child returns the values of the leaves and the boolean
    structure is evaluated here on plain data (`_TreeEvaluator`). Only an assert whose leaves would
    still compare inside the child (e.g. `all(f(x) == y for ...)`) runs whole in the child and is
    marked untrusted. `shadowed`: names the program defines (its function), which must not be
    taken for the builtins of the same name.
    """
    fallback = AssertPlan({"kind": "exec", "src": source}, "exec_ok", trusted=False)
    try:
        tree = parse_quietly(source.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return fallback
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return fallback
    test = tree.body[0].test

    def expr(node: ast.AST) -> dict:
        if _compares(node):
            raise NotLiteral("a comparison would run in the child")
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
        if isinstance(test, (ast.Call, ast.Name, ast.Attribute, ast.Subscript)):
            return AssertPlan(expr(test), "truthy")
    except NotLiteral:
        pass
    return _plan_tree(test, shadowed) or fallback


def _compares(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Compare, ast.BoolOp)) or (isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not))
               for n in ast.walk(node))


_TREE_CALLS = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "dict": dict, "float": float,
               "int": int, "str": str, "sorted": sorted, "abs": abs, "bool": bool, "len": len, "round": round,
               "sum": sum, "min": min, "max": max, "all": all, "any": any}
_TREE_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
                ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}
_TREE_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
                 ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
                 ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b, ast.In: lambda a, b: a in b,
                 ast.NotIn: lambda a, b: a not in b}
_LEAF = "__leaf_"


def _plan_tree(test: ast.AST, shadowed: frozenset[str]) -> AssertPlan | None:
    """Replace every maximal sub-expression this process cannot evaluate by a leaf the child computes."""
    leaves: list[str] = []

    def evaluable(node: ast.AST) -> bool:
        if isinstance(node, (ast.BoolOp, ast.Compare, ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict)):
            return True
        if isinstance(node, ast.UnaryOp):
            return isinstance(node.op, (ast.Not, ast.USub, ast.UAdd))
        if isinstance(node, ast.BinOp):
            return type(node.op) in _TREE_BINOPS
        if isinstance(node, ast.Subscript):
            return True
        if isinstance(node, ast.Slice):
            return True
        if isinstance(node, ast.Call):
            return (isinstance(node.func, ast.Name) and node.func.id in _TREE_CALLS and node.func.id not in shadowed
                    and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args)) or (
                _is_isclose(node.func) and len(node.args) == 2 and all(k.arg in ("rel_tol", "abs_tol") for k in node.keywords))
        return False

    class Splitter(ast.NodeTransformer):
        def generic_visit(self, node: ast.AST) -> ast.AST:
            if isinstance(node, ast.expr) and not evaluable(node):
                if _compares(node):
                    raise NotLiteral("a comparison inside a leaf")
                leaves.append(ast.unparse(node))
                return ast.Name(id=f"{_LEAF}{len(leaves) - 1}", ctx=ast.Load())
            if isinstance(node, ast.Call):  # the callee is resolved here, not evaluated as a leaf
                node.args = [self.visit(a) for a in node.args]
                for keyword in node.keywords:
                    keyword.value = self.visit(keyword.value)
                return node
            return super().generic_visit(node)

    try:
        skeleton = Splitter().visit(ast.parse(ast.unparse(test), mode="eval").body)
    except (NotLiteral, SyntaxError, RecursionError):
        return None
    # A comparison of two values the child computes (`f(x) == sys.getsizeof(x)`, `f(r) == Node(1)`)
    # has no expected side here; such an assert keeps running whole in the child, marked untrusted.
    trusted = all(not (_has_leaf(a) and _has_leaf(b))
                  for node in ast.walk(skeleton) if isinstance(node, ast.Compare)
                  for a, b in zip([node.left, *node.comparators[:-1]], node.comparators, strict=True))
    if not trusted:
        return None
    return AssertPlan({"kind": "expr", "src": "(" + "".join(f"{leaf}, " for leaf in leaves) + ")"}, "tree",
                      (skeleton, len(leaves)))


def _has_leaf(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id.startswith(_LEAF) for n in ast.walk(node))


class _TreeEvaluator:
    """Evaluates a planned assert skeleton on plain decoded data (no object of the program exists here)."""

    MAX_ITEMS = 1_000_000

    def __init__(self, leaves: tuple) -> None:
        self.leaves = leaves

    def eval(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Name):
            return self.leaves[int(node.id[len(_LEAF):])]
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [self.eval(e) for e in node.elts]
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            return {self.eval(k): self.eval(v) for k, v in zip(node.keys, node.values, strict=True)}
        if isinstance(node, ast.BoolOp):
            values = (self.eval(v) for v in node.values)
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp):
            value = self.eval(node.operand)
            return not value if isinstance(node.op, ast.Not) else (-value if isinstance(node.op, ast.USub) else +value)
        if isinstance(node, ast.Compare):
            left = self.eval(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = self.eval(comparator)
                if not _TREE_COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.BinOp):
            left, right = self.eval(node.left), self.eval(node.right)
            if isinstance(node.op, ast.Mult) and any(isinstance(x, (str, bytes, list, tuple)) for x in (left, right)):
                sequence, count = (left, right) if isinstance(right, int) else (right, left)
                if isinstance(count, int) and len(sequence) * count > self.MAX_ITEMS:
                    raise OverflowError("too large")
            return _TREE_BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.Subscript):
            return self.eval(node.value)[self.eval(node.slice)]
        if isinstance(node, ast.Slice):
            return slice(*(self.eval(x) if x is not None else None for x in (node.lower, node.upper, node.step)))
        if isinstance(node, ast.Call):
            args = [self.eval(a) for a in node.args]
            if _is_isclose(node.func):
                kwargs = {k.arg: self.eval(k.value) for k in node.keywords}
                return math.isclose(*args, **kwargs)
            return _TREE_CALLS[node.func.id](*args)
        raise NotLiteral(type(node).__name__)


def _contains_opaque(value: Any, depth: int = 0) -> bool:
    if isinstance(value, protocol.Opaque) or depth > 300:
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_contains_opaque(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_contains_opaque(k, depth + 1) or _contains_opaque(v, depth + 1) for k, v in value.items())
    return False


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
    if c == "tree":
        skeleton, n_leaves = e
        if not isinstance(actual, tuple) or len(actual) != n_leaves or _contains_opaque(actual):
            return False
        try:
            return bool(_TreeEvaluator(actual).eval(skeleton))
        except Exception:  # noqa: BLE001 - a type error, overflow... is a failed assert
            return False
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


_INTEGER = re.compile(r"[+-]?\d+")


def _integer_digits(token: str) -> str:
    """An integer token in canonical form, without int() (which refuses > 4300 digits)."""
    negative, digits = token.startswith("-"), token.lstrip("+-").lstrip("0") or "0"
    return ("-" if negative and digits != "0" else "") + digits


def stdout_matches(actual: str, expected: str, rel_tol: float = 1e-5, abs_tol: float = 1e-8) -> bool:
    """Token-wise comparison with numeric tolerance for floats only (see the module docstring)."""
    got, want = actual.split(), expected.split()
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if a == b:
            continue
        if _INTEGER.fullmatch(a) and _INTEGER.fullmatch(b):  # integers compare exactly: "1000000000" != "1000000007"
            if _integer_digits(a) != _integer_digits(b):
                return False
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
    shadowed = frozenset({task.fn_name} if task.fn_name else ())
    plans = [plan_assert(a, shadowed) for a in asserts]
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


def task_secret_paths(config: Any) -> list[str]:
    """The task files of a run (`config.paths`): hidden from programs by every pool that scores
    them (phase 4 adds its --eval_file, the trainer and phases 1-2 hide these)."""
    paths = config.paths
    return [str(p) for p in (paths.data_dir, paths.train_file, paths.val_file, paths.teacher_traces_file)]


def _python_paths() -> list[str]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(site.getsitepackages())
    return sorted(p for p in paths if p)


class _Worker:
    def __init__(self, init: dict) -> None:
        self._close_lock = threading.Lock()
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
        os.set_blocking(self._to_worker, False)
        os.set_blocking(self._from_worker, False)
        self._send(init, 60.0)
        ready = self._receive(60.0)
        if not isinstance(ready, dict) or ready.get("k") != "ready":
            self.close()
            raise SandboxError(f"sandbox worker failed to start: {ready!r}")
        self.info = ready

    def _receive(self, timeout: float) -> Any:
        """One reply frame, read under a deadline with a size bound (a stuck, dead or babbling
        worker raises SandboxError; it never blocks this process)."""
        deadline = time.monotonic() + timeout
        header = self._read_exact(protocol._HEADER.size, deadline)
        (size,) = protocol._HEADER.unpack(header)
        if size > protocol.MAX_MESSAGE:
            raise SandboxError(f"sandbox worker sent a {size}-byte reply (limit {protocol.MAX_MESSAGE})")
        body = self._read_exact(size, deadline)
        try:
            return json.loads(body)
        except (ValueError, RecursionError, MemoryError) as exc:
            raise SandboxError(f"sandbox worker sent an unreadable reply: {type(exc).__name__}") from None

    def _read_exact(self, n: int, deadline: float) -> bytes:
        chunks, remaining = [], n
        with selectors.DefaultSelector() as selector:
            selector.register(self._from_worker, selectors.EVENT_READ)
            while remaining:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise SandboxError("sandbox worker did not answer in time")
                chunk = os.read(self._from_worker, min(remaining, 1 << 20))
                if not chunk:
                    raise SandboxError(f"sandbox worker exited (code {self.process.poll()})")
                chunks.append(chunk)
                remaining -= len(chunk)
        return b"".join(chunks)

    def _send(self, obj: object, timeout: float) -> None:
        data = json.dumps(obj).encode("utf-8")
        view = memoryview(protocol._HEADER.pack(len(data)) + data)
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self._to_worker, selectors.EVENT_WRITE)
            while view:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise SandboxError("sandbox worker did not take its job in time")
                view = view[os.write(self._to_worker, view[:1 << 16]):]

    def run(self, job: dict, timeout: float) -> dict:
        self._send(job, timeout)
        reply = self._receive(timeout)
        if not isinstance(reply, dict):
            raise SandboxError("sandbox worker sent a reply that is not an object")
        return reply

    def close(self, grace: float = 5.0) -> None:
        """Close the job pipe (the worker then stops any running program, ends its zygote and removes
        its cgroup), kill it after `grace` s; a thread still waiting for a reply then sees it gone."""
        with self._close_lock:  # close each fd once (a second close could hit a reused fd number)
            to_worker, self._to_worker = self._to_worker, -1
        if to_worker >= 0:
            os.close(to_worker)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        _empty_cgroup(getattr(self, "info", {}).get("memory_cgroup"))
        with self._close_lock:
            from_worker, self._from_worker = self._from_worker, -1
        if from_worker >= 0:
            os.close(from_worker)


def _empty_cgroup(path: str | None) -> None:
    """Kill every process left in a dead worker's memory cgroup (a program that cleared its parent-death
    signal while its worker was killed), then remove the cgroup. Nothing a program starts can leave it."""
    if not path or not os.path.isdir(path):
        return
    import signal as _signal

    for _ in range(100):
        try:
            with open(os.path.join(path, "cgroup.procs")) as handle:
                pids = [int(x) for x in handle.read().split()]
        except (OSError, ValueError):
            return
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, _signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    try:
        os.rmdir(path)
    except OSError:
        pass


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
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, this worker is replaced, never leaked
            with self._lock:
                if worker in self._all:
                    self._all.remove(worker)
            worker.close(grace=0.0)
            if not self._closed:
                self._spawn()
            raise SandboxError(f"{type(exc).__name__}: {exc}") from exc
        self._idle.put(worker)
        return result

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers, self._all = self._all, []
        threads = [threading.Thread(target=worker.close) for worker in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

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


def _signal_status(sig: object) -> str:
    import signal as _signal

    if sig == _signal.SIGXCPU:
        return "timeout"
    if sig == _signal.SIGXFSZ:
        return "output_limit"
    return "runtime_error"  # any other signal, real-time ones included, is the program's crash


def _text(value: object, limit: int = 300) -> str | None:
    return None if value is None else str(value)[:limit]


def _common_outcome(test: dict) -> TestOutcome | None:
    """Statuses shared by both modes: what the supervisor measured, not what the program said."""
    status, t, error = test.get("status"), test.get("time", 0.0), _text(test.get("error"))
    t = float(t) if isinstance(t, (int, float)) else 0.0
    if status in ("timeout", "output_limit", "memory_limit"):
        return TestOutcome(False, status, error or status.replace("_", " "), t)
    if status == "crashed":
        sig = test.get("signal")
        return TestOutcome(False, _signal_status(sig) if sig is not None else "runtime_error", error, t)
    return None


def _judge_stdin(raw: dict, expected: list[str]) -> list[TestOutcome]:
    outcomes = []
    for test, want in zip(raw["tests"], expected, strict=True):
        common = _common_outcome(test)
        if common is not None:
            outcomes.append(common)
            continue
        t, error = float(test.get("time") or 0.0), _text(test.get("error"))
        got = test.get("stdout") if isinstance(test.get("stdout"), str) else ""
        if test.get("status") != "done":
            outcomes.append(TestOutcome(False, "runtime_error", "test did not run", t))
        elif test.get("exit_code") != 0:  # includes a crash by os._exit(n != 0) during the test
            outcomes.append(TestOutcome(False, _classify_error(None, error), error or f"exit code {test.get('exit_code')}", t))
        elif stdout_matches(got, want):
            outcomes.append(TestOutcome(True, "passed", None, t))
        else:
            outcomes.append(TestOutcome(False, "wrong_answer", f"expected {want[:60]!r}, got {got[:60]!r}", t))
    return outcomes


def _judge_calls(raw: dict, expectations: list, mode_is_call: bool) -> list[TestOutcome]:
    outcomes = []
    for test, expectation in zip(raw["tests"], expectations, strict=True):
        common = _common_outcome(test)
        if common is not None:
            outcomes.append(common)
            continue
        t, status = float(test.get("time") or 0.0), test.get("status")
        if status == "ok":
            actual = protocol.decode_value(test.get("value"))
            try:
                ok = call_output_matches(actual, expectation) if mode_is_call else check_value(expectation, actual)
                shown = f"got {actual!r}"[:200]
            except Exception:  # noqa: BLE001 - a decoded value is plain data, but judge defensively
                ok, shown = False, "the returned value could not be compared"
            outcomes.append(TestOutcome(ok, "passed" if ok else "wrong_answer", None if ok else shown, t))
        elif status == "error":
            kind, phase = _text(test.get("type"), 100) or "Error", _text(test.get("phase"), 20)
            where = f" during {phase}" if phase and phase != "test" else ""
            is_assert = kind == "AssertionError" and phase == "test"
            outcomes.append(TestOutcome(False, "wrong_answer" if is_assert else _classify_error(kind, _text(test.get("error"))),
                                        f"{kind}{where}: {_text(test.get('error')) or ''}"[:300], t))
        else:
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
        return _sandbox_failure(str(raw["sandbox_error"]), n, start, sample_id)
    tests = raw.get("tests")
    if not isinstance(tests, list) or len(tests) != n or not all(isinstance(x, dict) for x in tests):
        return _sandbox_failure(f"sandbox worker sent a reply of the wrong shape ({type(tests).__name__})", n, start,
                                sample_id)
    try:
        if planned.job["mode"] == "stdin":
            outcomes = _judge_stdin(raw, planned.expectations)
        else:
            outcomes = _judge_calls(raw, planned.expectations, task.test_type == "call")
    except Exception as exc:  # noqa: BLE001 - a reply that cannot be judged fails this program only
        message = f"unjudgeable result: {type(exc).__name__}"
        outcomes = [TestOutcome(False, "runtime_error", message) for _ in range(n)]
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
        try:
            result = execute_program(code, task, limits, pool, ids[index], include_challenge, plans[id(task)])
        except Exception as exc:  # noqa: BLE001 - one program's failure never loses the batch
            result = _sandbox_failure(f"{type(exc).__name__}: {exc}", plans[id(task)].total, time.monotonic(), ids[index])
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
