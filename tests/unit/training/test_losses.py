"""The loss math against numbers worked out by hand (arithmetic in the comments)."""

import math

import pytest
import torch

from training.losses import (
    aggregate_loss,
    aggregation_denominator,
    clipped_surrogate,
    combine_losses,
    group_advantages,
    grpo_loss,
    k3_kl,
    kl_loss,
    masked_sft_nll,
    selective_log_softmax,
)

NAN = float("nan")


def sft_loss_via_log_softmax(logits, labels):
    """Reference: plain cross-entropy with the same shift and ignore index."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def test_advantages_z_score_by_hand():
    # group [1, 0, 0, 1]: mean 0.5, Bessel std = sqrt((4 * 0.25) / 3) = sqrt(1/3) = 0.57735
    adv, m = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), scale=True, eps=0.0)
    a = 0.5 / math.sqrt(1 / 3)  # = 0.866025
    assert adv.tolist()[0] == pytest.approx([a, -a, -a, a], rel=1e-5)
    assert m["reward/mean"] == 0.5 and m["frac_reward_zero_std"] == 0.0


def test_advantages_mean_only_and_zero_variance_groups():
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    adv, m = group_advantages(rewards, scale=False)
    # mean of group 0 = 0.5: advantages r - 0.5
    assert adv[0].tolist() == [0.5, -0.5, 0.0, 0.0]
    assert adv[1].tolist() == [0.0] * 4 and adv[2].tolist() == [0.0] * 4
    assert m["frac_reward_zero_std"] == pytest.approx(2 / 3)


def test_unscorable_rewards_get_zero_advantage_and_leave_the_statistics():
    # valid [1, 0] (NaNs excluded): mean 0.5, Bessel std = sqrt(0.5) = 0.7071; eps 0
    adv, m = group_advantages(torch.tensor([[1.0, NAN, 0.0, NAN]]), eps=0.0)
    assert adv[0, 1] == 0 and adv[0, 3] == 0
    assert adv[0, 0].item() == pytest.approx(0.5 / math.sqrt(0.5)) and adv[0, 2].item() == pytest.approx(
        -0.5 / math.sqrt(0.5)
    )
    assert m["frac_unscorable"] == 0.5
    alone, m2 = group_advantages(torch.tensor([[1.0, NAN, NAN, NAN]]))
    assert alone.tolist() == [[0.0] * 4] and m2["frac_reward_zero_std"] == 1.0  # one valid sample: no comparison
    assert not torch.isnan(group_advantages(torch.full((2, 3), NAN))[0]).any()


def test_selective_log_softmax_matches_the_full_computation():
    torch.manual_seed(0)
    logits = torch.randn(5, 7, 50)
    index = torch.randint(0, 50, (5, 7))
    reference = torch.log_softmax(logits, dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    for chunk in (1, 2, 5):
        assert torch.allclose(selective_log_softmax(logits, index, chunk_rows=chunk), reference, atol=1e-6)
    half = selective_log_softmax(logits.to(torch.bfloat16), index)
    assert half.dtype == torch.float32 and torch.allclose(half, reference, atol=0.05)


def test_clipping_on_both_sides_by_hand():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.9]]))  # ratios 1.5, 0.5, 1.1, 0.9 (old_logp = 0)
    old = torch.zeros(1, 4)
    mask = torch.ones(1, 4)
    pos, m = clipped_surrogate(logp, old, torch.tensor([2.0]), mask, clip_low=0.2, clip_high=0.2)
    # A = +2: -min(r A, clip(r) A) = -min(3.0, 2.4), -min(1.0, 1.6), -min(2.2, 2.2), -min(1.8, 1.8)
    assert pos[0].tolist() == pytest.approx([-2.4, -1.0, -2.2, -1.8])
    assert m["clip_ratio/high_mean"] == 0.25 and m["clip_ratio/low_mean"] == 0.0
    neg, m = clipped_surrogate(logp, old, torch.tensor([-2.0]), mask, clip_low=0.2, clip_high=0.2)
    # A = -2: -min(-3.0, -2.4) = 3.0 (unclipped, pessimistic), -min(-1.0, -1.6) = 1.6 (clipped at 0.8)
    assert neg[0].tolist() == pytest.approx([3.0, 1.6, 2.2, 1.8])
    assert m["clip_ratio/low_mean"] == 0.25
    higher, _ = clipped_surrogate(logp, old, torch.tensor([2.0]), mask, clip_low=0.2, clip_high=0.28)
    assert higher[0, 0].item() == pytest.approx(-2 * 1.28)  # DAPO clip-higher


def test_ratio_one_means_plain_policy_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = clipped_surrogate(logp, logp.detach(), torch.tensor([0.5]), torch.ones(1, 2))
    loss.sum().backward()
    assert logp.grad.tolist() == [[-0.5, -0.5]]  # d/dlogp of -r A at r = 1 is -A


def test_k3_kl_by_hand():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.25)]])
    # delta = ref - logp = -ln 2, 0: exp(-ln2) + ln2 - 1 = 0.5 + 0.693147 - 1 = 0.193147; and 0
    assert k3_kl(logp, ref).tolist()[0] == pytest.approx([0.193147, 0.0], abs=1e-6)
    assert (k3_kl(torch.randn(3, 4), torch.randn(3, 4)) >= 0).all()


def test_aggregation_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)  # 2.5
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((6 / 3 + 4 / 1) / 2)  # 3.0
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", norm_length=4).item() == pytest.approx((6 + 4) / 2 / 4)
    empty = torch.zeros(2, 4)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert aggregate_loss(loss, empty, mode).item() == 0.0  # all masked: 0, not NaN
    with pytest.raises(ValueError, match="valid: token-mean"):
        aggregate_loss(loss, mask, "sum")


def test_denominators_by_hand_and_chunk_losses_add_up_to_the_batch_loss():
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [5.0, 6.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    assert aggregation_denominator(mask, "token-mean") == 6.0
    assert aggregation_denominator(mask, "seq-mean-token-mean") == 3.0  # the empty row does not count
    assert aggregation_denominator(mask, "seq-mean-token-sum-norm", norm_length=5) == 20.0
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        whole = aggregate_loss(loss, mask, mode, norm_length=5)
        denominator = aggregation_denominator(mask, mode, norm_length=5)
        for cut in ([[0], [1], [2], [3]], [[0, 1], [2, 3]], [[0, 2, 3], [1]]):
            parts = sum(aggregate_loss(loss[rows], mask[rows], mode, 5, denominator) for rows in cut)
            assert parts.item() == pytest.approx(whole.item()), (mode, cut)
    # by hand: token-mean (1+2+3+4+5+6)/6 = 3.5; rows [0] alone with that denominator: 6/6 = 1
    assert aggregate_loss(loss[[0]], mask[[0]], "token-mean", denominator=6.0).item() == pytest.approx(1.0)


def test_masked_sft_nll_chunks_with_a_shared_token_count_add_up():
    torch.manual_seed(2)
    logits = torch.randn(3, 5, 7)
    labels = torch.tensor([[-100, 1, 2, -100, -100], [-100, -100, 3, 4, 5], [-100, 6, -100, -100, -100]])
    whole, m = masked_sft_nll(logits, labels)
    n = int(m["sft/tokens"])  # 2 + 3 + 1
    assert n == 6
    parts = masked_sft_nll(logits[:2], labels[:2], n)[0] + masked_sft_nll(logits[2:], labels[2:], n)[0]
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_grpo_loss_at_step_zero_has_zero_kl_and_the_expected_value():
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.25]]))
    loss, _ = grpo_loss(logp, logp, torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    kl, m = kl_loss(logp, logp, torch.ones(2, 2))
    # ratio 1 everywhere: per-token -A -> [-1, -1, 1, 1]; token-mean = 0; KL = 0 (policy == reference)
    assert loss.item() == pytest.approx(0.0) and kl.item() == 0.0 and m["kl"] == 0.0


def test_masked_sft_nll_matches_cross_entropy_and_ignores_prompt_and_pads():
    torch.manual_seed(1)
    logits = torch.randn(2, 6, 11, requires_grad=True)
    labels = torch.tensor([[-100, -100, 3, 4, 5, -100], [-100, 7, 8, -100, -100, -100]])
    loss, m = masked_sft_nll(logits, labels)
    assert loss.item() == pytest.approx(sft_loss_via_log_softmax(logits, labels).item(), rel=1e-6)
    assert m["sft/tokens"] == 5.0  # shifted targets labels[:, 1:]: 3, 4, 5 in row 0 and 7, 8 in row 1
    loss.backward()
    assert logits.grad[:, -1].abs().sum() == 0  # the last position predicts nothing
    none, m = masked_sft_nll(logits, torch.full((2, 6), -100))
    assert none.item() == 0.0 and m["sft/tokens"] == 0.0


def test_combine_losses_by_hand():
    total, m = combine_losses(
        torch.tensor(2.0), torch.tensor(1.0), None, grpo_weight=1.0, teacher_weight=0.3, self_weight=0.2
    )
    assert total.item() == pytest.approx(2.0 + 0.3)  # the missing self-SFT term counts as 0
    assert m["weight/self_sft"] == 0.2 and "loss/self_sft" not in m and m["loss/total"] == pytest.approx(2.3)
    with pytest.raises(ValueError):
        combine_losses(None, None, None, grpo_weight=1, teacher_weight=1, self_weight=1)


def test_the_format_bonus_is_centred_but_not_z_scored():
    # all-fail group differing only in format: bonus mean 0.0625 -> 0.0375, -0.0125, 0.0375, -0.0625
    # (z-scoring the total 0.1, 0.05, 0.1, 0 would give 0.78, -0.26, 0.78, -1.30: a full pass/fail signal)
    zeros = torch.zeros(1, 4)
    adv, m = group_advantages(zeros, bonus=torch.tensor([[0.1, 0.05, 0.1, 0.0]]), eps=0.0)
    assert adv[0].tolist() == pytest.approx([0.0375, -0.0125, 0.0375, -0.0625], abs=1e-6)
    assert m["frac_reward_zero_std"] == 0.0 and m["frac_format_only_spread"] == 1.0
    assert m["reward/mean"] == pytest.approx(0.0625)
    # mixed group: z-score of correctness (+-0.866025) plus the centred bonus (mean 0.0875)
    adv, m = group_advantages(
        torch.tensor([[1.0, 0.0, 0.0, 1.0]]), bonus=torch.tensor([[0.1, 0.1, 0.05, 0.1]]), eps=0.0
    )
    a = 0.5 / math.sqrt(1 / 3)
    assert adv[0].tolist() == pytest.approx([a + 0.0125, -a + 0.0125, -a - 0.0375, a + 0.0125], abs=1e-6)
    assert m["frac_format_only_spread"] == 0.0
    # Dr. GRPO (no scaling): the plain centred total reward
    adv, _ = group_advantages(torch.tensor([[1.0, 0.0]]), scale=False, bonus=torch.tensor([[0.1, 0.0]]))
    assert adv[0].tolist() == pytest.approx([0.55, -0.55])
    # nothing varies: no signal at all
    adv, m = group_advantages(torch.ones(1, 3), bonus=torch.full((1, 3), 0.1))
    assert adv.abs().sum() == 0 and m["frac_reward_zero_std"] == 1.0 and m["frac_format_only_spread"] == 0.0


@pytest.mark.parametrize("size", [7, 8, 16])
@pytest.mark.parametrize("value", [0.05, 1.05, 0.1, 1 / 3, 2 / 3, 0.7])
def test_equal_rewards_that_are_not_binary_fractions_have_no_spread(size, value):
    # float32 sums of equal non-dyadic values leave a one-ulp std; the group must still count as flat
    adv, m = group_advantages(torch.full((1, size), value))
    assert adv.abs().sum() == 0 and m["frac_reward_zero_std"] == 1.0
    adv, m = group_advantages(torch.zeros(1, size), bonus=torch.full((1, size), value))
    assert adv.abs().sum() == 0 and m["frac_reward_zero_std"] == 1.0


def test_k3_as_a_loss_has_the_gradient_of_kl_reference_to_policy():
    # sampling x ~ policy (not differentiated) and averaging grad k3(x): sum_x pi(x) grad k3(x)
    torch.manual_seed(4)
    theta = torch.randn(6, requires_grad=True)
    ref = torch.log_softmax(torch.randn(6), -1)
    logp = torch.log_softmax(theta, -1)
    expected_k3 = (logp.exp().detach() * k3_kl(logp, ref)).sum()
    (grad_k3,) = torch.autograd.grad(expected_k3, theta)
    reverse = (ref.exp() * (ref - torch.log_softmax(theta, -1))).sum()  # KL(ref || policy)
    (grad_reverse,) = torch.autograd.grad(reverse, theta)
    forward = (torch.log_softmax(theta, -1).exp() * (torch.log_softmax(theta, -1) - ref)).sum()  # KL(policy || ref)
    (grad_forward,) = torch.autograd.grad(forward, theta)
    assert torch.allclose(grad_k3, grad_reverse, atol=1e-6)
    assert not torch.allclose(grad_k3, grad_forward, atol=1e-3)
    # while its value, on policy samples, is KL(policy || ref)
    assert expected_k3.item() == pytest.approx(forward.item(), rel=1e-5)


def test_opd_is_bounded_by_grpo_on_a_failing_sample_of_a_one_pass_group():
    from training.losses import bound_opd_advantages

    # one pass of eight, binary reward z-scored: the failing samples' GRPO advantage is -1/sqrt(7) = -0.378
    rewards = torch.tensor([1.0] + [0.0] * 7)
    grpo = (rewards - rewards.mean()) / rewards.std()  # (8,)
    mask = torch.ones(8, 6)
    mask[1, 4:] = 0  # a shorter failing sample
    opd = torch.full((8, 6), 5.0)  # the teacher loves every token (the clipped template credit)
    bounded, metrics = bound_opd_advantages(opd, grpo, mask, max_ratio=1.0)
    summed_opd = (bounded.abs() * mask).sum(dim=1)
    summed_grpo = (grpo.abs()[:, None] * mask).sum(dim=1)
    assert torch.all(summed_opd <= summed_grpo + 1e-6)
    # by hand: sample 1 has 4 tokens, budget 4 x 0.378 = 1.512 over a total of 20 -> each token 5 x 1.512 / 20
    assert bounded[1, 0].item() == pytest.approx(5 * 4 * float(grpo[1].abs()) / 20)
    assert metrics["opd/bounded_frac"] == 1.0
    # a small OPD credit inside the budget is left as it is; half the ratio halves the budget
    small = torch.full((8, 6), 0.01)
    assert torch.equal(bound_opd_advantages(small, grpo, mask, 1.0)[0], small)
    half = bound_opd_advantages(opd, grpo, mask, 0.5)[0]
    assert (half[2].abs().sum()).item() == pytest.approx(0.5 * 6 * float(grpo[2].abs()))


def test_an_all_fail_group_gets_no_opd_credit_under_the_bound():
    from training.losses import bound_opd_advantages

    bounded, _ = bound_opd_advantages(torch.full((4, 3), 2.0), torch.zeros(4), torch.ones(4, 3), 1.0)
    assert torch.count_nonzero(bounded) == 0


def test_importance_weight_tails_are_the_uncapped_weights_percentiles():
    from training.losses import truncated_importance_weights

    sampling = torch.zeros(1, 101)
    old = torch.log(torch.linspace(0.5, 5.5, 101)).unsqueeze(0)  # (1, 101) ratios 0.5, 0.55, ..., 5.5
    mask = torch.ones(1, 101)
    _, metrics = truncated_importance_weights(old, sampling, mask, "token", 3.0, tails=True)
    assert metrics["rollout/is_weight_p01"] == pytest.approx(0.55, abs=1e-4)  # the 2nd of 101: 1% of 100 gaps
    assert metrics["rollout/is_weight_p99"] == pytest.approx(5.45, abs=1e-4)  # uncapped: above the cap of 3
    _, plain = truncated_importance_weights(old, sampling, mask, "token", 3.0)
    assert "rollout/is_weight_p01" not in plain
