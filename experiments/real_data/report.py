"""The real-data experiment's report, from its evidence alone (experiments/results/real_data/): real_data.json
and .md under --results_dir; per evaluation set (MBPP test, HumanEval) the teacher-guidance rerun's tables
(experiments/teacher_guidance/report.py): strict and sanitized pass@1 per arm and seed, the share ended by the
budget, the pre-registered contrasts by paired t over seeds."""

from __future__ import annotations

import json
import os
from pathlib import Path

from experiments.frame import write_report_files
from experiments.real_data.design import ARMS, BASE, EVAL_SETS, NAME, SAMPLES
from experiments.teacher_guidance.report import analyse_runs, load_runs, run_rows
from experiments.teacher_guidance.report import markdown as tg_markdown


def view(run: dict, eval_set: str) -> dict:
    """A run as seen on one evaluation set (its samples, scores and budget share)."""
    block = (run.get("evals") or {}).get(eval_set) or {}
    return {**run, **{k: v for k, v in block.items()}}


def arm_names(arm: str) -> dict:
    """An arm's letter and label as the design names them (the base: no training)."""
    return (
        {"letter": ARMS[arm].letter, "label": ARMS[arm].label}
        if arm in ARMS
        else {"letter": arm, "label": "no training"}
    )


def build_report(evidence: Path, command: str) -> dict:
    prepass_path = evidence / "prepass.json"
    if not prepass_path.is_file():
        return {"complete": False, "command": command, "note": "no pre-pass yet: nothing to report"}
    prepass = json.loads(prepass_path.read_text())
    all_runs = load_runs(evidence)
    recipe = json.loads((evidence / "recipe.json").read_text()) if (evidence / "recipe.json").is_file() else {}
    sets = {}
    for eval_set in EVAL_SETS:
        runs = [view(r, eval_set) for r in all_runs if r.get("stopped") or eval_set in (r.get("evals") or {})]
        task_ids = sorted({row[0] for r in runs for row in r.get("samples", [])})
        sets[eval_set] = {
            "tasks": len(task_ids),
            "runs": run_rows(runs),
            "analysis": analyse_runs(runs, task_ids, prepass["samples"]) if task_ids else {},
        }
    return {
        "command": command,
        "load_at_report": list(os.getloadavg()),
        "commits": sorted({(r.get("git") or {}).get("commit") or "unknown" for r in all_runs}),
        # the recipe's sampler for the arms (the pre-pass records its own per budget)
        "sampler": (recipe.get("flags") or {}).get("sampler", "kv"),
        "samples": prepass.get("samples", SAMPLES),
        "max_new_tokens": prepass["max_new_tokens"],
        "budgets_tried": prepass.get("budgets_tried") or [],
        "training_pool": prepass["training_pool"],
        "eval_sets": sets,
    }


def markdown(report: dict) -> str:
    if "eval_sets" not in report:
        return f"# Teacher guidance on real data\n\n{report['note']}\n"
    parts = [f"# Teacher guidance on real data (budget {report['max_new_tokens']} tokens)\n"]
    for eval_set, block in report["eval_sets"].items():
        if not block["analysis"]:
            parts.append(f"## {eval_set}\n\nno runs yet\n")
            continue
        arms = {r["arm"] for r in block["runs"].values()}
        shaped = {
            "analysis": block["analysis"],
            "runs": block["runs"],
            "arms": {a: arm_names(a) for a in [BASE, *ARMS] if a in arms},
            "design": "experiments/real_data/design.py",
            "command": report["command"],
            "commits": report.get("commits", []),
            "sampler": report.get("sampler", "kv"),
            "load_at_report": report["load_at_report"],
            "complete": False,
            "flagged_runs": [k for k, r in block["runs"].items() if r["signal"] and not r["signal"]["ok"]],
            "population": {
                "heldout_set": [None] * block["tasks"],
                "duplicates_dropped": [],
                "strata": {"all": block["tasks"]},
                "max_new_tokens": report["max_new_tokens"],
                "budgets_tried": report.get("budgets_tried", []),
                "heldout_note": f"{eval_set}: every problem ({block['tasks']}), {report.get('samples', SAMPLES)} "
                "samples each, none dropped (MBPP's test ids; HumanEval is never trained)",
            },
        }
        parts.append(f"## {eval_set} ({block['tasks']} problems)\n\n" + tg_markdown(shaped).split("\n", 2)[2])
    return "\n".join(parts)


def write_report(report: dict, results_dir: Path) -> list[Path]:
    return write_report_files(report, results_dir, NAME, markdown, lambda r, p: None, plotted=False)
