"""Raw rows from local files (.jsonl, .json, .parquet), the load report, and what every source's loader shares."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from utils.dataset_loader.task import Task, TaskSchemaError
from utils.jsonl import DataFormatError, iter_jsonl

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


def build_task(where: str, **values: Any) -> Task:
    """Task(**values), with a schema violation reported as a DataFormatError naming the row."""
    try:
        return Task(**values)
    except TaskSchemaError as exc:
        raise DataFormatError(f"{where}: {exc}.") from None


def require_columns(row: dict, keys: tuple[str, ...], where: str, schema: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise DataFormatError(
            f"{where}: missing required field(s) {', '.join(missing)} for the {schema} schema "
            f"(row has: {', '.join(sorted(row)) or 'nothing'})."
        )


def hub_error(what: str, exc: Exception, local_flag: str) -> DataFormatError:
    """One line instead of a 100-line traceback when the hub cannot be reached (offline, no network, a typo)."""
    offline = " HF_HUB_OFFLINE=1 is set, so nothing is downloaded." if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return DataFormatError(
        f"could not load {what} from the Hugging Face hub ({type(exc).__name__}: {first}).{offline} "
        f"Check the network, pass a local copy with {local_flag}, or use --offline for the embedded fixtures."
    )


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
