"""The phase scripts as tests call them: one argv builder for the cpu preset and one runner for a script
run as a user runs it (a subprocess from the repository root)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tests.conftest import ROOT

TINY_STUDENT = "student.model_name=embedded:tiny-random"


def cpu_argv(*flags: str, sets: Sequence[str] = ()) -> list[str]:
    """`--preset cpu`, the flags, then one `--set` per `key=value` of `sets` (in order: a later one wins)."""
    return ["--preset", "cpu", *flags, *[arg for key_value in sets for arg in ("--set", key_value)]]


def fake_teacher_argv(url: str, task_file: object, trace_file: object, *flags: str) -> list[str]:
    """Phase 2's argv against a `tests.fake_openai_server.FakeTeacher` at `url` (model `fake-teacher`)."""
    return cpu_argv(
        "--api_url", url, "--model", "fake-teacher", "--input", str(task_file), "--output", str(trace_file), *flags
    )


def run_script(*args: str, timeout: float = 120, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python *args` from the repository root with this environment (plus `env`), output captured as text."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def start_script(*args: str, **popen: Any) -> subprocess.Popen:
    """`python *args` from the repository root in the background; output discarded unless `popen` (Popen's
    keyword arguments) says where it goes."""
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, **{"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, **popen}
    )
