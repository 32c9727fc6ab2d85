"""The team store against the local store on the same data, in the same run; ingest over the API.

    python bench/team.py [--sizes 30000 300000] [--rounds 3] [--queries 100] [--ingest 60]

Data: passages of real text (SciFact sentences, two to a passage, recombined to reach the
size), so the keyword leg (Whoosh locally, our terms in a GIN-indexed tsvector in
PostgreSQL) works on a real term distribution; the vectors are random unit vectors
(384-d, the MiniLM shape), written through the store seam without embedding, so the
vector leg's cost is real but its neighbours are not meaningful. Queries are the SciFact
claims, embedded by the real model (the same cost on both sides).

Filters: every passage gets an access level (uniform over the four); the team query runs
as a user cleared to "internal", so about half the passages are visible and both legs
filter inside their SQL. The local store has no access levels and searches everything.

Rounds interleave team and local (A/B/A/B); each round prints hybrid p50/p95 per store,
and the summary gives min/median/max over the rounds. The machine is shared: compare
the two stores within a run, not absolute figures across runs.

Ingest: N SciFact abstracts added over the HTTP API (extract, chunk, embed, write on the
server) against the same abstracts added to a local store, interleaved; passages/s.

Team chat (``--chat N``): N SciFact claims asked over ``POST /v1/chat`` against 300 real
abstracts (real model, real PostgreSQL), the model a loopback server speaking the OpenAI
protocol that answers at once (tests/fakellm.py: the generation cost of a real model is NOT
in these figures, so the ratio understates what a hit saves). Each round asks every claim
afresh (``regenerate``: the full pipeline) and then again (an exact-tier hit), interleaved.

Semantic threshold (``--threshold``): cosines of the real model over SciFact claim pairs that
the SciFact authors tied to the same evidence sentences of the same abstract, split by the
authors' labels: both SUPPORT or both CONTRADICT (same verdict: the closest thing to a
paraphrase in that set, though most are different claims) vs one SUPPORT and one
CONTRADICT (a claim and its negation: serving one's answer for the other is a wrong
answer), beside random claim pairs. For each threshold: the share of each class a
semantic cache would serve.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SCIFACT, scifact_docs

from localkb.config import Settings
from localkb.ingest.extract import extract_text
from localkb.ingest.pipeline import add_document
from localkb.retrieval.search import Searcher
from localkb.store.base import ChunkWrite, SourceWrite
from localkb.store.catalog import chunk_id, source_id
from localkb.store.kb import Store
from localkb.team.access import Access, Directory, Grant
from localkb.team.cli import throwaway_team_store
from localkb.team.client import TeamClient
from localkb.team.schema import hnsw_index_sql
from localkb.team.server import TeamAPI, TeamServer

SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
BATCH = 2000


def passages(n: int) -> list[tuple[str, str]]:
    sents = [s for d in scifact_docs() for s in SENT.split(d["text"]) if len(s) > 30]
    titles = [d["title"][:80] for d in scifact_docs()]
    out = []
    for i in range(n):
        a, b = sents[i % len(sents)], sents[(i * 7 + 3) % len(sents)]
        out.append((titles[i % len(titles)], f"{a} {b}"))
    return out


def claims(limit: int) -> list[str]:
    import json

    path = SCIFACT / "queries.jsonl"
    if not path.exists():
        return [t for t, _ in passages(limit)]
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line)["text"] for line in fh][:limit]


def fill(kb, data: list[tuple[str, str]], vecs: np.ndarray, levels: np.ndarray | None) -> float:
    """Write the passages through the seam (one source each), in batches; seconds taken."""
    t0 = time.perf_counter()
    for start in range(0, len(data), BATCH):
        writes = []
        for i in range(start, min(len(data), start + BATCH)):
            title, text = data[i]
            sid = source_id(kb.id, f"p{i}")
            cid = chunk_id(kb.id, sid, 0)
            writes.append(SourceWrite(
                id=sid, key=f"p{i}", type="text", title=title, url=None, file_name=None,
                content_hash=str(i), captured_by="api", chunk_count=1, pages=None, lang=None,
                keep={cid}, chunks=[ChunkWrite(cid, 0, text, str(i), None, 48, vecs[i], "api")]))
        if levels is None:
            kb.write_sources(writes)
        else:
            by_level: dict[int, list] = {}
            for w, lvl in zip(writes, levels[start : start + BATCH], strict=False):
                by_level.setdefault(int(lvl), []).append(w)
            for lvl, group in by_level.items():
                kb.store.open_kb(kb.id, write_level=lvl).write_sources(group)
        print(f"    {min(len(data), start + BATCH):,} / {len(data):,} written", end="\r", flush=True)
    print()
    return time.perf_counter() - t0


def timed(searcher: Searcher, kb: str, queries: list[str], mode: str = "hybrid") -> list[float]:
    out = []
    for q in queries:
        t0 = time.perf_counter()
        searcher.search([kb], q, k=10, mode=mode)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * (len(s) - 1)))]


def bench_size(n: int, *, rounds: int, queries: list[str], db_url: str | None, settings: Settings) -> None:
    print(f"\n== {n:,} passages (real SciFact text, random unit vectors, access levels 0-3) ==")
    rng = np.random.default_rng(n)
    data = passages(n)
    vecs = rng.normal(size=(n, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    levels = rng.integers(0, 4, size=n)
    tmp = Path(tempfile.mkdtemp(prefix="localkb-bench-team-"))
    try:
        local = Store(replace(settings, data_dir=tmp / "local"))
        local.create_kb("bench")
        lkb = local.open_kb("bench")
        print(f"  local write: {fill(lkb, data, vecs, None):.1f} s")
        lkb.legs()
        with throwaway_team_store(db_url) as team:
            rec = team.create_kb("bench")
            # A bulk load as pgvector advises: rows first, then the HNSW index in one build.
            with team.db.conn() as conn:
                conn.execute("DROP INDEX chunks_hnsw_384")
                conn.commit()
            print(f"  team write:  {fill(team.open_kb('bench'), data, vecs, levels):.1f} s")
            t0 = time.perf_counter()
            with team.db.conn() as conn:
                conn.execute("SET maintenance_work_mem = '1GB'")
                conn.execute(hnsw_index_sql(384))
                conn.execute("ANALYZE chunks")
                conn.commit()
            print(f"  team HNSW index build: {time.perf_counter() - t0:.1f} s")
            viewer = team.for_access(Access("u", "bench-user", kbs={rec.id: Grant(1, False)}))
            visible = viewer.counts(rec.id)["chunks"]
            print(f"  the team user may see {visible:,} of {n:,} passages (clearance internal)")
            ts, ls = Searcher(viewer), Searcher(local)
            timed(ts, rec.id, queries[:10])  # warm both: model, caches, index pages
            timed(ls, "bench", queries[:10])
            for mode in ("hybrid", "keyword"):
                rows = []
                for r in range(rounds):
                    t = timed(ts, rec.id, queries, mode)
                    loc = timed(ls, "bench", queries, mode)
                    rows.append((pct(t, 0.5), pct(t, 0.95), pct(loc, 0.5), pct(loc, 0.95)))
                    print(f"  {mode} round {r + 1}: team p50 {rows[-1][0]:7.1f} ms p95 {rows[-1][1]:7.1f} ms"
                          f" | local p50 {rows[-1][2]:7.1f} ms p95 {rows[-1][3]:7.1f} ms")
                for name, col in (("team p50", 0), ("team p95", 1), ("local p50", 2), ("local p95", 3)):
                    vals = [row[col] for row in rows]
                    print(f"  {mode} {name:10} min {min(vals):7.1f}  median {statistics.median(vals):7.1f}  "
                          f"max {max(vals):7.1f} ms")
                ratio = statistics.median(r[0] / r[2] for r in rows)
                print(f"  {mode}: team / local p50 (median of rounds) {ratio:.2f}x")
            res = ts.search([rec.id], queries[0], k=10)
            print(f"  team vector path: {res.trace['kbs'][rec.id].get('vector_path')}")
        local.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def serve_one_writer(team, settings: Settings, kb_name: str, *, chat=None):
    """A knowledge base, one user cleared to everything who may write it, and a server on loopback."""
    rec = team.create_kb(kb_name)
    d = Directory(team.db)
    d.add_role("w", "secret")
    d.add_user("writer", roles=["w"])
    d.grant("w", rec.id, write=True)
    token = d.create_token("writer")["token"]
    httpd = TeamServer(TeamAPI(team.db, settings, name="bench", chat=chat), "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return rec, token, httpd


def bench_ingest(n: int, *, db_url: str | None, settings: Settings, rounds: int) -> None:
    print(f"\n== ingest: {n} SciFact abstracts, real model, over the API vs a local store ==")
    docs = scifact_docs(limit=n * rounds)
    tmp = Path(tempfile.mkdtemp(prefix="localkb-bench-ingest-"))
    try:
        with throwaway_team_store(db_url) as team:
            rec, token, httpd = serve_one_writer(team, settings, "ingest")
            local = Store(replace(settings, data_dir=tmp / "local"))
            local.create_kb("ingest")
            lkb = local.open_kb("ingest")
            with TeamClient(httpd.url, token) as client:
                client.add(rec.id, title="warm", text="warm up the model")
                add_document(lkb, extract_text("warm up the model", title="warm"), key="warm")
                for r in range(rounds):
                    part = docs[r * n : (r + 1) * n]
                    t0 = time.perf_counter()
                    api = sum(client.add(rec.id, title=x["title"], text=x["text"],
                                         url=f"https://bench/{x['_id']}")["total"] for x in part)
                    api_s = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    loc = sum(add_document(lkb, extract_text(x["text"], title=x["title"]),
                                           key=f"doc:{x['_id']}").total for x in part)
                    loc_s = time.perf_counter() - t0
                    print(f"  round {r + 1}: API {api / api_s:6.1f} passages/s ({api} in {api_s:.1f} s) | "
                          f"local {loc / loc_s:6.1f} passages/s ({loc} in {loc_s:.1f} s)")
            httpd.shutdown()
            httpd.server_close()
            local.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_chat(n: int, *, db_url: str | None, settings: Settings, rounds: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fakellm import FakeLLM
    from localkb.answer.llm import Endpoint
    from localkb.team.chat import ChatConfig
    from localkb.team.limits import Caps

    print(f"\n== team chat: {n} claims, full pipeline vs exact-cache hit, {rounds} rounds ==")
    docs = scifact_docs(limit=300)
    questions = claims(n)
    with throwaway_team_store(db_url) as team, FakeLLM(reply="See [1].") as llm:
        config = ChatConfig(endpoint=Endpoint("bench", llm.base_url, "fake"), caps=Caps(0, 0))
        rec, token, httpd = serve_one_writer(team, settings, "chat", chat=config)
        from localkb.ingest.pipeline import add_capture

        kb = team.open_kb(rec.id)
        for x in docs:
            add_capture(kb, url=f"https://bench/{x['_id']}", title=x["title"], text=x["text"],
                        captured_by="api")
        with TeamClient(httpd.url, token) as client:
            for q in questions:  # fill the cache (and warm both paths)
                client.chat([rec.id], q)
            full_p50, hit_p50 = [], []
            for r in range(rounds):
                full, hit = [], []
                for q in questions:
                    t0 = time.perf_counter()
                    client.chat([rec.id], q, regenerate=True)
                    full.append((time.perf_counter() - t0) * 1000)
                    t0 = time.perf_counter()
                    out = client.chat([rec.id], q)
                    hit.append((time.perf_counter() - t0) * 1000)
                    assert out["cached"] == "exact", out["cached"]
                full_p50.append(pct(full, 0.5))
                hit_p50.append(pct(hit, 0.5))
                print(f"  round {r + 1}: full answer p50 {full_p50[-1]:7.1f} ms p95 {pct(full, 0.95):7.1f} | "
                      f"exact hit p50 {hit_p50[-1]:6.1f} ms p95 {pct(hit, 0.95):6.1f} | "
                      f"ratio {full_p50[-1] / hit_p50[-1]:5.1f}x")
        print(f"  over rounds (min/median/max): full p50 {min(full_p50):.1f}/"
              f"{statistics.median(full_p50):.1f}/{max(full_p50):.1f} ms; hit p50 {min(hit_p50):.1f}/"
              f"{statistics.median(hit_p50):.1f}/{max(hit_p50):.1f} ms")
        httpd.shutdown()
        httpd.server_close()


def threshold_pairs() -> dict[str, list[tuple[str, str]]]:
    """SciFact claim pairs by the authors' evidence links and labels (see the module doc)."""
    import itertools
    import json
    import random

    rows = [json.loads(line) for line in (SCIFACT / "queries.jsonl").open()]
    groups: dict[tuple, list[tuple[str, str]]] = {}
    for q in rows:
        for doc, evidence in (q.get("metadata") or {}).items():
            for ev in evidence:
                groups.setdefault((doc, tuple(ev["sentences"])), []).append((q["text"], ev["label"]))
    same: set[tuple[str, str]] = set()
    negated: set[tuple[str, str]] = set()
    for items in groups.values():
        for (ta, la), (tb, lb) in itertools.combinations(items, 2):
            if ta != tb:
                (same if la == lb else negated).add(tuple(sorted((ta, tb))))
    rng = random.Random(0)
    texts = sorted({q["text"] for q in rows})
    rand = [tuple(rng.sample(texts, 2)) for _ in range(1000)]
    return {"same verdict": sorted(same), "negation": sorted(negated), "random": rand}


