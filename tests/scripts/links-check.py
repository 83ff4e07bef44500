#!/usr/bin/env python3
"""Every link of the repository's Markdown files resolves inside the repository.

A link's target must be a file or folder of the repository (never outside it), and a `#part`
must name a heading of the Markdown file it points to (GitHub's anchors: lower case, spaces to
dashes, punctuation dropped). Links to the web (http, https, mailto) are not followed: the check
runs offline. Code blocks and inline code are skipped. Exits 1 listing every broken link.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def markdown_files():
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()
    return [ROOT / name for name in listed if "node_modules/" not in name and (ROOT / name).is_file()]


def prose(text):
    """The text without fenced code blocks and inline code spans."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path, cache={}):
    if path not in cache:
        seen = {}
        found = set()
        for line in prose(path.read_text(encoding="utf-8")).splitlines():
            heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not heading:
                continue
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        # Inline code in a heading keeps its text in the anchor: read the headings raw too.
        fenced = r"^(```|~~~).*?^\1[^\n]*$"
        text = re.sub(fenced, "", path.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
        for line in text.splitlines():
            heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if heading:
                found.add(re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-"))
        cache[path] = found
    return cache[path]


def broken_links(path):
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if EXTERNAL.match(target):
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if ROOT not in resolved.parents and resolved != ROOT:
            yield target, "points outside the repository"
        elif not resolved.exists():
            yield target, "no such file"
        elif fragment and resolved.suffix == ".md" and fragment.lower() not in anchors(resolved):
            yield target, f"no heading #{fragment} in {resolved.relative_to(ROOT)}"


def main():
    files = markdown_files()
    broken = [(path, target, why) for path in files for target, why in broken_links(path)]
    for path, target, why in broken:
        print(f"{path.relative_to(ROOT)}: ({target}): {why}", file=sys.stderr)
    if broken:
        print(f"links: {len(broken)} broken in {len(files)} Markdown files", file=sys.stderr)
        return 1
    print(f"links: every link of {len(files)} Markdown files resolves inside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main())
