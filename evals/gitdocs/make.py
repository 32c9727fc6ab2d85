"""Build a BEIR-layout eval set from Git's manual pages (AsciiDoc), judged by the pages' own lists.

    python evals/gitdocs/make.py OUT [--docs DIR] [--pages N] [--identifiers N] [--concepts N]

The pages are Git 2.39's HTML manual pages, guides and how-tos as AsciiDoc renders them,
a user's saved copy (221; ``index.html`` left out), a fixed sample of ``--pages`` by a
hash of their paths. Relevance comes from the pages, never from LocalKB:

- ``identifier``: each command of ``git.html``'s command list (``git-cherry-pick``),
  relevant: the page it links to; each option a ``git-*.html`` page lists in its own
  option list, asked with its command (``git rebase --keep-base``), relevant: that page;
  each configuration variable the pages list (``rebase.autoSquash``), relevant: every
  page whose list holds it;
- ``concept``: the one-line purpose ``git.html`` gives each command and guide ("Apply the
  changes introduced by some existing commits"), relevant: the page it links to;
- ``absent``: later Git releases' options and commands, other tools' names and typos of
  real names, checked against every page of the corpus and dropped, loudly, if found.

The docs are Debian's ``git-doc`` (``/usr/share/doc/git-doc``), under the GPL-2 (``copyright``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from beirset import assemble, by_hash, cli, is_redirect, norm, parse, words

DOCS = Path("/usr/share/doc/git-doc")
PAGES = 120
IDENTIFIERS = 300
CONCEPTS = 150
_OPTION = re.compile(r"--[a-z][a-z0-9-]+")
_CONFIG = re.compile(r"[a-z][a-zA-Z0-9]*(?:\.[a-zA-Z][a-zA-Z0-9]*)+")

#: Names not in Git 2.39's manual, with where they come from.
ABSENT = {
    "git-replay": "Git 2.44 command",
    "git-last-modified": "Git 2.51 command",
    "git-refs": "Git 2.46 command",
    "git-backfill": "Git 2.49 command",
    "git log --exclude-first-parent-only": "Git 2.40 option",
    "git merge-tree --merge-base": "Git 2.40 option",
    "git repack --max-cruft-size": "Git 2.41 option",
    "git clone --ref-format": "Git 2.45 option",
    "transfer.bundleURI": "Git 2.42 setting",
    "core.maxTreeDepth": "Git 2.42 setting",
    "hg bookmark": "Mercurial",
    "svn propset": "Subversion",
    "p4 sync": "Perforce",
    "gh pr checkout": "GitHub CLI",
    "git-cherry-pik": "typo of git-cherry-pick",
    "git rebase --autosqash": "typo of git rebase --autosquash",
    "git stash --keep-indx": "typo of git stash --keep-index",
    "core.autocrfl": "typo of core.autocrlf",
    "git log --first-parnt": "typo of git log --first-parent",
    "push.autoSetupRemot": "typo of push.autoSetupRemote",
    "git bisect --term-od": "typo of git bisect --term-old",
    "git-worktre": "typo of git-worktree",
}


def command_list(docs: Path) -> list[dict]:
    """``git.html``'s list: each command or guide (identifier) and its one-line purpose (concept)."""
    out = []
    for dt in parse(docs / "git.html").xpath('//dt[@class="hdlist1"][a[@href]]'):
        a = dt.find("a")
        dd = dt.getnext()
        page = norm(a.get("href"))
        name = re.sub(r"\(\d\)$", "", words(a))
        if "://" in a.get("href") or not name:
            continue
        if re.fullmatch(r"git-[a-z0-9-]+", name):
            out.append({"text": name, "kind": "identifier", "pages": [page]})
        purpose = words(dd) if dd is not None and dd.tag == "dd" else ""
        if len(purpose.split()) >= 3:
            out.append({"text": purpose.rstrip("."), "kind": "concept", "pages": [page]})
    return out


def listed_names(name: str, tree) -> list[dict]:
    """A page's own option and configuration lists: ``git CMD --option`` on a command's page,
    configuration variables on any page."""
    command = re.fullmatch(r"git-([a-z0-9-]+)\.html", name)
    out = []
    for dt in tree.xpath('//dt[@class="hdlist1"]'):
        term = words(dt)
        for part in term.split(", "):
            opt = _OPTION.match(part)
            if command and opt:
                out.append({"text": f"git {command.group(1)} {opt.group(0)}", "kind": "identifier",
                            "pages": [name]})
        if _CONFIG.fullmatch(term):
            out.append({"text": term, "kind": "identifier", "pages": [name]})
    return out


def build(docs: Path, out: Path, *, pages: int | None, identifiers: int, concepts: int) -> dict:
    every = sorted(p.relative_to(docs).as_posix() for pattern in ("*.html", "howto/*.html")
                   for p in docs.glob(pattern) if p.name != "index.html" and not is_redirect(p))
    chosen = sorted(by_hash(every, pages))
    trees = {name: parse(docs / name) for name in chosen}
    entries = command_list(docs)
    for name, tree in trees.items():
        entries += listed_names(name, tree)
    return assemble(docs, out, chosen, entries, ABSENT, identifiers=identifiers, concepts=concepts,
                    trees=trees)


if __name__ == "__main__":
    cli(__doc__, build, DOCS, "git.html", "git-doc", pages=PAGES, identifiers=IDENTIFIERS,
        concepts=CONCEPTS)
