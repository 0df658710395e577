"""Planning and judging: the trusted side of the sandbox, and the only place expected values exist.

No processes and no I/O of its own: `plan_tests` turns a task into a *job* for the worker (the program's
inputs only) and *expectations* that stay here; `PlannedTests.run` sequences a verdict's runs (the
reference, the program's, the derived) through the `run_job` callable it is given (`sandbox.executor`
gives it the pool) and `judge` turns the worker's replies into one `TestOutcome` per test.

How a verdict is made:
- stdin tests: the worker gets only the input text; stdout comes back and is compared here;
- call tests (APPS ``fn_name``): the worker gets the arguments; the return value comes back
  encoded as plain data and is compared here (tuples become lists, a one-element-list expected
  value is also accepted, as the APPS harness does);
- assert tests (MBPP): ``assert f(x) == EXPECTED`` is split; the worker evaluates ``f(x)`` and
  returns its value, and EXPECTED is evaluated here by a literal-only evaluator. Forms handled
  this way: ``==``, ``!=``, ``in``, ``not in``, ``is True/False/None``, ``not X``, a bare ``X``
  (truthiness) and ``math.isclose(X, EXPECTED, ...)``; compound asserts become a "tree" whose
  leaves the worker computes and whose boolean structure is evaluated here (`_TreeEvaluator`).
  A leaf that needs nothing of the program (``sys.getsizeof(x)``) is computed by a program-free
  job (`PlannedTests.reference_job`) in a fresh process, never in the program's. Only an assert
  no process can split runs whole inside the child, whose report a hostile program could forge:
  `plan_assert` marks it ``trusted=False``, the result counts it in ``untrusted_tests`` and the
  training rewards give it no signal (0 real MBPP tasks: tests/integration/sandbox/test_sandbox_hostile_zygote.py).
- Statuses: passed, wrong_answer, runtime_error, syntax_error, timeout, memory_limit,
  output_limit, no_code, sandbox_error. `sandbox_error` means the harness failed, not the
  program; rewards treat it as "no signal" (None), never as wrong.

Output comparison for stdin tests (`stdout_matches`): `utils.output_rule`, shared with the shown-test rule:
non-empty lines paired (line breaks count, blank lines and the spaces at the ends of a line do not), tokens
paired within a line; an expected integer is matched only by an integer token of that value, an expected
float by a decimal number within the statements' tolerance, |a - b| <= 1e-6 * max(1, |b|). This is APPS's
harness without its token-set fallback (which ignores order and repetition and so accepts some wrong
answers, e.g. "2 1" for "1 2") and with the statements' tolerance in place of its numpy one (rel 1e-5 on
any number, an expected integer included); docs/sandbox.md lists each difference.
"""

from __future__ import annotations

import ast
import json
import math
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sandbox.protocol import Opaque, decode_value, hashing_is_bounded, valid_text
from utils.code_parser import parse_quietly
from utils.dataset_loader import Task
from utils.output_rule import output_matches

# how a `sandbox_error` that is the task's, not the harness's nor the program's, begins: an expected side
# that errs or times out in its program-free process (`ExecutionResult.unjudgeable`)
UNJUDGEABLE = "unjudgeable task: "


class Unjudgeable(Exception):  # noqa: N818 - an outcome (no verdict on the program), not a harness error
    """The task's own expected side could not be computed: the verdict says nothing of the program."""


STATUSES = (
    "passed",
    "wrong_answer",
    "runtime_error",
    "syntax_error",
    "timeout",
    "memory_limit",
    "output_limit",
    "no_code",
    "sandbox_error",
)


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class TestOutcome:
    passed: bool
    status: str  # a STATUSES value other than syntax_error/no_code, or not_run (after a failure, binary reward)
    error: str | None = None
    time: float = 0.0

    def __post_init__(self) -> None:
        # the error text quotes the program (its exception message): only valid Unicode leaves here
        self.error = None if self.error is None else valid_text(self.error)


@dataclass(kw_only=True)
class ExecutionResult:
    passed: bool
    tests_passed: int
    tests_total: int
    status: str
    error: str | None = None
    wall_time: float = 0.0
    test_outcomes: list[TestOutcome] = field(default_factory=list)
    sample_id: str | None = None  # the caller's id, for matching results of a batch
    # tests whose verdict came from inside the program's process (an assert no process here can
    # split): a program could forge them, so the training rewards give such a result no signal
    untrusted_tests: int = 0

    def __post_init__(self) -> None:
        self.error = None if self.error is None else valid_text(self.error)

    @property
    def pass_fraction(self) -> float:
        return self.tests_passed / self.tests_total if self.tests_total else 0.0

    @property
    def unjudgeable(self) -> bool:
        """The task's data could not judge this run (an expected side that errs or times out): no verdict
        on the program, however often it is run."""
        return self.status == "sandbox_error" and (self.error or "").startswith(UNJUDGEABLE)

    @property
    def compiles(self) -> bool:
        """The program was found and compiled (in its own process: a model's program is never compiled
        in a trusted one); False for no code and for a syntax error."""
        return self.status not in ("no_code", "syntax_error")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pass_fraction"] = self.pass_fraction
        return out


# --------------------------------------------------------------------------------------------
# Planning tests
# --------------------------------------------------------------------------------------------

_SAFE_CALLS: dict[str, Callable[..., Any]] = {
    "set": set,
    "frozenset": frozenset,
    "tuple": tuple,
    "list": list,
    "dict": dict,
    "float": float,
    "int": int,
    "str": str,
    "sorted": sorted,
    "abs": abs,
    "bool": bool,
}


class NotLiteralError(ValueError):
    pass


