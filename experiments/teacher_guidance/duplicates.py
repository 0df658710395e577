"""Which held-out fixture tasks are near-duplicates of a training task, measured in the sandbox: each held-out
task's reference solution runs on each training task's tests with its entry point renamed to the training task's
(an alias line appended), and each training reference on each held-out task's tests the same way. A pair whose
program passes all of the other task's tests (`THRESHOLD`), in either direction, is a measured duplicate; pairs
passing at least `PARTIAL` are listed beside it.

    python -m experiments.teacher_guidance.duplicates --data DIR --output FILE

DIR holds phase 1's train.jsonl and val.jsonl. Only tasks of one calling style are compared with each other (a
function with a function, a stdin program with a stdin program); a pair across styles (the same computation as a
function and as a stdin program) is not measured here, and the design adds the hand-classified pairs of that kind
(`design.REVIEWED_DUPLICATES`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

THRESHOLD = 1.0  # share of the other task's tests a renamed reference must pass: the same function
PARTIAL = 0.5  # reported beside (an overlap on these 2-4 tests can be a coincidence on trivial inputs)


def alias(code: str, source: str | None, target: str | None, starter: str) -> str:
    """`code` with `target` made a name for its entry point `source`: an alias line, or a small wrapper when one side
    is a method of class Solution and the other a plain function."""
    if not source or not target:
        return code
    as_method, is_method = "class Solution" in starter, "class Solution" in code
    if as_method and not is_method:
        return f"{code}\n\nclass Solution:\n    def {target}(self, *args):\n        return {source}(*args)\n"
    if is_method and not as_method:
        return f"{code}\n\ndef {target}(*args):\n    return Solution().{source}(*args)\n"
    if source == target:
        return code
    return f"{code}\n\nSolution.{target} = Solution.{source}\n" if is_method else f"{code}\n\n{target} = {source}\n"


def style(task) -> str:
    return "stdin" if task.test_type == "stdin" else "function"


def measure(train, heldout, pool) -> list[dict]:
    """One row per (held-out, training) pair of one calling style: the share of the other task's tests each
    renamed reference passes, in both directions."""
    from sandbox.executor import execute_many

    pairs, jobs = [], []
    for h in heldout:
        for t in train:
            if style(h) != style(t) or not h.reference_solutions or not t.reference_solutions:
                continue
            pairs.append((h, t))
            jobs.append((alias(h.reference_solutions[0], h.fn_name, t.fn_name, t.starter_code or ""), t))
            jobs.append((alias(t.reference_solutions[0], t.fn_name, h.fn_name, h.starter_code or ""), h))
    results = execute_many(jobs, pool)
    rows = []
    for n, (h, t) in enumerate(pairs):
        forward, backward = results[2 * n], results[2 * n + 1]
        rows.append(
            {
                "heldout": h.task_id,
                "train": t.task_id,
                "heldout_ref_on_train_tests": round(forward.pass_fraction, 3),
                "train_ref_on_heldout_tests": round(backward.pass_fraction, 3),
                "duplicate": max(forward.pass_fraction, backward.pass_fraction) >= THRESHOLD,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="Folder with phase 1's train.jsonl and val.jsonl.")
    parser.add_argument("--output", required=True, help="Where the JSON map goes.")
    args = parser.parse_args(argv)
    from sandbox.executor import SandboxPool
    from utils.dataset_loader import read_tasks
    from utils.jsonl import write_json_atomic

    data = Path(args.data)
    train, heldout = read_tasks(data / "train.jsonl"), read_tasks(data / "val.jsonl")
    with SandboxPool(2) as pool:
        rows = measure(train, heldout, pool)
    found = sorted({(r["heldout"], r["train"]) for r in rows if r["duplicate"]})
    record = {
        "threshold": THRESHOLD,
        "pairs_compared": len(rows),
        "duplicates": [{"heldout": h, "train": t} for h, t in found],
        "partial": sorted(
            {
                (r["heldout"], r["train"])
                for r in rows
                if max(r["heldout_ref_on_train_tests"], r["train_ref_on_heldout_tests"]) >= PARTIAL
            }
        ),
        "rows": [r for r in rows if r["heldout_ref_on_train_tests"] > 0 or r["train_ref_on_heldout_tests"] > 0],
    }
    write_json_atomic(Path(args.output), record)
    print(json.dumps(record["duplicates"], indent=1))
    return record


if __name__ == "__main__":
    main()
