"""Search at scale: p50/p95 per mode per keyword engine, interleaved, beside FTS5; cold open, RSS, writes.

    python bench/search.py [--sizes 3000 30000 100000 300000] [--rounds 3] [--queries 300]
                           [--real-vectors-up-to 3000] [--cache DIR] [--whoosh-up-to N]

Per size, one knowledge base is built in the cache directory (kept, so a second run only
measures): passages of real SciFact text (abstracts cut into ~70-word windows of whole
sentences; past the ~14,000 that gives, further passages recombine SciFact sentences of
random abstracts under a random title, printed as such), vectors from the real model up
to --real-vectors-up-to passages and random unit vectors above (printed as such). The
catalogue rows are written directly; the derived indexes are then rebuilt from the
catalogue through the product (timed). Both keyword engines' indexes are built from the
same rows, and the knowledge base is switched between them round by round (A/B, B/A ...),
each round running the 300 SciFact test claims in every mode through the product's
``Searcher``. Printed: p50/p95 per mode per engine over all rounds, min/median/max of the
per-round p50 and of the whoosh/tantivy ratio, where the time goes (stage medians), a
keyword row with SQLite FTS5 (porter unicode61, bm25, OR of the query terms) and each
engine on the same terms interleaved query by query, the engines' top-32 overlap, a cold
open in a new process with the first query and RSS after warm-up, and "add one note"
in a new process (seconds, peak RSS, what the add spends inside and what the process paid
before it) on a copy of the knowledge base, with the one write that folds the vector log.
Above ``--whoosh-up-to`` passages only tantivy (what ``auto`` uses there) is built and
measured: a Whoosh build of 100,000 passages takes most of an hour on a loaded machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    SCIFACT,
    add_record_flag,
    installed_env,
    recorded,
    rotated,
    scifact_docs,
    source_tree_start,
    spread,
)

from localkb.config import Settings
from localkb.ingest.chunk import passage_text
from localkb.retrieval.search import Searcher, fetch_k
from localkb.store import keyword_engine
from localkb.store.analysis import query_terms
from localkb.store.catalog import chunk_id, source_id, vector_blob, vector_key
from localkb.store.kb import Store

SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
WINDOW_WORDS = 70  # ~96 model tokens, the product's passage size
ENGINES = keyword_engine.ENGINES


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


# -- data ---------------------------------------------------------------------------
def passages(size: int) -> tuple[list[tuple[str, str]], str]:
    """(title, text) passages of SciFact text, and how they were made."""
    docs = scifact_docs()
    out: list[tuple[str, str]] = []
    pool: list[str] = []
    for d in docs:
        sents = [s for s in SENT.split(d["text"]) if s.strip()]
        pool += sents
        cur: list[str] = []
        for s in sents:
            cur.append(s)
            if sum(len(x.split()) for x in cur) >= WINDOW_WORDS:
                out.append((d["title"], " ".join(cur)))
                cur = []
        if cur:
            out.append((d["title"], " ".join(cur)))
    natural = len(out)
    if size <= natural:
        return out[:size], f"{size:,} SciFact passages (abstracts in ~{WINDOW_WORDS}-word windows)"
    rng = random.Random(size)
    titles = [d["title"] for d in docs]
    while len(out) < size:
        words, cur = 0, []
        while words < WINDOW_WORDS:
            s = rng.choice(pool)
            cur.append(s)
            words += len(s.split())
        out.append((rng.choice(titles), " ".join(cur)))
    return out, (f"{natural:,} SciFact passages + {size - natural:,} recombined from SciFact sentences "
                 "(random abstracts' sentences under a random title)")


def settings_for(home: Path) -> Settings:
    return Settings.from_env({**os.environ, "LOCALKB_HOME": str(home), "LOCALKB_KEYWORD_ENGINE": "whoosh"})


def built_engines(home: Path) -> tuple[str, ...]:
    """The keyword engines whose index the cached knowledge base holds."""
    return tuple(e for e in ENGINES if keyword_engine.folder_for(next((home / "kbs").iterdir()), e).exists())


def build(root: Path, size: int, real_upto: int, engines: tuple[str, ...] = ENGINES) -> Path:
    home = root / f"kb{size}"
    done = home / "built.json"
    if done.exists():
        return home
    shutil.rmtree(home, ignore_errors=True)
    store = Store(settings_for(home))
    rec = store.create_kb("bench", keyword_engine=engines[0])
    kb = store.open_kb(rec.id)
    kb.close()
    rows, made = passages(size)
    texts = [passage_text(t, x) for t, x in rows]
    t0 = time.perf_counter()
    if size <= real_upto:
        vecs = kb.embedder.embed(texts)
        vec_kind = f"real {kb.record.model} vectors"
    else:
        rng = np.random.default_rng(size)
        vecs = rng.standard_normal((size, kb.record.dim), dtype=np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        vec_kind = "random unit vectors"
    embed_s = time.perf_counter() - t0
    now = time.time()
    with store.catalog.tx() as db:
        for i, ((title, text), full) in enumerate(zip(rows, texts, strict=True)):
            sid = source_id(rec.id, f"bench:{i}")
            h = hashlib.sha256(full.encode()).hexdigest()[:32]
            db.execute("INSERT INTO sources VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       (sid, rec.id, f"bench:{i}", "text", title, None, None, h, "api", 1, None, "en",
                        now, now))
            cid = chunk_id(rec.id, sid, 0)
            db.execute("INSERT INTO chunks VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                       (cid, vector_key(cid), rec.id, sid, 0, text, h, None, len(text.split()),
                        vector_blob(vecs[i]), "bench", now))
        db.execute("UPDATE kbs SET generation = generation + 1 WHERE id = ?", (rec.id,))
    shutil.rmtree(store.kb_dir(rec.id))  # the derived indexes are rebuilt from the catalogue
    times = {}
    kb = store.open_kb(rec.id)
    gen = store.catalog.generation(rec.id)
    with store.lock.hold():  # what a first open (or doctor --repair) does, one index at a time
        t0 = time.perf_counter()
        vi = kb._rebuild_vectors(gen)
        times["vectors"] = time.perf_counter() - t0
        t0 = time.perf_counter()  # the graph the rebuild leaves to compaction: searched below
        vi.compact()
        times["graph"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        kb._rebuild_keywords(gen, engines[0]).close()
        times[engines[0]] = time.perf_counter() - t0
        kb._prune(gen)
    # The other engine beside it, from the same rows (the product removes the other engine's
    # folder on a switch; the bench keeps both so it can switch between them without rebuilding).
    for other in engines[1:]:
        t0 = time.perf_counter()
        ti = keyword_engine.create(other, keyword_engine.folder_for(kb.dir, other))
        ti.write(((r["id"], passage_text(r["title"], r["text"])) for r in store.catalog.db.execute(
            "SELECT c.id, c.text, s.title FROM chunks c JOIN sources s ON s.id = c.source_id "
            "WHERE c.kb_id = ? ORDER BY c.rowid", (rec.id,))), [], gen)
        times[other] = time.perf_counter() - t0
        ti.close()
    del vi
    t0 = time.perf_counter()
    fts = sqlite3.connect(home / "fts5.sqlite")
    fts.execute("CREATE VIRTUAL TABLE p USING fts5(cid UNINDEXED, body, tokenize='porter unicode61')")
    fts.executemany("INSERT INTO p VALUES (?, ?)", [
        (r[0], passage_text(r[2], r[1])) for r in store.catalog.db.execute(
            "SELECT c.id, c.text, s.title FROM chunks c JOIN sources s ON s.id = c.source_id "
            "WHERE c.kb_id = ?", (rec.id,))])
    fts.commit()
    fts.close()
    times["fts5"] = time.perf_counter() - t0
    n = store.catalog.counts(rec.id)["chunks"]
    store.close()
    done.write_text(json.dumps({"chunks": n, "text": made, "vectors": vec_kind,
                                "embed_s": round(embed_s, 1),
                                "index_s": {k: round(v, 1) for k, v in times.items()}}))
    return home


def use_engine(store: Store, engine: str):
    kb = store.open_kb("bench")
    store.catalog.update_settings(kb.id, keyword_engine=engine, keyword_index=engine)
    kb.close()
    kb = store.open_kb("bench")
    kb.indexes()
    assert kb.indexes()[1].engine == engine
    return kb


def queries(n: int) -> list[str]:
    path = SCIFACT / "queries.jsonl"
    if path.exists():
        with open(path, encoding="utf-8") as fh:
            qs = [json.loads(line)["text"] for line in fh]
        return qs[:n]
    return [f"protein expression in tumour cohort {i}" for i in range(n)]


# -- measurements ---------------------------------------------------------------------
def run_modes(store: Store, qs: list[str], modes: tuple[str, ...]) -> dict[str, tuple[list[float], dict]]:
    searcher = Searcher(store)
    out = {}
    for mode in modes:
        lat, stages = [], {}
        for q in qs:
            t1 = time.perf_counter()
            res = searcher.search(["bench"], q, k=8, mode=mode)
            lat.append((time.perf_counter() - t1) * 1000)
            for kbt in res.trace.get("kbs", {}).values():
                for name, v in kbt.items():
                    if name.endswith("_ms"):
                        stages.setdefault(name[:-3], []).append(v)
        out[mode] = (lat, stages)
    return out


def keyword_row(home: Path, store: Store, qs: list[str], rounds: int, engines: tuple[str, ...]) -> None:
    """Raw keyword search per engine and FTS5 on the same terms, interleaved query by query."""
    kb = store.open_kb("bench")
    kis = {e: keyword_engine.load(e, keyword_engine.folder_for(kb.dir, e)) for e in engines}
    fts = sqlite3.connect(home / "fts5.sqlite")
    want = fetch_k(8)

    def fts5(terms: list[str]) -> list[str]:
        words = [w for t in terms for w in re.findall(r"\w+", t)]
        if not words:
            return []
        match = " OR ".join(f'"{w}"' for w in dict.fromkeys(words))
        return [r[0] for r in fts.execute("SELECT cid FROM p WHERE p MATCH ? ORDER BY bm25(p) LIMIT ?",
                                          (match, want))]

    runners = {"fts5": fts5, **{e: (lambda terms, ki=ki: [h.chunk_id for h in ki.search(terms, want)])
                                for e, ki in kis.items()}}
    names = list(runners)
    lat: dict[str, list[float]] = {n: [] for n in names}
    per_round: dict[str, list[float]] = {n: [] for n in names}
    overlap = []
    terms_all = [query_terms(q) for q in qs]
    for r in range(rounds):
        this: dict[str, list[float]] = {n: [] for n in names}
        for i, terms in enumerate(terms_all):
            got = {}
            for n in rotated(names, r + i):
                t0 = time.perf_counter()
                got[n] = runners[n](terms)
                this[n].append((time.perf_counter() - t0) * 1000)
            if r == 0 and len(kis) == 2 and got["whoosh"]:
                overlap.append(len(set(got["whoosh"]) & set(got["tantivy"])) / len(got["whoosh"]))
        for n in names:
            lat[n] += this[n]
            per_round[n].append(statistics.median(this[n]))
    n_chunks = store.catalog.counts(kb.id)["chunks"]
    for n in names:
        print(f"{n_chunks:7} keyword-only {n:8} p50 {statistics.median(lat[n]):7.2f}  "
              f"p95 {pct(lat[n], .95):7.2f} ms   per-round p50 min/med/max {spread(per_round[n])}")
    last = engines[-1]
    fts_r = [f / t for f, t in zip(per_round["fts5"], per_round[last], strict=True)]
    if len(kis) == 2:
        ratios = [w / t for w, t in zip(per_round["whoosh"], per_round["tantivy"], strict=True)]
        print(f"{n_chunks:7} keyword-only whoosh/tantivy p50 ratio min/med/max {spread(ratios)}; "
              f"fts5/tantivy {spread(fts_r)}; top-{want} overlap whoosh vs tantivy "
              f"{statistics.mean(overlap):.3f} over {len(overlap)} queries")
    else:
        print(f"{n_chunks:7} keyword-only fts5/{last} p50 ratio min/med/max {spread(fts_r)}")
    fts.close()
    for ki in kis.values():
        ki.close()


COLD = """
import json, os, resource, sys, time
t0 = time.perf_counter()
from localkb.config import Settings
from localkb.store.kb import Store
from localkb.retrieval.search import Searcher
import numpy, onnxruntime, usearch.index, tantivy  # a Whoosh index imports Whoosh in kb.indexes()
t_imports = time.perf_counter() - t0
t1 = time.perf_counter()
s = Store(Settings.from_env())
kb = s.open_kb('bench')
t_kb = time.perf_counter() - t1
t1 = time.perf_counter()
kb.indexes()
t_indexes = time.perf_counter() - t1
t_open = time.perf_counter() - t0
qs = json.loads(sys.argv[1])
t1 = time.perf_counter(); Searcher(s).search(['bench'], qs[0]); t_first = time.perf_counter() - t1
t1 = time.perf_counter(); Searcher(s).search(['bench'], qs[1]); t_second = time.perf_counter() - t1
for q in qs[2:]:
    Searcher(s).search(['bench'], q)
