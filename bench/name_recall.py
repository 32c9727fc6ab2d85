"""Extraction name recall: of the names a documentation set's own index attributes to a page,
the share found in at least one passage of that page (the product's extract, then chunk).

Only names in the page's visible text count (an index term the page never writes, such as
a concept phrase, is left out and counted). A name counts as found when a passage body (the
title line left out) holds it as a whole word, case-insensitively, once Markdown marks are
ignored; what is measured is text kept, not ranking. Pairs come from each set's own index:

  python   Python 3.11 (python3.11-doc): ``genindex-all.html``, an entry's name on the page
           its link points to
  pandas   pandas (python-pandas-doc): ``genindex.html``, alike
  scipy    SciPy (python-scipy-doc): ``genindex.html``, alike
  pg       PostgreSQL 15 (postgresql-doc-15): ``bookindex.html``, a term on each page it links
  sqlite   SQLite (sqlite3-doc): ``keyword_index.html``, a keyword on the page it links
  rust     Rust's std (rust-doc): ``std/all.html``, each item's name on its module's page
           (``std/fmt/index.html`` lists ``Arguments``)
  git      git (git-doc): each ``git-*.html`` manual page's option terms (its OPTIONS list)

  bench/name_recall.py python pg sqlite [--pages 150] [--worst 8] [--seed 0]

Pages are sampled (``--pages`` per set, fixed seed); every pair of a sampled page counts.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_record_flag, recorded

DOC = Path("/usr/share/doc")
_MARKS = re.compile(r"[`*\\]")
_QUALIFIER = re.compile(r"\s*\(.*\)\s*$")


def _tree(path: Path):
    import lxml.html

    return lxml.html.fromstring(path.read_bytes())


def _text(el) -> str:
    return " ".join("".join(el.itertext()).split())


def _entry_name(text: str) -> str:
    name = _QUALIFIER.sub("", text).strip()
    return name[:-2] if name.endswith("()") else name


def _li_name(li) -> str:
    """An index entry's name: its text, or its first link's (``[1]``, ``[2]`` are more links)."""
    own = " ".join((li.text or "").split()).rstrip(",")
    if not own:
        first = next((c for c in li if c.tag == "a"), None)
        own = _text(first) if first is not None else ""
    return own


def sphinx_pairs(root: Path, index: str) -> set[tuple[Path, str]]:
    """(page, name) from a Sphinx general index; a sub-entry's pages count for its parent
    entry's name (``done()`` > ``(asyncio.Task method)``, ``PATH`` > ``environment variable``)."""
    pairs = set()
    for li in _tree(root / index).xpath("//table[contains(@class, 'indextable')]//li"):
        parent = li.getparent().getparent()
        owner = parent if parent is not None and parent.tag == "li" else li
        name = _entry_name(_li_name(owner))
        for a in li.xpath("./a[@href]"):
            href = a.get("href").split("#")[0]
            if name and href.endswith(".html") and "genindex" not in href:
                pairs.add((root / href, name))
    return pairs


def pg_pairs(root: Path) -> set[tuple[Path, str]]:
    """(page, term) from the PostgreSQL manual's book index; a sub-entry counts for its term."""
    pairs = set()
    tree = _tree(root / "bookindex.html")
    for dt in tree.xpath("//div[contains(@class, 'index')]//dt[not(ancestor::dd)]"):
        term = " ".join((dt.text or "").split()).rstrip(",").strip()
        if not term:
            continue
        links = dt.xpath(".//a[@class='indexterm']")
        dd = dt.getnext()
        if dd is not None and dd.tag == "dd":
            links += dd.xpath(".//a[@class='indexterm']")
        for a in links:
            href = a.get("href").split("#")[0]
            if href:
                pairs.add((root / href, _entry_name(term)))
    return pairs


def sqlite_pairs(root: Path) -> set[tuple[Path, str]]:
    pairs = set()
    for a in _tree(root / "keyword_index.html").xpath("//li/a[@href]"):
        href = a.get("href").split("#")[0]
        name = _text(a)
        if href.endswith(".html") and name:
            pairs.add((root / href, name))
    return pairs


def rust_pairs(root: Path) -> set[tuple[Path, str]]:
    """(module page, item name) for every item ``all.html`` lists."""
    pairs = set()
    crate = root / "std"
    for a in _tree(crate / "all.html").xpath("//ul[contains(@class, 'docblock')]/li/a[@href]"):
        parts = a.get("href").split("/")
        module = crate.joinpath(*parts[:-1], "index.html")
        if module.exists():
            pairs.add((module, _text(a).rsplit("::", 1)[-1]))
    return pairs