def safe_literal(node: ast.AST) -> Any:
    """Evaluate an expected-value expression made only of literals and a few pure constructors."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _SAFE_CALLS
        and not node.keywords
    ):
        args = [safe_literal(a) for a in node.args]
        try:
            return _SAFE_CALLS[node.func.id](*args)
        except (TypeError, ValueError) as exc:
            raise NotLiteralError(str(exc)) from None
    raise NotLiteralError(ast.dump(node)[:80])


@dataclass(frozen=True)
class AssertPlan:
    worker_test: dict  # what the worker runs: {"kind": "expr"|"exec", "src": ...}
    check: str  # eq, ne, in, not_in, is, truthy, falsy, isclose, exec_ok
    expected: Any = None
    tolerance: tuple[float, float] = (1e-9, 0.0)
    trusted: bool = True  # False: the verdict comes from inside the child (forgeable): it earns no reward
    reference_test: dict | None = None  # "tree" leaves that need no program: computed in a program-free process
    # sources of program-free values the child's expressions take as inputs (`shift("abc")` in
    # `unshift(shift("abc"))`): computed with the reference leaves (after them in `reference_test`) and
    # passed to the child as plain data, bound to `__ref_<j>`
    bound_refs: tuple[str, ...] = ()
    # "tree" leaves that apply a program-free function to the program's values (`np.allclose(f(x), [...])`):
    # computed in a program-free process after the program ran, its values bound to `__leaf_<k>`
    derived_test: dict | None = None


def plan_assert(
    source: str,
    shadowed: frozenset[str] = frozenset(),
    imported: frozenset[str] = frozenset(),
    external: frozenset[str] = frozenset(),
) -> AssertPlan:
    """Split an assert statement into the part the child evaluates and the check done here.

    The child only ever evaluates expressions that produce the program's values, never a
    comparison: an expression sent to the child that contains a comparison, `and`/`or` or `not`
    would let an object of the program decide the verdict. Simple shapes (`f(x) == LITERAL` ...)
    become one check; compound ones (`A and B`, `(X == Y) is True`, `not (X != Y)`, `sorted(f(x))
    == [...]`) become a "tree": the child returns the values of the leaves and the boolean
    structure is evaluated here on plain data (`_TreeEvaluator`). Only an assert whose leaves would
    still compare inside the child (e.g. `all(f(x) == y for ...)`) runs whole in the child and is
    marked untrusted. `shadowed`: names the program defines (its function), which must not be
    taken for the builtins of the same name; `imported`: names the task's test imports bind.

    A leaf that needs nothing of the program (`sys.getsizeof((1, 2))`, `list(range(5))`: only
    builtins, standard modules and `imported` names) is a *reference* leaf: it is computed in a
    fresh process that never ran the program (`reference_test`), so a program that patches
    `sys.getsizeof` or a builtin changes only its own side of the comparison.

    Only what calls the program's own names runs in its process. `external`: names bound by the
    test's star imports of standard modules and by a program-free setup (HumanEval's helpers); they,
    the test's imports and standard modules are never evaluated there: a program-free value the
    child's expression takes as input is computed apart and passed in as data (`bound_refs`), and a
    call of such a function on the program's values (`np.allclose(f(x), [...])`, `is_palindrome(f(s))`)
    is computed in a program-free process with the program's values passed in (`derived_test`).
    """
    scope = _Scope(shadowed, imported, external)
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
            raise NotLiteralError("a comparison would run in the child")
        if scope.needs_split(node):  # something of the expected side would run in the child
            raise NotLiteralError("a program-free part")
        return {"kind": "expr", "src": ast.unparse(node)}

    try:
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if (
                isinstance(op, (ast.Is, ast.IsNot))
                and isinstance(right, ast.Constant)
                and right.value in (True, False, None)
            ):
                return AssertPlan(expr(left), "is" if isinstance(op, ast.Is) else "is_not", right.value)
            names = {ast.Eq: "eq", ast.NotEq: "ne", ast.In: "in", ast.NotIn: "not_in"}
            if type(op) in names:
                try:
                    return AssertPlan(expr(left), names[type(op)], safe_literal(right))
                except NotLiteralError:
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
    except NotLiteralError:
        pass
    return _plan_tree(test, scope) or fallback


def _compares(node: ast.AST) -> bool:
    return any(
        isinstance(n, (ast.Compare, ast.BoolOp)) or (isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not))
        for n in ast.walk(node)
    )


def _bounded_set(items: Any) -> set:
    items = list(items)
    if not hashing_is_bounded(items):  # see sandbox.protocol.hashing_is_bounded
        raise OverflowError("too many values of one hash")
    return set(items)


def _bounded_frozenset(items: Any = ()) -> frozenset:
    return frozenset(_bounded_set(items))


def _bounded_dict(pairs: Any = ()) -> dict:
    pairs = list(pairs.items() if isinstance(pairs, dict) else pairs)
    if not hashing_is_bounded([key for key, _ in pairs]):
        raise OverflowError("too many keys of one hash")
    return dict(pairs)


def _bounded_round(number: Any, ndigits: Any = None) -> Any:
    if isinstance(ndigits, int) and abs(ndigits) > 400:  # round(5, -10**8) computes 10**(10**8)
        raise OverflowError("too many digits to round to")
    return round(number, ndigits)


# the tree evaluator works on decoded plain data, so it may also aggregate (len, sum, min, ...); every
# call that builds a hash table from a program's values goes through a bounded builder
_TREE_CALLS: dict[str, Callable[..., Any]] = {
    **_SAFE_CALLS,
    "set": _bounded_set,
    "frozenset": _bounded_frozenset,
    "dict": _bounded_dict,
    "len": len,
    "round": _bounded_round,
    "sum": sum,
    "min": min,
    "max": max,
    "all": all,
    "any": any,
}
_TREE_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}
_TREE_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_LEAF = "__leaf_"


class _Scope:
    """Which names of an assert belong to the program and which never do (see `plan_assert`)."""

    def __init__(self, shadowed: frozenset[str], imported: frozenset[str], external: frozenset[str]) -> None:
        self.shadowed = shadowed
        self.allowed = (_BUILTIN_NAMES | sys.stdlib_module_names | imported | external) - shadowed
        # roots of functions and values that are never the program's (builtins stay where their
        # expression is evaluated: `sorted(f(x))` in the child, as always)
        self.external = (sys.stdlib_module_names | imported | external) - shadowed

    def program_free(self, node: ast.AST) -> bool:
        """True when an expression uses only builtins, standard modules, the test's imports and external
        names: its value does not depend on the program (names it binds itself, a comprehension's, do not
        count)."""
        bound: set[str] = set()
        used: set[str] = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                (used if isinstance(n.ctx, ast.Load) else bound).add(n.id)
            elif isinstance(n, ast.arg):
                bound.add(n.arg)
        return used - bound <= self.allowed

    def root(self, node: ast.AST) -> str | None:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    def external_call(self, node: ast.AST) -> bool:
        """A call of a function that is never the program's (`np.allclose`, a setup helper, `math.sqrt`)."""
        return isinstance(node, ast.Call) and self.root(node.func) in self.external and self.program_free(node.func)

    def external_value(self, node: ast.AST) -> bool:
        """A program-free value the child must not compute: an external call, or an external name or
        attribute read as a value (`pi` from `from math import *`, `math.pi`)."""
        if not self.program_free(node):
            return False
        if isinstance(node, ast.Call):
            return self.external_call(node)
        return isinstance(node, (ast.Name, ast.Attribute)) and self.root(node) in self.external

    def needs_split(self, node: ast.AST) -> bool:
        return any(self.external_value(n) or self.external_call(n) for n in _value_nodes(node))


