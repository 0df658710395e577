"""The task record (`Task`), its checks (every test must depend on the program), and task files (read, write)."""

from __future__ import annotations

import ast
import builtins
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from utils.jsonl import DataFormatError, iter_jsonl, write_jsonl_atomic

TEST_TYPES = ("assert", "stdin", "call")
TUPLE_FIELDS = ("tests", "test_imports", "challenge_tests", "reference_solutions")


class TaskSchemaError(ValueError):
    """A task record that breaks the schema; the message names the field and what a valid value looks like."""


@dataclass(frozen=True)
class Task:
    task_id: str  # "<source>/<original id>", e.g. "mbpp/11", "apps/4001"
    source: str  # "mbpp", "apps", or the name of another loader
    problem: str  # the problem statement shown to the model
    test_type: str  # one of TEST_TYPES
    tests: tuple  # assert strings, or {"input", "output"} dicts (see module docstring)
    difficulty: str = ""  # APPS: introductory/interview/competition; MBPP: "basic"
    fn_name: str | None = None  # entry point, when the source names one (MBPP: from the asserts)
    starter_code: str = ""  # APPS call-based starter code, e.g. "class Solution:\n    def ..."
    test_imports: tuple[str, ...] = ()  # assert style: import lines run before the program
    test_setup_code: str = ""  # assert style: code run after the program, before the asserts
    challenge_tests: tuple = ()  # extra hidden tests (MBPP challenge_test_list), same style
    reference_solutions: tuple[str, ...] = ()  # known-correct programs, when the source has them
    metadata: dict = field(default_factory=dict)  # source-specific extras (url, original ids, ...)

    def __post_init__(self) -> None:
        validate_task(self)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("tests", "test_imports", "challenge_tests", "reference_solutions"):
            out[key] = list(out[key])
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        known = {f.name for f in fields(cls)}
        missing = [k for k in ("task_id", "source", "problem", "test_type", "tests") if k not in data]
        if missing:
            raise ValueError(f"missing required field(s): {', '.join(missing)}")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown field(s): {', '.join(unknown)}")
        values = dict(data)
        for key in TUPLE_FIELDS:
            if key in values:
                if not isinstance(values[key], (list, tuple)):  # tuple("abc") would make one test per character
                    raise TaskSchemaError(f"{key} must be a list, got {type(values[key]).__name__} {values[key]!r:.60}")
                values[key] = tuple(values[key])
        return cls(**values)


def _is_constant_assert(node: ast.AST) -> bool:
    return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant)


_PROGRAM_FREE_NAMES = frozenset(dir(builtins)) | frozenset(sys.stdlib_module_names)


