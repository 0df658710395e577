"""The task record, and reading/writing task files.

Every phase reads tasks only through this module. A task is one programming problem with its
tests stored as data, in one of three test styles:

- ``assert`` (MBPP): ``tests`` is a list of assert statements. ``test_imports`` run before the
  program, ``test_setup_code`` runs *after* the program (MBPP's setup code uses classes that the
  solution defines) and before the asserts.
- ``stdin`` (APPS standard-input problems): ``tests`` is a list of ``{"input": str, "output": str}``.
- ``call`` (APPS problems with ``fn_name``): ``tests`` is a list of ``{"input": [args...],
  "output": value}``; ``fn_name`` is a plain function or a method of ``class Solution``.

What this module does not know: how tests are executed (evaluation.code_executor) or how a
prompt is worded (utils.prompts).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

TEST_TYPES = ("assert", "stdin", "call")


class DataFormatError(ValueError):
    """Bad input data; the message names the file (and line) and what to do."""


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
        if self.test_type not in TEST_TYPES:
            raise ValueError(f"test_type must be one of {TEST_TYPES}, got {self.test_type!r}")
        if self.test_type == "call" and not self.fn_name:
            raise ValueError("a call-style task needs fn_name")

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
        for key in ("tests", "test_imports", "challenge_tests", "reference_solutions"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line_number, object) for each non-blank line; errors name file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: file not found.")
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(
                    f"{path}:{line_no}: malformed JSON ({exc.msg} at column {exc.colno}). "
                    "Each line must be one JSON object; fix or remove that line."
                ) from None
            if not isinstance(obj, dict):
                raise DataFormatError(f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}.")
            yield line_no, obj


def read_tasks(path: str | Path) -> list[Task]:
    """Load a task file written by phase 1 (data/train.jsonl, data/val.jsonl)."""
    tasks = []
    for line_no, obj in read_jsonl(path):
        try:
            tasks.append(Task.from_dict(obj))
        except (TypeError, ValueError) as exc:
            raise DataFormatError(
                f"{path}:{line_no}: not a valid task record: {exc}. "
                "Regenerate the file with phase1_prepare_data.py."
            ) from None
    return tasks


def write_jsonl_atomic(path: str | Path, records: Iterable[dict[str, Any]]) -> Path:
    """Write records as JSONL to a temp file in the same folder, then rename over `path`.

    A crash leaves either the old file or the new one, never half of one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False, sort_keys=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_tasks(path: str | Path, tasks: Iterable[Task]) -> Path:
    return write_jsonl_atomic(path, (t.to_dict() for t in tasks))