def _value_nodes(node: ast.AST) -> list[ast.AST]:
    """Sub-expressions of `node` (itself included) except callees: `math.sqrt` in `math.sqrt(x)` is no value."""
    out: list[ast.AST] = []
    stack = [node]
    while stack:
        n = stack.pop()
        out.append(n)
        for child in ast.iter_child_nodes(n):
            if isinstance(n, ast.Call) and child is n.func:
                if isinstance(child, ast.Attribute):  # `obj.method`: obj is a value
                    stack.append(child.value)
                continue
            stack.append(child)
    return out


def _plan_tree(test: ast.AST, scope: _Scope) -> AssertPlan | None:
    """Replace every maximal sub-expression this process cannot evaluate by a leaf computed elsewhere."""
    shadowed = scope.shadowed
    leaves: list[str] = []
    kinds: list[str] = []  # per leaf: "program", "reference" or "derived"
    bound_refs: list[str] = []

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
            return (
                isinstance(node.func, ast.Name)
                and node.func.id in _TREE_CALLS
                and node.func.id not in shadowed
                and not node.keywords
                and not any(isinstance(a, ast.Starred) for a in node.args)
            ) or (
                _is_isclose(node.func)
                and len(node.args) == 2
                and all(k.arg in ("rel_tol", "abs_tol") for k in node.keywords)
            )
        return False

    def leaf(source: str, kind: str) -> ast.Name:
        leaves.append(source)
        kinds.append(kind)
        return ast.Name(id=f"{_LEAF}{len(leaves) - 1}", ctx=ast.Load())

    class BindRefs(ast.NodeTransformer):
        """In an expression for the child: each maximal external value becomes `__ref_<j>`, computed apart."""

        def visit(self, node: ast.AST) -> Any:
            if isinstance(node, ast.expr) and scope.external_value(node):
                bound_refs.append(ast.unparse(node))
                return ast.Name(id=f"{_REF}{len(bound_refs) - 1}", ctx=ast.Load())
            if isinstance(node, ast.Call):  # the callee stays (a program's function, or a builtin)
                node.args = [self.visit(a) for a in node.args]
                for keyword in node.keywords:
                    keyword.value = self.visit(keyword.value)
                return node
            return super().generic_visit(node)

    def program_leaf(node: ast.AST) -> ast.Name:
        if _compares(node):
            raise NotLiteralError("a comparison inside a leaf")
        return leaf(ast.unparse(BindRefs().visit(node)), "program")

    class Derived(ast.NodeTransformer):
        """The arguments of an external call: program-free ones stay, the program's become its leaves."""

        def visit(self, node: ast.AST) -> Any:
            if not isinstance(node, ast.expr) or scope.program_free(node):
                return node
            if scope.external_call(node):
                assert isinstance(node, ast.Call)
                node.args = [self.visit(a) for a in node.args]
                for keyword in node.keywords:
                    keyword.value = self.visit(keyword.value)
                return node
            if isinstance(node, (ast.List, ast.Tuple, ast.Starred)):
                return super().generic_visit(node)
            return program_leaf(node)

    class Splitter(ast.NodeTransformer):
        def generic_visit(self, node: ast.AST) -> ast.AST:
            if isinstance(node, ast.expr) and not evaluable(node):
                if _compares(node):
                    raise NotLiteralError("a comparison inside a leaf")
                if scope.program_free(node):
                    return leaf(ast.unparse(node), "reference")
                if scope.external_call(node):
                    return leaf(ast.unparse(Derived().visit(node)), "derived")
                return program_leaf(node)
            if isinstance(node, ast.Call):  # the callee is resolved here, not evaluated as a leaf
                node.args = [self.visit(a) for a in node.args]
                for keyword in node.keywords:
                    keyword.value = self.visit(keyword.value)
                return node
            return super().generic_visit(node)

    try:
        skeleton = Splitter().visit(ast.parse(ast.unparse(test), mode="eval").body)
    except (NotLiteralError, SyntaxError, RecursionError):
        return None
    # Every leaf is computed in a process and compared here as plain data: a program leaf in the
    # program's process, a reference leaf (and every input it takes that needs no program) in a fresh
    # process that never ran a program, a derived leaf in another one after the program, on the
    # program's values. Nothing the program patches (sys.getsizeof, builtins.compile, np.allclose)
    # reaches the side it is compared with; an object of the program comes back opaque.
    program = tuple(k for k, kind in enumerate(kinds) if kind == "program")
    reference = tuple(k for k, kind in enumerate(kinds) if kind == "reference")
    derived = tuple(k for k, kind in enumerate(kinds) if kind == "derived")
    computed_apart = [leaves[k] for k in reference] + bound_refs
    return AssertPlan(
        _tuple_expr(leaves[k] for k in program),
        "tree",
        (skeleton, len(leaves), program, reference, derived),
        reference_test=_tuple_expr(computed_apart) if computed_apart else None,
        bound_refs=tuple(bound_refs),
        derived_test=_tuple_expr(leaves[k] for k in derived) if derived else None,
    )


