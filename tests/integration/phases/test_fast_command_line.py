"""--help and a mistyped flag are answered before the heavy imports: torch and transformers are never imported
(a timing-free check: the answer comes from the real entry point, run as a user runs it)."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_script

# Runs the entry point as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would, then reports its exit code and
# which heavy packages it had imported.
PROBE = """
import json, runpy, sys
target, args = sys.argv[1], sys.argv[2:]
sys.argv = [target, *args]
code = 0
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "heavy": sorted(m for m in ("torch", "transformers", "peft") if m in sys.modules)}),
      file=sys.stderr)
"""

ENTRY_POINTS = [
    "phase1_prepare_data.py",
    "phase2_generate_teacher_traces.py",
    "phase3_train_grpo.py",
    "phase4_evaluate.py",
    "test_all.py",
    "config",
    "evaluation.solve",
]


def probe(target: str, *args: str) -> tuple[dict, str]:
    result = run_script("-c", PROBE, target, *args)
    report = json.loads(result.stderr.strip().splitlines()[-1])
    return report, result.stdout + result.stderr


@pytest.mark.parametrize("target", ENTRY_POINTS)
def test_help_before_heavy_imports(target):
    report, output = probe(target, "--help")
    assert report["code"] in (0, None) and "usage:" in output, output
    assert report["heavy"] == [], f"{target} --help imported {report['heavy']}"


@pytest.mark.parametrize("target", ENTRY_POINTS)
def test_a_mistyped_flag_before_heavy_imports(target):
    report, output = probe(target, "--learning_rat", "1e-5")
    assert report["code"] == 2, output
    assert report["heavy"] == [], f"{target}: the argument error came after importing {report['heavy']}"
