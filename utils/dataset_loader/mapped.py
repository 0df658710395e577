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


def apps_io_tests(value: Any, where: str) -> tuple[list, str | None] | None:
    """APPS's `input_output` form ({"inputs": [...], "outputs": [...], "fn_name"?}, as an object or its JSON
    string) -> (tests as {input, output} records, fn_name or None); None when `value` is not that form. Without
    fn_name the tests are stdin tests (a list of lines is joined, as phase 1 does for APPS itself)."""
    from utils.dataset_loader.apps import _join_lines

    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise DataFormatError(f"{where}: tests looks like a JSON object but does not parse.") from None
    if not isinstance(value, dict) or not {"inputs", "outputs"} <= set(value):
        return None
    inputs, outputs, fn_name = value["inputs"], value["outputs"], value.get("fn_name") or None
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise DataFormatError(
            f"{where}: tests is APPS's input_output form, but its inputs and outputs are not lists of one length."
        )
    if fn_name:
        return [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)], fn_name
    return [{"input": _join_lines(i), "output": _join_lines(o)} for i, o in zip(inputs, outputs, strict=True)], None


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
        shape = "a JSON string that is not a list" if isinstance(value, str) else type(value).__name__
        raise DataFormatError(
            f"{where}: {name} must be a list (or a JSON string of one), or for tests APPS's input_output object "
            f'({{"inputs": [...], "outputs": [...]}}); got {shape}.'
        )
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
    io_tests = apps_io_tests(values["tests"], where)
    if io_tests is not None:  # APPS's input_output: stdin tests, or call tests when it names the function
        values["tests"], io_fn = io_tests
        if io_fn:
            values.setdefault("fn_name", io_fn)
            values["test_type"] = "call"
        elif "test_type" not in values:
            values["test_type"] = "stdin"
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


def is_saved_dataset(folder: Path) -> bool:
    """A folder written by `Dataset.save_to_disk` (state.json) or `DatasetDict.save_to_disk` (dataset_dict.json)."""
    return folder.is_dir() and ((folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file())


def _saved_split(folder: Path, split: str) -> Any:
    from datasets import DatasetDict, load_from_disk  # lazy: only this path needs it

    saved = load_from_disk(str(folder))
    if isinstance(saved, DatasetDict):
        if split not in saved:
            raise DataFormatError(f"{folder}: no split {split!r}; it has {', '.join(saved)} (--dataset_split).")
        return saved[split]
    return saved  # one Dataset: it is the split


def load_mapped_dataset(
    name: str, config_name: str = "", split: str = "train", field_map: Iterable[str] = (), test_type: str = "assert"
) -> tuple[list[Task], LoadReport]:
    """Tasks from any dataset `datasets.load_dataset` reads (hub name, local folder or file), through a field map."""
    from datasets import load_dataset  # lazy: only this path needs it

    mapping = parse_field_map(field_map)
    source = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(name.rstrip("/")).name).strip("-") or "dataset"
    local = Path(name).exists()
    try:
        if is_saved_dataset(Path(name)):  # written by Dataset(Dict).save_to_disk: load_dataset refuses those
            rows = _saved_split(Path(name), split)
        elif Path(name).is_file():  # a single local file: the packaged builder for its type
            builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(Path(name).suffix)
            if builder is None:
                raise DataFormatError(f"{name}: unsupported file type; use .jsonl, .json, .parquet or .csv.")
            rows = load_dataset(builder, data_files=name, split=split)
        else:
            rows = load_dataset(name, config_name or None, split=split)
    except DataFormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - hub unreachable, unknown name, bad split: many unrelated types
        if local:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise DataFormatError(
                f"could not read the local {'folder' if Path(name).is_dir() else 'file'} {name} as a dataset "
                f"(split {split}; {type(exc).__name__}: {first}). It takes .jsonl, .json, .parquet or .csv files (a "
                "folder of them), or a folder written by save_to_disk."
            ) from None
        raise hub_error(
            f"dataset {name!r} (config {config_name or 'default'}, split {split})",
            exc,
            "--dataset_name (a local folder or file)",
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
