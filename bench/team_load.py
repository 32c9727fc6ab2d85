"""The team server under load: throughput and latency at 20, 50 and 100 concurrent users.

    python bench/team_load.py [--users 20 50 100] [--seconds 45] [--compare OTHER/host]
                              [--server-arg=--pool-size=40 ...]

What runs, side by side on this machine (each in its own process):
  - the embedded PostgreSQL (a cluster kept in $TMPDIR/localkb-team-load, built once);
  - the team server (``localkb team serve --db``, started from ``--code`` or this checkout);
  - a fake model on loopback speaking the OpenAI protocol (tests/fakellm.py, ``slow``): 50
    tokens, one every 20 ms (a 1 s answer), so a chat holds its thread as a real model would;
  - this load generator: N users, each in a loop, half searches (``POST /v1/search``, hybrid,
    k 8) and half uncached chats (``POST /v1/chat``, ``regenerate``, streamed to the end).

Data: the PostgreSQL 15 manual (``/usr/share/doc/postgresql-doc-15/html``), each page's text
split into passages of 200+ characters (paragraphs packed; 11,430 of them), one knowledge
base, embedded once by the real model (``--random-vectors``: random unit vectors instead, a
quick build whose HNSW walks are much longer than real ones). Queries are
the manual's own section titles, embedded by the server's real model. Three roles
(public/internal/secret clearances), five users, one token each; passage levels vary.

Per level it prints requests/s (completed, both kinds), p50/p95 per kind, errors by status,
and the server's peak RSS. ``--compare`` runs a second server from another checkout's
``host`` folder, interleaved level by level (A B A B ...), so the two are compared within one
run on a shared machine: compare ratios, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import add_record_flag, recorded  # noqa: E402 - the bench folder, not a package

DOCS = Path("/usr/share/doc/postgresql-doc-15/html")
CACHE = Path(os.environ.get("TMPDIR", tempfile.gettempdir())) / "localkb-team-load"
REPLY = " ".join(f"word{i}" for i in range(49)) + " [1]."  # 50 tokens (tests/fakellm.split_tokens)
PASSAGE_CHARS = 200


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * (len(s) - 1)))]


# -- the corpus and the database (built once, kept in CACHE) -------------------------------------
def corpus(limit: int) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(url, title, passage) triples from the manual's pages, and queries (their section titles)."""
    from localkb.ingest.extract import extract_html

    out, titles = [], []
    for page in sorted(DOCS.glob("*.html")):
        doc = extract_html(page.read_bytes(), url=f"https://www.postgresql.org/docs/15/{page.name}")
        titles.append(doc.title)
        buf = ""
        for raw in re.split(r"\n\s*\n", doc.text):
            para = " ".join(raw.split())
            if not para:
                continue
            buf = f"{buf}\n\n{para}" if buf else para
            if len(buf) >= PASSAGE_CHARS:
                out.append((doc.url, doc.title, buf[: PASSAGE_CHARS * 3]))
                buf = ""
        if buf:
            out.append((doc.url, doc.title, buf))
        if len(out) >= limit:
            break
    return out[:limit], [t for t in titles if t and len(t) > 8]


