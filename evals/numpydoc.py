"""What the Sphinx + numpydoc sets (``scipy/``, ``pandas/``) share: the general index and the summary tables.

Both judge by the docs' own links: ``genindex.html`` links every documented name to the
page that documents it (``reference/generated/scipy.linalg.solve.html#scipy.linalg.solve``),
and each API page's ``autosummary`` tables give a one-line summary per name linked to the
same page ("Solve the equation a x = b for x, assuming a is banded matrix.").
"""

from __future__ import annotations

import re
from pathlib import Path

from beirset import assemble, by_hash, is_redirect, norm, parse, words

_QUALIFIED = re.compile(r"[A-Za-z_]\w*(?:\.\w+)+")


def genindex(docs: Path, prefix: str) -> list[dict]:
    """Every name the general index links under ``prefix``, fully qualified as the anchor spells it."""
    tree = parse(docs / "genindex.html")
    out = []
    for a in tree.xpath('//table[contains(@class, "genindextable")]//a[@href]'):
        page, _, anchor = a.get("href").partition("#")
        if page.startswith(prefix) and _QUALIFIED.fullmatch(anchor):
            out.append({"text": anchor, "kind": "identifier", "pages": [norm(page)]})
    return out


def summaries(docs: Path, pages: list[str]) -> list[dict]:
    """Each autosummary row's summary (four words or more) and the page its name links to;
    a summary that links to more than one page is dropped (it says nothing of either)."""
    found: dict[str, set[str]] = {}
    for name in pages:
        folder = str(Path(name).parent)
        for row in parse(docs / name).xpath('//table[contains(@class, "autosummary")]//tr'):
            cells = row.xpath("./td")
            link = row.find(".//a[@href]")
            if len(cells) < 2 or link is None or "://" in link.get("href"):
                continue
            text = words(cells[-1]).rstrip()
            if len(text.split()) >= 4 and re.search(r"[A-Za-z]{3}", text):
                found.setdefault(text, set()).add(norm(f"{folder}/{link.get('href')}"))
    return [{"text": t, "kind": "concept", "pages": sorted(p)} for t, p in found.items() if len(p) == 1]


def build(docs: Path, out: Path, *, folders: tuple[str, ...], prefix: str, absent: dict[str, str],
          pages: int | None, identifiers: int, concepts: int) -> dict:
    """All pages under ``folders`` (redirect stubs left out), a fixed sample of ``pages`` by path hash."""
    every = sorted({p.relative_to(docs).as_posix() for f in folders for p in (docs / f).rglob("*.html")
                    if not is_redirect(p)})
    chosen = sorted(by_hash(every, pages))
    tables = [p for p in every if "/generated/" not in p and "/api/" not in p]
    entries = genindex(docs, prefix) + summaries(docs, tables)
    return assemble(docs, out, chosen, entries, absent, identifiers=identifiers, concepts=concepts)
