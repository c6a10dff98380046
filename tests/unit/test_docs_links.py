"""What the docs point to is there: every relative link in README.md and docs/ names a file of the
repository and, with a `#section`, a heading of that page (as GitHub makes its anchor), and every
repository path a page writes in backticks (`examples/...`, `tests/...`) exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
TOP = "examples|tests|operator|contract|trainer-image|helm|bench|scripts|docs|crds"
PATH = re.compile(rf"`((?:{TOP})/[\w./\-]*[\w/])`")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, only word characters, spaces and hyphens kept,
    each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for match in re.finditer(r"^#+\s+(.*)$", FENCE.sub("", page.read_text()), re.M):
        name, n = anchor(match.group(1)), 0
        while (f"{name}-{n}" if n else name) in found:  # a repeated heading gets -1, -2, ...
            n += 1
        found.add(f"{name}-{n}" if n else name)
    return found


def line_of(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def broken_links(page: Path) -> list[str]:
    text = page.read_text()
    broken = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not this repository's
            continue
        path, _, section = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(REPO)}:{line_of(text, match.start())}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif section and dest.suffix == ".md" and section not in anchors(dest):
            broken.append(f"{where} (no such section in {dest.relative_to(REPO)})")
    return broken


def missing_paths(page: Path) -> list[str]:
    text = page.read_text()
    return [
        f"{page.relative_to(REPO)}:{line_of(text, m.start())}: {m.group(1)}"
        for m in PATH.finditer(text)
        if not (REPO / m.group(1)).exists()
    ]


def test_anchor_is_githubs() -> None:
    assert anchor("Framework adapters (`bench/adapter_overhead.py`)") == "framework-adapters-benchadapter_overheadpy"
    assert anchor("`mpjob run`: the job on this machine") == "mpjob-run-the-job-on-this-machine"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_names_a_file_and_section_that_exist(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    assert missing_paths(page) == []