def _tuple_expr(sources: Any) -> dict:
    return {"kind": "expr", "src": "(" + "".join(f"{src}, " for src in sources) + ")"}


_BUILTIN_NAMES = frozenset(dir(__import__("builtins")))
_REF = "__ref_"


def reference_imports(plans: list, imported: frozenset[str]) -> str:
    """Import lines for the standard modules the plans' program-free expressions name without importing."""
    names: set[str] = set()
    for plan in plans:
        for test in (plan.reference_test, plan.derived_test):
            if test is not None:
                tree = ast.parse(test["src"], mode="eval")
                names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    modules = sorted((names & sys.stdlib_module_names) - imported - _BUILTIN_NAMES)
    return "".join(f"import {m}\n" for m in modules)


def imported_names(imports: tuple[str, ...] | list[str]) -> frozenset[str]:
    """Names the task's test import lines bind (a line that does not parse binds nothing; a star
    import of a standard module binds that module's public names)."""
    names: set[str] = set()
    for line in imports:
        try:
            tree = ast.parse(line)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                names |= _star_names(node.module or "")
    return frozenset(names)


def _star_names(module: str) -> frozenset[str]:
    """What `from module import *` binds, for a standard module (imported here to know: standard modules
    only, never a task's or a program's); another module's names stay unknown (the program's side)."""
    if module.split(".")[0] not in sys.stdlib_module_names:
        return frozenset()
    import importlib

    try:
        loaded = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a module that cannot be imported here binds nothing we know of
        return frozenset()
    public = getattr(loaded, "__all__", None)
    if not isinstance(public, (list, tuple)):
        public = [n for n in dir(loaded) if not n.startswith("_")]
    return frozenset(n for n in public if isinstance(n, str))


def setup_names(setup: str, allowed: frozenset[str]) -> frozenset[str] | None:
    """The names a task's setup code defines when it needs nothing of the program (HumanEval's helper
    functions: only builtins, standard modules, `allowed` names and its own), else None (MBPP's setup
    builds the program's classes: it runs in the program's process)."""
    if not setup.strip():
        return frozenset()
    try:
        tree = parse_quietly(setup)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    bound: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if not used - bound <= _BUILTIN_NAMES | sys.stdlib_module_names | allowed:
        return None
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return frozenset(defined)


class _TreeEvaluator:
    """Evaluates a planned assert skeleton on plain decoded data (no object of the program exists here)."""

    MAX_INT_BITS = 1 << 16  # about 20,000 digits: far above any MBPP/APPS value

    def __init__(self, leaves: tuple, program_leaves: frozenset[int] = frozenset()) -> None:
        self.leaves = leaves
        self.program_leaves = program_leaves  # leaves whose value is the program's (its own or derived from it)

    def eval(self, node: ast.AST | None) -> Any:
        """The value of `node`; an error in a part that holds none of the program's values is the task's
        (`Unjudgeable`), an error anywhere else the program's (a failed assert)."""
        try:
            return self._eval(node)
        except Unjudgeable:
            raise
        except Exception as exc:
            if node is not None and not self._holds_program(node):
                raise Unjudgeable(f"the expected side {ast.unparse(node)[:80]!r} fails: {type(exc).__name__}") from exc
            raise

    def _holds_program(self, node: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Name) and n.id.startswith(_LEAF) and int(n.id[len(_LEAF) :]) in self.program_leaves
            for n in ast.walk(node)
        )

    def _eval(self, node: ast.AST | None) -> Any:  # None: a `**` key of a dict display
        if isinstance(node, ast.Name):
            return self.leaves[int(node.id[len(_LEAF) :])]
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [self.eval(e) for e in node.elts]
            builders: dict[type, Callable[[list], Any]] = {ast.Tuple: tuple, ast.List: list, ast.Set: _bounded_set}
            return builders[type(node)](items)
        if isinstance(node, ast.Dict):
            return _bounded_dict([(self.eval(k), self.eval(v)) for k, v in zip(node.keys, node.values, strict=True)])
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
            # numbers only: on a program's str, `%` is printf formatting (`"%999999999d" % 1`: a GiB
            # here) and `*` repetition; on its lists `+` and `*` build whatever it asks for
            if not all(isinstance(x, (int, float, complex)) for x in (left, right)):
                raise TypeError("arithmetic here takes numbers only")
            if not isinstance(node.op, (ast.Add, ast.Sub)) and any(
                isinstance(x, int) and x.bit_length() > self.MAX_INT_BITS for x in (left, right)
            ):  # a program's huge ints (they travel as hex) must not buy quadratic time in this process
                raise OverflowError("integer too large for arithmetic here")
            return _TREE_BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.Subscript):
            return self.eval(node.value)[self.eval(node.slice)]
        if isinstance(node, ast.Slice):
            return slice(*(self.eval(x) if x is not None else None for x in (node.lower, node.upper, node.step)))
        if isinstance(node, ast.Call):
            args = [self.eval(a) for a in node.args]
            if _is_isclose(node.func):
                kwargs: dict[Any, Any] = {k.arg: self.eval(k.value) for k in node.keywords}
                return math.isclose(*args, **kwargs)
            return _TREE_CALLS[node.func.id](*args)  # type: ignore[attr-defined]  # a Name: see evaluable()
        raise NotLiteralError(type(node).__name__)


