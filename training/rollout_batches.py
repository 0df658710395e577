"""Rollout batches: how one batch of scored rollouts is made, the same way for every rank it is made for.

A batch is `prompts_per_rank` prompts per rank, G samples each, scored in the sandbox.
`BatchMaker.make(position, ranks)` makes the batch at data-order position `position` for the ranks it serves.
The synchronous loop asks for its own rank; the asynchronous producer (`training.rollout_sources`) asks for every
rank, in rank order.
Each rank's share is what that rank would have made alone.

The steps of one batch, in order:
1. The data order: seeded epoch permutations, or the curriculum's draw (the same on every rank).
2. One round (`sample_round`): the served ranks' prompts, sampled in one call and scored
   (`training.scoring.score_rollouts`).
   With a `policy` the sampler is synced with it (the model being trained); without one it samples what it
   already loaded (the adapter the producer had the server load).
3. The revision step (`revise_round`), after scoring and before anything reads the rewards.
   A `GroupReviser` may re-sample some groups and rescore them with `score`.
   Teacher-guided rollouts plug in here: a group whose rewards are all zero continues from a teacher prefix.
4. The curriculum observes the round: every rank's groups, in rank order.
5. Dynamic sampling: rounds at the next positions until every share is full of groups with spread.

Collectives run only when the maker serves fewer ranks than there are (`launch.Peers`).
The synchronous loop then all-reduces "every share is full" and gathers the curriculum's observations.
The producer sees every share already and runs no collective on its thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from config import GRPOConfig, MultiTurnConfig, PromptConfig, SandboxConfig
from rollouts.completion import RolloutCompletion
from rollouts.groups import Episodes, sample_from_synced, sample_groups
from rollouts.protocol import Sampler
from sandbox.executor import SandboxPool
from training.curriculum import Curriculum, zero_spread_share
from training.launch import Peers
from training.losses import group_has_spread
from training.rewards import ScoredSample, UserReward
from training.scoring import score_rollouts
from training.update_plan import correctness_rewards, unguided_correctness
from utils.dataset_loader import Task
from utils.prompts import get_unified_prompt

T = TypeVar("T")
Groups = list[list[ScoredSample]]  # G scored samples per prompt, in prompt order
BesideScoring = Callable[[list[RolloutCompletion]], dict[str, float]]


@dataclass(frozen=True)
class RolloutShare:
    """One rank's part of a rollout batch."""

    groups: Groups
    metrics: dict[str, float]  # the share's own: rewards, times, sampling and curriculum figures
    last_position: int  # the data-order position of the batch's last round (dynamic sampling's refills follow)


@dataclass
class RoundShare:
    """One rank's part of one sampling round, as the revision step sees it."""

    indices: list[int]  # task indices, in prompt order
    tasks: list[Task]
    prompts: list[str]
    groups: Groups
    metrics: dict[str, float]


class GroupReviser(Protocol):
    """The revision step of a round, after it was scored.
    It may replace some groups: re-sampled with `maker.sampler`, rescored with `maker.score`.
    It may add to each share's metrics.
    `policy` and `step` are what the round sampled (policy None: the adapter the sampler loaded)."""

    def revise(self, maker: BatchMaker, shares: list[RoundShare], policy: Any, step: int) -> list[RoundShare]: ...


