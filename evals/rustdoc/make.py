"""Build a BEIR-layout eval set from Rust's standard library docs (rustdoc), judged by rustdoc's own lists.

    python evals/rustdoc/make.py OUT [--docs DIR] [--pages N] [--identifiers N] [--concepts N]

The pages are rustdoc's HTML for ``std`` as a user would save them (redirect stubs and
the ``all.html`` list left out), a fixed sample of ``--pages`` by a hash of their paths.
Relevance comes from rustdoc, never from LocalKB:

- ``identifier``: every item of ``std/all.html`` ("List of all items"), asked by its path
  (``std::collections::BTreeMap``), relevant: the page that list links it to; and every
  method a page documents in its own implementation or trait method list
  (``id="method.retain"`` on ``struct.Vec.html``), asked as ``Vec::retain``, relevant: the
  pages that document a method of that name on a type of that name;
- ``concept``: the one-line summaries of module pages ("An ordered map based on a
  B-Tree."), relevant: the page each links to (a summary linking to two pages is dropped);
- ``absent``: later Rust releases' APIs, other crates' names and typos of real names,
  checked against every page of the corpus and dropped, loudly, if found.

The docs are Debian's ``rust-doc`` (``/usr/share/doc/rust-doc/html``, Rust 1.63), under
the MIT and Apache-2.0 licences (``COPYRIGHT.txt`` in it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from beirset import assemble, by_hash, cli, is_redirect, norm, parse, words

DOCS = Path("/usr/share/doc/rust-doc/html")
PAGES = 400
IDENTIFIERS = 300
CONCEPTS = 150
_KIND = re.compile(r"(struct|enum|trait|primitive|union)\.(\w+)\.html")

#: Names not in Rust 1.63's standard library docs, with where they come from.
ABSENT = {
    "std::sync::LazyLock": "Rust 1.80",
    "std::io::IsTerminal": "Rust 1.70",
    "Option::is_none_or": "Rust 1.82",
    "Option::take_if": "Rust 1.80",
    "Vec::extract_if": "Rust 1.87",
    "slice::chunk_by": "Rust 1.77",
    "std::iter::repeat_n": "Rust 1.82",
    "std::hint::assert_unchecked": "Rust 1.81",
    "std::mem::offset_of": "Rust 1.77",
    "Result::inspect_err": "Rust 1.76",
    "std::array::repeat": "Rust 1.91",
    "tokio::spawn": "tokio",
    "serde::Deserialize": "serde",
    "rayon::join": "rayon",
    "anyhow::Context": "anyhow",
    "regex::Regex": "regex",
    "numpy.einsum": "NumPy",
    "std::colections::HashMap": "typo of std::collections::HashMap",
    "Vec::retian": "typo of Vec::retain",
    "Option::unwarp_or": "typo of Option::unwrap_or",
    "String::from_utf9": "typo of String::from_utf8",
    "BTreeMap::fisrt_key_value": "typo of BTreeMap::first_key_value",
    "Iterator::flat_mpa": "typo of Iterator::flat_map",
    "thread::spwan": "typo of thread::spawn",
    "HashMap::entri": "typo of HashMap::entry",
}


def listed_items(docs: Path) -> list[dict]:
    """Every item of ``std/all.html``, by path, and the page it links to."""
    tree = parse(docs / "std" / "all.html")
    return [{"text": "std::" + words(a), "kind": "identifier", "pages": ["std/" + a.get("href")]}
            for a in tree.xpath('//section[@id="main-content"]//ul/li/a[@href]')]


def summaries(docs: Path) -> list[dict]:
    """Each module page's one-line item summaries and the page each links to."""
    out = []
    for index in sorted((docs / "std").rglob("index.html")):
        folder = index.parent.relative_to(docs).as_posix()
        tree = parse(index)
        for right in tree.xpath('//div[contains(@class, "item-right")][contains(@class, "docblock-short")]'):
            left = right.getprevious()
            link = left.find(".//a[@href]") if left is not None else None
            text = words(right)
            if link is None or len(text.split()) < 4 or "://" in link.get("href"):
                continue
            target = (Path(folder) / link.get("href")).as_posix()
            out.append({"text": text, "kind": "concept", "pages": [norm(target)]})
    return out



def methods(name: str, tree) -> list[dict]:
    """The methods a type or trait page documents itself (not those reached through Deref or traits)."""
    m = _KIND.fullmatch(name.rsplit("/", 1)[-1])
    if m is None:
        return []
    found = tree.xpath('//div[@id="implementations-list"]//section[starts-with(@id, "method.")]/@id'
                       ' | //div[contains(@class, "methods")]/section'
                       '[starts-with(@id, "method.") or starts-with(@id, "tymethod.")]/@id')
    names = {i.split(".", 1)[1] for i in found if re.fullmatch(r"(ty)?method\.\w+", i)}
    return [{"text": f"{m.group(2)}::{n}", "kind": "identifier", "pages": [name]} for n in sorted(names)]


def build(docs: Path, out: Path, *, pages: int | None, identifiers: int, concepts: int) -> dict:
    every = sorted(p.relative_to(docs).as_posix() for p in (docs / "std").rglob("*.html")
                   if p.name != "all.html" and not is_redirect(p))
    chosen = sorted(by_hash(every, pages))
    trees = {name: parse(docs / name) for name in chosen}
    entries = listed_items(docs) + summaries(docs)
    concept_pages: dict[str, set[str]] = {}
    for e in entries:
        if e["kind"] == "concept":
            concept_pages.setdefault(e["text"], set()).update(e["pages"])
    entries = [e for e in entries if e["kind"] != "concept" or len(concept_pages[e["text"]]) == 1]
    for name, tree in trees.items():
        entries += methods(name, tree)
    return assemble(docs, out, chosen, entries, ABSENT, identifiers=identifiers, concepts=concepts,
                    trees=trees)


if __name__ == "__main__":
    cli(__doc__, build, DOCS, "std/all.html", "rust-doc", pages=PAGES, identifiers=IDENTIFIERS,
        concepts=CONCEPTS)
