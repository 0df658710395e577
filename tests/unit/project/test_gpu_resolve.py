"""scripts/check_gpu_resolve.py: the verdict from pip's answer, the cache key, the pins it checks. (The real
resolve against the package index runs in `make check-gpu-resolve`, from .ci/run.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("check_gpu_resolve", ROOT / "scripts" / "check_gpu_resolve.py")
assert _spec is not None and _spec.loader is not None
resolve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resolve)

# What pip 26.3 printed for the old pins (numpy==2.4.6 against mistral_common's numpy<2.4), abridged.
CONFLICT = """WARNING: Location 'file:///opt/pypi/simple/numpy/' is ignored: it is neither a file nor a directory.
ERROR: Cannot install -r requirements.txt (line 13), mistral_common, numpy==2.4.6 and vllm because these package \
versions have conflicting dependencies.
ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/
"""


def report(**versions: str) -> dict:
    return {"install": [{"metadata": {"name": name, "version": version}} for name, version in versions.items()]}


def test_a_conflict_is_a_failure_that_names_the_packages():
    verdict = resolve.verdict_from(1, CONFLICT, None, {"vllm": "0.33.0"})
    assert verdict["status"] == "conflict"
    assert "numpy==2.4.6" in verdict["detail"] and "WARNING" not in verdict["detail"]


def test_a_resolution_passes_only_with_the_pinned_vllm_and_torch():
    pins = {"vllm": "0.33.0", "torch": "2.14.0"}
    assert resolve.verdict_from(0, "", report(vllm="0.33.0", torch="2.14.0", numpy="2.3.5"), pins)["status"] == "ok"
    other = resolve.verdict_from(0, "", report(vllm="0.33.0", torch="2.14.1"), pins)
    assert other["status"] == "mismatch" and "torch" in other["detail"]


def test_an_unreachable_index_is_neither_a_pass_nor_a_conflict():
    verdict = resolve.verdict_from(1, "ERROR: Could not find a version ... Connection refused", None, {})
    assert verdict["status"] == "unreachable"


def test_the_cache_key_follows_every_included_file(tmp_path: Path):
    (tmp_path / "base.txt").write_text("numpy==2.4.6\n")
    (tmp_path / "gpu.txt").write_text("-r base.txt\nvllm==0.33.0\n")
    before = resolve.cache_key(tmp_path / "gpu.txt", "3.11", "26.3")
    assert resolve.pinned(tmp_path / "gpu.txt") == {"numpy": "2.4.6", "vllm": "0.33.0"}
    (tmp_path / "base.txt").write_text("numpy==2.3.5\n")
    assert resolve.cache_key(tmp_path / "gpu.txt", "3.11", "26.3") != before
    assert resolve.cache_key(tmp_path / "gpu.txt", "3.12", "26.3") != resolve.cache_key(
        tmp_path / "gpu.txt", "3.11", "26.3"
    )


def test_the_project_pins_numpy_below_what_mistral_common_caps():
    """vLLM 0.33.0 needs mistral_common, every release of which caps numpy < 2.4 on Python <= 3.12."""
    from packaging.version import Version

    assert Version(resolve.pinned(ROOT / "requirements-gpu.txt")["numpy"]) < Version("2.4")
