"""The samplers' parity check (experiments/teacher_guidance/parity.py) against hand-computed values."""

from __future__ import annotations

import pytest

from experiments.teacher_guidance.parity import compare


def rows(task: str, passes: list[bool], length: int = 10, cut: int = 0) -> list[dict]:
    return [
        {
            "task_id": task,
            "sample_idx": i,
            "passed": p,
            "finish_reason": "length" if i < cut else "stop",
            "num_tokens": length,
        }
        for i, p in enumerate(passes)
    ]


def test_tasks_pair_by_pass_rate_and_only_tasks_sampled_in_full_by_both_count():
    first = rows("a", [True, False]) + rows("b", [False, False]) + rows("c", [True, True])[:1]  # c: one of two
    second = rows("a", [True, True], length=20, cut=1) + rows("b", [True, False]) + rows("c", [True, True])
    out = compare(first, second, samples=2)
    assert out["tasks"] == 2 and out["per_task"] == {"a": [0.5, 1.0], "b": [0.0, 0.5]}
    # differences 0.5 and 0.5: mean 0.5, sd 0, so the interval is the point
    assert out["difference"]["mean"] == pytest.approx(0.5) and out["difference"]["ci95"] == pytest.approx([0.5, 0.5])
    assert out["first"] == {"pass_rate": 0.25, "at_budget": 0.0, "mean_tokens": 10.0}
    assert out["second"] == {"pass_rate": 0.75, "at_budget": 0.25, "mean_tokens": 15.0}
    assert out["tasks_differing_by_more_than_half"] == []


def test_the_interval_is_the_t_interval_over_tasks():
    first = rows("a", [False, False]) + rows("b", [False, False]) + rows("c", [True, True])
    second = rows("a", [True, True]) + rows("b", [True, False]) + rows("c", [True, True])
    out = compare(first, second, samples=2)
    # differences 1.0, 0.5, 0.0: mean 0.5, sd 0.5, se 0.5/sqrt(3), t_{2, 0.975} = 4.302653
    half = 4.302653 * 0.5 / 3**0.5
    assert out["difference"]["ci95"] == pytest.approx([0.5 - half, 0.5 + half], abs=1e-5)
    assert out["tasks_differing_by_more_than_half"] == ["a"]


def test_no_task_in_common_is_an_error():
    with pytest.raises(ValueError, match="no task"):
        compare(rows("a", [True]), rows("b", [True]), samples=1)