status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
print(json.dumps({'open': t_open, 'imports': t_imports, 'kb': t_kb, 'indexes': t_indexes,
                  'first': t_first, 'second': t_second,
                  'rss_mb': int(status['VmRSS'].split()[0]) / 1024,
                  'hwm_mb': int(status['VmHWM'].split()[0]) / 1024}))
"""

ADD = """
import json, sys, time
t0 = time.perf_counter()
from localkb.config import Settings
from localkb.ingest.extract import extract_text
from localkb.ingest.pipeline import add_document
from localkb.store.kb import KnowledgeBase, Store
from localkb.store.vectors import VectorIndex
phases = {'imports': time.perf_counter() - t0}
t1 = time.perf_counter()
s = Store(Settings.from_env())
kb = s.open_kb('bench')
phases['store open'] = time.perf_counter() - t1
t1 = time.perf_counter()
vi, ki = kb.indexes()
phases['indexes open'] = time.perf_counter() - t1
t1 = time.perf_counter()
kb.embedder.embed(['warm up the model'])  # the host has its model loaded; time the write
phases['model choice, load, first run'] = time.perf_counter() - t1
spent = {}
def timed(cls, name, label):
    real = getattr(cls, name)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
    setattr(cls, name, wrapper)
timed(type(kb.embedder), 'embed', 'embed')
timed(KnowledgeBase, 'write', 'store write')
timed(type(ki), 'write', 'keyword write')
timed(VectorIndex, 'save', 'vector save')
def hwm_mb():  # VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's RSS at fork
    status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
    return int(status['VmHWM'].split()[0]) / 1024
