"""Every relative link of the README, the changelog and docs/*.md resolves: the file exists
and, for a ``#fragment`` into a Markdown page, a heading (GitHub's slug) or an explicit
``<a id>`` of that page has that name. Code blocks are skipped."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text()
    out, seen = set(), {}
    for m in re.finditer(r"^#{1,6}\s+(.*)$", re.sub(r"```.*?```", "", text, flags=re.S),
                         re.M):
        s = _slug(m.group(1))
        out.add(f"{s}-{seen[s]}" if s in seen else s)
        seen[s] = seen.get(s, 0) + 1
    return out | set(re.findall(r'<a id="([^"]+)"', text))


def broken_links(page: Path) -> list[str]:
    bad = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):
            continue  # http:, https:, mailto:
        path, _, frag = link.partition("#")
        target = (page.parent / path) if path else page
        if not target.exists():
            bad.append(f"{link}: no such file")
        elif frag and target.suffix == ".md" and frag not in _anchors(target):
            bad.append(f"{link}: no such anchor")
    return bad


def test_relative_links_resolve():
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    bad = [f"{p.relative_to(ROOT)}: {b}" for p in pages for b in broken_links(p)]
    assert not bad, "\n".join(bad)


def test_a_broken_link_is_caught(tmp_path):
    (tmp_path / "a.md").write_text("# Title here\n\n[ok](#title-here) [gone](b.md) "
                                   "[no anchor](a.md#nothing) [web](https://example.org)\n")
    assert broken_links(tmp_path / "a.md") == ["b.md: no such file",
                                               "a.md#nothing: no such anchor"]
