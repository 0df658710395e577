"""The difficulty filter for GRPO: draw prompts whose groups can have spread.

A GRPO group whose G samples all pass, or all fail, has no correctness spread: its advantages are
(nearly) zero, and the rollouts it cost teach nothing but the format bonus. On real MBPP the 135M
student passes ~1% of its rollouts, so most groups are all-fail. Like PRIME's and
DeepCoder's online filters, this module keeps, per training task, the correctness rewards of its
newest `window` samples under the policy as it was when they were drawn (the reward in use: 1/0 for
`binary`, the share of hidden tests for `fraction`, so partial credit counts as spread exactly where the
advantage sees it), and when the next rollout batch is drawn it skips a task whose estimate is *settled*:
at least `min_samples` samples, all with the same reward (all passed, or all equal short of a pass). A
skipped task comes back after `revisit_after` skips, because the policy moves.

The draw walks the same seeded epoch permutations as the plain order (`order_position`), from a cursor
kept in the state, so with every task unsettled it draws exactly what the plain order draws. When every
task is settled it takes the permutation's tasks anyway (a batch must be drawn) and says so in the
metrics.

Where an estimate comes from: the rollouts already made (`observe`, after each batch is scored), and
optionally a prior (`prior_from_samples`: phase 4's per-sample rows of the starting model on the
training tasks, the cheap pre-pass). Its whole state is JSON (`state`/`load`) and rides in the
trainer's checkpoint, so a resumed run draws what the uninterrupted run would have drawn.

Pure Python and numpy; knows task indices and reward values, not models, tokenizers or the sandbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np


def order_position(seed: int, num_tasks: int, position: int) -> int:
    """The task index at `position` of the plain data order: epoch permutations seeded by (seed, epoch)."""
    epoch, offset = divmod(position, num_tasks)
    return int(np.random.default_rng([seed, epoch]).permutation(num_tasks)[offset])


# the advantage's own tolerance (training.losses.ZERO_SPREAD_TOL): rewards closer than this are equal
SPREAD_TOL = 1e-6


class Curriculum:
    """Per-task reward history and the filtered draw; one per process, identical on every process."""

    def __init__(self, num_tasks: int, seed: int, min_samples: int, window: int, revisit_after: int) -> None:
        if num_tasks < 1:
            raise ValueError("the curriculum needs at least one task")
        if min_samples < 1 or window < min_samples:
            raise ValueError(f"need 1 <= min_samples <= window, got min_samples={min_samples}, window={window}")
        self.num_tasks = num_tasks
        self.seed = seed
        self.min_samples = min_samples
        self.window = window
        self.revisit_after = revisit_after
        self.history: list[list[float]] = [[] for _ in range(num_tasks)]  # newest `window` rewards per task
        self.skips = [0] * num_tasks  # times skipped since last drawn
        self.cursor = 0  # the next position of the plain order to look at
        self.skipped_total = 0

    # ---------------------------------------------------------------- estimates

    def observe(self, task_index: int, outcomes: Iterable[float]) -> None:
        """Add a group's correctness rewards (one per sample: 1/0 passed, or the share of tests) to a task's
        history."""
        kept = self.history[task_index] + [float(x) for x in outcomes]
        self.history[task_index] = kept[-self.window :]

    def rate(self, task_index: int) -> float | None:
        """The task's estimated mean correctness reward (the pass rate for binary rewards); None when it has none."""
        h = self.history[task_index]
        return sum(h) / len(h) if h else None

    def settled(self, task_index: int) -> str | None:
        """'all_pass' / 'all_fail' when the task's kept rewards are all equal (no spread for the advantage):
        'all_pass' when they are all full solves, 'all_fail' otherwise; else None."""
        h = self.history[task_index]
        if len(h) < self.min_samples or max(h) - min(h) > SPREAD_TOL:
            return None
        return "all_pass" if min(h) >= 1.0 - SPREAD_TOL else "all_fail"

    # ---------------------------------------------------------------- the draw

    def draw(self, count: int) -> tuple[list[int], dict[str, float]]:
        """The next `count` task indices and what the filter did while drawing them (metrics)."""
        chosen: list[int] = []
        looked = skipped = 0
        settled_in_plain = 0  # how many of the plain order's first `count` tasks were settled
        start = self.cursor
        # one full epoch without a drawable task means every task is settled: take the plain order then
        limit = start + self.num_tasks + count
        position = start
        while len(chosen) < count and position < limit:
            task = order_position(self.seed, self.num_tasks, position)
            position += 1
            looked += 1
            state = self.settled(task)
            if looked <= count and state is not None:
                settled_in_plain += 1
            if state is not None and (self.revisit_after == 0 or self.skips[task] < self.revisit_after):
                self.skips[task] += 1
                skipped += 1
                continue
            self.skips[task] = 0
            chosen.append(task)
        forced = 0
        while len(chosen) < count:  # everything settled and nothing due for a revisit
            chosen.append(order_position(self.seed, self.num_tasks, position))
            position += 1
            forced += 1
        self.cursor = position
        self.skipped_total += skipped
        return chosen, {
            "curriculum/skipped": float(skipped),
            "curriculum/forced": float(forced),
            "curriculum/settled_share_plain_draw": settled_in_plain / count if count else 0.0,
            **self.summary(),
        }

    def summary(self) -> dict[str, float]:
        states = [self.settled(i) for i in range(self.num_tasks)]
        rates = [r for r in (self.rate(i) for i in range(self.num_tasks)) if r is not None]
        return {
            "curriculum/known_tasks": float(sum(bool(h) for h in self.history)),
            "curriculum/settled_all_pass": float(states.count("all_pass")),
            "curriculum/settled_all_fail": float(states.count("all_fail")),
            "curriculum/mean_rate": sum(rates) / len(rates) if rates else float("nan"),
            "curriculum/skipped_total": float(self.skipped_total),
        }

    # ---------------------------------------------------------------- prior and state

    def prior_from_samples(self, rows: Iterable[Mapping[str, Any]], task_ids: Sequence[str]) -> int:
        """Seed the histories with a pre-pass's per-sample rows ({'task_id', 'passed'}); returns the rows used."""
        index = {task_id: i for i, task_id in enumerate(task_ids)}
        used = 0
        for row in rows:
            i = index.get(str(row.get("task_id")))
            if i is not None:
                self.observe(i, [float(bool(row.get("passed")))])
                used += 1
        return used

    def state(self) -> dict[str, Any]:
        return {
            "num_tasks": self.num_tasks,
            "history": [list(h) for h in self.history],
            "skips": list(self.skips),
            "cursor": self.cursor,
            "skipped_total": self.skipped_total,
        }

    def load(self, state: Mapping[str, Any]) -> None:
        if state["num_tasks"] != self.num_tasks:
            raise ValueError(
                f"the checkpoint's curriculum has {state['num_tasks']} tasks, this run {self.num_tasks}: "
                "resume with the same task file"
            )
        self.history = [[float(x) for x in h] for h in state["history"]]
        self.skips = list(state["skips"])
        self.cursor = int(state["cursor"])
        self.skipped_total = int(state["skipped_total"])