def build(pg_url: str, passages: int, *, random_vectors: bool) -> dict:
    """The database ``load``: one knowledge base of the manual, 3 roles, 5 users and their tokens."""
    import numpy as np
    import psycopg

    from localkb.config import Settings
    from localkb.store.base import ChunkWrite, SourceWrite
    from localkb.store.catalog import chunk_id, source_id
    from localkb.team.access import Access, Directory
    from localkb.team.db import Database
    from localkb.team.schema import hnsw_index_sql
    from localkb.team.store import TeamStore

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS load WITH (FORCE)")
        conn.execute("CREATE DATABASE load")
    url = psycopg.conninfo.make_conninfo(pg_url, dbname="load")
    data, queries = corpus(passages)
    print(f"  corpus: {len(data):,} passages from {DOCS}", flush=True)
    db = Database(url)
    settings = Settings(data_dir=CACHE / "settings")
    store = TeamStore(db, settings, Access.system())
    rec = store.create_kb("pgdocs")
    with db.conn() as conn:
        conn.execute("DROP INDEX IF EXISTS chunks_hnsw_384")
        conn.commit()
    rng = np.random.default_rng(15)
    if random_vectors:
        vecs = rng.normal(size=(len(data), 384)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    else:
        from localkb.ingest.chunk import passage_text

        t0 = time.perf_counter()
        vecs = store.open_kb(rec.id).embedder.embed([passage_text(t, x) for _, t, x in data])
        print(f"  embedded {len(data):,} passages in {time.perf_counter() - t0:.0f} s", flush=True)
    levels = rng.choice(4, size=len(data), p=[0.5, 0.3, 0.15, 0.05])
    by_level: dict[int, list] = {}
    for i, (page_url, title, text) in enumerate(data):
        sid = source_id(rec.id, f"p{i}")
        cid = chunk_id(rec.id, sid, 0)
        by_level.setdefault(int(levels[i]), []).append(SourceWrite(
            id=sid, key=f"p{i}", type="html", title=title, url=f"{page_url}#p{i}", file_name=None,
            content_hash=str(i), captured_by="api", chunk_count=1, pages=None, lang="en",
            keep={cid}, chunks=[ChunkWrite(cid, 0, text, str(i), None, len(text.split()), vecs[i], "api")]))
    for lvl, writes in by_level.items():
        kb = store.open_kb(rec.id, write_level=lvl)
        for start in range(0, len(writes), 2000):
            kb.write_sources(writes[start : start + 2000])
    with db.conn() as conn:
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute(hnsw_index_sql(384))
        conn.execute("ANALYZE chunks")
        conn.commit()
    d = Directory(db)
    for role, clearance in (("staff", "public"), ("eng", "internal"), ("sec", "secret")):
        d.add_role(role, clearance)
        d.grant(role, rec.id)
    tokens = []
    for i, role in enumerate(("staff", "staff", "eng", "eng", "sec")):
        d.add_user(f"user{i}", roles=[role])
        tokens.append(d.create_token(f"user{i}")["token"])
    db.close()
    return {"kb": rec.id, "tokens": tokens, "queries": queries, "passages": len(data)}


# -- the server and the fake model, each a process of its own -------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_model(port: int, delay: float) -> subprocess.Popen:
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); import fakellm; "
            f"f = fakellm.FakeLLM(mode='slow', reply={REPLY!r}, delay={delay!r}); "
            f"s = fakellm._Server(('127.0.0.1', {port}), fakellm._Handler); s.fake = f; "
            "s.serve_forever()")
    return subprocess.Popen([sys.executable, "-c", code])


