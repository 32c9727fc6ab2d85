"""Why the keyword leg scores what it does on prose: plain BM25 rebuilt factor by factor.

    python bench/keyword_factors.py SET --index-dir DIR [--split train]
    python bench/keyword_factors.py SET --index-dir DIR --hybrid [--page-unit page|passages]

SET is a BEIR-layout set (BEIR SciFact: ``../shared/datasets/beir-scifact``) and DIR an
index ``localkb eval SET --index-dir DIR`` built (read only: the catalogue's passages;
``--hybrid`` opens it as ``localkb eval --index-dir`` does, so use a copy).
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

``--hybrid`` asks whether page-level keyword statistics would lift the *fused* ranking
before any engine holds them: the product's own search (``run_eval``, hybrid and keyword
modes, per_source=1) runs with its keyword list replaced by whole-page BM25 computed here,
each variant paired query by query with today's search on the same index:

- ``page``: the keyword leg returns pages by page BM25, each shown by its best passage
  (passage BM25); every list built from keyword hits (exact, defines) sees those passages;
- ``page list only``: page BM25 orders the keyword list; the exact and defining lists and
  the terms each passage holds stay those of the passage search (statuses unchanged);
- ``page list, vector's passage``: as the last, but a page's keyword vote goes to the
  passage of that page the vector list ranks highest (its best keyword passage when the
  vector list holds none) — RRF fuses passages, so a page's vote only adds to the vector
  leg's when both name the same passage;
- ``page list beside passage list``: the page list (best keyword passages) as a third list,
  at the keyword list's weight.

``--page-unit``: a page is its title once and its passages' bodies (``page``), or the sum of
its passages' indexed terms, title line included in each (``passages``: what a page
document built from the passage index would hold).
"""

from __future__ import annotations

import argparse
import contextlib
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
        self._index([Counter(tokens(t)) for t in texts])

    @classmethod
    def from_counts(cls, counts: list[Counter]) -> BM25:
        index = cls.__new__(cls)
        index._index(counts)
        return index

    def _index(self, counts: list[Counter]) -> None:
        self.tfs = counts
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


class PageBM25:
    """Whole-page BM25 over a kept index's catalogue, as a keyword leg would return it."""

    def __init__(self, index_dir: Path, unit: str) -> None:
        db = sqlite3.connect(f"file:{index_dir / 'catalog.sqlite'}?mode=ro", uri=True)
        rows = list(db.execute(
            "SELECT c.id, c.source_id, s.title, c.text FROM chunks c JOIN sources s "
            "ON s.id = c.source_id ORDER BY c.source_id, c.idx"))
        db.close()
        self.chunk_ids = [r[0] for r in rows]
        self.at = {cid: i for i, cid in enumerate(self.chunk_ids)}
        self.pages: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            self.pages.setdefault(r[1], []).append(i)
        self.page_ids = list(self.pages)
        self.page_of = {i: src for src, ids in self.pages.items() for i in ids}
        self.passages = BM25.from_counts([Counter(t for t, _ in analyze(passage_text(r[2], r[3])))
                                          for r in rows])
        if unit == "passages":
            counts = []
            for src in self.page_ids:
                c: Counter = Counter()
                for i in self.pages[src]:
                    c.update(self.passages.tfs[i])
                counts.append(c)
        else:
            counts = [Counter(t for t, _ in analyze(
                (rows[ids[0]][2] or "") + "\n" + "\n".join(rows[i][3] for i in ids)))
                for ids in self.pages.values()]
        self.whole = BM25.from_counts(counts)

    def hits(self, terms: list[str], count: int):
        """Pages by BM25, best first, each as its best passage with the terms that passage holds."""
        from localkb.store.keywords import MAX_SEARCH_TERMS, KeywordHit

        terms = list(dict.fromkeys(terms))[:MAX_SEARCH_TERMS]
        page_s, pass_s = self.whole.scores(terms), self.passages.scores(terms)
        out = []
        for j in np.argsort(-page_s)[:count]:
            if page_s[j] <= 0:
                break
            best = max(self.pages[self.page_ids[j]], key=lambda i: pass_s[i])
            out.append(KeywordHit(self.chunk_ids[best], float(page_s[j]),
                                  frozenset(t for t in terms if self.passages.tfs[best][t])))
        return out

    def held(self, chunk_id: str, terms: frozenset[str]) -> frozenset[str]:
        return frozenset(t for t in terms if self.passages.tfs[self.at[chunk_id]][t])


