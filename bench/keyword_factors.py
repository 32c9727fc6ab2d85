"""Why the keyword leg scores what it does on prose: plain BM25 rebuilt factor by factor.

    python bench/keyword_factors.py SET --index-dir DIR [--split train]

SET is a BEIR-layout set (BEIR SciFact: ``../shared/datasets/beir-scifact``) and DIR an
index ``localkb eval SET --index-dir DIR`` built (read only: the catalogue's passages).
Every variant is BM25 (k1 1.2, b 0.75, Lucene's idf, the keyword engines' formula) written
here in numpy, so that one factor changes at a time between the product's keyword leg and
the eval's baseline (whole pages, ``\\w+`` tokens):

- the unit scored: whole pages, or the product's passages (a page ranked by its best one);
- the analysis: ``\\w+`` lower-cased tokens, or ``store.analysis`` (stems, stopwords,
  code-like tokens whole with their parts);
- the query: ``plan_query``'s terms (whole, at most 12), without the cap, and with the parts
  of a code-like term asked too (always, or only where no passage holds the term whole — the
  rule ``retrieval.search`` applies).

Choose on a split that does not report (``--split train`` for SciFact). Prints nDCG@10 per
variant, with a bootstrap interval.
"""

from __future__ import annotations

import argparse
import math
import re
import sqlite3
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "host"))

from localkb.ingest.chunk import passage_text  # noqa: E402
from localkb.retrieval.evaluate import bootstrap_ci, load_beir, metrics  # noqa: E402
from localkb.store.analysis import (  # noqa: E402
    TOKEN,
    _parts,
    analyze,
    normalize,
    plan_query,
    stopwords,
    token_terms,
)

WORD = re.compile(r"\w+")


class BM25:
    def __init__(self, texts: list[str], tokens) -> None:
        self.tfs = [Counter(tokens(t)) for t in texts]
        self.lens = np.array([sum(c.values()) for c in self.tfs], float)
        self.post: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        acc: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, c in enumerate(self.tfs):
            for t, n in c.items():
                acc[t].append((i, n))
        for t, p in acc.items():
            self.post[t] = (np.array([i for i, _ in p]), np.array([n for _, n in p], float))

    def scores(self, terms, k1: float = 1.2, b: float = 0.75) -> np.ndarray:
        n, avg = len(self.lens), self.lens.mean()
        s = np.zeros(n)
        for t in set(terms):
            if t not in self.post:
                continue
            ids, tf = self.post[t]
            idf = math.log(1 + (n - len(ids) + 0.5) / (len(ids) + 0.5))
            s[ids] += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * self.lens[ids] / avg))
        return s

    def holds(self, term: str) -> bool:
        return term in self.post


def query_terms(query: str, *, cap: bool = True, parts: str = "none", index: BM25 | None = None):
    plan = plan_query(query)
    if cap:
        terms = list(plan.terms)
    else:
        terms = list(dict.fromkeys(n for raw in TOKEN.findall(query)
                                   if (n := normalize(raw.strip("'’")))))
    if parts == "none":
        return terms
    out = list(terms)
    for raw in TOKEN.findall(query):
        token = raw.strip("'’")
        whole = normalize(token)
        if not whole or whole not in terms or len(token_terms(token)[0]) <= 1:
            continue
        if parts == "absent" and index is not None and index.holds(whole):
            continue
        out += [p for p in _parts(token) if p not in stopwords()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set", type=Path)
    ap.add_argument("--index-dir", type=Path, required=True)
    ap.add_argument("--split", default="train")
    args = ap.parse_args()
    corpus, queries, qrels = load_beir(args.set, args.split)
    db = sqlite3.connect(f"file:{args.index_dir / 'catalog.sqlite'}?mode=ro", uri=True)
    doc_of = {sid: key.removeprefix("doc:") for sid, key in db.execute("SELECT id, key FROM sources")}
    passages = [(doc_of[s], passage_text(t, x)) for s, t, x in db.execute(
        "SELECT c.source_id, s.title, c.text FROM chunks c JOIN sources s ON s.id = c.source_id "
        "ORDER BY c.source_id, c.idx")]
    doc_ids = list(corpus)
    pages = [(corpus[d].get("title") or "") + "\n" + (corpus[d].get("text") or "") for d in doc_ids]
    pdoc = [d for d, _ in passages]
    print(f"{args.set} ({args.split}): {len(doc_ids)} pages, {len(passages)} passages "
          f"(median {np.median([len(t.split()) for _, t in passages]):.0f} words), "
          f"{len(queries)} queries")
    ours = lambda text: [t for t, _ in analyze(text)]  # noqa: E731
    plain = lambda text: WORD.findall(text.lower())  # noqa: E731
    page_w, page_a = BM25(pages, plain), BM25(pages, ours)
    pass_w, pass_a = BM25([t for _, t in passages], plain), BM25([t for _, t in passages], ours)

    def by_page(index: BM25, qt):
        def rank(q: str) -> list[str]:
            s = index.scores(qt(q))
            return [doc_ids[i] for i in np.argsort(-s)[:10] if s[i] > 0]
        return rank

    def by_passage(index: BM25, qt):
        def rank(q: str) -> list[str]:
            s = index.scores(qt(q))
            out: list[str] = []
            for i in np.argsort(-s):
                if s[i] <= 0 or len(out) == 10:
                    break
                if pdoc[i] not in out:
                    out.append(pdoc[i])
            return out
        return rank

    variants = [
        ("whole pages, \\w+ (the baseline's analysis)", by_page(page_w, plain)),
        ("whole pages, ours, plan terms", by_page(page_a, query_terms)),
        ("whole pages, ours, no 12-term cap", by_page(page_a, lambda q: query_terms(q, cap=False))),
        ("whole pages, ours, + parts always", by_page(page_a, lambda q: query_terms(q, parts="all"))),
        ("passages, \\w+", by_passage(pass_w, plain)),
        ("passages, ours, plan terms (the leg before)", by_passage(pass_a, query_terms)),
        ("passages, ours, + parts always", by_passage(pass_a, lambda q: query_terms(q, parts="all"))),
        ("passages, ours, + parts where not held whole (now)",
         by_passage(pass_a, lambda q: query_terms(q, parts="absent", index=pass_a))),
    ]
    print(f"{'variant':55s} ndcg@10  95% CI")
    for name, rank in variants:
        nd = [metrics(rank(q["text"]), qrels[qid])["ndcg@10"] for qid, q in queries.items()]
        lo, hi = bootstrap_ci(nd)
        print(f"{name:55s} {np.mean(nd):.3f}    {lo:.3f}-{hi:.3f}", flush=True)


if __name__ == "__main__":
    main()
