""".ci/run, the CI entry point, against a `make` that records its calls: every check and tier runs, the test tiers
one after the other, and a failing step (in the foreground or in the background) fails the run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

FAKE_MAKE = """#!/usr/bin/env bash
# records "start TARGET" / "end TARGET"; fails the target named in $FAIL_TARGET after printing a marker
for target in "$@"; do
    echo "start $target" >> "$CALLS"
    case "$target" in vllm-venv|contract-venv|test-all) sleep 0.5 ;; esac  # slow enough to show an overlap
    if [ "$target" = "${FAIL_TARGET:-}" ]; then echo "fake make: $target broke"; exit 2; fi
    echo "end $target" >> "$CALLS"
done
"""
CHECKS = (
    "install",
    "lint",
    "check-gpu-resolve",
    "test-all",
    "contract-venv",
    "test-contract",
    "vllm-venv",
    "test-vllm",
)


def run_ci(tmp_path: Path, fail: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text(FAKE_MAKE)
    (bin_dir / "make").chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), "FAIL_TARGET": fail}
    done = subprocess.run(["bash", str(repo / ".ci" / "run")], capture_output=True, text=True, env=env, timeout=60)
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_every_check_and_tier_runs_and_the_tiers_run_one_after_the_other(tmp_path):
    done, calls = run_ci(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {line.split()[1] for line in calls if line.startswith("end ")} == set(CHECKS), calls
    # the sandbox's wall-clock backstops must not share the machine with the vLLM tier's engines
    assert calls.index("end test-all") < calls.index("start test-vllm"), calls
    assert calls.index("end vllm-venv") < calls.index("start test-vllm"), calls
    assert calls.index("end install") < calls.index("start contract-venv"), calls  # it reads .venv's packages
    assert calls.index("end contract-venv") < calls.index("start test-contract"), calls


@pytest.mark.parametrize("fail", ["vllm-venv", "contract-venv", "test-contract", "lint", "check-gpu-resolve"])
def test_a_failed_background_step_fails_the_run_and_shows_its_log(tmp_path, fail):
    done, calls = run_ci(tmp_path, fail)
    assert done.returncode != 0
    assert f"fake make: {fail} broke" in done.stdout, done.stdout
    assert "start test-vllm" not in calls


@pytest.mark.parametrize("fail", ["test-all", "test-vllm"])
def test_a_failed_foreground_step_fails_the_run(tmp_path, fail):
    done, calls = run_ci(tmp_path, fail)
    assert done.returncode != 0
    assert "=== .ci/run" in done.stdout and "done" not in done.stdout.splitlines()[-1]
    assert f"end {fail}" not in calls
