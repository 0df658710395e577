"""On-policy distillation's loss term (training.losses.opd_token_advantages, opd_loss) against numbers
worked out by hand (arithmetic in the comments)."""

import pytest
import torch

from training.losses import combine_losses, grpo_loss, opd_loss, opd_token_advantages


def close(tensor: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(tensor.detach().float(), torch.tensor(expected, dtype=torch.float32))


def test_the_token_advantage_is_teacher_minus_student_masked():
    student = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -4.0]])
    teacher = torch.tensor([[-0.5, -4.0, -0.5], [-1.0, -0.2, -0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the last token of row 2: padding / environment
    adv, m = opd_token_advantages(student, teacher, mask)
    # teacher - student: [0.5, -2.0, 0.0], [2.0, -0.1, (4.0 masked -> 0)]
    close(adv, [[0.5, -2.0, 0.0], [2.0, -0.1, 0.0]])
    # opd/kl: mean of student - teacher over the 5 kept tokens = (-0.5 + 2.0 + 0 - 2.0 + 0.1) / 5 = -0.08
    assert m["opd/kl"] == pytest.approx(-0.08)
    assert m["opd/advantage_mean"] == pytest.approx(0.08)
    assert m["opd/clipped_frac"] == 0.0


def test_the_clip_bounds_a_token_the_teacher_rules_out():
    student = torch.tensor([[-1.0, -1.0, -1.0]])
    teacher = torch.tensor([[-9999.0, -0.25, 2.0]])  # vLLM reports -inf as -9999
    adv, m = opd_token_advantages(student, teacher, torch.ones(1, 3), clip=1.5)
    # raw: -9998, 0.75, 3.0 -> clamped to [-1.5, 1.5]: -1.5, 0.75, 1.5
    close(adv, [[-1.5, 0.75, 1.5]])
    assert m["opd/clipped_frac"] == pytest.approx(2 / 3)
    assert m["opd/kl"] == pytest.approx((9998.0 - 0.75 - 3.0) / 3)  # the unclipped estimate


def test_the_advantages_are_detached():
    student = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv, _ = opd_token_advantages(student, torch.zeros(1, 2), torch.ones(1, 2))
    assert not adv.requires_grad


def test_opd_loss_by_hand_and_its_gradient_pushes_each_token_by_its_advantage():
    # one row, 3 tokens, the last masked (an environment token); ratio 1 (old = current)
    logp = torch.tensor([[-1.0, -2.0, -0.3]], requires_grad=True)
    teacher = torch.tensor([[-0.5, -3.0, -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, m = opd_loss(logp, logp.detach(), teacher, mask)
    # a = [0.5, -1.0, 0]; per token -r * a = [-0.5, 1.0, 0]; token-mean over 2 tokens = 0.25
    assert loss.item() == pytest.approx(0.25)
    assert m["loss/opd"] == pytest.approx(0.25)
    loss.backward()
    # d/dlogp of -exp(logp - old) * a / 2 at ratio 1 = -a / 2: [-0.25, 0.5, 0]
    close(logp.grad, [[-0.25, 0.5, 0.0]])


def test_opd_loss_uses_the_given_denominator_and_importance_weights():
    logp = torch.tensor([[-1.0, -2.0]])
    teacher = torch.tensor([[0.0, 0.0]])  # a = [1, 2]
    weights = torch.tensor([[2.0, 0.5]])
    loss, _ = opd_loss(logp, logp, teacher, torch.ones(1, 2), denominator=4.0, token_weights=weights)
    # per token -a * w = [-2, -1]; sum -3 / 4 = -0.75
    assert loss.item() == pytest.approx(-0.75)


def test_the_ppo_clip_applies_per_token_with_a_stale_policy():
    # mu > 1: ratio exp(0.5) = 1.6487 > 1.2 on token 1 with a > 0 -> clipped to 1.2 (no gradient);
    # token 2: ratio exp(-0.5) = 0.6065 < 0.8 with a < 0 -> clipped to 0.8 (no gradient)
    old = torch.tensor([[-1.5, -1.5]])
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    teacher = torch.tensor([[-0.5, -2.5]])  # a against old: [1.0, -1.0]
    loss, _ = opd_loss(logp, old, teacher, torch.ones(1, 2))
    # per token: -min(1.6487 * 1, 1.2 * 1) = -1.2; -min(0.6065 * -1, 0.8 * -1) = 0.8; mean -0.2
    assert loss.item() == pytest.approx(-0.2)
    loss.backward()
    close(logp.grad, [[0.0, 0.0]])


def test_grpo_plus_opd_equals_one_surrogate_with_the_combined_token_advantage():
    # at ratio 1, w_grpo * L_grpo(A) + w_opd * L_opd(a) has the gradient of one surrogate with w_grpo A + w_opd a
    logp = torch.tensor([[-1.0, -2.0, -0.7], [-0.2, -1.1, -3.0]], requires_grad=True)
    teacher = torch.tensor([[-0.4, -2.5, -0.7], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    seq_adv = torch.tensor([0.8, -0.8])
    w_grpo, w_opd = 1.0, 0.5
    g, _ = grpo_loss(logp, logp.detach(), seq_adv, mask)
    o, _ = opd_loss(logp, logp.detach(), teacher, mask)
    (w_grpo * g + w_opd * o).backward()
    combined = logp.grad.clone()
    logp.grad = None
    token_adv = w_grpo * seq_adv.unsqueeze(1) + w_opd * (teacher - logp.detach()) * mask
    one, _ = grpo_loss(logp, logp.detach(), token_adv, mask)
    one.backward()
    close(combined, logp.grad.tolist())


def test_combine_losses_reports_the_opd_term_only_when_present():
    no_sft = {"teacher_weight": 0.0, "self_weight": 0.0}
    opd = {"opd": torch.tensor(-1.0)}
    total, m = combine_losses(torch.tensor(2.0), None, None, grpo_weight=1.0, **no_sft, **opd, opd_weight=0.5)
    assert total.item() == pytest.approx(2.0 - 0.5)
    assert m["weight/opd"] == 0.5 and m["loss/opd"] == -1.0
    _, without = combine_losses(torch.tensor(2.0), None, None, grpo_weight=1.0, **no_sft)
    assert "weight/opd" not in without and "loss/opd" not in without
    only, _ = combine_losses(
        torch.tensor(2.0), None, None, grpo_weight=0.0, **no_sft, **opd, opd_weight=1.0
    )  # OPD only
    assert only.item() == -1.0