@dataclass(kw_only=True)
class BatchMaker:
    """Makes rollout batches (see the module docstring); holds no model and no optimizer."""

    sampler: Sampler | None  # None: a run that samples nothing (a test)
    tasks: list[Task]
    pool: SandboxPool
    episodes: Episodes | None  # None: single-turn samples
    curriculum: Curriculum | None  # None: the plain data order
    user_rewards: Sequence[UserReward] = ()
    reviser: GroupReviser | None = None  # None: rounds are kept as scored
    peers: Peers
    prompts_per_rank: int
    seed: int  # the data order's
    grpo: GRPOConfig
    sandbox: SandboxConfig
    prompt: PromptConfig
    multi_turn: MultiTurnConfig
    draw_metrics: dict[str, float] = field(default_factory=dict, init=False)  # the curriculum's last draw

    @property
    def group_size(self) -> int:
        return self.grpo.num_samples_per_prompt

    def make(
        self,
        position: int,
        ranks: Sequence[int],
        *,
        policy: Any = None,
        step: int = 0,
        beside_scoring: BesideScoring | None = None,
    ) -> list[RolloutShare]:
        """The batch at data-order `position`, one share per rank in `ranks`, in that order.
        Without dynamic sampling it is one round.
        With it, rounds at `position`, `position + 1`, ... until every share is full of groups with spread (or
        `dynamic_sampling_max_rounds` rounds).
        `policy`/`step`: what to sample (None: what the sampler loaded).
        `beside_scoring`: work run in a thread while the sandbox scores one rank's round; its metrics join the
        share's."""
        grpo = self.grpo
        if not grpo.dynamic_sampling:
            shares = self.sample_round(position, ranks, policy=policy, step=step, beside_scoring=beside_scoring)
            return [RolloutShare(s.groups, s.metrics, position) for s in shares]
        wanted = self.prompts_per_rank
        kept: list[Groups] = [[] for _ in ranks]
        rounds: list[list[tuple[dict, int]]] = [[] for _ in ranks]
        sampled = [0] * len(ranks)
        last = position
        for round_index in range(grpo.dynamic_sampling_max_rounds):
            last = position + round_index
            for k, made in enumerate(self.sample_round(last, ranks, policy=policy, step=step)):
                rounds[k].append((made.metrics, sum(len(g) for g in made.groups)))
                sampled[k] += len(made.groups)
                kept[k] += keep_with_spread(made.groups, wanted - len(kept[k]))
            short = sum(len(groups) < wanted for groups in kept)
            if self._everyone(short, ranks) == 0:  # every share of every rank is full
                break
        out = []
        for k, groups in enumerate(kept):
            merged = merge_round_metrics(rounds[k])
            merged["sampling/rounds"] = float(len(rounds[k]))
            merged["sampling/groups_sampled"] = float(sampled[k])
            merged["sampling/groups_kept"] = float(len(groups))
            out.append(RolloutShare(groups, merged, last))
        return out

    def sample_round(
        self,
        position: int,
        ranks: Sequence[int],
        *,
        policy: Any = None,
        step: int = 0,
        beside_scoring: BesideScoring | None = None,
    ) -> list[RoundShare]:
        """One round: the prompts at data-order `position` of each rank in `ranks`, G samples each.
        Every rank's prompts go to the sampler in one call; each share is then scored, revised and observed by the
        curriculum."""
        by_rank = self.batch_indices(position)
        chosen = [by_rank[r] for r in ranks]
        tasks = [[self.tasks[i] for i in share] for share in chosen]
        mode = self.multi_turn.mode
        visible = self.prompt.num_visible_tests
        prompts = [[get_unified_prompt(t, visible, mode=mode) for t in share] for share in tasks]
        start = time.monotonic()
        generations = split_by_rank(
            self._sample([p for share in prompts for p in share], [t for share in tasks for t in share], policy, step),
            len(ranks),
        )
        rollout_time = time.monotonic() - start
        if beside_scoring is not None:  # one rank's round: its forwards run while the sandbox scores it
            assert len(ranks) == 1, "work beside the scoring is one rank's"
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="no-grad-forwards") as beside:
                future = beside.submit(beside_scoring, [s for group in generations[0] for s in group])
                scored = [self.score(tasks[0], prompts[0], generations[0])]
                scored[0][1].update(future.result())
        elif len(ranks) == 1:
            scored = [self.score(tasks[0], prompts[0], generations[0])]
        else:  # every share on the sandbox pool at once, each scored (and its metrics taken) as its rank would
            with ThreadPoolExecutor(max_workers=len(ranks), thread_name_prefix="score-share") as scorers:
                scored = list(
                    scorers.map(lambda k: self.score(tasks[k], prompts[k], generations[k]), range(len(ranks)))
                )
        score_time = time.monotonic() - start - rollout_time
        shares = []
        for k, ((groups, metrics), share_generations) in enumerate(zip(scored, generations, strict=True)):
            generated = sum(s.num_policy_tokens for group in share_generations for s in group)  # not inserted ones
            metrics = {
                "time/rollout_s": rollout_time,
                "time/score_s": score_time,
                "tokens_per_s": generated / max(rollout_time, 1e-9),
                **metrics,
            }
            shares.append(RoundShare(chosen[k], tasks[k], prompts[k], groups, metrics))
        shares = self.revise_round(shares, policy, step)
        if self.curriculum is not None:
            observed = self.observe_curriculum(shares, ranks)
            for share, curriculum_metrics in zip(shares, observed, strict=True):
                share.metrics.update(curriculum_metrics)
        return shares

    def revise_round(self, shares: list[RoundShare], policy: Any, step: int) -> list[RoundShare]:
        """The revision step: the round as the `reviser` leaves it (unchanged without one).
        It runs after the scoring, before the curriculum and dynamic sampling read the rewards.
        The trainer runs no forwards beside the scoring when a reviser is set: they would read the first samples."""
        if self.reviser is None:
            return shares
        return self.reviser.revise(self, shares, policy, step)

    def score(
        self, tasks: Sequence[Task], prompts: Sequence[str], generations: Sequence[Sequence[RolloutCompletion]]
    ) -> tuple[Groups, dict[str, float]]:
        """`training.scoring.score_rollouts` with this run's pool, sections and reward functions."""
        return score_rollouts(
            tasks,
            prompts,
            generations,
            self.pool,
            grpo=self.grpo,
            sandbox=self.sandbox,
            prompt=self.prompt,
            multi_turn=self.multi_turn,
            user_rewards=self.user_rewards,
        )

    def batch_indices(self, position: int) -> list[list[int]]:
        """Every rank's task indices at data-order `position`, in rank order: epoch permutations seeded by
        (seed, epoch), or the curriculum's draw (which moves the curriculum: one call per round)."""
        world = self.peers.world
        per_batch = self.prompts_per_rank * world
        if self.curriculum is not None:  # the filtered draw: the same on every rank (identical state)
            indices, self.draw_metrics = self.curriculum.draw(per_batch)
            return split_by_rank(indices, world)
        start = position * per_batch
        indices = []
        for at in range(start, start + per_batch):
            epoch, offset = divmod(at, len(self.tasks))
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))
            indices.append(int(order[offset]))
        return split_by_rank(indices, world)

    def observe_curriculum(self, shares: list[RoundShare], ranks: Sequence[int]) -> list[dict[str, float]]:
        """Add the round's correctness rewards to the curriculum, every rank's groups in rank order.
        The reward is the one in use: partial credit is spread, as the advantage sees it.
        When this maker serves one rank of several the other ranks' rows are gathered, so every rank holds the
        same estimates. Returns each share's filter metrics."""
        assert self.curriculum is not None
        # (P, G) per share, NaN = unscorable or guided (a teacher-guided sample says nothing of the task's own rate)
        rewards = [unguided_correctness(share.groups) for share in shares]
        indices = [torch.tensor(s.indices, dtype=torch.float64).reshape(-1, 1) for s in shares]  # (P, 1) per share
        rows = torch.cat([torch.cat([i, r.to(torch.float64)], dim=1) for i, r in zip(indices, rewards, strict=True)])
        if len(ranks) < self.peers.world:
            rows = self.peers.gather(rows)
        for row in rows.tolist():  # (P x ranks, 1 + G)
            values = [v for v in row[1:] if v == v]  # NaN (unscorable) says nothing about the task
            if values:
                self.curriculum.observe(int(row[0]), values)
        summary = {**self.draw_metrics, **self.curriculum.summary()}
        return [
            {
                **summary,
                "curriculum/zero_spread_share": zero_spread_share([[v for v in row if v == v] for row in r.tolist()]),
            }
            for r in rewards
        ]

    def _sample(self, prompts: list[str], tasks: list[Task], policy: Any, step: int) -> list[list[RolloutCompletion]]:
        assert self.sampler is not None, "a run that samples rollouts needs a sampler (phase 3 builds one)"
        if policy is None:  # the sampler samples the adapter it loaded; the model is being trained meanwhile
            return sample_from_synced(self.sampler, prompts, self.group_size, tasks=tasks, episodes=self.episodes)
        with torch.no_grad():
            return sample_groups(
                self.sampler, policy, prompts, self.group_size, step=step, tasks=tasks, episodes=self.episodes
            )

    def _everyone(self, short: int, ranks: Sequence[int]) -> float:
        """`short` summed over every rank: from the other ranks too when this maker serves one rank of several."""
        return self.peers.sums([float(short)])[0] if len(ranks) < self.peers.world else float(short)