before = hwm_mb()
i = int(sys.argv[1])
text = ' '.join(f'Note {i} paragraph {p}: the interleukin assay on cohort {i} gave a new reading.'
                for p in range(25))
t1 = time.perf_counter()
add_document(kb, extract_text(text, title=f'Bench note {i}'), key=f'note:{i}')
t_add = time.perf_counter() - t1
vi, ki = kb.indexes()
print(json.dumps({'add': t_add, 'embed': spent.get('embed', 0.0), 'spent': spent, 'phases': phases,
                  'process': time.perf_counter() - t0, 'rss_before_mb': before,
                  'peak_mb': hwm_mb(),
                  'passages': s.catalog.counts(kb.id)['chunks'], 'log': vi.log_size(),
                  'segments': ki.segment_count()}))
"""


ENSURE = """
import json, time
from localkb.config import Settings
from localkb.store import ingest_staging as staging
from localkb.store.kb import Store
s = Store(Settings.from_env())
t0 = time.perf_counter()
staging.ensure_tables(s)
print(json.dumps({'seconds': time.perf_counter() - t0}))
"""


FOLD = """
import json, time
from localkb.config import Settings
from localkb.store.kb import Store
s = Store(Settings.from_env())
kb = s.open_kb('bench')
vi, ki = kb.indexes()
def hwm_mb():
    status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
    return int(status['VmHWM'].split()[0]) / 1024
