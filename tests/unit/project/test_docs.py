"""The README stays a door (short, short table cells, linking into docs/), ARCHITECTURE.md stays a map (short, the
detail in the package docstrings), docs/results.md holds claims in one shape and docs/log.md their history newest
first, and no link of the documentation points nowhere, anchors included."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

README_MAX_WORDS = 1200  # a door: what it is, the two commands, the phases, one results table; the rest in docs/
README_MAX_CELL_WORDS = 15  # a results cell is a figure and its interval; the question, method and history are linked
ARCHITECTURE_MAX_LINES = 200  # the rest belongs in the docstring of the package or module it is about
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6}) (.*)$")
TABLE_DIVIDER = re.compile(r"^\|[-:| ]+\|$")


def broken_links(page: Path) -> list[str]:
    """Relative links of a markdown page whose file does not exist (web links and in-page anchors are not checked)."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            broken.append(target)
    return broken


def heading_anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def sections(page: Path) -> dict[str, str]:
    """Each heading's anchor -> its text up to the next heading of the same or a higher level (a repeated title
    gets -1, -2, … as on GitHub); headings inside fenced code are not headings."""
    found: dict[str, str] = {}
    open_sections: list[tuple[int, str]] = []
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            level, anchor = len(match.group(1)), heading_anchor(match.group(2))
            repeats = sum(1 for known in found if re.fullmatch(rf"{re.escape(anchor)}(-\d+)?", known))
            anchor = f"{anchor}-{repeats}" if repeats else anchor
            open_sections = [(lv, a) for lv, a in open_sections if lv < level] + [(level, anchor)]
            found[anchor] = ""
        for _, anchor in open_sections:
            found[anchor] += line + "\n"
    return found


def table_cells(text: str) -> list[list[str]]:
    """The cells of every markdown table row (divider rows left out; an escaped pipe stays inside its cell)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not TABLE_DIVIDER.match(line):
            cells = re.split(r"(?<!\\)\|", line.strip()[1:-1])
            rows.append([cell.strip() for cell in cells])
    return rows


def test_the_readme_is_short():
    words = len((ROOT / "README.md").read_text().split())
    assert words <= README_MAX_WORDS, f"README.md has {words} words: move details to a docs/ page and link it"


def test_the_readmes_table_cells_are_short():
    long_cells = [
        cell
        for row in table_cells((ROOT / "README.md").read_text())
        for cell in row
        if len(cell.split()) > README_MAX_CELL_WORDS
    ]
    assert long_cells == [], (
        f"README table cells over {README_MAX_CELL_WORDS} words: keep the figure, link the rest into docs/results.md"
    )


def test_a_long_cell_and_a_repeated_heading_are_seen():
    rows = table_cells("| a | b \\| c |\n|---|---|\n| " + "word " * 16 + "| x |\n")
    assert rows == [["a", "b \\| c"], ["word " * 15 + "word", "x"]]
    assert heading_anchor("Does teacher guidance add to GRPO? (under review)") == (
        "does-teacher-guidance-add-to-grpo-under-review"
    )


def test_the_architecture_map_is_short():
    lines = (ROOT / "ARCHITECTURE.md").read_text().count("\n")
    assert lines <= ARCHITECTURE_MAX_LINES, (
        f"ARCHITECTURE.md has {lines} lines: move the detail into the docstring of the package or module it is about"
    )


def test_every_relative_link_of_the_documentation_resolves():
    pages = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) > 3
    assert {str(page.relative_to(ROOT)): broken_links(page) for page in pages if broken_links(page)} == {}


def broken_anchors(page: Path) -> list[str]:
    """Links of a markdown page to a heading (`file.md#anchor` or `#anchor`) that the target page does not have."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        file = page.parent / path if path else page
        if file.suffix == ".md" and file.exists() and anchor not in sections(file):
            broken.append(target)
    return broken


def test_every_anchor_of_the_documentation_resolves():
    pages = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert {str(page.relative_to(ROOT)): broken_anchors(page) for page in pages if broken_anchors(page)} == {}


def test_a_broken_anchor_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# Title\n\n## Does it work? (yes)\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#does-it-work-yes) [gone](there.md#not-a-heading) [self](#nowhere)\n")
    assert broken_anchors(page) == ["there.md#not-a-heading", "#nowhere"]


# The shape of a claim in docs/results.md: the question, the command, a table, the verdict in one sentence, when and
# where it was measured, the evidence; or, until its figure lands, the question, the command and what is pending.
CLAIM_PARTS = ("**Question.**", "**Command.**", "**Verdict.**", "**Measured.**", "**Evidence.**")


