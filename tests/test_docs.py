"""README and docs link only inside the repository, to files that exist, and name no machine."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_link_of_readme_and_docs_is_a_file_of_the_repository() -> None:
    outside, missing = [], []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            where = f"{page.relative_to(ROOT)} -> {target}"
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("/"):
                outside.append(where)
                continue
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).exists():
                missing.append(where)
    assert outside == [], "links leaving the repository (name the page instead)"
    assert missing == [], "links to files that do not exist"


def test_readme_and_docs_name_no_machine_path() -> None:
    found = [
        f"{page.relative_to(ROOT)}: {m.group(0)}"
        for page in PAGES
        for m in re.finditer(r"(?<![\w.])/(?:root|home/\w+|work|Users/\w+)/\S*", page.read_text())
    ]
    assert found == []
