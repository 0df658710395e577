"""Any dataset `datasets.load_dataset` reads, through a column mapping, to `Task` records."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from utils.dataset_loader.rows import LoadReport, build_task, hub_error
from utils.dataset_loader.task import Task
from utils.jsonl import DataFormatError

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
    return build_task(
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
