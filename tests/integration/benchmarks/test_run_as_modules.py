"""Every product benchmark, and each script that imports the project, answers `--help` run as a user runs it:
`python -m <package>.<name> --help` from the repository root, its usage line naming that command."""

from __future__ import annotations

import pytest

from tests.cli_helpers import run_script
from tests.conftest import ROOT

BENCHMARKS = sorted(f"benchmarks.{path.stem}" for path in (ROOT / "benchmarks").glob("*.py") if path.stem != "__init__")
SCRIPTS = ["scripts.check_vllm_adapter", "scripts.gen_config_docs", "scripts.serve_local_teacher"]


def test_each_benchmark_shows_its_module_command_in_its_docstring_and_usage():
    assert len(BENCHMARKS) >= 11, BENCHMARKS  # the glob found the folder
    for module in BENCHMARKS:
        text = (ROOT / "benchmarks" / f"{module.split('.')[1]}.py").read_text()
        assert f"    python -m {module}" in text.split('"""')[1], module  # the docstring's command lines
        assert f'prog="python -m {module}"' in text, module  # --help's usage line


@pytest.mark.slow  # the benchmarks that import torch at the top take 5-15 s each on a busy 2-core machine
@pytest.mark.parametrize("module", BENCHMARKS + SCRIPTS)
def test_help_as_a_module_from_the_repository_root(module):
    done = run_script("-m", module, "--help", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"usage: python -m {module} "), done.stdout[:300]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