def _depends_on_program(node: ast.AST, fn_name: str | None) -> bool:
    """True when the expression names something other than literals, builtins and standard modules (the
    program's function, a name its setup or imports bind): only such a part can tell programs apart."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    bound |= {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    return bool(names - bound - (_PROGRAM_FREE_NAMES - {fn_name}))


def _program_free_part(test: ast.AST, fn_name: str | None) -> str | None:
    """The source of the assert's test, or of an operand of one of its `and`/`or`, that does not depend on
    the program (`1 == 1`, the `True` of `f(x) == 2 or True`), else None."""
    if not _depends_on_program(test, fn_name):
        return ast.unparse(test)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _program_free_part(test.operand, fn_name)
    if isinstance(test, ast.BoolOp):  # the verdict's own boolean structure (not a value's `x or y` inside it)
        # A program-free operand decides the whole when it is falsy under `and` or truthy under `or`; the
        # other truth value only repeats the rest (`f(x) == 2 and True`). Only a literal's truth is known
        # without running anything; any other program-free operand is refused as if it decided.
        deciding = isinstance(test.op, ast.Or)
        for operand in test.values:
            if not _depends_on_program(operand, fn_name):
                try:
                    redundant = bool(ast.literal_eval(operand)) != deciding
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    redundant = False
                if not redundant:
                    return ast.unparse(operand)
                continue
            part = _program_free_part(operand, fn_name)
            if part is not None:
                return part
    return None


def _check_test(test: Any, test_type: str, where: str, fn_name: str | None = None) -> None:
    """One test of a task; raises TaskSchemaError saying what a valid one looks like."""
    if test_type == "assert":
        if not isinstance(test, str):
            raise TaskSchemaError(f"{where} must be a string like 'assert f(1) == 2', got {type(test).__name__}")
        try:
            body = ast.parse(test).body
        except SyntaxError as exc:
            raise TaskSchemaError(f"{where} {test!r:.80} is not valid Python ({exc.msg})") from None
        asserts = [node for node in body if isinstance(node, ast.Assert)]
        if not asserts:
            raise TaskSchemaError(
                f"{where} {test!r:.80} is not an assert statement, so it could never fail; "
                f"write 'assert {test.strip()}'"
            )
        if all(_is_constant_assert(node) for node in asserts):
            raise TaskSchemaError(f"{where} {test!r:.80} asserts a constant and tests nothing")
        for node in asserts:
            part = _program_free_part(node.test, fn_name)
            if part is not None:
                raise TaskSchemaError(
                    f"{where} {test!r:.80}: its verdict does not depend on the program ({part!r:.60} names only "
                    "literals, builtins and standard modules), so every program would get the same verdict; "
                    "write the test so that it calls the program (e.g. 'assert f(1) == 2') or remove it"
                )
        return
    if not isinstance(test, dict) or set(test) != {"input", "output"}:
        found = f"keys {sorted(test)}" if isinstance(test, dict) else type(test).__name__
        raise TaskSchemaError(f"{where} must be an object with exactly the keys 'input' and 'output', got {found}")
    if test_type == "stdin" and not (isinstance(test["input"], str) and isinstance(test["output"], str)):
        raise TaskSchemaError(
            f"{where}: a stdin test's input and output must be strings (the text fed to stdin and "
            "the text expected on stdout)"
        )
    if test_type == "call" and not isinstance(test["input"], list):
        raise TaskSchemaError(
            f"{where}: a call test's input must be the list of arguments, got {type(test['input']).__name__}"
        )


def validate_task(task: Task) -> None:
    """The task schema (ARCHITECTURE.md, "The task record"), checked on every Task ever built.

    Every entry point builds Tasks (phase 1's loaders, `read_tasks` for --train_file/--eval_file/phase 2's
    --input, `evaluation.solve`), so no malformed task reaches the sandbox. A task must have at least one
    real test: an assert that is not an `assert` statement, or an empty test list, could only ever pass.
    """
    for name in ("task_id", "source", "problem", "test_type", "difficulty", "starter_code", "test_setup_code"):
        if not isinstance(getattr(task, name), str):
            raise TaskSchemaError(f"{name} must be a string, got {type(getattr(task, name)).__name__}")
    if not task.task_id.strip():
        raise TaskSchemaError("task_id must not be empty")
    if task.test_type not in TEST_TYPES:
        raise TaskSchemaError(f"test_type must be one of {', '.join(TEST_TYPES)}, got {task.test_type!r}")
    if task.fn_name is not None and (not isinstance(task.fn_name, str) or not task.fn_name.isidentifier()):
        raise TaskSchemaError(f"fn_name must be a Python identifier or null, got {task.fn_name!r}")
    if task.test_type == "call" and not task.fn_name:
        raise TaskSchemaError("a call-style task needs fn_name (the function or Solution method the tests call)")
    for name in TUPLE_FIELDS:
        if not isinstance(getattr(task, name), tuple):
            raise TaskSchemaError(f"{name} must be a list, got {type(getattr(task, name)).__name__}")
    if not task.tests:
        raise TaskSchemaError("tests is empty: a task needs at least one test, or every program would pass it")
    for i, test in enumerate(task.tests):
        _check_test(test, task.test_type, f"tests[{i}]", task.fn_name)
    for i, test in enumerate(task.challenge_tests):
        _check_test(test, task.test_type, f"challenge_tests[{i}]", task.fn_name)
    for name in ("test_imports", "reference_solutions"):
        for i, item in enumerate(getattr(task, name)):
            if not isinstance(item, str):
                raise TaskSchemaError(f"{name}[{i}] must be a string, got {type(item).__name__}")
    if not isinstance(task.metadata, dict):
        raise TaskSchemaError(f"metadata must be an object, got {type(task.metadata).__name__}")


def read_tasks(path: str | Path) -> list[Task]:
    """Load a task file (phase 1's data/train.jsonl and data/val.jsonl, or one a user wrote to the schema)."""
    tasks = []
    seen: dict[str, int] = {}
    for line_no, obj in iter_jsonl(path):
        try:
            task = Task.from_dict(obj)
        except (TypeError, ValueError) as exc:
            raise DataFormatError(
                f"{path}:{line_no}: not a valid task record: {exc}. "
                'The task schema is in ARCHITECTURE.md ("The task record"); phase1_prepare_data.py writes valid files.'
            ) from None
        if task.task_id in seen:
            raise DataFormatError(
                f"{path}:{line_no}: task_id {task.task_id!r} already used on line {seen[task.task_id]}; "
                "task ids must be unique."
            )
        seen[task.task_id] = line_no
        tasks.append(task)
    return tasks


def require_tasks(tasks: Sequence[Task], source: str | Path, total: int | None = None) -> list[Task]:
    """`tasks` as a list, or a DataFormatError naming `source` when there are none: a phase with no task
    would load a model (or start a server) and end with nothing done. `total`: how many the file held
    before a limit cut them (a limit that leaves none is named as the cause)."""
    if tasks:
        return list(tasks)
    if total:
        raise DataFormatError(f"{source}: the task limit leaves none of its {total} tasks; raise it or remove it.")
    raise DataFormatError(
        f"{source}: no task records (the file is empty). Run phase 1 (python phase1_prepare_data.py) to write "
        "data/train.jsonl and data/val.jsonl, or name a task file that has records."
    )


def write_tasks(path: str | Path, tasks: Iterable[Task]) -> Path:
    return write_jsonl_atomic(path, (t.to_dict() for t in tasks))