def split_by_rank(items: list[T], world: int) -> list[list[T]]:
    """`items` (a rollout batch's prompts, or what was made of them, in data order) cut into `world` equal
    consecutive shares, rank 0's first: the share rank r trains on is items[r x n : (r + 1) x n]."""
    if len(items) % world:
        raise ValueError(f"{len(items)} items do not split into {world} equal shares")
    size = len(items) // world
    return [items[rank * size : (rank + 1) * size] for rank in range(world)]


def keep_with_spread(groups: Groups, room: int) -> Groups:
    """Dynamic sampling's keep: the groups whose correctness rewards differ, in order, at most `room` of them."""
    if not groups or room <= 0:
        return []
    spread = group_has_spread(correctness_rewards(groups)).tolist()
    return [g for g, has in zip(groups, spread, strict=True) if has][:room]


def merge_round_metrics(rounds: list[tuple[dict, int]]) -> dict:
    """One rollout batch's metrics from several sampling rounds (metrics, samples): times add up, tokens/s is
    the rounds' total over their total time, every other value is a mean weighted by the round's samples."""
    total = max(sum(n for _, n in rounds), 1)
    out: dict = {}
    for key in dict.fromkeys(k for metrics, _ in rounds for k in metrics):  # first-seen order: stable rows
        present = [(metrics[key], n) for metrics, n in rounds if key in metrics]
        if key.startswith("time/"):
            out[key] = sum(v for v, _ in present)
        else:
            weight = max(sum(n for _, n in present), 1) if len(present) < len(rounds) else total
            out[key] = sum(v * n for v, n in present) / weight
    rollout_s = out.get("time/rollout_s", 0.0)
    if rollout_s > 0 and all("tokens_per_s" in m for m, _ in rounds):
        out["tokens_per_s"] = sum(m["tokens_per_s"] * m.get("time/rollout_s", 0.0) for m, _ in rounds) / rollout_s
    return out
