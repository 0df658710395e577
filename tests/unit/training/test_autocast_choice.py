"""training.autocast=auto: bfloat16 only where the CPU does bfloat16 in hardware (emulated, it is slower than
float32); an explicit setting is kept as written."""

from __future__ import annotations

import platform

import pytest

from training.batching import cpu_features, resolve_autocast


@pytest.mark.parametrize(
    ("setting", "device", "features", "expected"),
    [
        ("auto", "cpu", {"avx512_bf16": True, "amx_bf16": False}, "bfloat16"),
        ("auto", "cpu", {"avx512_bf16": False, "amx_bf16": True}, "bfloat16"),
        ("auto", "cpu", {"avx512_bf16": False, "amx_bf16": False, "avx2": True}, "off"),
        ("auto", "cpu", {}, "off"),  # a torch that cannot say: the safe choice
        ("auto", "cuda", {"avx512_bf16": True}, "off"),  # a GPU student's precision is student.torch_dtype
        ("auto", "mps", {"avx512_bf16": True}, "off"),
        ("off", "cpu", {"avx512_bf16": True}, "off"),
        ("bfloat16", "cpu", {}, "bfloat16"),  # asked for explicitly: kept, even emulated
    ],
)
def test_auto_picks_bfloat16_only_on_a_cpu_with_hardware_bfloat16(setting, device, features, expected):
    assert resolve_autocast(setting, device, features) == expected


def test_this_torch_reports_the_features_auto_reads():
    features = cpu_features()
    assert isinstance(features, dict)
    if platform.machine().lower() in ("x86_64", "amd64"):  # torch.cpu.get_capabilities() names x86's features
        assert "avx512_bf16" in features and "amx_bf16" in features