before = hwm_mb()
records = vi.log_size()['records']
t0 = time.perf_counter()
with s.lock.hold():
    vi.fold(vi.generation)
print(json.dumps({'fold': time.perf_counter() - t0, 'records': records, 'rss_before_mb': before,
                  'peak_mb': hwm_mb(), 'base': len(vi)}))
"""


def subprocess_json(code: str, home: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
                         env={**(os.environ if env is None else env), "LOCALKB_HOME": str(home)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def cold_and_writes(home: Path, store: Store, qs: list[str], rounds: int, n: int,
                    engines: tuple[str, ...]) -> None:
    # Cold starts as installed (bytecode compiled, as pip and pipx leave it) and, interleaved
    # with them, from this source tree as the shell runs it (here: no bytecode written).
    starts = {"installed": installed_env(dict(os.environ), home.parent / "pycache"),
              "source tree": dict(os.environ)}
    cold: dict[str, list[dict]] = {e: [] for e in engines}
    tree: dict[str, list[dict]] = {e: [] for e in engines}
    for r in range(rounds):
        for e in rotated(list(engines), r):
            use_engine(store, e).close()
            for how in rotated(list(starts), r):
                got = subprocess_json(COLD, home, json.dumps(qs[:52]), env=starts[how])
                (cold if how == "installed" else tree)[e].append(got)
    for e in engines:
        t = tree[e]
        print(f"{n:7} cold open {e:8} from the source tree as this shell runs it "
              f"({source_tree_start()}) min/med/max {spread([x['open'] * 1000 for x in t])} ms = imports "
              f"{spread([x['imports'] * 1000 for x in t])} ms")
        c = cold[e]
        print(f"{n:7} cold open {e:8} (new process, as installed) min/med/max "
              f"{spread([x['open'] * 1000 for x in c])} ms"
              f" = imports {spread([x['imports'] * 1000 for x in c])} + store and embedder choice "
              f"{spread([x['kb'] * 1000 for x in c])} + indexes (vector view, log, keyword index) "
              f"{spread([x['indexes'] * 1000 for x in c])} ms; first hybrid query (loads "
              f"the model) {spread([x['first'] * 1000 for x in c])} ms, second "
              f"{spread([x['second'] * 1000 for x in c])} ms; RSS after 50 queries "
              f"{spread([x['rss_mb'] for x in c])} MB (peak {max(x['hwm_mb'] for x in c):.0f})")
    # "add one note" on a copy per engine, so the measured knowledge base stays as built.
    for e in engines:
        use_engine(store, e).close()
        with tempfile.TemporaryDirectory(prefix="localkb-bench-add-") as tmp:
            copy = Path(tmp) / "home"
            shutil.copytree(home, copy, ignore=shutil.ignore_patterns("fts5.sqlite", "built.json"))
            # The bench writes its catalogue directly, so ingest's tables and its chunks_text_hash
            # index do not exist yet: the first add would build that index over every passage
            # (1.2-2.2 s at 300,000), once. A catalogue that only ever had imports (.awkb) pays the
            # same once; one built by adds has it from its first add. Timed and printed apart.
            once = subprocess_json(ENSURE, copy)
            adds = [subprocess_json(ADD, copy, str(i)) for i in range(rounds + 2)]
            fold = subprocess_json(FOLD, copy) if e == engines[0] else None
        print(f"{n:7} ingest's tables and chunks_text_hash index on a catalogue no add has written "
              f"(once per data dir, before the adds): {once['seconds']:.2f} s")
        print(f"{n:7} add one note ({adds[0]['passages'] - n} passages) {e:8} min/med/max "
              f"{spread([a['add'] for a in adds])} s in a process with the model loaded (the host), "
              f"of which embedding {spread([a['embed'] for a in adds])} s, the rest (chunk, "
              f"catalogue, indexes) {spread([a['add'] - a['embed'] for a in adds])} s; "
              f"peak RSS {spread([a['peak_mb'] for a in adds])} MB "
              f"(before the add {statistics.median([a['rss_before_mb'] for a in adds]):.0f} MB, the model "
              f"loaded); vector log after: {adds[-1]['log']}; keyword segments {adds[-1]['segments']}")
        inside = sorted({k for a in adds for k in a["spent"]} - {"embed"})
        print(f"{n:7}   inside the add (median s): " + ", ".join(
            f"{k} {statistics.median([a['spent'].get(k, 0.0) for a in adds]):.3f}" for k in inside)
            + " (store write = catalogue transaction + both indexes)")
        print(f"{n:7}   a new process (what `localkb add` pays before the add, fixed whatever the size; "
              f"median s): " + ", ".join(
                  f"{k} {statistics.median([a['phases'][k] for a in adds]):.3f}" for k in adds[0]["phases"])
              + f"; whole process to the end of the add {spread([a['process'] for a in adds])} s")
        if fold is not None:
            every = adds[-1]["log"]["fold_at"]
            print(f"{n:7}   the write that folds the vector log (one in every ~{every:,} "
                  f"changed passages) into a segment: {fold['fold']:.2f} s for {fold['records']} logged "
                  f"records ({fold['base']:,} vectors), peak RSS {fold['peak_mb']:.0f} MB "
                  f"(before {fold['rss_before_mb']:.0f} MB, no model loaded); a full log's fold and the "
                  f"segments' merges: bench/vector_fold.py")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[3000, 30000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--real-vectors-up-to", type=int, default=3000)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "localkb-bench-search"))
    ap.add_argument("--build-only", action="store_true", help="build (and cache) the knowledge bases")
    ap.add_argument("--whoosh-up-to", type=int, default=None,
                    help="above this many passages build and measure tantivy only (what auto uses there)")
    add_record_flag(ap)
    args = ap.parse_args()
    with recorded(args.record):
        root = Path(args.cache)
        qs = queries(args.queries)
        print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
              "(a shared machine: read the ratios)")
        for size in args.sizes:
            wanted = ENGINES if args.whoosh_up_to is None or size <= args.whoosh_up_to else ("tantivy",)
            home = build(root, size, args.real_vectors_up_to, wanted)
            engines = built_engines(home)
            built = json.loads((home / "built.json").read_text())
            if args.build_only:
                print(f"built {size}: {built}", flush=True)
                continue
            n = built["chunks"]
            print(f"\n== {n:,} passages: {built['text']}; {built['vectors']}; indexes rebuilt from the "
                  f"catalogue in (s): {built['index_s']}")
            store = Store(settings_for(home))
            lat: dict[tuple[str, str], list[float]] = {}
            p50s: dict[tuple[str, str], list[float]] = {}
            stages: dict[tuple[str, str], dict] = {}
            for r in range(args.rounds):
                order = rotated(list(engines), r)
                for e in order:
                    use_engine(store, e)
                    Searcher(store).search(["bench"], "warm up")
                    modes = ("vector", "keyword", "hybrid") if e == order[0] else ("keyword", "hybrid")
                    for mode, (ms, st) in run_modes(store, qs, modes).items():
                        key = ("any" if mode == "vector" else e, mode)
                        lat.setdefault(key, []).extend(ms)
                        p50s.setdefault(key, []).append(statistics.median(ms))
                        into = stages.setdefault(key, {})
                        for name, v in st.items():
                            into.setdefault(name, []).extend(v)
            print(f"{'passages':>8} {'engine':8} {'mode':8} {'p50 ms':>7} {'p95 ms':>7}  "
                  "per-round p50 min/med/max   where the time goes (median ms)")
            for (e, mode), ms in sorted(lat.items(), key=lambda kv: (kv[0][1] != "vector", kv[0])):
                where = "  ".join(f"{k} {statistics.median(v):.2f}" for k, v in stages[(e, mode)].items())
                print(f"{n:8} {e:8} {mode:8} {statistics.median(ms):7.1f} {pct(ms, .95):7.1f}  "
                      f"{spread(p50s[(e, mode)]):>22}   {where}")
            for mode in ("keyword", "hybrid") if len(engines) == 2 else ():
                ratio = [w / t for w, t in zip(p50s[("whoosh", mode)], p50s[("tantivy", mode)], strict=True)]
                print(f"{n:8} {mode} p50 whoosh/tantivy per round min/med/max {spread(ratio)}")
            if len(engines) < len(ENGINES):
                print(f"{n:8} keyword engines measured: {', '.join(engines)} (the others were not built at "
                      "this size: --whoosh-up-to)")
            keyword_row(home, store, qs, args.rounds, engines)
            store.close()
            cold_and_writes(home, Store(settings_for(home)), qs, args.rounds, n, engines)


if __name__ == "__main__":
    main()
