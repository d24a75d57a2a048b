"""The README stays the first hour (at most 200 lines, the two commands in it) and every relative
link in README.md and docs/*.md reaches a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 200
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
"""A Markdown inline link or image ``[text](target "title")``; group 1 is the target."""


def relative_links(markdown: str) -> list[str]:
    """The link targets of ``markdown`` that are paths in this repository: no URL scheme, no
    pure ``#anchor``, the ``#anchor`` of a path dropped. Code spans and fenced blocks are skipped."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def test_readme_fits_the_first_hour() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; move detail into docs/"
    )
    text = README.read_text()
    assert "./scripts/demo.sh" in text and "./scripts/test.sh" in text


def test_readme_links_every_docs_page() -> None:
    linked = {(ROOT / t).resolve() for t in relative_links(README.read_text())}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md links no docs page named {missing}"


@pytest.mark.parametrize(
    "page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_relative_links_reach_files(page: Path) -> None:
    broken = [t for t in relative_links(page.read_text()) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files {broken}"


def test_the_link_finder_sees_links_and_skips_urls_and_code() -> None:
    md = (
        'see [a](docs/A.md#x), [b](https://x.org/y), [c](#top), ![img](pic.png), [d](../R.md "t")\n'
        "`[e](code.md)`\n```\n[f](fenced.md)\n```\n"
    )
    assert relative_links(md) == ["docs/A.md", "pic.png", "../R.md"]
