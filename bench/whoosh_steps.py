"""Each step that made the Whoosh keyword search faster, measured on the same index and queries.

    python bench/whoosh_steps.py [--sizes 3000 30000] [--rounds 3] [--queries 150] [--cache DIR]

Uses the Whoosh index of bench/search.py's cached knowledge base of each size (built by it
first when missing). Variants, interleaved round by round (rotating order), on the SciFact
claims' query terms, top fetch_k(8) = 32:
  matchers+refresh  Whoosh's own OR query and collector, the searcher refreshed per query (before)
  matchers          the same with the searcher kept open between queries
  taat-nocache      term-at-a-time BM25 in numpy, field lengths in memory, postings read per query
  taat              the same with recent postings kept (the product's search)
Also checks that taat returns the same scores, and the same passages and matched terms above
the last score (passages tied at the cut may be kept in either order).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search as bench_search
from _common import rotated, spread

from localkb.retrieval.search import fetch_k
from localkb.store import keyword_engine, whoosh_scoring
from localkb.store.analysis import query_terms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[3000, 30000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queries", type=int, default=150)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "localkb-bench-search"))
    args = ap.parse_args()
    qs = [query_terms(q) for q in bench_search.queries(args.queries)]
    want = fetch_k(8)
    for size in args.sizes:
        home = bench_search.build(Path(args.cache), size, 0)
        folder = next((home / "kbs").iterdir()) / "keywords"
        ki = keyword_engine.load("whoosh", folder)

        def refreshed(terms, ki=ki):
            ki._searcher = ki._searcher.refresh()
            return ki.search_matchers(terms, want)

        def nocache(terms, ki=ki):
            ki._taat._cache.clear()
            ki._taat._cached = 0
            return ki.search(terms, want)

        variants = {"matchers+refresh": refreshed,
                    "matchers": lambda terms, ki=ki: ki.search_matchers(terms, want),
                    "taat-nocache": nocache, "taat": lambda terms, ki=ki: ki.search(terms, want)}
        ki.searcher()
        differ = 0  # beyond ties at the cut (equal scores at rank 32 may be kept in either order)
        for terms in qs:
            ref = variants["matchers"](terms)
            got = variants["taat"](terms)
            last = ref[-1].bm25 if ref else 0.0
            same_scores = len(ref) == len(got) and all(
                abs(a.bm25 - b.bm25) < 1e-9 for a, b in zip(ref, got, strict=True))
            above = {(h.chunk_id, h.terms) for h in ref if h.bm25 > last + 1e-9}
            if not same_scores or above != {(h.chunk_id, h.terms) for h in got if h.bm25 > last + 1e-9}:
                differ += 1
        names = list(variants)
        p50s: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for n in rotated(names, r):
                lat = []
                for terms in qs:
                    t0 = time.perf_counter()
                    variants[n](terms)
                    lat.append((time.perf_counter() - t0) * 1000)
                p50s[n].append(statistics.median(lat))
        print(f"{ki.doc_count():,} passages, {ki.segment_count()} segments, {len(qs)} queries x "
              f"{args.rounds} rounds; differing from matchers beyond ties at the cut: {differ}")
        base = p50s["matchers+refresh"]
        for n in names:
            ratio = [b / x for b, x in zip(base, p50s[n], strict=True)]
            print(f"  {n:18} p50 min/med/max {spread(p50s[n]):>22} ms   "
                  f"speed-up vs before {spread(ratio)}x")
        print(f"  postings cache cap {whoosh_scoring.CACHE_BYTES >> 20} MiB")
        ki.close()


if __name__ == "__main__":
    main()
