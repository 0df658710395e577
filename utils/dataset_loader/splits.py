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
