"""What the real-docs eval builders share: stable hashing, the absent-name check, BEIR-layout output.

Each builder (``pgdocs/build.py``, ``pydocs/build.py``) takes its relevance from the
manual's own index and hands this module the pages, the judged entries and the candidate
absent names; nothing here looks at LocalKB's output.
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
