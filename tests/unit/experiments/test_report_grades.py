"""Every experiment's report puts the sanitized grade and the share of answers ended by the token budget beside its
strict pass@k, so a format failure cannot pass for a coding one (the ablation, the held-out learning experiment
and the seeded ablation; the teacher-guidance and real-data reports are tested with their runners)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.ablation import run as ablation
from experiments.ablation_seeds import report as seeds_report
from experiments.frame import phase4_grades
from experiments.learning_heldout import run as heldout

# phase 4's evaluation_results.json, the fields these reports read
RESULT = {
    "pass_at_k": {"1": 0.25, "2": 0.4},
    "pass_at_k_ci95": {"1": [0.1, 0.4], "2": [0.2, 0.6]},
    "pass_at_k_sanitized": {"1": 0.375, "2": 0.5},
    "format": {"truncated": 0.125},
}


def test_phase4s_sanitized_grade_and_budget_share_are_read_and_an_older_result_has_none():
    assert phase4_grades(RESULT, "1") == {"sanitized_pass": 0.375, "at_budget": 0.125}
    assert phase4_grades({"pass_at_k": {"1": 0.25}}, "1") == {"sanitized_pass": None, "at_budget": None}


def test_the_ablation_table_has_the_sanitized_grade_and_the_budget_share(tmp_path: Path):
    variant = {
        "name": "full",
        "label": "GRPO + teacher-SFT + self-SFT",
        "pass_at_k": RESULT["pass_at_k"],
        "pass_at_k_ci95": RESULT["pass_at_k_ci95"],
        "full_minus_variant": None,
        "variant_minus_base": None,
        "train_seconds": 10.0,
        **phase4_grades(RESULT, "1"),
    }
    report = {
        "recipe": {"steps": 2, "lr": 5e-4, "max_new_tokens": 64, "teacher": "t", "eval_max_new_tokens": 64, "seed": 1},
        "k_values": [1, 2],
        "train_tasks": 4,
        "eval_set": {"name": "val", "num_tasks": 8, "version": "v"},
        "decoding": "T 0.7, 2 samples per task",
        "variants": [variant],
    }
    ablation.write_reports(report, tmp_path)
    text = (tmp_path / "ablation.md").read_text()
    assert "| sanitized pass@1 | ended by the budget |" in text
    assert "| 0.3750 | 12.5% |" in text


def test_the_held_out_learning_table_has_the_sanitized_grade_and_the_budget_share(tmp_path: Path):
    report = {
        "eval_set": {"name": "mbpp_test", "num_tasks": 8, "decoding": "T 0.7", "samples_per_task": 2},
        "complete": True,
        "command": "python -m experiments.learning_heldout.run",
        "k_values": [1, 2],
        "variants": [
            {
                "name": "base",
                "label": "base model",
                "pass_at_1": 0.25,
                "pass_at_1_ci": [0.1, 0.4],
                "pass_at_k": {"1": 0.25, "2": 0.4},
                **phase4_grades(RESULT, "1"),
            }
        ],
        "power_full_vs_base": None,
        "machine_load_at_report": "1.0",
    }
    heldout.write_reports(report, tmp_path)
    text = (tmp_path / "learning_heldout.md").read_text()
    assert "| variant | pass@1 [95% CI] | sanitized pass@1 | ended by the budget |" in text
    assert "| 0.3750 | 12.5% |" in text


def test_the_seeded_ablations_taxonomy_grades_both_ways_where_the_evidence_has_the_column():
    # task, sample, passed, status, finish_reason, tokens, lenient, sanitized
    rows = [
        ["a", 0, 1, "passed", "stop", 10, 1, 1],
        ["a", 1, 0, "syntax_error", "stop", 12, 0, 1],
        ["b", 0, 0, "syntax_error", "length", 64, 0, 0],
        ["b", 1, 0, "wrong_answer", "stop", 9, 0, 0],
    ]
    shape = seeds_report.taxonomy([{"samples": rows}])
    assert shape["passed"] == pytest.approx(0.25) and shape["sanitized_passed"] == pytest.approx(0.5)
    assert shape["truncated"] == pytest.approx(0.25)
    older = seeds_report.taxonomy([{"samples": [r[:6] for r in rows]}])
    assert older["passed"] == pytest.approx(0.25) and older["sanitized_passed"] is None