def bench_threshold(settings: Settings) -> None:
    from localkb.embedding.embedder import EmbedderRegistry

    print("\n== semantic cache threshold: cosines of the real model on SciFact claim pairs ==")
    reg = EmbedderRegistry(settings)
    model = reg.get(reg.spec(settings.default_model).id)
    cos = {}
    for name, pairs in threshold_pairs().items():
        a = model.embed([p[0] for p in pairs])
        b = model.embed([p[1] for p in pairs])
        cos[name] = np.sum(a * b, axis=1)
        q = np.percentile(cos[name], [5, 25, 50, 75, 95])
        print(f"  {name:12s} {len(pairs):5d} pairs  cosine p5 {q[0]:.3f} p25 {q[1]:.3f} "
              f"median {q[2]:.3f} p75 {q[3]:.3f} p95 {q[4]:.3f} max {cos[name].max():.3f}")
    print("  threshold | share served: same verdict | negation (wrong answer) | random")
    for t in (0.80, 0.85, 0.90, 0.92, 0.95, 0.97, 0.98, 0.99):
        print(f"  {t:9.2f} | {float((cos['same verdict'] >= t).mean()):26.3f} | "
              f"{float((cos['negation'] >= t).mean()):23.3f} | {float((cos['random'] >= t).mean()):6.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[30_000, 300_000],
                    help="passage counts to search (none: skip)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--ingest", type=int, default=60, help="abstracts per ingest round (0: skip)")
    ap.add_argument("--db", default=None, help="a PostgreSQL URL (default: an embedded cluster)")
    ap.add_argument("--chat", type=int, default=50, help="claims per team-chat round (0: skip)")
    ap.add_argument("--threshold", action=argparse.BooleanOptionalAction, default=True,
                    help="print the semantic-cache threshold measurement")
    args = ap.parse_args()
    settings = Settings.from_env()
    if args.threshold:
        bench_threshold(settings)
    if args.chat:
        bench_chat(args.chat, db_url=args.db, settings=settings, rounds=args.rounds)
    queries = claims(args.queries)
    print("hybrid search, k=10, one knowledge base; the machine is shared, so read ratios")
    for n in args.sizes:
        bench_size(n, rounds=args.rounds, queries=queries, db_url=args.db, settings=settings)
    if args.ingest:
        bench_ingest(args.ingest, db_url=args.db, settings=settings, rounds=args.rounds)


if __name__ == "__main__":
    main()
