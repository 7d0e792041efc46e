"""Checks the relative links of README.md and docs/*.md.

Every link that is not a URL must name a file or folder of the checkout,
and a link with a #fragment into a Markdown file must name one of its
headings, as GitHub makes anchors of them. Links inside code (fenced
blocks, `code spans`) are not links and are skipped.

    python3 docs/check_links.py        # from anywhere; exit 1 naming each bad link
    bazel test //docs:links_test       # the same, in `bazel test //...`

Under Bazel the checkout is found through this file's runfile, a symlink
into it (as tools/node/node_test.sh finds node_modules): links may name any
file of the checkout, which Bazel does not know as inputs, so the test is
tagged "external" and runs every time.
"""

import os
import re
import sys

# Pages written on other branches that links may name before they land.
# A page listed here is checked like any other once it exists.
EXPECTED_PAGES = {"docs/glossary.md"}

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^[ \t]{0,3}\[[^\]]+\]:[ \t]+<?(\S+?)>?(?:[ \t].*)?$", re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose(text):
    """The text outside fenced code blocks, line for line (fences blanked)."""
    lines, fenced = [], None
    for line in text.split("\n"):
        match = _FENCE.match(line)
        if fenced:
            if match and match.group(1) == fenced:
                fenced = None
            lines.append("")
        elif match:
            fenced = match.group(1)
            lines.append("")
        else:
            lines.append(line)
    return "\n".join(lines)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, each
    space a hyphen (github-slugger)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return "".join("-" if c == " " else c for c in text
                   if c.isalnum() or c in " -_")


def anchors(path):
    """The anchors of a Markdown file's headings, repeats numbered."""
    with open(path, encoding="utf-8") as f:
        text = prose(f.read())
    seen, result = {}, set()
    for line in text.split("\n"):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else "%s-%d" % (base, n))
    return result


def links(path):
    """(line number, target) of every link of a Markdown file."""
    with open(path, encoding="utf-8") as f:
        text = prose(f.read())
    # Blank code spans (which may span lines) but keep the line breaks.
    text = _CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    found = []
    for regex in (_LINK, _REF_DEF):
        for match in regex.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((line, match.group(1)))
    return sorted(found)


def check(root):
    """Messages naming each bad link under `root`, a checkout."""
    pages = ["README.md"] + sorted(
        os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs"))
        if f.endswith(".md"))
    problems, cache = [], {}
    for page in pages:
        for line, target in links(os.path.join(root, page)):
            if not target or _SCHEME.match(target):
                continue  # a URL, or mailto:
            where = "%s:%d: %s" % (page, line, target)
            path, _, fragment = target.partition("#")
            rel = os.path.normpath(
                os.path.join(os.path.dirname(page), path) if path else page)
            if rel.startswith(".." + os.sep) or rel == ".." or os.path.isabs(path):
                problems.append(where + ": outside the checkout")
                continue
            full = os.path.join(root, rel)
            if not os.path.exists(full):
                if rel not in EXPECTED_PAGES:
                    problems.append(where + ": no such file")
                continue
            if not fragment:
                continue
            if not rel.endswith(".md"):
                problems.append(where + ": a #fragment into a file that is not Markdown")
                continue
            if rel not in cache:
                cache[rel] = anchors(full)
            if fragment not in cache[rel]:
                problems.append(where + ": %s has no heading with anchor #%s" %
                                (rel, fragment))
    return pages, problems


def main():
    here = os.path.dirname(os.path.realpath(__file__))
    root = os.path.dirname(here)
    if not os.path.isfile(os.path.join(root, "WORKSPACE")):
        sys.exit("FAIL: %s is not a syncnorm checkout" % root)
    pages, problems = check(root)
    for problem in problems:
        print(problem)
    if problems:
        print("FAIL: %d bad link(s)" % len(problems))
        sys.exit(1)
    print("links: every relative link of %d pages resolves" % len(pages))


if __name__ == "__main__":
    main()
