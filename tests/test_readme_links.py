"""README.md's links lead to files that exist and to headings those files have.

`make docs` (mkdocs --strict) checks the links inside docs/; the README lies outside the
site, so this test checks its links into the manual.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """The anchor GitHub (and mkdocs.yml's slugify) gives a Markdown heading.

    Parameters
    ----------
    heading
        The heading's text, without its leading ``#`` marks.
    """
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on a Markdown page, code blocks left out.

    Parameters
    ----------
    page
        The Markdown file.
    """
    found, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.add(github_anchor(line.lstrip("#")))
    return found


def test_the_anchor_rule_matches_the_site_s():
    # mkdocs.yml's slugify (pymdownx, case lower) keeps each hyphen, as GitHub does
    assert github_anchor("Several seeds at once: `--seeds --workers`") == (
        "several-seeds-at-once---seeds---workers"
    )


def test_every_readme_link_resolves():
    links = LINK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    assert any(link.startswith("docs/") for link in links)
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        if not target.exists() or (anchor and anchor not in anchors(target)):
            broken.append(link)
    assert broken == [], f"README.md links to missing files or headings: {broken}"
