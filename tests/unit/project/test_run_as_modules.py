"""The programs beside the product run as modules from the repository root (`python -m benchmarks.bench_executor`,
`accelerate launch -m tests.ddp_two_steps`), so none edits `sys.path` to find the project, and no import waits
below such an edit."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT

# Spelled in pieces so that this file does not find itself.
PATH_EDITS = ("sys.path." + "insert", "sys.path." + "append")
LATE_IMPORT = "noqa: " + "E402"
FOLDERS = ("benchmarks", "scripts", "experiments", "tests")
# (file, pattern): a late import with a reason other than sys.path
ALLOWED = {
    # the vLLM classes are imported after `pytest.importorskip("vllm")`, which skips the file where vLLM is absent
    ("tests/unit/rollouts/test_vllm_contract.py", LATE_IMPORT),
}


def python_files(root: Path) -> list[Path]:
    """The repository root's own .py files and every .py file under FOLDERS."""
    found = sorted(root.glob("*.py"))
    for folder in FOLDERS:
        found += sorted(path for path in (root / folder).rglob("*.py") if "results" not in path.parts)
    return found


def path_edits(root: Path) -> list[str]:
    """'file:line: text' for each sys.path edit and each late import marker outside ALLOWED."""
    hits = []
    for path in python_files(root):
        relative = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for pattern in (*PATH_EDITS, LATE_IMPORT):
                if pattern in line and (relative, pattern) not in ALLOWED:
                    hits.append(f"{relative}:{number}: {line.strip()}")
    return hits


def test_no_program_edits_sys_path_or_imports_below_such_an_edit():
    hits = path_edits(ROOT)
    assert not hits, "run it as a module from the repository root (python -m package.module) instead:\n" + "\n".join(
        hits
    )


def test_the_check_finds_a_path_edit_and_a_late_import(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bench_x.py").write_text(
        f"import sys\n{PATH_EDITS[0]}(0, '..')\nimport config  # {LATE_IMPORT}\n"
    )
    (tmp_path / "tests" / "unit" / "rollouts").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "rollouts" / "test_vllm_contract.py").write_text(f"import vllm  # {LATE_IMPORT}\n")
    assert path_edits(tmp_path) == [
        f"benchmarks/bench_x.py:2: {PATH_EDITS[0]}(0, '..')",
        f"benchmarks/bench_x.py:3: import config  # {LATE_IMPORT}",
    ]
