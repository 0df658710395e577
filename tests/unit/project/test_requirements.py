"""The pins must stay inside what vLLM 0.33.0 accepts, so the GPU environment resolves."""

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]


def read_requirements(name: str) -> dict[str, Requirement]:
    out: dict[str, Requirement] = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            out.update(read_requirements(line[3:].strip()))
            continue
        req = Requirement(line)
        key = canonicalize_name(req.name)
        if key in out:  # a platform file narrows a shared range: keep both constraints
            req = Requirement(f"{req.name}{SpecifierSet(str(out[key].specifier)) & req.specifier}")
        out[key] = req
    return out


def pinned_version(req: Requirement) -> str | None:
    pins = [s.version for s in req.specifier if s.operator == "=="]
    return pins[0] if pins else None


def vllm_requirements() -> dict[str, Requirement]:
    reqs: dict[str, Requirement] = {}
    for line in (ROOT / "tests/data/vllm-0.33.0-requires.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"platform_machine": "x86_64", "python_version": "3.11"}):
            reqs[canonicalize_name(req.name)] = req
    return reqs


def test_every_runtime_dependency_is_pinned_or_bounded():
    for name, req in read_requirements("requirements-cpu.txt").items():
        assert pinned_version(req), f"{name} is not pinned in the CPU install"
    for name, req in read_requirements("requirements-gpu.txt").items():
        assert pinned_version(req), f"{name} is not pinned in the GPU install"


def test_cpu_torch_is_the_cpu_build_version():
    assert pinned_version(read_requirements("requirements-cpu.txt")["torch"]) == "2.13.0"


def test_gpu_pins_satisfy_vllm():
    vllm = vllm_requirements()
    gpu = read_requirements("requirements-gpu.txt")
    checked = []
    for name, req in gpu.items():
        version = pinned_version(req)
        if name in vllm and version:
            assert vllm[name].specifier.contains(version, prereleases=True), (
                f"{name}=={version} is outside vLLM 0.33.0's {vllm[name].specifier}"
            )
            checked.append(name)
    # the pins that matter most must actually have been checked
    assert {"torch", "transformers", "openai", "numpy", "tqdm", "pyyaml"} <= set(checked)


def test_shared_pins_admit_both_torch_versions_and_vllm_is_gpu_only():
    base = read_requirements("requirements.txt")
    assert base["torch"].specifier.contains("2.13.0") and base["torch"].specifier.contains("2.14.0")
    assert "vllm" not in base and "vllm" not in read_requirements("requirements-cpu.txt")
    assert pinned_version(read_requirements("requirements-gpu.txt")["vllm"]) == "0.33.0"


def test_vllm_is_never_imported_at_module_level():
    # vLLM is an optional GPU extra: a top-level import would break every CPU install
    offenders = []
    for path in ROOT.rglob("*.py"):
        if any(part.startswith(".venv") for part in path.parts) or "tests" in path.parts:  # .venv, .venv-contract
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.match(r"^(import vllm|from vllm\b)", line):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_every_logging_backend_has_a_pinned_extra_with_its_package():
    """`training.logging_backends=X` tells the user `pip install -r requirements-X.txt`: that file must install X."""
    import phase3_train_grpo as phase3

    for backend, package in phase3.TRACKER_PACKAGES.items():
        extra = read_requirements(f"requirements-{backend}.txt")
        assert canonicalize_name(package) in extra and pinned_version(extra[canonicalize_name(package)])
