"""The asynchronous rollout producer: bounded staleness under a slow trainer or a slow sampler, dropped batches
counted, a producer failure raised in the trainer, and a stop that leaves no thread behind."""

from __future__ import annotations

import threading
import time

import pytest

from training.async_rollouts import ProducerError, RolloutProducer
from training.rollout_batches import RolloutShare


class ScriptedSampler:
    """`produce`/`load` for the producer: records the version each batch was sampled with; `delay` makes it slow."""

    def __init__(self, delay: float = 0.0, fail_at: int | None = None, rounds: int = 1) -> None:
        self.delay, self.fail_at, self.rounds = delay, fail_at, rounds  # rounds: data-order positions per batch
        self.loaded: int | None = None
        self.sampled: dict[int, int] = {}  # batch index -> loaded version

    def load(self, version: int) -> None:
        self.loaded = version

    def produce(self, index: int) -> tuple[list, int]:
        if index == self.fail_at:
            raise ConnectionError("the rollout server went away")
        time.sleep(self.delay)
        assert self.loaded is not None
        self.sampled[index] = self.loaded
        last = index + self.rounds - 1
        share = RolloutShare([[index]] * 2, {"pass_rate": 0.5}, last)  # type: ignore[list-item]  # ids stand in for groups
        return [share], last  # one process's share


def run_trainer(producer: RolloutProducer, steps: int, delay: float = 0.0) -> list[dict]:
    """A scripted trainer: take a batch, 'update' for `delay` seconds, publish the next version."""
    out = []
    producer.publish(0)
    producer.start()
    try:
        for step in range(steps):
            batch, metrics = producer.take(step)
            time.sleep(delay)
            out.append({"index": batch.index, "last_index": batch.last_index, "version": batch.version, **metrics})
            producer.publish(step + 1)
    finally:
        producer.stop()
    return out


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_a_slow_trainer_gets_batches_exactly_as_stale_as_allowed_never_more(max_staleness):
    sampler = ScriptedSampler()
    producer = RolloutProducer(sampler.produce, sampler.load, max_staleness=max_staleness, first_index=0, first_step=0)
    taken = run_trainer(producer, steps=8, delay=0.02)
    assert [t["index"] for t in taken] == list(range(8))  # the data order, nothing dropped
    assert all(t["async/staleness_max"] <= max_staleness for t in taken)
    assert all(t["async/dropped_groups"] == 0 for t in taken)
    # the producer ran ahead as far as allowed: after the first batches every one is max_staleness old
    assert [t["async/staleness_max"] for t in taken[max_staleness:]] == [max_staleness] * (8 - max_staleness)
    assert all(sampler.sampled[t["index"]] == t["version"] for t in taken)  # the stamp is the adapter sampled


def test_batches_of_several_rounds_move_the_data_order_past_their_last_round_and_the_bound_by_one_batch():
    sampler = ScriptedSampler(rounds=3)  # dynamic sampling: each batch samples three rounds
    producer = RolloutProducer(sampler.produce, sampler.load, max_staleness=1, first_index=5, first_step=0)
    taken = run_trainer(producer, steps=4, delay=0.02)
    assert [(t["index"], t["last_index"]) for t in taken] == [(5, 7), (8, 10), (11, 13), (14, 16)]
    assert [t["async/staleness_max"] for t in taken] == [0.0, 1.0, 1.0, 1.0]  # a batch is one step, not three


def test_a_slow_sampler_keeps_the_bound_and_the_trainer_waits_for_it():
    sampler = ScriptedSampler(delay=0.02)
    producer = RolloutProducer(sampler.produce, sampler.load, max_staleness=2, first_index=0, first_step=0)
    taken = run_trainer(producer, steps=6)
    assert all(0 <= t["async/staleness_max"] <= 2 for t in taken)
    assert [t["index"] for t in taken] == list(range(6))
    assert all(t["async/trainer_wait_s"] >= 0 and t["async/sampler_wait_s"] >= 0 for t in taken)


def test_mu_steps_per_batch_move_the_bound_by_mu():
    sampler = ScriptedSampler()
    producer = RolloutProducer(
        sampler.produce, sampler.load, max_staleness=1, first_index=3, first_step=6, steps_per_batch=2
    )
    producer.publish(6)
    producer.start()
    try:
        for k in range(4):
            step = 6 + 2 * k
            batch, metrics = producer.take(step)
            assert batch.index == 3 + k and metrics["async/staleness_max"] <= 1
            producer.publish(step + 1)  # the batch's first step
            producer.publish(step + 2)  # and its second
    finally:
        producer.stop()


def test_batches_older_than_the_bound_are_dropped_and_counted():
    sampler = ScriptedSampler()
    producer = RolloutProducer(sampler.produce, sampler.load, max_staleness=1, first_index=0, first_step=0)
    producer.publish(0)
    producer.start()
    try:
        while producer.queue.qsize() < 2:  # batches 0 and 1 (version 0); batch 2 waits for version 1
            time.sleep(0.005)
        producer.publish(3)  # the trainer is at step 3 (e.g. a resumed run): both queued batches are too old
        batch, metrics = producer.take(3)
        assert (batch.index, batch.version) == (2, 3)
        assert metrics["async/dropped_groups"] == 4.0  # two batches of two groups
    finally:
        producer.stop()


def test_a_producer_failure_is_one_error_in_the_trainer_and_no_thread_stays():
    sampler = ScriptedSampler(fail_at=2)
    producer = RolloutProducer(sampler.produce, sampler.load, max_staleness=1, first_index=0, first_step=0)
    with pytest.raises(ProducerError, match="went away") as raised:
        run_trainer(producer, steps=5)
    assert isinstance(raised.value.__cause__, ConnectionError)
    assert not producer.running
    assert not [t for t in threading.enumerate() if t.name == "rollout-producer"]


def test_ctrl_c_in_the_trainer_stops_a_producer_waiting_for_it():
    sampler = ScriptedSampler()
    producer = RolloutProducer(sampler.produce, sampler.load, max_staleness=1, first_index=0, first_step=0)
    producer.publish(0)
    producer.start()
    with pytest.raises(KeyboardInterrupt):
        try:
            producer.take(0)
            while producer.queue.qsize() < 1:  # batch 1 is ready; batch 2 waits for the trainer's next version
                time.sleep(0.005)
            raise KeyboardInterrupt
        finally:
            producer.stop()
    assert not producer.running


def test_max_staleness_zero_is_not_a_producer():
    with pytest.raises(ValueError, match="synchronous"):
        RolloutProducer(lambda i: ([], i), lambda v: None, max_staleness=0, first_index=0, first_step=0)


def test_a_batch_splits_into_equal_consecutive_shares_rank_0_first():
    from training.rollout_batches import split_by_rank

    assert split_by_rank([10, 11, 12, 13, 14, 15], 2) == [[10, 11, 12], [13, 14, 15]]
    assert split_by_rank(["a", "b", "c"], 3) == [["a"], ["b"], ["c"]]
    assert split_by_rank([1, 2], 1) == [[1, 2]]
    with pytest.raises(ValueError, match="5 items do not split into 2"):
        split_by_rank([1, 2, 3, 4, 5], 2)