def start_server(code: Path, url: str, llm_port: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(code)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "localkb", "team", "serve", "--db", url, "--port", str(port),
         "--llm-url", f"http://127.0.0.1:{llm_port}/v1", "--llm-model", "fake",
         "--daily-cap-user", "0", "--daily-cap-address", "0", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if "listening on" in line:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, f"127.0.0.1:{port}"
        print("   server:", line.rstrip())
    raise SystemExit(f"the team server did not start (exit {proc.wait()})")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- the load -------------------------------------------------------------------------------------
class Load:
    def __init__(self, addr: str, facts: dict, users: int, seconds: float) -> None:
        self.addr, self.facts, self.users, self.seconds = addr, facts, users, seconds
        self.lat: dict[str, list[float]] = {"search": [], "chat": []}
        self.errors: Counter = Counter()
        self.lock = threading.Lock()

    def one(self, conn: http.client.HTTPConnection, kind: str, token: str, query: str) -> int:
        kb = self.facts["kb"]
        if kind == "search":
            body = {"kbs": [kb], "query": query, "k": 8}
            path = "/v1/search"
        else:
            body = {"kbs": [kb], "message": f"{query}?", "regenerate": True, "stream": True}
            path = "/v1/chat"
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status == 200 and kind == "chat" and b"event: result" not in raw:
            return 599  # the stream ended without its result
        if (resp.status == 200 and kind == "chat") or resp.getheader("Connection") == "close":
            conn.close()
        return resp.status

    def user(self, n: int, end: float) -> None:
        rng = random.Random(n)
        token = self.facts["tokens"][n % len(self.facts["tokens"])]
        conn = http.client.HTTPConnection(self.addr, timeout=120)
        while time.monotonic() < end:
            kind = rng.choice(("search", "chat"))
            query = rng.choice(self.facts["queries"])
            t0 = time.perf_counter()
            try:
                status = self.one(conn, kind, token, query)
            except (OSError, http.client.HTTPException) as err:
                status = type(err).__name__
                conn.close()
                conn = http.client.HTTPConnection(self.addr, timeout=120)
            took = time.perf_counter() - t0
            with self.lock:
                if status == 200:
                    self.lat[kind].append(took)
                else:
                    self.errors[f"{kind} {status}"] += 1
        conn.close()

    def run(self) -> dict:
        end = time.monotonic() + self.seconds
        t0 = time.monotonic()
        threads = [threading.Thread(target=self.user, args=(n, end), daemon=True) for n in range(self.users)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        done = len(self.lat["search"]) + len(self.lat["chat"])
        return {"rps": done / wall, "done": done, "errors": dict(self.errors),
                **{f"{k} p50": pct(v, 0.5) for k, v in self.lat.items()},
                **{f"{k} p95": pct(v, 0.95) for k, v in self.lat.items()},
                **{f"{k} n": len(v) for k, v in self.lat.items()}}


def warm(addr: str, facts: dict) -> None:
    load = Load(addr, facts, 1, 0)
    conn = http.client.HTTPConnection(addr, timeout=120)
    for kind in ("search", "chat", "search"):
        load.one(conn, kind, facts["tokens"][0], facts["queries"][0])
        conn = http.client.HTTPConnection(addr, timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, nargs="*", default=[20, 50, 100])
    ap.add_argument("--seconds", type=float, default=45.0, help="per level (default 45)")
    ap.add_argument("--passages", type=int, default=20_000)
    ap.add_argument("--delay", type=float, default=0.02, help="the fake model's seconds per token")
    ap.add_argument("--code", default=str(ROOT / "host"), help="the host folder the server runs from")
    ap.add_argument("--compare", default=None, help="a second host folder, run interleaved (A B A B)")
    ap.add_argument("--server-arg", action="append", default=[], help="an extra flag for --code's server")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the cached database")
    ap.add_argument("--random-vectors", action="store_true",
                    help="random unit vectors instead of the real model's (a quicker build; HNSW walks "
                    "random vectors far longer than real ones)")
    add_record_flag(ap)
    args = ap.parse_args()
    with recorded(args.record):
        from localkb.team.embedded import EmbeddedPostgres

        CACHE.mkdir(parents=True, exist_ok=True)
        pg = EmbeddedPostgres(CACHE / "pg")
        pg.acquire(wait=True)
        base_url = pg.start()
        facts_file = CACHE / f"facts-{args.passages}{'-random' if args.random_vectors else ''}.json"
        llm = None
        try:
            if args.rebuild or not facts_file.exists():
                print(f"building the load database in {CACHE} (once)", flush=True)
                for old in CACHE.glob("facts-*.json"):  # one database: the other build is gone
                    old.unlink()
                facts_file.write_text(json.dumps(build(base_url, args.passages,
                                                       random_vectors=args.random_vectors)))
            facts = json.loads(facts_file.read_text())
            import psycopg

            url = psycopg.conninfo.make_conninfo(base_url, dbname="load")
            llm_port = free_port()
            llm = fake_model(llm_port, args.delay)
            runs = [("A", Path(args.code), args.server_arg)]
            if args.compare:
                runs.append(("B", Path(args.compare), []))
            print(f"load: {facts['passages']:,} passages, 5 users' tokens, model 50 tokens x "
                  f"{args.delay * 1000:.0f} ms; uptime: {os.getloadavg()}")
            for name, code, extra in runs:
                print(f"  {name}: {code} {' '.join(extra)}")
            print(f"{'run':3} {'users':>5} {'req/s':>7} {'search p50':>10} {'p95':>7} {'chat p50':>9} "
                  f"{'p95':>7} {'errors':>7} {'RSS MiB':>8}  errors by kind")
            summary: dict[tuple[str, int], float] = {}
            for users in args.users:
                for name, code, extra in runs:
                    proc, addr = start_server(code, url, llm_port, extra)
                    try:
                        warm(addr, facts)
                        r = Load(addr, facts, users, args.seconds).run()
                        rss = rss_mib(proc.pid)
                    finally:
                        proc.terminate()
                        proc.wait(timeout=120)
                    summary[(name, users)] = r["rps"]
                    nerr = sum(r["errors"].values())
                    print(f"{name:3} {users:5d} {r['rps']:7.1f} {r['search p50']:9.2f}s "
                          f"{r['search p95']:6.2f}s {r['chat p50']:8.2f}s {r['chat p95']:6.2f}s "
                          f"{nerr:7d} {rss:8.0f}  "
                          f"{r['errors'] or ''}", flush=True)
            if args.compare:
                for users in args.users:
                    a, b = summary[("A", users)], summary[("B", users)]
                    print(f"  {users} users: A / B throughput {a / b if b else float('nan'):.2f}x")
            print(f"uptime after: {os.getloadavg()}; median req/s over A: "
                  f"{statistics.median(v for (n, _), v in summary.items() if n == 'A'):.1f}")
        finally:
            if llm is not None:
                llm.terminate()
                llm.wait()
            pg.stop()
            pg.release()


if __name__ == "__main__":
    main()
