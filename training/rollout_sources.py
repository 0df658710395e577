"""Where the loop's rollout batches come from: one `RolloutSource` per run, chosen by `training.setup`.

`SyncRollouts` makes this rank's share now, from the model being trained.
`AsyncRollouts` (`grpo.async_rollouts`) takes it from a producer thread that makes the next batches ahead of the
trainer (`training.async_rollouts.RolloutProducer`).
Both make a batch with the same `training.rollout_batches.BatchMaker`, so a rank's share is the same either way;
only the policy it was sampled with differs.

The loop calls the same methods on either source:
`start` before the first batch, `next` for each batch, `after_update` after each batch's optimizer steps,
`curriculum_state` when it saves a checkpoint, `stop` when it ends (also on an error or Ctrl-C).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollouts.protocol import AdapterPublisher
from training.async_rollouts import ProducerError, RolloutProducer
from training.checkpointing import TrainerState
from training.rollout_batches import BatchMaker, BesideScoring, RolloutShare


class RolloutSource(Protocol):
    """What the training loop takes rollout batches from. `policy` is the model being trained (unwrapped)."""

    maker: BatchMaker

    def start(self, policy: Any, state: TrainerState) -> None: ...

    def next(self, policy: Any, state: TrainerState, beside_scoring: BesideScoring | None = None) -> RolloutShare: ...

    def after_update(self, policy: Any, step: int) -> None: ...

    def curriculum_state(self) -> dict | None: ...

    def stop(self) -> None: ...


@dataclass
class SyncRollouts:
    """This rank's share of the batch at the trainer's data-order position, made now from `policy`."""

    maker: BatchMaker

    def start(self, policy: Any, state: TrainerState) -> None:
        return None

    def next(self, policy: Any, state: TrainerState, beside_scoring: BesideScoring | None = None) -> RolloutShare:
        """The share of the batch at `state.rollout_batches`, sampled from `policy` at `state.global_step`;
        `beside_scoring` runs while the sandbox scores it."""
        [share] = self.maker.make(
            state.rollout_batches,
            [self.maker.peers.rank],
            policy=policy,
            step=state.global_step,
            beside_scoring=beside_scoring,
        )
        return share

    def after_update(self, policy: Any, step: int) -> None:
        return None

    def curriculum_state(self) -> dict | None:
        return self.maker.curriculum.state() if self.maker.curriculum is not None else None

    def stop(self) -> None:
        return None


@dataclass(frozen=True)
class TakeFailed:
    """What every process receives instead of its share when the main process could not take a batch."""

    message: str


@dataclass
class AsyncRollouts:
    """Batches made ahead of the trainer by one producer thread, on the main process, for every rank.

    The trainer publishes its adapter after each batch's steps (every process; the main process writes it).
    The producer has the server load the newest one before each batch and makes every rank's share
    (`BatchMaker.make` for all ranks: one burst of requests, the shares scored side by side). Each step the main
    process takes the next batch fresh enough and hands every process its share in one scatter, on the training
    thread. One producer keeps the server's adapters single-owner (one process loads each and unloads the previous
    one, which no other rank can still be sampling with) and every collective on the training thread.

    The curriculum runs ahead of the trainer on the producer's thread: its state after each made batch is kept, and
    a checkpoint saves the one after the last trained batch (the main process's, sent to every rank), so a resumed
    run samples the batches that were in flight again."""

    maker: BatchMaker
    publisher: AdapterPublisher
    max_staleness: int
    steps_per_batch: int  # optimizer steps trained on one batch (mu)
    producer: RolloutProducer | None = field(default=None, init=False)  # the main process's, while it runs
    _curriculum_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _curriculum_after: dict[int, dict] = field(default_factory=dict, init=False)  # by a batch's last position
    _trained_curriculum: dict | None = field(default=None, init=False)

    def start(self, policy: Any, state: TrainerState) -> None:
        """Publish the current adapter (every process) and start the producer (the main process)."""
        if not self.maker.peers.is_main:
            self.publisher.publish_adapter(policy, state.global_step)
            return
        self.producer = RolloutProducer(
            self._produce,
            self.publisher.load_adapter,
            max_staleness=self.max_staleness,
            first_index=state.rollout_batches,
            first_step=state.global_step,
            steps_per_batch=self.steps_per_batch,
        )
        self.after_update(policy, state.global_step)
        self.producer.start()

    def next(self, policy: Any, state: TrainerState, beside_scoring: BesideScoring | None = None) -> RolloutShare:
        """This process's share of the next batch fresh enough for `state.global_step`, with the async metrics.
        `beside_scoring` is not run: the producer scores while the model it would read is being updated. When
        taking fails on the main process (the producer's error, Ctrl-C), every process gets the error instead of a
        share and raises it: none is left waiting for the main process."""
        peers = self.maker.peers
        shares: list | None = None
        if self.producer is not None:
            try:
                batch, async_metrics = self.producer.take(state.global_step)
            except BaseException as error:
                if peers.world > 1:
                    message = str(error) if isinstance(error, ProducerError) else f"the main process stopped: {error!r}"
                    peers.scatter([TakeFailed(message)] * peers.world)
                raise
            shares = [
                RolloutShare(share.groups, {**share.metrics, **async_metrics}, share.last_position)
                for share in batch.shares
            ]
            if self.maker.curriculum is not None:  # the curriculum as it stood after this batch (and before the next)
                with self._curriculum_lock:
                    self._trained_curriculum = self._curriculum_after.pop(batch.last_index)
                    for older in [k for k in self._curriculum_after if k < batch.last_index]:  # dropped batches
                        del self._curriculum_after[older]
        mine = peers.scatter(shares) if peers.world > 1 else shares[0] if shares else None
        if isinstance(mine, TakeFailed):
            raise ProducerError(mine.message)
        assert mine is not None, "the main process takes the batches"
        return mine

    def after_update(self, policy: Any, step: int) -> None:
        """Write the adapter of `step` (on the training thread, which owns the weights; the main process writes,
        every process waits for it) and tell the producer."""
        self.publisher.publish_adapter(policy, step)
        if self.producer is not None:
            self.producer.publish(step)

    def curriculum_state(self) -> dict | None:
        """The curriculum after the last trained batch (the producer's has drawn the batches in flight since)."""
        curriculum = self.maker.curriculum
        if curriculum is None:
            return None
        if self.maker.peers.world > 1:  # only the main process has a producer: every rank saves its state
            return self.maker.peers.broadcast(self._trained_curriculum)
        return self._trained_curriculum if self._trained_curriculum is not None else curriculum.state()

    def stop(self) -> None:
        """End the producer and wait for it (the batches in flight are discarded)."""
        if self.producer is not None:
            self.producer.stop()

    def _produce(self, position: int) -> tuple[list[RolloutShare], int]:
        """The producer's batch at data-order `position` (on its thread), every rank's share, from the adapter the
        server loaded; with the curriculum, its state after this batch is kept for the checkpoint of the step that
        trains it."""
        maker = self.maker
        shares = maker.make(position, range(maker.peers.world))
        last = shares[0].last_position
        if maker.curriculum is not None:
            with self._curriculum_lock:
                self._curriculum_after[last] = maker.curriculum.state()
        return shares, last
