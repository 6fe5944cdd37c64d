"""The docs: every relative link and image resolves (files and #anchors), the README stays
short, and no doc refers to things a reader of the repository does not have (tracker
issue numbers, design notes kept elsewhere)."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md",
             ROOT / "kernels" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [path for path in files if path.exists()]


# [text](target) and ![alt](target), with an optional "title"; the text may hold one level
# of brackets (a badge, an image inside a link).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code blanked out."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, INLINE_CODE.sub("``", line)))
    return lines


def links(path: Path) -> list[tuple[int, str]]:
    return [(number, match.group(1)) for number, line in prose_lines(path.read_text())
            for match in LINK.finditer(line)]


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith("//")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed,
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = text.replace("`", "").replace("*", "")  # code and emphasis marks (underscores stay)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def heading_anchors(path: Path) -> set[str]:
    """Anchors of a file's headings, inline code kept as its text."""
    found, seen, fenced = set(), {}, False
    for line in path.read_text().splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def dead_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if not is_relative(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where} (no such file)")
            continue
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{where} (outside the repository)")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
            problems.append(f"{where} (no heading with that anchor)")
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert dead_links(path) == []


def test_the_docs_are_checked():
    names = {str(p.relative_to(ROOT)) for p in doc_files()}
    assert {"README.md", "CONTRIBUTING.md", "benchmarks/README.md", "kernels/README.md",
            "docs/index.md"} <= names
    assert any(name.startswith("docs/guide/") for name in names)
    assert any(name.startswith("docs/architecture/") for name in names)


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/")


# References a reader of the repository cannot follow: "issue 17", "issues #20", "DESIGN.md",
# "DESIGN's workload" (the word "design" in lower case is fine).
OUTSIDE_REFERENCE = re.compile(r"\b(?i:issues?)\s+#?\d{1,2}\b|\b(?i:design\.md)\b|\bDESIGN\b")


def outside_references(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}"
            for number, line in enumerate(path.read_text().splitlines(), 1)
            for match in OUTSIDE_REFERENCE.finditer(line)]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_references_outside_the_repository(path):
    assert outside_references(path) == []


def test_the_checks_can_fail(tmp_path, monkeypatch):
    """Each check on a doc made to fail it."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# A heading: with `code`\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("See [there](there.md#a-heading-with-code) and ![img](pic.svg),\n"
                    "[gone](missing.md), [bad anchor](there.md#nope), [web](https://example.com),\n"
                    "```\n[in code](nowhere.md)\n```\n"
                    "As issue 17 said, and DESIGN.md; the design is fine.\n")
    assert dead_links(page) == [
        "docs/page.md:1: pic.svg (no such file)",
        "docs/page.md:2: missing.md (no such file)",
        "docs/page.md:2: there.md#nope (no heading with that anchor)",
    ]
    assert outside_references(page) == ["docs/page.md:6: 'issue 17'", "docs/page.md:6: 'DESIGN.md'"]
