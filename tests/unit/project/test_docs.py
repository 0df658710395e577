"""The README stays a door (short, linking into docs/), ARCHITECTURE.md stays a map (short, the detail in the
package docstrings), and no link of the documentation points nowhere."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

README_MAX_LINES = 350  # the rest belongs in a docs/ page, with a headline row in the README
ARCHITECTURE_MAX_LINES = 200  # the rest belongs in the docstring of the package or module it is about
LINK = re.compile(r"\]\(([^)\s]+)\)")


def broken_links(page: Path) -> list[str]:
    """Relative links of a markdown page whose file does not exist (web links and in-page anchors are not checked)."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            broken.append(target)
    return broken


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move details to a docs/ page and link it"


def test_the_architecture_map_is_short():
    lines = (ROOT / "ARCHITECTURE.md").read_text().count("\n")
    assert lines <= ARCHITECTURE_MAX_LINES, (
        f"ARCHITECTURE.md has {lines} lines: move the detail into the docstring of the package or module it is about"
    )


def test_every_relative_link_of_the_documentation_resolves():
    pages = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) > 3
    assert {str(page.relative_to(ROOT)): broken_links(page) for page in pages if broken_links(page)} == {}


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("x\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [anchor](there.md#x) [web](https://example.org) [gone](docs/missing.md)\n")
    assert broken_links(page) == ["docs/missing.md"]


CODE_BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)


def unpinned_opd_commands(page: Path) -> list[str]:
    """In every code block that serves a teacher with `vllm serve` and runs phase 3 with on-policy distillation,
    the GPU commands (joined over their continuation lines; `--preset cpu` runs are not) that do not set
    CUDA_VISIBLE_DEVICES: with OPD the teacher is asked every step, so server and trainer need their own GPUs."""
    found = []
    for block in CODE_BLOCK.findall(page.read_text()):
        commands = [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip() and not c.startswith("#")]
        if not any("vllm serve" in c for c in commands) or not any("opd_weight" in c for c in commands):
            continue
        for command in commands:
            gpu = "vllm serve" in command or ("phase3_train_grpo.py" in command and "--preset cpu" not in command)
            if gpu and "CUDA_VISIBLE_DEVICES=" not in command:
                found.append(command)
    return found


def test_opd_commands_put_the_teacher_and_the_trainer_on_their_own_gpus():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert {str(p.relative_to(ROOT)): unpinned_opd_commands(p) for p in pages if unpinned_opd_commands(p)} == {}
    assert sum("opd_weight" in p.read_text() and "CUDA_VISIBLE_DEVICES" in p.read_text() for p in pages) >= 2


def test_the_documented_gpu_commands_sample_with_vllm_when_it_is_installed(monkeypatch):
    """Every `phase3_train_grpo.py` / `phase4_evaluate.py --preset gpu` line of the README and docs/gpu.md, with its
    own --set flags, samples with vLLM where vLLM is installed, unless the line chooses hf itself (and says so)."""
    import shlex

    import config as config_module
    from config import build_config

    monkeypatch.setattr(config_module.sections, "vllm_installed", lambda: True)
    found = 0
    for page in (ROOT / "README.md", ROOT / "docs" / "gpu.md"):
        for line in page.read_text().splitlines():
            if "--preset gpu" not in line or not re.search(r"phase[34]_\w+\.py", line):
                continue
            words = shlex.split(line.split("#")[0].rstrip(" \\"))
            sets = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]
            config = build_config("gpu", overrides=sets)
            backend = config.rollout_backend if "phase3" in line else config.evaluation_backend
            chooses_hf = any(s.endswith("=hf") for s in sets)
            assert backend == ("hf" if chooses_hf else "vllm") or backend == "vllm_server", (page.name, line)
            found += 1
    assert found >= 4


def test_the_trl_metric_name_table_names_what_the_trainer_logs():
    """docs/phase3-training.md maps TRL's logged names to ours; each of ours must be a key the trainer writes."""
    text = (ROOT / "docs" / "phase3-training.md").read_text()
    rows = re.findall(r"^\| [^|]+ \| `[^|]*` \| `([^`]+)`", text, flags=re.M)
    assert len(rows) >= 8, "the TRL metric name table is missing from docs/phase3-training.md"
    sources = "".join(path.read_text() for path in (ROOT / "training").glob("*.py"))
    for name in rows:
        if "<name>" in name:
            assert 'f"reward/{' in sources
            continue
        assert f'"{name}"' in sources, f"{name} is in the table but the trainer logs no such key"


def test_make_helps_timings_are_the_ones_docs_results_measured():
    """Each `~N min` in `make help` is a figure docs/results.md reports for that target."""
    makefile = (ROOT / "Makefile").read_text()
    results = (ROOT / "docs" / "results.md").read_text()
    timed = re.findall(r"^([a-z-]+):.*## .*?~(\d+) min", makefile, flags=re.M)
    assert {target for target, _ in timed} >= {"run", "test", "test-all", "test-vllm"}, timed
    for target, minutes in timed:
        spots = [m.end() for m in re.finditer(rf"`make {re.escape(target)}`", results)]
        assert any(re.search(rf"\b{minutes} min", results[at : at + 600]) for at in spots), (
            f"make help says ~{minutes} min for {target}; docs/results.md reports no such figure for `make {target}`"
        )


def test_the_gpu_quick_start_marks_one_and_several_gpus_as_alternatives():
    """Read top to bottom, the quick start must not look like two trainings to run in turn into one folder."""
    for page in (ROOT / "README.md", ROOT / "docs" / "gpu.md"):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("accelerate launch --multi_gpu") and "phase3_train_grpo.py" in line:
                before = "\n".join(lines[max(0, i - 8) : i + 1])
                assert "or:" in line and re.search(r"ONE of|one of", before), f"{page.name}:{i + 1}: {line}"