def _contains_opaque(value: Any, depth: int = 0) -> bool:
    if isinstance(value, Opaque) or depth > 300:
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_contains_opaque(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_contains_opaque(k, depth + 1) or _contains_opaque(v, depth + 1) for k, v in value.items())
    return False


def _is_isclose(func: ast.AST) -> bool:
    return (isinstance(func, ast.Name) and func.id == "isclose") or (
        isinstance(func, ast.Attribute)
        and func.attr == "isclose"
        and isinstance(func.value, ast.Name)
        and func.value.id in ("math", "cmath")
    )


def check_value(plan: AssertPlan, actual: Any, reference: Any = (), derived: Any = ()) -> bool:
    """Apply a planned check to a decoded (plain data) value; `reference`: the decoded values of the
    plan's reference leaves (from the program-free process); `derived`: those of its derived leaves
    (from the program-free process run on the program's values)."""
    c, e = plan.check, plan.expected
    if c == "eq":
        return _equal(actual, e)
    if c == "ne":
        return not isinstance(actual, Opaque) and not _equal(actual, e)
    if c in ("in", "not_in"):
        try:
            inside = (
                any(_equal(actual, item) for item in e)
                if not isinstance(e, (str, bytes))
                else (isinstance(actual, type(e)) and actual in e)  # type: ignore[operator]  # both str or both bytes
            )
        except TypeError:
            return False
        return inside if c == "in" else not inside and not isinstance(actual, Opaque)
    if c == "is":
        return actual is e
    if c == "is_not":
        return actual is not e and not isinstance(actual, Opaque)
    if c == "truthy":
        return bool(actual)
    if c == "falsy":
        return not bool(actual) and not isinstance(actual, Opaque)
    if c == "isclose":
        numeric = (int, float)
        return (
            isinstance(actual, numeric)
            and not isinstance(actual, bool)
            and isinstance(e, numeric)
            and math.isclose(actual, e, rel_tol=plan.tolerance[0], abs_tol=plan.tolerance[1])
        )
    if c == "tree":
        skeleton, n_leaves, program, references, derived_ix = e
        if isinstance(reference, tuple):  # the bound inputs come after the reference leaves
            reference = reference[: len(references)]
        sides = ((actual, program), (reference, references), (derived, derived_ix))
        if any(not isinstance(v, tuple) or len(v) != len(ix) or _contains_opaque(v) for v, ix in sides):
            return False
        leaves: list[Any] = [None] * n_leaves
        for values, indices in sides:
            for k, value in zip(indices, values, strict=True):
                leaves[k] = value
        try:
            return bool(_TreeEvaluator(tuple(leaves), frozenset(program) | frozenset(derived_ix)).eval(skeleton))
        except Unjudgeable:
            raise
        except Exception:  # noqa: BLE001 - a type error, overflow... on the program's values is a failed assert
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


def stdout_matches(actual: str, expected: str) -> bool:
    """The stdin tests' rule (`utils.output_rule`): lines paired, tokens paired, an expected integer wants
    the same integer, an expected float a number within 1e-6 * max(1, |expected|)."""
    return output_matches(actual, expected)


