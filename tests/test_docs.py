"""The README stays a door (short, linking into docs/), and no link of the documentation points nowhere."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

README_MAX_LINES = 350  # issue 30: the rest belongs in a docs/ page, with a headline row in the README
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


def test_every_relative_link_of_the_documentation_resolves():
    pages = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) > 3
    assert {str(page.relative_to(ROOT)): broken_links(page) for page in pages if broken_links(page)} == {}


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("x\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [anchor](there.md#x) [web](https://example.org) [gone](docs/missing.md)\n")
    assert broken_links(page) == ["docs/missing.md"]
