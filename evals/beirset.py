"""What the real-docs eval builders share: stable hashing, the absent-name check, BEIR-layout output.

Each builder (``NAME/make.py``; ``pgdocs/build.py`` and ``pydocs/build.py`` as first
published) takes its relevance from the docs' own index or lists and hands this module the
pages, the judged entries and the candidate absent names (``assemble``); nothing here
looks at LocalKB's output. ``cli`` is the command line every ``make.py`` shares.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path


def stable_hash(text: str) -> int:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest()[:8], 16)


def absent_pattern(name: str) -> re.Pattern:
    """The name, any case, its parts joined by any punctuation or space, not inside a longer word."""
    parts = [re.escape(p) for p in re.split(r"[-_.:/]", name) if p]
    return re.compile(r"(?<![A-Za-z0-9])" + r"[\W_]{0,3}".join(parts) + r"(?![A-Za-z0-9])",
                      re.IGNORECASE)


def truly_absent(candidates: dict[str, str], texts: dict[str, str]) -> dict[str, str]:
    """The candidates no page holds (in any case, parts joined any way); the others dropped loudly."""
    absent = {}
    for name, where in candidates.items():
        pattern = absent_pattern(name)
        found = [p for p, t in texts.items() if pattern.search(t)]
        if found:
            print(f"not absent, dropped: {name} ({where}) is in {', '.join(found[:3])}", file=sys.stderr)
        else:
            absent[name] = where
    return absent


def write_set(out: Path, pages: list[tuple[str, str, str, str]], entries: list[dict],
              absent: dict[str, str]) -> dict:
    """``corpus.jsonl`` (id, title, text, html), ``queries.jsonl`` and ``qrels/{dev,test}.tsv``.

    One query in three (by a hash of its text) goes to dev, the others to test: rules are
    chosen on dev, figures reported on test. Absent names have no judgements.
    """
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for name, title, text, html in pages:
            fh.write(json.dumps({"_id": name, "title": title, "text": text, "html": html},
                                ensure_ascii=False) + "\n")
    splits: dict[str, list[str]] = {"dev": [], "test": []}
    with open(out / "queries.jsonl", "w", encoding="utf-8") as fh:
        for n, e in enumerate(sorted(entries, key=lambda e: (e["kind"], e["text"].lower())), start=1):
            split = "dev" if stable_hash(e["text"]) % 3 == 0 else "test"
            qid = f"{e['kind'][0]}{n}"
            fh.write(json.dumps({"_id": qid, "text": e["text"], "kind": e["kind"], "split": split})
                     + "\n")
            splits[split] += [f"{qid}\t{p}\t1" for p in e["pages"]]
        for n, (name, where) in enumerate(sorted(absent.items()), start=1):
            fh.write(json.dumps({"_id": f"a{n}", "text": name, "kind": "absent", "source": where})
                     + "\n")
    for split, rows in splits.items():
        (out / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(r + "\n" for r in rows), encoding="utf-8")
    return {"pages": len(pages), "queries": len(entries), "absent": len(absent),
            "dev": len({r.split("\t")[0] for r in splits["dev"]}),
            "test": len({r.split("\t")[0] for r in splits["test"]})}


def parse(path: Path):
    """The page as lxml reads it (bytes, so its own charset declaration decides)."""
    import lxml.html

    return lxml.html.fromstring(path.read_bytes())


def plain(tree) -> str:
    """The body's text, white space collapsed (what the absent-name check reads)."""
    body = tree.find("body")
    return re.sub(r"\s+", " ", (body if body is not None else tree).text_content()).strip()


def is_redirect(path: Path) -> bool:
    """A stub that only sends the browser elsewhere (``<meta http-equiv="refresh">``): not a page."""
    if path.stat().st_size > 4096:
        return False
    head = path.read_bytes().lower()
    return b'http-equiv="refresh"' in head or b"<title>redirection</title>" in head


def norm(path: str) -> str:
    """A relative link resolved against the docs' root (``a/b/../c.html`` → ``a/c.html``), anchor dropped."""
    parts: list[str] = []
    for p in path.split("#", maxsplit=1)[0].split("/"):
        if p == "..":
            if parts:
                parts.pop()
        elif p and p != ".":
            parts.append(p)
    return "/".join(parts)


def words(el) -> str:
    return re.sub(r"\s+", " ", el.text_content()).strip()


def by_hash(items, n: int | None) -> list:
    """A fixed sample: the first ``n`` of ``items`` by a hash of their text (all when ``n`` is None)."""
    ordered = sorted(items, key=lambda x: (stable_hash(str(x)), str(x)))
    return ordered if n is None else ordered[:n]


def merge(entries: list[dict]) -> list[dict]:
    """One entry per (text, kind), its pages the union of the pages each copy links to."""
    seen: dict[tuple[str, str], set[str]] = {}
    for e in entries:
        seen.setdefault((e["text"], e["kind"]), set()).update(e["pages"])
    return [{"text": t, "kind": k, "pages": sorted(p)} for (t, k), p in seen.items()]


def assemble(docs: Path, out: Path, pages: list[str], entries: list[dict], absent: dict[str, str], *,
             identifiers: int | None, concepts: int | None, trees: dict | None = None) -> dict:
    """The set from chosen pages (paths under ``docs``) and the docs' own judged entries.

    Entries are merged by text, kept only when every page they link to is in the corpus,
    and sampled by a hash of their text (``identifiers`` and ``concepts`` of each kind);
    absent names are checked against every page of the corpus. ``trees``: pages already
    parsed by the builder.
    """
    trees = dict(trees or {})
    for name in pages:
        if name not in trees:
            trees[name] = parse(docs / name)
    corpus = set(pages)
    kept = [e for e in merge(entries) if e["pages"] and set(e["pages"]) <= corpus]
    chosen = []
    for kind, n in (("identifier", identifiers), ("concept", concepts)):
        of_kind = [e for e in kept if e["kind"] == kind]
        chosen += sorted(of_kind, key=lambda e: (stable_hash(e["text"]), e["text"]))[:n]
    texts = {name: plain(trees[name]) for name in pages}
    rows = [(name, (trees[name].findtext(".//title") or name).strip(), texts[name],
             (docs / name).read_bytes().decode("utf-8", "replace")) for name in pages]
    return write_set(out, rows, chosen, truly_absent(absent, texts))


def cli(doc: str, build, default_docs: Path, marker: str, package: str, *, pages: int | None,
        identifiers: int | None, concepts: int | None) -> None:
    """The command line every ``make.py`` shares:
    ``OUT [--docs DIR] [--pages N] [--identifiers N] [--concepts N]``."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n", maxsplit=1)[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=Path, default=default_docs)
    ap.add_argument("--pages", type=int, default=pages,
                    help="a fixed sample of this many pages, by a hash of their paths (0: all)")
    for kind, n in (("identifiers", identifiers), ("concepts", concepts)):
        ap.add_argument(f"--{kind}", type=int, default=n, help="a fixed sample (default: %(default)s)")
    args = ap.parse_args()
    if not (args.docs / marker).exists():
        sys.exit(f"no documentation at {args.docs} (Debian: apt-get install {package})")
    print(json.dumps(build(args.docs, args.out, pages=args.pages or None, identifiers=args.identifiers,
                           concepts=args.concepts)))