@dataclass
class PlannedTests:
    job: dict  # sent to the worker (inputs only)
    expectations: list  # kept here: expected stdout, expected call value, or AssertPlan
    # the program-free job that computes the reference leaves (one test per planned test), or None;
    # its decoded values are kept in `references` once run (they do not depend on the program)
    reference_job: dict | None = None
    references: list | None = field(default=None, compare=False)
    # the reference run's values as they came (tagged JSON per test): the inputs bound in the child
    reference_values: list | None = field(default=None, compare=False)
    # the program-free job that computes derived leaves on a program's values (tests without any: "()")
    derived_job: dict | None = None
    test_type: str = "assert"  # the task's: "stdin", "call" or "assert"

    def run(
        self, code: str, run_job: Callable[[dict], dict], *, stop_at_first_failure: bool = False
    ) -> ExecutionResult:
        """A program's verdict, its runs in order: the reference run (once per plan: the program-free values
        its tests take or are compared with), the program's own run, the derived run (program-free functions
        of the program's values), then the judgement here. `run_job(job)` runs one job in the sandbox and
        returns the worker's reply ({"sandbox_error": why} when the sandbox failed). Wall time and sample id
        are the caller's to fill in."""
        n = self.total
        if self.reference_job is not None and self.references is None:  # before the program: it may take inputs
            error = self.compute_references(run_job)
            if error is not None:
                return sandbox_failure(error, n)
        job = (
            dict(self.job, code=code, tests=self.program_tests()) if "tests" in self.job else dict(self.job, code=code)
        )
        if self.test_type == "stdin":  # a program that compiles only inside a function is wrapped as APPS does
            job["wrap_like_apps"] = True
        if stop_at_first_failure:
            job["stop_at_first_failure"] = True
        try:
            tests = _reply_tests(run_job(job), n, "")
            compile_message = syntax_error(tests)
            if compile_message is not None:
                return ExecutionResult(
                    passed=False,
                    tests_passed=0,
                    tests_total=n,
                    status="syntax_error",
                    error=compile_message,
                    test_outcomes=[TestOutcome(False, "runtime_error", compile_message) for _ in range(n)],
                )
            derived = None
            if self.derived_job is not None:  # functions of the test applied to the program's values, program-free
                derived_job = dict(self.derived_job, tests=self.derived_tests(tests), id="derived")
                derived = decode_references(_reply_tests(run_job(derived_job), n, "derived run: "))
        except _RunFailedError as exc:
            return sandbox_failure(str(exc), n)
        try:
            outcomes = judge(self, tests, self.test_type == "call", derived)
        except Unjudgeable as exc:
            return sandbox_failure(f"{UNJUDGEABLE}{exc}", n)
        except Exception as exc:  # noqa: BLE001 - a reply that cannot be judged fails this program only
            message = f"unjudgeable result: {type(exc).__name__}"
            outcomes = [TestOutcome(False, "runtime_error", message) for _ in range(n)]
        return summarize(outcomes, 0.0, None, self.untrusted)

    def compute_references(self, run_job: Callable[[dict], dict]) -> str | None:
        """Run the program-free job once (a fresh sandbox process with no program in it) and keep the
        reference values here; returns why when it could not (the harness, or the task's own data)."""
        assert self.reference_job is not None
        try:
            tests = _reply_tests(run_job(dict(self.reference_job, id="reference")), self.total, "reference run: ")
        except _RunFailedError as exc:
            return str(exc)
        failed = [k for k, t in enumerate(tests) if self.expectations[k].reference_test and t.get("status") != "ok"]
        if failed:  # the task's own data cannot be computed: no program is to blame (kept uncached: retried)
            k = failed[0]
            why = tests[k].get("error") or tests[k].get("status")
            return f"{UNJUDGEABLE}the expected side of test {k} could not be computed ({str(why)[:200]})"
        self.references = decode_references(tests)
        self.reference_values = [t.get("value") if t.get("status") == "ok" else None for t in tests]
        return None

    @property
    def total(self) -> int:
        return len(self.expectations)

    @property
    def untrusted(self) -> int:
        """Tests whose verdict can only come from inside the program's process."""
        return sum(isinstance(e, AssertPlan) and not e.trusted for e in self.expectations)

    def program_tests(self) -> list[dict]:
        """The job's tests with the program-free inputs bound (`reference_values` must be filled when
        any plan has `bound_refs`); a test whose inputs could not be computed binds nothing (it fails)."""
        tests = self.job["tests"]
        if not any(isinstance(e, AssertPlan) and e.bound_refs for e in self.expectations):
            return tests
        out = []
        for k, (test, plan) in enumerate(zip(tests, self.expectations, strict=True)):
            bind = self._bound_inputs(k, plan)
            out.append(dict(test, bind=bind) if bind else test)
        return out

    def _bound_inputs(self, k: int, plan: Any) -> dict:
        """Test k's program-free inputs (`__ref_<j>`, tagged JSON) from the reference run, or {}."""
        value = (self.reference_values or [None] * self.total)[k]
        if not (isinstance(plan, AssertPlan) and plan.bound_refs and isinstance(value, dict)):
            return {}
        if not isinstance(value.get("v"), list):
            return {}
        first = len(plan.expected[3])  # the reference leaves come first, then the bound inputs
        return {f"{_REF}{j}": item for j, item in enumerate(value["v"][first:])}

    def derived_tests(self, raw_tests: list[dict]) -> list[dict]:
        """The derived job's tests for one program's reply: each binds the program's leaf values
        (tagged JSON, as the program's process wrote them; decoded to plain data over there)."""
        assert self.derived_job is not None
        out: list[dict] = []
        for test, raw, plan in zip(self.derived_job["tests"], raw_tests, self.expectations, strict=True):
            value = raw.get("value") if raw.get("status") == "ok" else None
            if isinstance(plan, AssertPlan) and plan.derived_test and isinstance(value, dict):
                items: list = value["v"] if isinstance(value.get("v"), list) else []
                program = plan.expected[2]
                bind = {f"{_LEAF}{k}": item for k, item in zip(program, items, strict=False)}
                test = dict(test, bind={**self._bound_inputs(len(out), plan), **bind})
            out.append(test)
        return out


