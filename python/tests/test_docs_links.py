"""Every relative link of the documentation resolves: README.md, python/README.md,
bench/README.md and docs/*.md name files that exist and, where a link names a heading
(``file.md#heading``), a heading that file has (GitHub's anchor rule: lower case, spaces to
hyphens, punctuation dropped). The standard library only."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#+)\s+(.*)")


def anchors(path: Path) -> set[str]:
    found = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else HEADING.match(line)
        if m:
            text = m.group(2).strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
        found.update(re.findall(r'<a (?:name|id)="([^"]+)"', line))
    return found


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "python" / "README.md", ROOT / "bench" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]


def broken_links() -> list[str]:
    broken = []
    for doc in documents():
        for link in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"^[a-z]+:", link):
                continue  # http:, https:, mailto:
            path, _, anchor = link.partition("#")
            target = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(ROOT)}: {link}"
            if not target.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{where} (no such heading)")
    return broken


def test_the_documents_are_found():
    assert len(documents()) >= 10, documents()


def test_every_relative_link_resolves():
    broken = broken_links()
    assert not broken, "broken links:\n  " + "\n  ".join(broken)