def hybrid_with_page_lists(args) -> None:
    """The product's search with its keyword list ranked by whole-page BM25, paired with today's."""
    from unittest import mock

    from localkb.retrieval import search as search_mod
    from localkb.retrieval.evaluate import run_eval
    from localkb.store.catalog import vector_key
    from localkb.store.kb import LocalLegs

    pages = PageBM25(args.index_dir, args.page_unit)
    print(f"{args.set} ({args.split}): {len(pages.page_ids)} pages, {len(pages.chunk_ids)} passages; "
          f"page unit: {args.page_unit}")
    original = search_mod.Searcher._candidates
    passage_keyword = LocalLegs.keyword

    def page_keyword(_legs, terms, count):
        return pages.hits(terms, count)

    def page_list(vector_passage: bool, beside: bool = False):
        def candidates(self, kb, legs, query, plan, found, **kw):
            asked: list[list[str]] = []

            def recording(legs_self, terms, count):
                asked.append(list(terms))
                return passage_keyword(legs_self, terms, count)

            with mock.patch.object(LocalLegs, "keyword", recording):
                got = original(self, kb, legs, query, plan, found, **kw)
            if not isinstance(got, search_mod.Candidates) or "keyword" not in got.lists:
                return got
            hits = pages.hits(asked[-1], kw["want"])
            if vector_passage and "vector" in got.lists:
                rank = {key: r for r, key in enumerate(got.lists["vector"])}
                for n, h in enumerate(hits):
                    seen = [i for i in pages.pages[pages.page_of[pages.at[h.chunk_id]]]
                            if vector_key(pages.chunk_ids[i]) in rank]
                    if seen:
                        cid = pages.chunk_ids[min(seen, key=lambda i: rank[vector_key(pages.chunk_ids[i])])]
                        hits[n] = type(h)(cid, h.bm25, pages.held(cid, h.terms))
            name = "keyword_pages" if beside else "keyword"
            got.lists[name] = [vector_key(h.chunk_id) for h in hits]
            got.weights[name] = got.weights.get("keyword", 1.0)
            for h in hits:
                got.terms.setdefault(vector_key(h.chunk_id), h.terms & set(plan.terms))
            return got
        return candidates

    variants = [("today (passage BM25)", None),
                ("page", mock.patch.object(LocalLegs, "keyword", page_keyword)),
                ("page list only", mock.patch.object(search_mod.Searcher, "_candidates", page_list(False))),
                ("page list, vector's passage",
                 mock.patch.object(search_mod.Searcher, "_candidates", page_list(True))),
                ("page list beside passage list",
                 mock.patch.object(search_mod.Searcher, "_candidates", page_list(False, True)))]
    base: dict[str, np.ndarray] = {}
    print(f"{'variant':32s} {'mode':8s} ndcg@10  95% CI        paired with today")
    for name, patch in variants:
        with patch or contextlib.nullcontext():
            res = run_eval(args.set, modes=("hybrid", "keyword"), split=args.split,
                           index_dir=args.index_dir, per_query=True)
        for mode in ("hybrid", "keyword"):
            nd = np.array(res["per_query_ndcg"][mode])
            lo, hi = bootstrap_ci(list(nd))
            line = f"{name:32s} {mode:8s} {nd.mean():.4f}   {lo:.3f}-{hi:.3f}"
            if patch is None:
                base[mode] = nd
            else:
                d = nd - base[mode]
                dlo, dhi = bootstrap_ci(list(d))
                line += (f"   {d.mean():+.4f} ({dlo:+.4f} to {dhi:+.4f}; better {int((d > 0).sum())}, "
                         f"worse {int((d < 0).sum())})")
            print(line, flush=True)


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
    ap.add_argument("--hybrid", action="store_true",
                    help="the product's search with a whole-page BM25 keyword list, paired with today's")
    ap.add_argument("--page-unit", choices=("page", "passages"), default="page")
    args = ap.parse_args()
    if args.hybrid:
        hybrid_with_page_lists(args)
        return
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
