"""The batch maker's revision step: a reviser sees each round after it was scored, and what it re-samples and
rescores is what dynamic sampling keeps and the loop trains on."""

from __future__ import annotations

from tests.integration.training.test_async_training import HalfRightOrFlat
from tests.trainer_helpers import scripted_trainer


class ResampleFlatGroups:
    """A stand-in for teacher-guided re-sampling: every group whose samples all failed is sampled again and
    rescored with the maker's own scoring; the share's metrics count them."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def revise(self, maker, shares, policy, step):
        for share in shares:
            flat = [k for k, group in enumerate(share.groups) if all(s.reward.correctness == 0 for s in group)]
            self.seen.append(len(flat))
            prompts, tasks = [share.prompts[k] for k in flat], [share.tasks[k] for k in flat]
            groups, _ = maker.score(tasks, prompts, maker.sampler.sample(prompts, maker.group_size))
            for k, group in zip(flat, groups, strict=True):
                share.groups[k] = group
            share.metrics["revised/groups"] = float(len(flat))
        return shares


def test_a_reviser_runs_after_scoring_and_before_dynamic_sampling_keeps_the_groups(tmp_path, pool):
    settings = {"grpo.dynamic_sampling": "true", "grpo.dynamic_sampling_max_rounds": 2}
    trainer = scripted_trainer(tmp_path, pool, rollout_class=HalfRightOrFlat, **settings)
    per_rank = trainer.prompts_per_rollout
    trainer.parts.rollout.flat = {1: range(per_rank)}  # the round's own call: every group all wrong
    reviser = ResampleFlatGroups()
    trainer.rollouts.maker.reviser = reviser
    groups, metrics = trainer.collect_rollouts()
    assert reviser.seen == [per_rank]  # it saw the scored round: every group flat
    # the re-sampled groups have spread, so the first round filled the batch: no refill round was sampled
    assert metrics["sampling/rounds"] == 1.0 and metrics["sampling/groups_kept"] == float(per_rank)
    assert metrics["revised/groups"] == float(per_rank) and len(trainer.parts.rollout.asked) == 2
    assert all(len({s.reward.correctness for s in group}) == 2 for group in groups)
    assert trainer.state.rollout_batches == 0


def test_no_forwards_run_beside_the_scoring_of_a_round_a_reviser_may_change(tmp_path, pool):
    trainer = scripted_trainer(tmp_path, pool)  # kl_coef 0.05: a reference forward per micro-batch
    assert trainer.forwards_while_scoring
    trainer.rollouts.maker.reviser = ResampleFlatGroups()
    assert not trainer.forwards_while_scoring