def plan_tests(task: Task, include_challenge: bool = False) -> PlannedTests:
    if task.test_type == "stdin":
        return PlannedTests(
            {"mode": "stdin", "inputs": [t["input"] for t in task.tests], "apps_imports": True},
            [t["output"] for t in task.tests],
            test_type="stdin",
        )
    if task.test_type == "call":
        tests = [{"kind": "call", "args": json.dumps(t["input"])} for t in task.tests]
        return PlannedTests(
            {"mode": "calls", "tests": tests, "fn_name": task.fn_name, "apps_imports": True},
            [t["output"] for t in task.tests],
            test_type="call",
        )
    asserts = list(task.tests) + (list(task.challenge_tests) if include_challenge else [])
    shadowed = frozenset({task.fn_name} if task.fn_name else ())
    imported = imported_names(task.test_imports)
    helpers = setup_names(task.test_setup_code, imported)  # None: the setup needs the program
    external = (helpers or frozenset()) - shadowed
    plans = [plan_assert(a, shadowed, imported, external) for a in asserts]
    checks = False
    if helpers is not None and task.fn_name and task.reference_solutions:  # a check with its own control flow
        for k, plan in enumerate(plans):
            replay = plan_check(asserts[k], task.fn_name, task.reference_solutions[0]) if not plan.trusted else None
            if replay is not None:
                plans[k], checks = replay, True
    imports = "\n".join(task.test_imports)
    # the program-free jobs run the test's imports and, when it needs no program, the setup code (its
    # helpers); never the program
    program_free = {
        "mode": "calls",
        "imports": imports + "\n" + reference_imports(plans, imported),
        "setup": (task.test_setup_code if helpers else "") + (_CHECK_RUNNERS if checks else ""),
        "apps_imports": False,
        "code": "",
    }
    empty = {"kind": "expr", "src": "()"}
    reference_job = derived_job = None
    if any(p.reference_test is not None for p in plans):
        reference_job = dict(program_free, tests=[p.reference_test or empty for p in plans])
    if any(p.derived_test is not None for p in plans):
        derived_job = dict(program_free, tests=[p.derived_test or empty for p in plans])
    return PlannedTests(
        {
            "mode": "calls",
            "tests": [p.worker_test for p in plans],
            "imports": imports,
            "setup": task.test_setup_code,
            "apps_imports": False,
        },
        plans,
        reference_job,
        derived_job=derived_job,
    )


_RECORD, _REPLAY = "__record_calls", "__replay_check"
# Defined in the program-free processes of a task with a check that has its own control flow (`plan_check`).
# Both runs seed `random` alike, and the recording restores its state around every call of the reference,
# so the replay draws what the recording drew.
_CHECK_RUNNERS = f"""
def {_RECORD}(check_source, check_name, reference_source, entry):
    import copy, random
    check_scope, reference_scope = dict(globals()), dict(globals())
    exec(reference_source, reference_scope)
    exec(check_source, check_scope)
    reference, calls = reference_scope[entry], []
    def candidate(*args):
        calls.append(copy.deepcopy(args))
        state = random.getstate()
        try:
            return reference(*args)
        finally:
            random.setstate(state)
    random.seed(0)
    if check_scope[check_name](candidate) is not True:
        raise AssertionError("the reference solution does not pass the check")
    return calls

def {_REPLAY}(check_source, check_name, calls, results):
    import random
    scope = dict(globals())
    exec(check_source, scope)
    taken = 0
    def candidate(*args):
        nonlocal taken
        if taken >= len(results) or tuple(args) != tuple(calls[taken]):
            raise AssertionError("the check took another path than on the reference solution")
        taken += 1
        return results[taken - 1]
    random.seed(0)
    try:
        return scope[check_name](candidate) is True and taken == len(results)
    except AssertionError:
        return False
"""


