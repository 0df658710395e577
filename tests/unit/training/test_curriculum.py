"""The difficulty filter (training.curriculum): settled tasks are not drawn, the draw is the plain order when
nothing is known, its state survives a checkpoint, and its statistics reach the metrics."""

from __future__ import annotations

import json

import pytest

from training.curriculum import Curriculum, build_curriculum, order_position, zero_spread_share


def _draws(curriculum: Curriculum, batches: int, size: int) -> list[list[int]]:
    return [curriculum.draw(size)[0] for _ in range(batches)]


def test_with_nothing_known_the_draw_is_the_plain_seeded_order():
    c = Curriculum(7, seed=3, min_samples=2, window=2, revisit_after=3)
    drawn = [i for batch in _draws(c, 5, 3) for i in batch]
    assert drawn == [order_position(3, 7, p) for p in range(15)]
    assert sorted(drawn[:7]) == list(range(7))  # an epoch is a permutation


def test_all_pass_and_all_fail_tasks_are_not_drawn_once_known():
    c = Curriculum(6, seed=0, min_samples=4, window=4, revisit_after=0)
    c.observe(0, [False] * 4)  # all fail
    c.observe(1, [True] * 4)  # all pass
    c.observe(2, [True, False, False, False])  # spread: stays
    c.observe(3, [False] * 3)  # too few samples to judge: stays
    assert (c.settled(0), c.settled(1), c.settled(2), c.settled(3)) == ("all_fail", "all_pass", None, None)
    assert c.rate(1) == 1.0 and c.rate(2) == 0.25 and c.rate(5) is None
    drawn = [i for batch in _draws(c, 8, 2) for i in batch]
    assert 0 not in drawn and 1 not in drawn and {2, 3, 4, 5} <= set(drawn)
    _, metrics = c.draw(2)
    assert metrics["curriculum/settled_all_fail"] == 1 and metrics["curriculum/settled_all_pass"] == 1
    assert metrics["curriculum/skipped_total"] >= 4 and metrics["curriculum/known_tasks"] == 4


def test_a_skipped_task_is_revisited_and_a_moved_estimate_unsettles_it():
    c = Curriculum(3, seed=1, min_samples=2, window=2, revisit_after=2)
    c.observe(0, [False, False])
    drawn = [i for batch in _draws(c, 6, 2) for i in batch]
    assert drawn.count(0) >= 1  # after two skips it is drawn again
    c.observe(0, [True])  # the window keeps the newest 2: [False, True]
    assert c.settled(0) is None


def test_every_task_settled_still_fills_the_batch_and_says_so():
    c = Curriculum(2, seed=0, min_samples=1, window=1, revisit_after=0)
    c.observe(0, [False])
    c.observe(1, [False])
    batch, metrics = c.draw(3)
    assert len(batch) == 3 and metrics["curriculum/forced"] == 3
    assert metrics["curriculum/settled_share_plain_draw"] == 1.0


def test_state_round_trips_and_a_resumed_filter_draws_the_same():
    a = Curriculum(9, seed=5, min_samples=2, window=3, revisit_after=2)
    for i in range(0, 9, 2):
        a.observe(i, [False, False])
    a.draw(4)
    b = Curriculum(9, seed=5, min_samples=2, window=3, revisit_after=2)
    b.load(json.loads(json.dumps(a.state())))  # what the checkpoint stores (torch.save of plain types)
    assert _draws(a, 6, 4) == _draws(b, 6, 4)
    with pytest.raises(ValueError, match="same task file"):
        Curriculum(8, 5, 2, 3, 2).load(a.state())


def test_a_prepass_file_seeds_the_estimates(tmp_path):
    from config import build_config

    rows = [{"task_id": "x/1", "passed": False}] * 4 + [
        {"task_id": "x/2", "passed": True},
        {"task_id": "y", "passed": 1},
    ]
    prior = tmp_path / "eval_samples.jsonl"
    prior.write_text("".join(json.dumps(r) + "\n" for r in rows))
    section = build_config("cpu", overrides=["curriculum.enabled=true", f"curriculum.prior_file={prior}"]).curriculum
    c = build_curriculum(section, group_size=4, task_ids=["x/1", "x/2"], seed=0)
    assert c is not None and c.settled(0) == "all_fail" and c.rate(1) == 1.0 and c.settled(1) is None
    off = build_config("cpu").curriculum
    assert off.enabled is False and build_curriculum(off, 4, ["x/1"], 0) is None  # default off


def test_zero_spread_share():
    assert zero_spread_share([[True, True], [False, False], [True, False], [False, True]]) == 0.5
    assert zero_spread_share([]) == 0.0
