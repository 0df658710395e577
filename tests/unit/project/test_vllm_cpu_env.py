"""vLLM's CPU platform is set one way everywhere the project builds an engine on it: the Makefile's `make test-vllm`
and the shell scripts spell `rollouts.vllm_cpu.CPU_PLATFORM_ENV` in their own languages and must agree with it."""

from __future__ import annotations

import re

from rollouts.vllm_cpu import CPU_PLATFORM_ENV
from tests.conftest import ROOT


def makefile_cpu_env(text: str) -> dict[str, str]:
    """The `VLLM_CPU_ENV := K=V ...` assignment, continuation lines joined."""
    match = re.search(r"^VLLM_CPU_ENV\s*:=((?:.*\\\n)*.*)$", text, re.MULTILINE)
    assert match, "the Makefile has no VLLM_CPU_ENV"
    return dict(word.split("=", 1) for word in match.group(1).replace("\\\n", " ").split())


def shell_defaults(text: str) -> dict[str, str]:
    """Each `NAME=${NAME:-value}` default a script exports."""
    return dict(re.findall(r"\b(\w+)=\$\{\1:-([^}]*)\}", text))


def shell_assignments(text: str) -> dict[str, str]:
    return dict(re.findall(r"\b([A-Z][A-Z0-9_]+)=([^\s)$]+)", text))


def test_the_makefile_runs_the_vllm_tier_on_the_projects_cpu_platform():
    assert makefile_cpu_env((ROOT / "Makefile").read_text()) == CPU_PLATFORM_ENV


def test_the_smoke_script_defaults_to_the_projects_cpu_platform():
    defaults = shell_defaults((ROOT / "scripts" / "gpu_smoke.sh").read_text())
    assert {key: defaults.get(key) for key in CPU_PLATFORM_ENV} == CPU_PLATFORM_ENV


def test_the_throughput_script_samples_with_vllm_on_the_projects_cpu_platform():
    text = (ROOT / "experiments" / "real_data" / "throughput.sh").read_text()
    vllm_leg = text[text.index('if [ "${VLLM:-0}" = 1 ]') :]
    assignments = shell_assignments(vllm_leg)
    assert {key: assignments.get(key) for key in CPU_PLATFORM_ENV} == CPU_PLATFORM_ENV


def test_the_parsers_see_a_difference():
    assert makefile_cpu_env("VLLM_CPU_ENV := VLLM_HOST_IP=127.0.0.1 \\\n    VLLM_CPU_KVCACHE_SPACE=2\n") == {
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "2",
    }
    assert shell_defaults("export VLLM_CPU_CI_ENV=${VLLM_CPU_CI_ENV:-0}") == {"VLLM_CPU_CI_ENV": "0"}
