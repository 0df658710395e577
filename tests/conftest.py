"""Shared fixtures. Tests never touch the network: the hub is switched off for the whole session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"  # real MBPP/APPS, present beside the repo in CI
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Threads waiting for a busy core sleep instead of spinning: the suite runs model forwards beside sandbox workers,
# local servers and child phases on few cores, where OpenMP's spinning waits made a 57-token generation 7x slower.
# Set before torch loads (the OpenMP runtime reads it once); child processes inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def threads_per_worker(cores: int, workers: int) -> int:
    """Each pytest-xdist worker's share of the cores for torch's threads (at least one)."""
    return max(1, cores // max(1, workers))


# pytest-xdist runs several workers on the cores, and each test's torch (in the worker and in the phases and
# launches it starts, which inherit this) would otherwise run a thread per core: workers x cores threads taking
# turns on the cores. Measured on 2 cores with 3 workers, tests/e2e: 227 s -> 183 s, its CPU 441 s -> 348 s.
# A value the caller set wins. Not in `make test-vllm` (TGRPO_VLLM_CPU): an engine built in a test's process takes
# OMP_NUM_THREADS as its thread count, and that tier ran 580 s instead of 488 s with one thread a worker.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not os.environ.get("TGRPO_VLLM_CPU"):
    os.environ.setdefault(
        "OMP_NUM_THREADS",
        str(threads_per_worker(len(os.sched_getaffinity(0)), int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))),
    )


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The embedded student's tokenizer (materializes the GGUF once per machine, ~30 s)."""
    from utils.student_model import EMBEDDED_MODELS, load_tokenizer

    return load_tokenizer(EMBEDDED_MODELS[0])


@pytest.fixture(scope="session")
def pool():
    """One sandbox pool (2 workers, default limits) for the whole run; a test that needs other limits passes them
    per call (`execute_program(code, task, limits=limits, pool=pool)`). The hostile batteries start their own:
    they kill and replace workers on purpose."""
    from sandbox.pool import SandboxPool

    with SandboxPool(workers=2) as shared:
        yield shared


@pytest.fixture(scope="session")
def tiny_model_name():
    from utils.student_model import EMBEDDED_MODELS

    return EMBEDDED_MODELS[1]


@pytest.fixture
def gelu_model_dir(tmp_path, tiny_model_name):
    """A one-layer random Llama with a GELU MLP and the tiny model's tokenizer: a model the kv-cache sampler
    refuses (it implements SiLU only), with the q_proj/v_proj layers LoRA attaches to."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from utils.student_model import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(tiny_model_name))
    shape = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_act="gelu", **shape, **ids))
    model.save_pretrained(tmp_path / "gelu")
    tokenizer.save_pretrained(tmp_path / "gelu")
    return tmp_path / "gelu"


# The tiers are folders: a test's mark comes from where it lives, so no test can forget it. `make test` runs
# unit and integration tests not marked slow (the inner loop); `make test-all` (CI) runs every tier.
TIERS = ("unit", "integration", "e2e", "vllm_cpu")


def pytest_collection_modifyitems(config, items):
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        relative = Path(str(item.path)).resolve().relative_to(tests_dir)
        tier = relative.parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(
                f"tests/{relative}: a test file lives in a tier folder, tests/{{{','.join(TIERS)}}}/<package>/"
            )
        item.add_marker(getattr(pytest.mark, tier))


# tests/vllm_cpu runs the product against the real vLLM engine (its CPU build): `make test-vllm` sets
# TGRPO_VLLM_CPU=1 and runs it in .venv-vllm. The default suite (`make test`, .venv without vLLM) leaves it out.
collect_ignore = [] if os.environ.get("TGRPO_VLLM_CPU") == "1" else ["vllm_cpu"]