def zero_spread_share(groups_rewards: Sequence[Sequence[float]]) -> float:
    """Share of groups whose correctness rewards are all equal (no spread for the advantage); groups: (N, G)."""
    if not groups_rewards:
        return 0.0
    flat = sum(1 for g in groups_rewards if not g or max(g) - min(g) <= SPREAD_TOL)
    return flat / len(groups_rewards)


def build_curriculum(section: Any, group_size: int, task_ids: Sequence[str], seed: int) -> Curriculum | None:
    """The trainer's curriculum from the config's `curriculum` section (None when it is off), with its prior
    read from `prior_file` (phase 4's per-sample rows) when one is named."""
    if not section.enabled:
        return None
    min_samples = section.min_samples or group_size
    curriculum = Curriculum(
        len(task_ids), seed, min_samples, max(section.window or group_size, min_samples), section.revisit_after
    )
    if section.prior_file:
        from pathlib import Path

        from utils.jsonl import read_jsonl

        path = Path(section.prior_file)
        if not path.is_file():
            raise FileNotFoundError(f"curriculum.prior_file {path} does not exist (phase 4's eval_samples.jsonl)")
        used = curriculum.prior_from_samples(read_jsonl(path), task_ids)
        if used == 0:
            raise ValueError(f"curriculum.prior_file {path} has no sample of a training task (wrong file?)")
    return curriculum
