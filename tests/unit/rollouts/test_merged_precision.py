"""What reaches a merged bf16 engine of a small LoRA update: most of it is rounded away (the weight-level fact
behind grpo.vllm_weight_sync=auto choosing the adapter sync for a bf16 engine)."""

from __future__ import annotations

import pytest
import torch

from rollouts.vllm_colocated import surviving_update_share


def update_at(base: torch.Tensor, rho: float, seed: int) -> torch.Tensor:
    """A dense update with ||delta|| / ||base|| = rho (a LoRA's B @ A is dense)."""
    delta = torch.randn(base.shape, generator=torch.Generator().manual_seed(seed))
    return delta * (rho * base.float().norm() / delta.norm())


def test_surviving_share_by_hand():
    base = torch.tensor([1.0, 1.0, 1.0, 256.0], dtype=torch.bfloat16)  # bf16's step at 1.0 is 2^-7, at 256 it is 2
    delta = torch.tensor([2.0**-6, 2.0**-10, 0.0, 0.5])  # survives, rounded away, no update, rounded away
    assert surviving_update_share(base, delta, torch.bfloat16) == pytest.approx(1 / 3)
    assert surviving_update_share(base.float(), delta, torch.float32) == 1.0  # float32 keeps all of them
    assert surviving_update_share(base, torch.zeros(4), torch.bfloat16) == 1.0


def test_at_rho_1e_3_about_three_quarters_of_a_bf16_update_is_rounded_away():
    """‖ΔW‖/‖W‖ = 1e-3 (an early LoRA step): a weight of 8 significant bits loses every element of ΔW below half
    its last place, |W| x 2^-9; with Gaussian W and ΔW that is ~3/4 of them (0.76 of ΔW's elements measured on
    SmolLM2-135M's real weights). At 1e-2 most survive; a float32 engine keeps every one."""
    base = (torch.randn(512, 512, generator=torch.Generator().manual_seed(0)) * 0.02).to(torch.bfloat16)
    small = surviving_update_share(base, update_at(base, 1e-3, 1), torch.bfloat16)
    large = surviving_update_share(base, update_at(base, 1e-2, 2), torch.bfloat16)
    assert 0.15 < small < 0.35, small
    assert large > 0.7, large
    assert surviving_update_share(base.float(), update_at(base, 1e-3, 1), torch.float32) > 0.99


def test_phase3_says_what_a_merged_bf16_sync_loses_and_auto_never_picks_it():
    """'auto' resolves to merged only for a float32 student; a merged sync chosen for bf16 gets one line at start."""
    from config import build_config
    from phase3_train_grpo import rollout_lines

    def lines(dtype: str, sync: str) -> tuple[str, list[str]]:
        overrides = {"grpo": {"rollout_backend": "vllm", "vllm_weight_sync": sync}, "student": {"torch_dtype": dtype}}
        config = build_config("gpu", overrides=overrides)
        return config.vllm_weight_sync, rollout_lines(config, None)

    assert lines("bfloat16", "auto") == ("adapter", [])
    assert lines("float32", "auto") == ("merged", [])
    resolved, said = lines("bfloat16", "merged")
    assert resolved == "merged" and len(said) == 1 and "bfloat16(W + dW)" in said[0] and "'adapter'" in said[0]
