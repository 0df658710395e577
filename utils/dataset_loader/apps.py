"""APPS: the codeparrot/apps schema, from the hub's plain files or a local file, to `Task` records."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from utils.dataset_loader.rows import LoadReport, build_task, hub_error, keep_distinct, read_rows, require_columns
from utils.dataset_loader.task import Task

APPS_HUB_ID = "codeparrot/apps"
APPS_DIFFICULTIES = ("introductory", "interview", "competition")


def _join_lines(value: Any) -> Any:
    """APPS stdin data may be a list of lines; the reference harness joins them with newlines."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value) + "\n" if value else ""
    return value


def apps_row_to_task(row: dict[str, Any], where: str, split: str = "train") -> tuple[Task | None, str | None]:
    """One codeparrot/apps row -> (Task, None) or (None, skip reason)."""
    require_columns(row, ("problem_id", "question", "input_output"), where, "APPS")
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
    return build_task(
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
