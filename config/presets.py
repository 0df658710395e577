"""The presets: `gpu` is the sections' defaults (the product's design values), `cpu` the embedded default that
runs on a laptop with no network; `auto` picks one for the machine."""

from __future__ import annotations

from typing import Any

from config.sections import EMBEDDED_STUDENT

# The `gpu` preset is the dataclass defaults (the product's design values, for a single GPU
# with ~24-80 GB and a vLLM-served Qwen3-32B teacher). The `cpu` preset is the embedded default:
# the SmolLM2-135M-Instruct student shipped on PyPI, the project's own task fixtures, a local
# stand-in teacher serving the same small model, and sizes that finish in minutes on 2 cores.
# Since rollouts and phase 4 sample with the kv sampler (~3x generate), `make run` spends the time
# saved on 12 steps instead of 6, at 5e-4 (1e-4 barely moves a 135M LoRA in tens of steps:
# the retired learning check, benchmarks/results/learning_check.json), and 8 evaluation samples per task instead of 4.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "gpu": {},
    "cpu": {
        "data": {"offline": True},
        "teacher": {
            "api_url": "http://127.0.0.1:8129/v1",
            "model_name": EMBEDDED_STUDENT,
            "num_samples_per_problem": 1,
            "max_tasks": 12,
            "max_concurrent_requests": 2,
            "max_tokens": 160,
            "thinking_token_budget": 0,  # the local stand-in runs no reasoning parser
            "request_timeout": 120.0,
            # code-only teacher-SFT targets: SmolLM2-135M closed <think> in 0 of 32 of its own samples on training
            # prompts (test_all.py measures it), and thinking targets taught it to open a block it then left open
            "reference_thinking": "none",
        },
        "student": {"model_name": EMBEDDED_STUDENT, "torch_dtype": "float32"},
        "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0},
        "grpo": {
            "num_samples_per_prompt": 4,
            "max_new_tokens": 128,
            "correctness_reward": "fraction",
            "scale_rewards": False,  # partial credit: mean-centred advantages (see grpo.correctness_reward)
            "rollout_backend": "kv",
        },
        "training": {
            "num_train_epochs": 1,
            "max_steps": 12,
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 1,
            "learning_rate": 5e-4,
            "save_steps": 3,
            "forward_chunk_size": 2,
            "gradient_checkpointing": False,
            "autocast": "auto",  # bfloat16 where the CPU has it: ~1.2x the update (docs/results.md)
        },
        "dual_source": {"teacher_sft_batch_size": 1, "sft_max_length": 512, "include_thinking": False},
        "sandbox": {"timeout_per_test": 2.0, "memory_limit_mb": 512},
        "evaluation": {"num_samples": 8, "k_values": (1, 2, 4, 8), "max_new_tokens": 128},
        "multi_turn": {"max_total_tokens": 512},
    },
}
PRESET_CHOICES = ("auto", *PRESETS)


def resolve_preset_name(name: str) -> str:
    """'auto' picks `gpu` when CUDA is available and `cpu` otherwise."""
    if name != "auto":
        return name
    return "gpu" if _cuda_available() else "cpu"


def _cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch (seconds; --help must not wait for it) where the answer
    is plain: torch's CPU build ('+cpu' in its version), or a Linux machine with no GPU device node."""
    import importlib.metadata
    import sys
    from pathlib import Path

    if "torch" not in sys.modules:  # already imported: asking it costs nothing
        try:
            if "+cpu" in importlib.metadata.version("torch"):
                return False
        except importlib.metadata.PackageNotFoundError:
            return False
        if sys.platform.startswith("linux"):
            dev = Path("/dev")
            if not any(dev.glob("nvidia[0-9]*")) and not (dev / "kfd").exists() and not (dev / "dxg").exists():
                return False
    try:
        import torch  # local import: config must stay importable without torch

        return torch.cuda.is_available()
    except ImportError:
        return False