def claim_shape_problems(text: str) -> list[str]:
    """What a results page's `##` claim sections lack of the one shape (empty when every section has it)."""
    problems = []
    for section in re.split(r"^(?=## )", text, flags=re.M)[1:]:
        title = section.splitlines()[0][3:]
        pending = "**Pending.**" in section
        needed = CLAIM_PARTS[:2] if pending else CLAIM_PARTS
        problems += [f"{title}: no {part}" for part in needed if part not in section]
        if not pending and not table_cells(section):
            problems.append(f"{title}: no table")
        verdict = re.search(r"\*\*Verdict\.\*\* (.*?)(?:\n\n|$)", section, flags=re.S)
        if verdict and re.search(r"\.\s+[A-Z]", verdict.group(1).replace("e.g.", "")):
            problems.append(f"{title}: the verdict is more than one sentence")
    return problems


def test_every_claim_in_docs_results_has_the_one_shape():
    text = (ROOT / "docs" / "results.md").read_text()
    assert len(re.findall(r"^## ", text, flags=re.M)) >= 10
    assert claim_shape_problems(text) == []


def test_a_claim_without_its_parts_is_found():
    good = "**Question.** Q?\n\n**Command.** `c`\n\n| a |\n|---|\n| 1 |\n\n**Verdict.** It holds, 1.5× faster.\n\n"
    good += "**Measured.** today.\n\n**Evidence.** a file.\n"
    assert claim_shape_problems("# R\n\n## A\n\n" + good) == []
    assert claim_shape_problems("## P\n\n**Question.** Q?\n\n**Command.** c\n\n**Pending.** the figure.\n") == []
    two = good.replace("It holds, 1.5× faster.", "It holds. Then more.")
    assert claim_shape_problems("## B\n\n" + two) == ["B: the verdict is more than one sentence"]
    assert claim_shape_problems("## C\n\n**Question.** Q?\n") == [
        "C: no **Command.**",
        "C: no **Verdict.**",
        "C: no **Measured.**",
        "C: no **Evidence.**",
        "C: no table",
    ]


def test_the_measurement_log_is_dated_newest_first():
    titles = re.findall(r"^## (.*)$", (ROOT / "docs" / "log.md").read_text(), flags=re.M)
    dates = [re.match(r"\d{4}-\d{2}-\d{2}", title) for title in titles]
    assert titles and all(dates), [t for t, d in zip(titles, dates, strict=True) if not d]
    days = [d.group(0) for d in dates if d]
    assert days == sorted(days, reverse=True), "docs/log.md: entries go newest first"


NUMBER = re.compile(r"[+−-]?\d+(?:\.\d+)?")


def test_each_readme_result_is_the_figure_its_claim_reports():
    """A README results row links its claim in docs/results.md; the figures of its result and measured cells (values,
    interval bounds, date, commit) are in that claim's section, and a pending row links a pending claim."""
    results = sections(ROOT / "docs" / "results.md")
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Results") :].split("\n## ")[0]
    rows = [row for row in table_cells(table) if row[0] != "what"]
    assert len(rows) >= 10
    assert all(len(row) == 4 for row in rows), "README results rows: what | result [95% CI] | measured | details"
    for what, result, measured, details in rows:
        links = [t for t in LINK.findall(details) if t.startswith("docs/results.md#")]
        assert links, f"README row {what!r} links no claim of docs/results.md"
        claim = results.get(links[0].split("#", 1)[1], "")
        if result == "pending":
            assert "**Pending.**" in claim, what
            continue
        figures = NUMBER.findall(result.replace("*", "")) + re.findall(r"\b[0-9a-f]{7}\b|\d{4}-\d{2}-\d{2}", measured)
        missing = [figure for figure in figures if figure not in claim]
        assert missing == [], f"README row {what!r}: {missing} not in its claim ({links[0]})"


def test_no_page_names_a_config_module_that_does_not_exist():
    """The configuration is the `config/` package; a page that sends a reader to `config.py` sends them nowhere."""
    assert not (ROOT / "config.py").exists()
    pages = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert [str(p.relative_to(ROOT)) for p in pages if re.search(r"(?<![\w/])config\.py\b", p.read_text())] == []


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


MAKE_COMMAND = re.compile(r"`make ([a-z][a-z0-9-]*)")


def missing_make_targets(page: Path, makefile: str) -> list[str]:
    """The `make <target>` commands a page names that the Makefile does not define."""
    defined = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, flags=re.M))
    return sorted({t for t in MAKE_COMMAND.findall(page.read_text()) if t not in defined})


def test_every_make_command_a_page_names_exists():
    makefile = (ROOT / "Makefile").read_text()
    pages = [
        ROOT / "README.md",
        ROOT / "ARCHITECTURE.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "experiments").rglob("*.md")),
    ]
    missing = {str(p.relative_to(ROOT)): missing_make_targets(p, makefile) for p in pages}
    assert {page: targets for page, targets in missing.items() if targets} == {}


def test_a_make_command_without_its_target_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `make run`, then `make real-data` and `make test-all`.")
    assert missing_make_targets(page, "run: install\ntest-all:\n") == ["real-data"]
