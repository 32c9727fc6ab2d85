"""Full ingestion pipeline throughput against the raw model ceiling on the same chunks.

    python bench/ingest.py [--docs 600]

Writes 600 SciFact abstracts as files, runs `add_paths` on the folder (extract, chunk,
embed, write), then embeds the very same passages with the bare embedder. Prints
chunks/s and tokens/s for both, their ratio, and peak RSS.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import peak_rss_mb, scifact_docs

from localkb.config import Settings
from localkb.ingest.chunk import passage_text
from localkb.ingest.pipeline import add_paths
from localkb.store.kb import Store


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=600)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "corpus"
        folder.mkdir()
        for d in scifact_docs(args.docs):
            (folder / f"{d['_id']}.md").write_text(f"# {d['title']}\n\n{d['text']}\n", encoding="utf-8")
        store = Store(Settings.from_env({**os.environ, "LOCALKB_HOME": str(Path(tmp) / "data")}))
        store.create_kb("bench")
        kb = store.open_kb("bench")
        kb.embedder.load()
        kb.embedder.embed(["warm up the session"] * 8)

        t0 = time.perf_counter()
        report = add_paths(kb, [str(folder)])
        pipeline_s = time.perf_counter() - t0
        rows = store.catalog.db.execute(
            "SELECT s.title, c.text, c.tokens FROM chunks c JOIN sources s ON s.id = c.source_id").fetchall()
        texts = [passage_text(r[0], r[1]) for r in rows]
        tokens = sum(len(e.ids) for e in kb.embedder.tokenizer.encode_batch(texts))
        totals = report.totals()
        assert totals["added"] == len(rows), totals

        t0 = time.perf_counter()
        kb.embedder.embed(texts)
        raw_s = time.perf_counter() - t0

        print(f"corpus: {args.docs} documents -> {len(rows)} chunks, {tokens:,} model tokens; "
              f"model {kb.embedder.describe()['variant']}")
        print(f"{'':26} {'seconds':>8} {'chunks/s':>9} {'tokens/s':>9}")
        print(f"{'pipeline (extract..write)':26} {pipeline_s:8.2f} {len(rows) / pipeline_s:9.1f} "
              f"{tokens / pipeline_s:9.0f}")
        print(f"{'raw model, same chunks':26} {raw_s:8.2f} {len(rows) / raw_s:9.1f} {tokens / raw_s:9.0f}")
        print(f"pipeline / raw model: {raw_s / pipeline_s:.1%}   (target >= 80%)")
        print(f"peak RSS: {peak_rss_mb():.0f} MB")
        store.close()


if __name__ == "__main__":
    main()
