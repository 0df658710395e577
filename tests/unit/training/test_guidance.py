"""Teacher-guided rollouts' rules (training.guidance), against hand-computed values: which groups are guided, how
many samples, how long a prefix, how a task's prefix share adapts, and what one guided batch becomes."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from config import GuidanceConfig
from rollouts.completion import RolloutCompletion
from rollouts.groups import continue_prefixes
from rollouts.protocol import Continuation, SamplerBase
from training.batching import completion_logprobs, pad_rollout_batch
from training.guidance import (
    GuidanceState,
    all_failed,
    groups_to_guide,
    guide_groups,
    guided_count,
    missing_traces_line,
    next_fraction,
    prefix_length,
    unguided,
)
from training.losses import grpo_loss, truncated_importance_weights
from training.rewards import ScoredSample
from training.sft_sources import best_passing_sample

RULE = GuidanceConfig(
    enabled=True, initial_fraction=0.5, min_fraction=0.05, max_fraction=0.9, target_pass_rate=0.5, adapt_rate=0.4
)


def test_k_is_the_configured_count_or_half_the_group_and_at_least_one():
    assert guided_count(8, 0) == 4 and guided_count(4, 0) == 2 and guided_count(1, 0) == 1 and guided_count(3, 0) == 1
    assert guided_count(8, 3) == 3 and guided_count(4, 9) == 4


def test_only_all_fail_groups_whose_task_has_a_trace_are_guided():
    correctness = [
        [0.0, 0.0, 0.0, 0.0],  # all fail, trace: guided
        [0.0, 1.0, 0.0, 0.0],  # one success: the group has its own signal
        [None, None, None, None],  # unscorable: nothing to learn from rewards
        [0.0, None, 0.0, 0.0],  # all scorable samples failed: guided
        [0.0, 0.0, 0.0, 0.0],  # all fail, no trace
        [0.25, 0.0, 0.0, 0.0],  # partial credit (fraction reward) is a success
        [1.0, 1.0, 1.0, 1.0],
    ]
    assert groups_to_guide(correctness, [True, True, True, True, False, True, True]) == [0, 3]
    assert all_failed([0.0, 1e-9]) and not all_failed([]) and not all_failed([None])


@pytest.mark.parametrize(
    ("fraction", "answer", "budget", "expected"),
    [
        (0.5, 10, 100, 5),  # half of 10
        (0.5, 10, 4, 2),  # only the 4 answer tokens that fit the budget count: half of 4
        (0.0, 10, 100, 1),  # at least one token of guidance
        (1.0, 10, 100, 9),  # the student always writes the last answer token
        (0.3, 10, 100, 3),
        (0.5, 1, 100, 0),  # a one-token answer leaves nothing to continue
        (0.5, 10, 1, 0),
    ],
)
def test_prefix_length_by_hand(fraction, answer, budget, expected):
    assert prefix_length(fraction, answer, budget) == expected


def test_the_per_task_rule_moves_toward_the_target_pass_rate_within_its_bounds():
    # f + 0.4 x (0.5 - p)
    assert next_fraction(0.5, 0.0, RULE) == pytest.approx(0.7)  # every guided sample failed: longer
    assert next_fraction(0.5, 1.0, RULE) == pytest.approx(0.3)  # every one passed: shorter
    assert next_fraction(0.5, 0.5, RULE) == pytest.approx(0.5)  # at the target: unchanged
    assert next_fraction(0.6, 0.25, RULE) == pytest.approx(0.7)
    assert next_fraction(0.8, 0.0, RULE) == pytest.approx(0.9)  # 1.0 capped at max_fraction
    assert next_fraction(0.1, 1.0, RULE) == pytest.approx(0.05)  # -0.1 floored at min_fraction


def _sample(task_id: str, passed: bool, prefix: int = 0, prompt=(1, 2)) -> ScoredSample:
    ids = tuple(range(10, 10 + prefix + 3))
    completion = RolloutCompletion(
        "x",
        ids,
        tuple(prompt),
        "stop",
        action_mask=(0,) * prefix + (1,) * 3 if prefix else None,
        teacher_prefix_tokens=prefix,
    )
    task: Any = SimpleNamespace(task_id=task_id)  # stand-ins with the attributes guidance reads
    verdict: Any = SimpleNamespace(passed=passed)
    reward: Any = SimpleNamespace(correctness=float(passed))
    parsed: Any = None
    return ScoredSample(task, completion, parsed, verdict, reward)


def test_one_batch_replaces_the_last_k_samples_of_each_all_fail_group_and_adapts_its_task():
    answers = {"a": list(range(100, 110)), "b": list(range(200, 220))}  # 10 and 20 answer tokens
    groups = [
        [_sample("a", False) for _ in range(4)],  # all fail: guided with half of 10 = 5 tokens
        [_sample("b", False), _sample("b", True), _sample("b", False), _sample("b", False)],  # has a success
        [_sample("c", False) for _ in range(4)],  # all fail, no trace
    ]
    asked = {}

    def sample(prompt_ids, prefixes, k):
        asked.update(prompt_ids=prompt_ids, prefixes=prefixes, k=k)
        return [["guided"] * k for _ in prefixes]

    def score(tasks, drawn):
        assert [t.task_id for t in tasks] == ["a"] and drawn == [["guided", "guided"]]
        return [[_sample("a", True, prefix=5), _sample("a", False, prefix=5)]]

    state = GuidanceState()
    out, metrics = guide_groups(groups, answers, state, RULE, budget=64, sample=sample, score=score)
    assert asked == {"prompt_ids": [[1, 2]], "prefixes": [list(range(100, 105))], "k": 2}
    assert out[0][:2] == groups[0][:2] and [s.completion.teacher_prefix_tokens for s in out[0]] == [0, 0, 5, 5]
    assert out[1] is groups[1] and out[2] is groups[2]
    assert len(unguided(out[0])) == 2
    # guided pass rate 1/2 = the target: the share stays 0.5
    assert state.fractions == {"a": pytest.approx(0.5)} and state.guided_tasks == {"a"}
    assert metrics == {
        "guidance/groups": 1.0,
        "guidance/group_share": pytest.approx(1 / 3),
        "guidance/pass_rate_unguided": pytest.approx(1 / 12),  # every first-drawn sample: 1 of 12 passed
        "guidance/prefix_tokens_mean": 5.0,
        "guidance/prefix_fraction_mean": 0.5,
        "guidance/pass_rate_guided": 0.5,
    }

    # the next batch: task a is back, its unguided samples are the transfer; both guided samples fail now
    again = [[_sample("a", i == 0) for i in range(4)], [_sample("b", False) for _ in range(4)]]

    def score_b(tasks, drawn):
        return [[_sample("b", False, prefix=10), _sample("b", False, prefix=10)]]

    out, metrics = guide_groups(again, answers, state, RULE, budget=64, sample=sample, score=score_b)
    assert asked["prefixes"] == [list(range(200, 210))]  # b's first guidance: half of 20
    assert out[0] is again[0]  # a passed once unguided: not guided
    assert metrics["guidance/transfer_pass_rate"] == pytest.approx(0.25) and metrics["guidance/transfer_groups"] == 1
    assert state.fractions == {"a": pytest.approx(0.5), "b": pytest.approx(0.7)}  # 0.5 + 0.4 x (0.5 - 0)
    summary = state.summary()
    assert summary["guidance/total_guided_groups"] == 2 and summary["guidance/total_group_share"] == pytest.approx(0.4)
    assert summary["guidance/total_pass_rate_guided"] == pytest.approx(0.25)
    assert summary["guidance/total_prefix_tokens_mean"] == pytest.approx(7.5)

    restored = GuidanceState()
    restored.load(state.state())
    assert restored == state


def test_a_batch_without_an_all_fail_group_samples_nothing():
    groups = [[_sample("a", True), _sample("a", False)]]

    def never(*_):
        raise AssertionError("nothing to guide")

    out, metrics = guide_groups(groups, {"a": [1, 2, 3]}, GuidanceState(), RULE, budget=8, sample=never, score=never)
    assert out == groups and metrics["guidance/groups"] == 0 and "guidance/pass_rate_guided" not in metrics


def test_missing_traces_say_so_in_one_line():
    line = missing_traces_line(["a", "b", "c", "d", "e"], {"a": [1]}, "data/teacher_traces.jsonl")
    assert line == (
        "guidance: 4 of 5 training tasks have no passed teacher trace in data/teacher_traces.jsonl (b, c, d, ...); "
        "their all-fail groups stay unguided"
    )
    assert missing_traces_line(["a"], {"a": [1]}, "x") is None


def test_a_guided_completion_must_mask_its_prefix():
    with pytest.raises(ValueError, match="marked 0 in action_mask"):
        RolloutCompletion("x", (1, 2, 3), (0,), "stop", action_mask=(1, 1, 1), teacher_prefix_tokens=2)
    with pytest.raises(ValueError, match="marked 0 in action_mask"):
        RolloutCompletion("x", (1, 2, 3), (0,), "stop", teacher_prefix_tokens=1)


# ------------------------------------------------------------------ the loss on a guided sample, by hand


class BigramToy(torch.nn.Module):
    """A model whose next-token logits at a position are row W[token there] (V = 4): every log-prob is one
    softmax of one row, so the loss and its gradient can be computed by hand."""

    def __init__(self) -> None:
        super().__init__()
        w = torch.zeros(4, 4)
        w[1, 2] = math.log(2.0)  # p(. | 1) = [1, 1, 2, 1] / 5
        w[2, 3] = math.log(3.0)  # p(. | 2) = [1, 1, 1, 3] / 6
        self.w = torch.nn.Parameter(w)

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0):
        logits = self.w[input_ids]  # (B, L, V)
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


class OneContinuation(SamplerBase):
    """Continues every sequence with the ids [2, 3], reporting the log-probs the toy gives them after a 1."""

    def __init__(self) -> None:
        super().__init__(SimpleNamespace(decode=lambda ids, skip_special_tokens=True: " ".join(map(str, ids))), 8)
        self.asked: list = []

    def continue_sequences(self, sequences, max_new_tokens, stop_strings):
        self.asked.append((sequences, max_new_tokens, stop_strings))
        return [Continuation([2, 3], "2 3", "length", [math.log(0.4), math.log(0.5)]) for _ in sequences]


def test_a_guided_sample_trains_its_own_tokens_in_the_guided_context_and_never_its_prefix():
    """Prompt [0], teacher prefix [1], the policy's continuation [2, 3], advantage 1, mu = 1 (ratio 1), token-mean:
    loss = -(r_2 + r_3) / 2 = -1. Scored in the guided context, token 2's log-prob is log p(2 | 1) = log 0.4 (the
    unguided context would give log p(2 | 0) = log 0.25), so the sampler's log-prob and the trainer's agree. By
    hand: dL/dW[1] = -(onehot(2) - p(.|1)) / 2 = [0.1, 0.1, -0.3, 0.1]; dL/dW[2] = -(onehot(3) - p(.|2)) / 2 =
    [1/12, 1/12, 1/12, -0.25]; dL/dW[0] = 0: the prefix token (predicted from the prompt) carries no gradient."""
    sampler = OneContinuation()
    [[record]] = continue_prefixes(sampler, [[0]], [[1]], 1)
    assert sampler.asked == [([[0, 1]], [7], ())]  # the prefix takes 1 of the 8-token budget
    assert record.token_ids == (1, 2, 3) and record.action_mask == (0, 1, 1) and record.teacher_prefix_tokens == 1
    assert record.logprobs == pytest.approx((0.0, math.log(0.4), math.log(0.5))) and record.text == "1 2 3"
    assert record.num_policy_tokens == 2

    model = BigramToy()
    batch = pad_rollout_batch([record], pad_id=0)
    logp = completion_logprobs(model, batch)  # (1, 3)
    assert logp[0, 1:].tolist() == pytest.approx([math.log(0.4), math.log(0.5)])
    mask = batch["completion_mask"]
    weights, agreement = truncated_importance_weights(logp.detach(), batch["sampling_logps"], mask)
    assert agreement["rollout/logp_abs_diff"] == pytest.approx(0.0, abs=1e-6) and weights.tolist() == [[0, 1, 1]]
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([1.0]), mask, token_weights=weights)
    assert float(loss.detach()) == pytest.approx(-1.0)
    loss.backward()
    grad = model.w.grad
    assert grad[0].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert grad[1].tolist() == pytest.approx([0.1, 0.1, -0.3, 0.1])
    assert grad[2].tolist() == pytest.approx([1 / 12, 1 / 12, 1 / 12, -0.25])

    # the check can fail: the same ids without the prefix's mask train the prefix token (dL/dW[0] = -(onehot(1) -
    # 1/4) / 3 under a token-mean over 3 tokens)
    unmasked = dataclasses.replace(record, action_mask=None, teacher_prefix_tokens=0)
    model.w.grad = None
    batch = pad_rollout_batch([unmasked], pad_id=0)
    logp = completion_logprobs(model, batch)
    grpo_loss(logp, logp.detach(), torch.tensor([1.0]), batch["completion_mask"])[0].backward()
    assert model.w.grad[0].tolist() == pytest.approx([1 / 12, -0.25, 1 / 12, 1 / 12])


def test_a_prefix_that_leaves_no_budget_is_refused():
    with pytest.raises(ValueError, match="no room"):
        continue_prefixes(OneContinuation(), [[0]], [list(range(8))], 1)


def test_a_guided_success_is_not_imitated_by_self_sft():
    """Self-SFT imitates the student's own answers; a guided one began from the teacher's prefix."""
    guided = _sample("a", True, prefix=2)
    own = _sample("a", True)
    assert best_passing_sample([_sample("a", False), guided]) is None
    assert best_passing_sample([guided, own]) is own


def test_the_run_summary_says_how_much_guidance_the_run_used():
    from training.run_summary import guidance_line

    assert guidance_line([{"step": 1, "pass_rate": 0.0}]) is None  # guidance off
    rows = [
        {"step": 1, "guidance/transfer_pass_rate": 0.0, **GuidanceState().summary()},
        {"step": 2, "guidance/transfer_pass_rate": 0.5},
        {
            "step": 3,
            "guidance/total_guided_groups": 6.0,
            "guidance/total_group_share": 0.25,
            "guidance/total_tasks_guided": 4.0,
            "guidance/total_prefix_tokens_mean": 31.6,
            "guidance/total_prefix_fraction_mean": 0.42,
            "guidance/total_pass_rate_guided": 0.375,
        },
    ]
    assert guidance_line(rows) == (
        "phase 3 guidance: 6 guided groups (25% of groups, 4 tasks), mean prefix 32 tokens (42% of the teacher's "
        "answer), guided pass rate 0.38; unguided pass rate on tasks guided earlier 0.25 (mean of 2 steps)"
    )
    assert (
        guidance_line(rows[:1]) == "phase 3 guidance: no all-fail group of a task with a teacher trace, nothing guided"
    )