def plan_check(source: str, entry: str, reference: str) -> AssertPlan | None:
    """A check with its own control flow (HumanEval's loops: `def check(candidate): for ...: assert
    candidate(x) == ...` then `assert check(entry)`), judged without running the check in the program's
    process: the check runs on the task's `reference` solution in a program-free process, recording each
    call's arguments; the program's process computes only its results for those arguments (a program leaf);
    another program-free process replays the check on those results (a derived leaf) and says whether it
    passed. A check whose calls depend on the results it got fails where its path leaves the recorded one.
    None when `source` is not of that shape."""
    try:
        tree = parse_quietly(source.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if len(tree.body) != 2 or not isinstance(tree.body[0], ast.FunctionDef) or not isinstance(tree.body[1], ast.Assert):
        return None
    check, call = tree.body[0], tree.body[1].test
    if (
        len(check.args.args) != 1
        or not isinstance(call, ast.Call)
        or not isinstance(call.func, ast.Name)
        or call.func.id != check.name
        or len(call.args) != 1
        or call.keywords
        or not (isinstance(call.args[0], ast.Name) and call.args[0].id == entry)
    ):
        return None
    check_source = ast.unparse(check)
    calls = f"{_RECORD}({check_source!r}, {check.name!r}, {reference!r}, {entry!r})"
    return AssertPlan(
        {"kind": "expr", "src": f"(tuple({entry}(*__args) for __args in {_REF}0),)"},
        "tree",
        (ast.Name(id=f"{_LEAF}1", ctx=ast.Load()), 2, (0,), (), (1,)),
        reference_test={"kind": "expr", "src": f"({calls},)"},
        bound_refs=(calls,),
        derived_test={"kind": "expr", "src": f"({_REPLAY}({check_source!r}, {check.name!r}, {_REF}0, {_LEAF}0),)"},
    )


def untrusted_task_ids(tasks: list[Task], include_challenge: bool = False) -> list[str]:
    """Tasks with a test whose verdict can only come from inside the program's process (phases 1
    and 4 report them; the training rewards give their results no signal). 0 of real MBPP's 974."""
    return [t.task_id for t in tasks if t.test_type == "assert" and plan_tests(t, include_challenge).untrusted]


# --------------------------------------------------------------------------------------------
# Judging a reply
# --------------------------------------------------------------------------------------------


def _classify_error(error_type: str | None, message: str | None) -> str:
    text = f"{error_type or ''} {message or ''}"
    if "MemoryError" in text:
        return "memory_limit"
    if "File too large" in text:  # RLIMIT_FSIZE (Python ignores SIGXFSZ, so the write fails instead)
        return "output_limit"
    return "runtime_error"


def _signal_status(sig: object) -> str:
    if sig == signal.SIGXCPU:
        return "timeout"
    if sig == signal.SIGXFSZ:
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
    if status == "not_run":  # the binary reward's run stopped at an earlier failure (sandbox.supervisor)
        return TestOutcome(False, "not_run", "not run: an earlier test failed", 0.0)
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
            outcomes.append(
                TestOutcome(False, _classify_error(None, error), error or f"exit code {test.get('exit_code')}", t)
            )
        elif stdout_matches(got, want):
            outcomes.append(TestOutcome(True, "passed", None, t))
        else:
            outcomes.append(TestOutcome(False, "wrong_answer", f"expected {want[:60]!r}, got {got[:60]!r}", t))
    return outcomes


def _judge_calls(
    raw: dict, expectations: list, mode_is_call: bool, references: list | None, derived: list | None = None
) -> list[TestOutcome]:
    outcomes = []
    for k, (test, expectation) in enumerate(zip(raw["tests"], expectations, strict=True)):
        common = _common_outcome(test)
        if common is not None:
            outcomes.append(common)
            continue
        t, status = float(test.get("time") or 0.0), test.get("status")
        if status == "ok":
            actual = decode_value(test.get("value"))
            try:
                if mode_is_call:
                    ok = call_output_matches(actual, expectation)
                else:
                    ok = check_value(
                        expectation,
                        actual,
                        references[k] if references is not None else (),
                        derived[k] if derived is not None else (),
                    )
            except Unjudgeable:
                raise
            except Exception:  # noqa: BLE001 - a decoded value is plain data, but judge defensively
                ok = False
            outcomes.append(TestOutcome(ok, "passed" if ok else "wrong_answer", None if ok else _shown(actual), t))
        elif status == "error":
            kind, phase = _text(test.get("type"), 100) or "Error", _text(test.get("phase"), 20)
            where = f" during {phase}" if phase and phase != "test" else ""
            is_assert = kind == "AssertionError" and phase == "test"
            outcomes.append(
                TestOutcome(
                    False,
                    "wrong_answer" if is_assert else _classify_error(kind, _text(test.get("error"))),
                    f"{kind}{where}: {_text(test.get('error')) or ''}"[:300],
                    t,
                )
            )
        else:
            outcomes.append(TestOutcome(False, "runtime_error", "test did not run", t))
    return outcomes


def _shown(actual: Any) -> str:
    """The start of a wrong value for the error message; repr can fail on plain data too (an int
    over Python's 4300-digit str() limit), which must not change the verdict."""
    try:
        return f"got {actual!r}"[:200]
    except (ValueError, RecursionError, MemoryError):
        return f"got a value of type {type(actual).__name__}"


def summarize(outcomes: list[TestOutcome], wall: float, sample_id: str | None, untrusted: int = 0) -> ExecutionResult:
    n_pass = sum(o.passed for o in outcomes)
    failed = [o for o in outcomes if not o.passed]
    first = failed[0] if failed else TestOutcome(True, "passed")
    return ExecutionResult(
        passed=not failed,
        tests_passed=n_pass,
        tests_total=len(outcomes),
        status=first.status,
        error=first.error,
        wall_time=wall,
        test_outcomes=outcomes,
        sample_id=sample_id,
        untrusted_tests=untrusted,
    )


def sandbox_failure(message: str, n: int) -> ExecutionResult:
    """The verdict when the sandbox, or the task's own data (`UNJUDGEABLE`), could not judge: no signal."""
    return ExecutionResult(
        passed=False,
        tests_passed=0,
        tests_total=n,
        status="sandbox_error",
        error=message[:500],
        test_outcomes=[TestOutcome(False, "sandbox_error", message[:200]) for _ in range(n)],
    )


class _RunFailedError(Exception):
    """One of a verdict's runs came back without a usable reply."""


def _reply_tests(reply: dict, n: int, what: str) -> list[dict]:
    """The per-test records of a worker's reply, shape-checked (n dicts)."""
    tests = reply.get("tests")
    if reply.get("sandbox_error"):
        raise _RunFailedError(f"{what}{reply['sandbox_error']}")
    if not isinstance(tests, list) or len(tests) != n:
        raise _RunFailedError(f"{what}sandbox worker sent a reply of the wrong shape ({type(tests).__name__})")
    return [t if isinstance(t, dict) else {} for t in tests]


def syntax_error(tests: list[dict]) -> str | None:
    """The compiler's message when the program's own process could not compile it (every test then
    reports the same compile-phase SyntaxError), else None."""
    if tests and all(
        t.get("status") == "error" and t.get("phase") == "compile" and t.get("type") == "SyntaxError" for t in tests
    ):
        return str(tests[0].get("error") or "SyntaxError")
    return None


def decode_references(raw_tests: list[dict]) -> list:
    """The reference leaves' values from the program-free run: a tuple per test, or an Opaque where a
    leaf could not be computed (the test then fails: a leaf that errs is no pass)."""
    out: list = []
    for test in raw_tests:
        value = decode_value(test.get("value")) if test.get("status") == "ok" else None
        out.append(
            value if isinstance(value, tuple) else Opaque(f"reference not computed: {_text(test.get('error'), 100)}")
        )
    return out


def judge(
    planned: PlannedTests, raw_tests: list[dict], mode_is_call: bool, derived: list | None = None
) -> list[TestOutcome]:
    """One outcome per planned test from the worker's per-test records (already shape-checked);
    `planned.references` must be filled when the plan has a `reference_job`, and `derived` (decoded
    like the references) given when it has a `derived_job`."""
    reply = {"tests": raw_tests}
    if planned.job["mode"] == "stdin":
        return _judge_stdin(reply, planned.expectations)
    return _judge_calls(reply, planned.expectations, mode_is_call, planned.references, derived)
