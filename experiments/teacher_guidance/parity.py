"""The two samplers' parity on this experiment's population: the base model's passes per task under one sampler
against another's at the same budget, decoding and samples per task, over the tasks both sampled in full.

The samplers draw different random numbers, so single samples do not pair; each task's pass count does. The
verdict is the paired difference of per-task pass rates (second − first) with its 95% t interval over tasks, beside
each sampler's share of answers ended by the budget and mean length.

    python -m experiments.teacher_guidance.parity --first kv.samples.jsonl --second vllm.samples.jsonl \\
        --samples 8 --output experiments/results/teacher_guidance/prepass/sampler-parity-384.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments import frame


def per_task(rows: list[dict], samples: int) -> dict[str, list[dict]]:
    """Task id -> its rows, for the tasks with every one of `samples` samples (0 .. samples-1) graded."""
    by_task: dict[str, dict[int, dict]] = {}
    for row in rows:
        by_task.setdefault(row["task_id"], {})[row["sample_idx"]] = row
    return {t: [got[i] for i in range(samples)] for t, got in by_task.items() if all(i in got for i in range(samples))}


def compare(first: list[dict], second: list[dict], samples: int) -> dict:
    """Per-task pass rates of two samplers' graded samples, paired over the tasks both sampled in full."""
    from evaluation.seed_contrasts import paired_t

    a, b = per_task(first, samples), per_task(second, samples)
    tasks = sorted(set(a) & set(b))
    if not tasks:
        raise ValueError("the two samplers have no task sampled in full by both")
    rate_a = [sum(r["passed"] for r in a[t]) / samples for t in tasks]
    rate_b = [sum(r["passed"] for r in b[t]) / samples for t in tasks]
    diff = [y - x for x, y in zip(rate_a, rate_b, strict=True)]  # (tasks,)
    interval = paired_t(diff)  # over tasks here: each task is one pair

    def shape(rows: dict[str, list[dict]]) -> dict:
        flat = [r for t in tasks for r in rows[t]]
        return {
            "pass_rate": sum(r["passed"] for r in flat) / len(flat),
            "at_budget": sum(r["finish_reason"] == "length" for r in flat) / len(flat),
            "mean_tokens": sum(r["num_tokens"] for r in flat) / len(flat),
        }

    return {
        "tasks": len(tasks),
        "samples_per_task": samples,
        "first": shape(a),
        "second": shape(b),
        "difference": {"mean": interval["delta"], "ci95": interval["ci95"]},
        "tasks_differing_by_more_than_half": [t for t, d in zip(tasks, diff, strict=True) if abs(d) > 0.5],
        "per_task": {t: [x, y] for t, x, y in zip(tasks, rate_a, rate_b, strict=True)},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first", required=True, help="Phase 4's --samples_output of the first sampler.")
    parser.add_argument("--second", required=True, help="Phase 4's --samples_output of the second sampler.")
    parser.add_argument("--first_name", default="kv")
    parser.add_argument("--second_name", default="vllm")
    parser.add_argument("--samples", type=int, default=8, help="Samples per task (default 8).")
    parser.add_argument("--output", required=True, help="Where the JSON record goes.")
    args = parser.parse_args(argv)
    record = compare(frame.read_jsonl(Path(args.first)), frame.read_jsonl(Path(args.second)), args.samples)
    record = {"first_name": args.first_name, "second_name": args.second_name, **record, "git": frame.git_commit()}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    d = record["difference"]
    print(
        f"{record['tasks']} tasks x {args.samples}: pass rate {args.first_name} {record['first']['pass_rate']:.3f}, "
        f"{args.second_name} {record['second']['pass_rate']:.3f}; difference {d['mean']:+.3f} "
        f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
    )
    return record


if __name__ == "__main__":
    main()
