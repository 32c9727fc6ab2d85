"""Query latency (p50, p95) per mode at 3,000 and 50,000 chunks, and cold-open time.

    python bench/search.py [--sizes 3000 50000] [--cache DIR]

Knowledge bases are built from SciFact sentences (one passage each) with the real
model and kept in the cache directory, so a second run only measures. Queries are
the 300 SciFact test claims. Also prints where the time goes (stage medians).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SCIFACT, peak_rss_mb, scifact_docs

from localkb.config import Settings
from localkb.ingest.extract import Document, Section
from localkb.ingest.pipeline import ingest_documents
from localkb.retrieval.search import Searcher, fetch_k
from localkb.store.kb import Store
from localkb.store.vectors import EXPANSION_PER_CANDIDATE

SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def sentences(limit: int) -> list[tuple[str, str]]:
    out = []
    for d in scifact_docs():
        for i, s in enumerate(SENT.split(d["text"])):
            if len(s) > 30:
                out.append((f"{d['_id']}-{i}", f"{d['title']}: {s}"))
            if len(out) >= limit:
                return out
    while len(out) < limit:  # fewer sentences than asked: repeat with a marker
        k, t = out[len(out) % max(1, len(out))]
        out.append((f"{k}-r{len(out)}", t + f" (copy {len(out)})"))
    return out


def build(root: Path, size: int) -> Path:
    home = root / f"kb{size}"
    done = home / "built.json"
    if done.exists():
        return home
    store = Store(Settings.from_env({**os.environ, "LOCALKB_HOME": str(home)}))
    store.create_kb("bench")
    kb = store.open_kb("bench")
    items = []
    for key, text in sentences(size):
        def load(text=text, key=key):
            return Document(title="", type="text", sections=[Section(text)]), f"s:{key}"
        items.append((key, load))
    t0 = time.perf_counter()
    ingest_documents(kb, items, captured_by="api", batch_tokens=524_288)
    n = store.catalog.counts(kb.id)["chunks"]
    done.write_text(json.dumps({"chunks": n, "build_s": time.perf_counter() - t0}))
    store.close()
    return home


def queries() -> list[str]:
    path = SCIFACT / "queries.jsonl"
    if path.exists():
        with open(path, encoding="utf-8") as fh:
            qs = [json.loads(line)["text"] for line in fh]
        return qs[:300]
    return [f"protein expression in tumour cohort {i}" for i in range(300)]


def cold_open(home: Path) -> tuple[float, float]:
    code = (
        "import time,os;t=time.perf_counter();"
        "from localkb.config import Settings;from localkb.store.kb import Store;"
        "s=Store(Settings.from_env());kb=s.open_kb('bench');kb.indexes();"
        "t1=time.perf_counter();from localkb.retrieval.search import Searcher;"
        "Searcher(s).search(['bench'],'gene expression in tumours');"
        "print(t1-t, time.perf_counter()-t1)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "LOCALKB_HOME": str(home)})
    a, b = out.stdout.split()
    return float(a), float(b)


def hnsw_recall(store: Store, qs: list[str]) -> str:
    """How much of the exact top fetch_k(8) the HNSW search returns, over the bench queries."""
    kb = store.open_kb("bench")
    vi, _ = kb.indexes()
    count = fetch_k(8)
    shared = []
    for qv in kb.embedder.embed(qs):
        approx = set(vi.search(qv, count, exact_below=0).keys.tolist())
        exact = set(vi.search(qv, count, exact_below=len(vi) + 1).keys.tolist())
        shared.append(len(approx & exact) / len(exact))
    used = "exact" if len(vi) < store.settings.exact_search_below else "HNSW"
    return (f"HNSW recall of the exact top {count}: {statistics.mean(shared):.4f} "
            f"(expansion {EXPANSION_PER_CANDIDATE} per candidate; searches here use {used})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[3000, 50000])
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "localkb-bench-search"))
    args = ap.parse_args()
    root = Path(args.cache)
    qs = queries()
    print(f"{'chunks':>7} {'mode':8} {'p50 ms':>7} {'p95 ms':>7}   where the time goes (median ms)")
    for size in args.sizes:
        t0 = time.perf_counter()
        home = build(root, size)
        built = json.loads((home / "built.json").read_text())
        store = Store(Settings.from_env({**os.environ, "LOCALKB_HOME": str(home)}))
        searcher = Searcher(store)
        searcher.search(["bench"], "warm up")
        for mode in ("vector", "keyword", "hybrid"):
            lat, stages = [], {}
            for q in qs:
                t1 = time.perf_counter()
                res = searcher.search(["bench"], q, k=8, mode=mode)
                lat.append((time.perf_counter() - t1) * 1000)
                for kbt in res.trace.get("kbs", {}).values():
                    for name, v in kbt.items():
                        if name.endswith("_ms"):
                            stages.setdefault(name, []).append(v)
            lat.sort()
            where = "  ".join(f"{k[:-3]} {statistics.median(v):.1f}" for k, v in stages.items())
            print(f"{built['chunks']:7} {mode:8} {statistics.median(lat):7.1f} "
                  f"{lat[int(0.95 * (len(lat) - 1))]:7.1f}   {where}")
        print(f"{built['chunks']:7} {hnsw_recall(store, qs)}")
        store.close()
        open_s, first_s = cold_open(home)
        print(f"{built['chunks']:7} cold open of the knowledge base (new process, indexes loaded): "
              f"{open_s * 1000:.0f} ms; first hybrid query after it {first_s * 1000:.0f} ms "
              f"(built in {built['build_s']:.0f} s{'' if time.perf_counter() - t0 > 5 else ', cached'})")
    print(f"peak RSS of this process: {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
