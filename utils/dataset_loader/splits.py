"""The embedded fixtures, and the seeded sample and split every phase agrees on."""

from __future__ import annotations

import random
from pathlib import Path

from utils.dataset_loader.task import Task

EMBEDDED_DIR = Path(__file__).resolve().parents[2] / "data" / "embedded"
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


PHASE1_CONFIG = "phase1_config.json"  # the config phase 1 saves beside the task files it writes


def dataset_name_note(dataset_name: str, task_file: Path) -> tuple[str, bool]:
    """What a later phase says when the config names a dataset (data.dataset_name, a TRL / open-r1 habit: there
    the dataset is the training set): phase 1 reads that key, every later phase reads task files. Returns
    (message, refuse): refuse when phase 1's saved config beside `task_file` shows the file was made from
    another source; a note when nothing beside it says; ("", False) when the file was made from that dataset."""
    import json

    if not dataset_name:
        return "", False
    saved = task_file.parent / PHASE1_CONFIG
    try:
        made_from = json.loads(saved.read_text(encoding="utf-8")).get("data", {}).get("dataset_name")
    except (OSError, ValueError, AttributeError):
        made_from = None
    if made_from == dataset_name:
        return "", False
    if made_from is None:
        return (
            f"note: data.dataset_name {dataset_name!r} is read by phase 1 only; this phase reads {task_file} "
            "(nothing beside it says what it was made from).",
            False,
        )
    origin = f"dataset {made_from!r}" if made_from else "MBPP/APPS"
    return (
        f"data.dataset_name is {dataset_name!r}, but {task_file} was made by phase 1 from {origin} ({saved}); "
        "phases 2-4 read task files, not datasets. Run phase1_prepare_data.py with the same --config (or "
        f"--dataset_name {dataset_name}) first, or leave dataset_name out.",
        True,
    )
