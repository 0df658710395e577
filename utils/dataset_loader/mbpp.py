"""MBPP: the full and sanitized schemas, from the hub or a local file, to `Task` records."""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from utils.code_parser import parse_quietly
from utils.dataset_loader.rows import LoadReport, build_task, hub_error, keep_distinct, read_rows, require_columns
from utils.dataset_loader.task import Task
from utils.jsonl import DataFormatError

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
    require_columns(
        row, ("task_id", "code", "test_list", "prompt" if schema == "MBPP sanitized" else "text"), where, schema
    )
    for key in ("test_list", "challenge_test_list", "test_imports"):
        if row.get(key) is not None and not isinstance(row[key], (list, tuple)):
            raise DataFormatError(f"{where}: {key} must be a list of strings, got {type(row[key]).__name__}.")
    tests = tuple(t.strip() for t in (row.get("test_list") or []) if t and t.strip())
    if not tests:
        return None
    task_id = int(row["task_id"])
    code = row["code"] or ""
    imports = row.get("test_imports") or []
    return build_task(
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


def load_mbpp(path: str | Path | None = None, config: str = "full") -> tuple[list[Task], LoadReport]:
    """All MBPP tasks from a local file (either schema) or the hub (config 'full' or 'sanitized')."""
    rows, origin = (read_rows(path), str(path)) if path else _mbpp_hub_rows(config)
    report = LoadReport("mbpp", origin, rows=len(rows))
    candidates = ((mbpp_row_to_task(row, where), "no tests") for where, row in rows)
    return keep_distinct(candidates, report, "duplicate task_id"), report