def git_pairs(root: Path) -> set[tuple[Path, str]]:
    """(manual page, option) for each option term of each ``git-*.html`` page's OPTIONS list."""
    pairs = set()
    for page in sorted(root.glob("git-*.html")):
        tree = _tree(page)
        for h2 in tree.xpath("//h2[normalize-space()='OPTIONS']"):
            body = h2.getnext()
            for dt in body.xpath(".//dt") if body is not None else []:
                for option in re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", _text(dt)):
                    pairs.add((page, option))
    return pairs


SETS = {
    "python": lambda: sphinx_pairs(DOC / "python3.11-doc/html", "genindex-all.html"),
    "pandas": lambda: sphinx_pairs(DOC / "python-pandas-doc/html", "genindex.html"),
    "scipy": lambda: sphinx_pairs(DOC / "python-scipy-doc/html", "genindex.html"),
    "pg": lambda: pg_pairs(DOC / "postgresql-doc-15/html"),
    "sqlite": lambda: sqlite_pairs(DOC / "sqlite3"),
    "rust": lambda: rust_pairs(DOC / "rust-doc/html"),
    "git": lambda: git_pairs(DOC / "git-doc"),
}


def passages(path: Path, count) -> list[str]:
    """The passage bodies the product stores for one page."""
    from localkb.config import Settings
    from localkb.ingest.chunk import chunk_document
    from localkb.ingest.extract import extract_bytes

    fields = Settings.__dataclass_fields__
    doc = extract_bytes(path.read_bytes(), name=path.name)
    chunks = chunk_document(doc, count, max_tokens=fields["max_chunk_tokens"].default,
                            overlap=fields["chunk_overlap_tokens"].default)
    return [" ".join(_MARKS.sub("", c.text).split()) for c in chunks]


def _pattern(name: str) -> re.Pattern:
    words = " ".join(_MARKS.sub("", name).split())
    return re.compile(r"(?<!\w)" + re.escape(words) + r"(?!\w)", re.IGNORECASE)


def on_page(path: Path) -> str:
    """The page's whole visible text (scripts and styles left out), as one line."""
    tree = _tree(path)
    for el in tree.xpath("//script|//style|//noscript|//template|//head"):
        el.drop_tree()
    return " ".join(_MARKS.sub("", tree.text_content()).split())


def found(name: str, texts: list[str]) -> bool:
    pattern = _pattern(name)
    return any(pattern.search(t) for t in texts)


def measure(name: str, pages: int, seed: int, worst: int, count) -> tuple[int, int]:
    by_page: dict[Path, set[str]] = defaultdict(set)
    for page, entry in SETS[name]():
        if page.exists():
            by_page[page].add(entry)
    chosen = sorted(by_page)
    if pages and len(chosen) > pages:
        chosen = sorted(random.Random(seed).sample(chosen, pages))
    hits = total = off_page = 0
    misses: list[tuple[int, int, Path, list[str]]] = []
    started = time.perf_counter()
    for page in chosen:
        try:
            texts = passages(page, count)
        except Exception as err:  # a page the product refuses: every name of it is missed
            print(f"  {page}: {err}", file=sys.stderr)
            texts = []
        shown = on_page(page)
        names = sorted(n for n in by_page[page] if _pattern(n).search(shown))
        off_page += len(by_page[page]) - len(names)
        lost = [n for n in names if not found(n, texts)]
        hits += len(names) - len(lost)
        total += len(names)
        if lost:
            misses.append((len(lost), len(names), page, lost))
    recall = hits / total if total else 0.0
    print(f"{name}: name recall {recall:.4f} ({hits} of {total} names, {len(chosen)} pages, "
          f"{len(by_page)} in the index; {off_page} names not in their page's text left out; "
          f"{time.perf_counter() - started:.0f} s)")
    for lost, of, page, names in sorted(misses, key=lambda m: (-m[0], str(m[2])))[:worst]:
        shown = ", ".join(names[:6]) + (", …" if len(names) > 6 else "")
        print(f"  {lost}/{of} missed  {page.relative_to(DOC)}: {shown}")
    return hits, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="+", choices=sorted(SETS))
    parser.add_argument("--pages", type=int, default=150, help="pages sampled per set (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worst", type=int, default=8, help="pages with most misses to list")
    add_record_flag(parser)
    args = parser.parse_args()
    with recorded(args.record):
        from localkb.embedding.embedder import MiniLMEmbedder

        count = MiniLMEmbedder().count_tokens
        for name in args.sets:
            measure(name, args.pages, args.seed, args.worst, count)


if __name__ == "__main__":
    main()
