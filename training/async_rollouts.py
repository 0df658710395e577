"""Asynchronous rollouts (`grpo.async_rollouts`): a producer thread samples and scores the next rollout batches
while the trainer updates, at most `grpo.max_staleness` optimizer steps behind the policy being trained.

The trainer publishes the adapter after every optimizer step (`publish(version)`: the folder is written on the
trainer's thread, which owns the weights); the producer, before each batch, has the server load the newest
published adapter (`load(version)`, on its own thread: the sampler's HTTP loop is used by one thread only),
samples the batch's prompts and scores them in the sandbox (`produce(index)`). Each batch carries the version it
was sampled with.

Bounded staleness by waiting, not by discarding: the producer's `k`-th batch is trained at step
`first_step + k x mu` (mu = `grpo.num_iterations`), so the producer starts it only once the published version is
at least that step minus `max_staleness`; a batch is therefore never older than the bound when it is taken, and
no sample is wasted. The queue holds at most `max_staleness + 1` batches. `take` still checks every batch and
drops one that is older (counted in `async/dropped_groups`, every process's groups) rather than re-sampling
it: a re-sample would stall the trainer for a whole sampling round, while the producer's next batch is already
newer.

What one batch is stays the caller's business (`produce`, `training.rollout_sources.AsyncRollouts`): multi-turn
episodes, dynamic sampling's refill rounds (a batch then spans several data-order positions, `index` to
`last_index`, and the next batch starts after the last), the curriculum's draw, and every process's share of it
(one share per rank, in rank order). The producer only orders, stamps and bounds the batches.

A thread, not a process: the producer's work is HTTP to the server and waiting for sandbox subprocesses, both
outside the GIL, and it shares the tasks, the tokenizer, the sandbox pool and the sampler's connections with
the trainer without copying them. An error in the producer ends it and is raised by the next `take`;
`stop` (also on Ctrl-C) ends the thread and joins it, so nothing keeps running.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ProducerError(RuntimeError):
    """The rollout producer failed; the message names the error, `__cause__` is it."""


@dataclass
class RolloutBatch:
    """One rollout batch as the producer made it."""

    index: int  # its position in the data order (the rollout batch counter)
    last_index: int  # the position of its last sampling round (dynamic sampling's refills follow `index`)
    version: int  # optimizer step of the adapter it was sampled with
    shares: list[Any]  # per process, rank order: its share (a `RolloutShare`: `groups`, `metrics`)
    sampler_wait_s: float  # how long the producer waited for the trainer before sampling it


_DONE = object()  # the producer's last queue item after an error


class RolloutProducer:
    """The producer thread and its bounded queue (see the module docstring).

    produce(index) -> (shares, last_index): sample and score the rollout batch at data-order position `index`
    (with dynamic sampling's refill rounds at the positions after it, up to `last_index`), one share per process;
    load(version): have the sampler sample from the adapter published at `version` (called on the producer's
    thread, only when it changed); `first_index`/`first_step`: where the data order and the optimizer steps stand
    when the producer starts; `steps_per_batch`: optimizer steps trained on one batch (mu)."""

    def __init__(
        self,
        produce: Callable[[int], tuple[list[Any], int]],
        load: Callable[[int], None],
        *,
        max_staleness: int,
        first_index: int,
        first_step: int,
        steps_per_batch: int = 1,
    ) -> None:
        if max_staleness < 1:
            raise ValueError("the producer runs ahead by at least one step (max_staleness 0 is the synchronous loop)")
        self.produce, self.load = produce, load
        self.max_staleness = max_staleness
        self.first_index, self.first_step, self.steps_per_batch = first_index, first_step, steps_per_batch
        self.queue: queue.Queue = queue.Queue(maxsize=max_staleness + 1)
        self._published = -1  # newest version the trainer published
        self._loaded: int | None = None  # version the sampler samples from
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ trainer side

    def publish(self, version: int) -> None:
        """The adapter of optimizer step `version` is published (its folder written): the producer may use it."""
        with self._changed:
            self._published = max(self._published, version)
            self._changed.notify_all()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)
        self._thread.start()

    def take(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """The next batch no older than `max_staleness` at optimizer `step`, and the async metrics of taking it
        (older batches are dropped on the way and counted). ProducerError when the producer failed."""
        start = time.monotonic()
        dropped_groups = 0
        while True:
            item = self.queue.get()
            if item is _DONE:
                assert self._error is not None
                raise ProducerError(f"the rollout producer failed: {self._error!r}") from self._error
            batch: RolloutBatch = item
            if step - batch.version <= self.max_staleness:
                break
            dropped_groups += sum(len(share.groups) for share in batch.shares)
        staleness = step - batch.version
        return batch, {
            "async/staleness_mean": float(staleness),
            "async/staleness_max": float(staleness),
            "async/dropped_groups": float(dropped_groups),
            "async/trainer_wait_s": time.monotonic() - start,
            "async/sampler_wait_s": batch.sampler_wait_s,
            "async/policy_version": float(batch.version),
        }

    def stop(self) -> None:
        """End the producer and wait for it (a batch being sampled is finished first, then discarded)."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        while self._thread is not None and self._thread.is_alive():
            self._drain()  # a producer blocked on a full queue gets room to see the stop
            self._thread.join(timeout=0.1)
        self._drain()

    def _drain(self) -> None:
        try:
            while True:
                self.queue.get_nowait()
        except queue.Empty:
            pass

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------ producer side

    def _run(self) -> None:
        try:
            index, produced = self.first_index, 0
            while not self._stop.is_set():
                trained_at = self.first_step + produced * self.steps_per_batch
                waited = time.monotonic()
                with self._changed:  # never further ahead than max_staleness steps
                    while not self._stop.is_set() and self._published < trained_at - self.max_staleness:
                        self._changed.wait()
                    version = self._published
                if self._stop.is_set():
                    return
                if version != self._loaded:
                    self.load(version)
                    self._loaded = version
                wait_s = time.monotonic() - waited
                shares, last_index = self.produce(index)
                batch = RolloutBatch(index, last_index, version, shares, wait_s)
                while not self._stop.is_set():
                    try:
                        self.queue.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                index, produced = last_index + 1, produced + 1
        except BaseException as error:  # noqa: BLE001 - any failure ends the thread; the trainer raises it in `take`
            self._error = error
            while True:  # room for the marker even when the queue is full
                try:
                    self.queue.put_nowait(_DONE)
                    return
                except queue.Full:
                    self._drain_one()

    def _drain_one(self) -> None:
        try:
            self.queue.get_nowait()
        except queue.Empty:
            pass
