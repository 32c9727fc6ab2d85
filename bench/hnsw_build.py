"""HNSW graph build: speed and recall of the built graph against exact search, per build setting.

    python bench/hnsw_build.py --home DATA_DIR --kb NAME [--n 10000] [--rounds 3]
    python bench/hnsw_build.py --random [--n 10000]

Vectors come from a knowledge base's catalogue (real model vectors; ``--home`` is a LocalKB
data dir, opened read-only) or are random unit vectors. 300 of them are held out as queries;
the rest are indexed once per setting per round, settings in rotating order (A/B, B/A, ...).
Printed per setting: build seconds and vectors/s (min/median/max over rounds) and recall of
the exact top 32 (what the search asks for when k = 8) at the product's search expansion
(8x the candidates) and at usearch's default 64, with the speed-up against the first setting
per round.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import rotated, spread

from localkb.store import vectors as vectors_mod


def load(args) -> tuple[np.ndarray, str]:
    if args.random:
        rng = np.random.default_rng(1)
        v = rng.standard_normal((args.n + 300, 384)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True), "random unit vectors"
    db = sqlite3.connect(f"file:{Path(args.home) / 'catalog.sqlite'}?mode=ro", uri=True)
    kb_id, model, dim = db.execute("SELECT id, model, dim FROM kbs WHERE id = ? OR name = ?",
                                   (args.kb, args.kb)).fetchone()
    rows = db.execute("SELECT vector FROM chunks WHERE kb_id = ? ORDER BY rowid LIMIT ?",
                      (kb_id, args.n + 300)).fetchall()
    return np.stack([np.frombuffer(r[0], dtype="<f4") for r in rows]), f"{model} vectors ({dim}-d)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home")
    ap.add_argument("--kb")
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settings", nargs="+", default=["f32:128", "f32:64", "f16:128", "f16:64", "i8:64"],
                    help="dtype:expansion_add pairs, the first is the baseline")
    args = ap.parse_args()
    v, kind = load(args)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(v))
    queries, base = v[perm[:300]], np.ascontiguousarray(v[perm[300:]])
    k = 32
    truth = np.argsort(-(queries @ base.T), axis=1)[:, :k]
    keys = np.arange(len(base), dtype=np.uint64)
    Index = vectors_mod._index_class()
    settings = [(s.split(":")[0], int(s.split(":")[1])) for s in args.settings]
    secs: dict = {s: [] for s in settings}
    recall: dict = {s: {} for s in settings}
    for r in range(args.rounds):
        for s in rotated(settings, r):
            dtype, ea = s
            ix = Index(ndim=base.shape[1], metric="cos", dtype=dtype, connectivity=16, expansion_add=ea)
            t0 = time.perf_counter()
            ix.add(keys, base)
            secs[s].append(time.perf_counter() - t0)
            if r == 0:
                for ef in (64, vectors_mod.EXPANSION_PER_CANDIDATE * k):
                    ix.expansion_search = ef
                    got = np.asarray(ix.search(queries, k).keys)
                    recall[s][ef] = float(np.mean([len(set(got[i].tolist()) & set(truth[i].tolist())) / k
                                                   for i in range(len(queries))]))
    print(f"{len(base):,} {kind}, {len(queries)} held-out queries, connectivity 16, {args.rounds} rounds")
    first = settings[0]
    for s in settings:
        ratio = [b / x for b, x in zip(secs[first], secs[s], strict=True)]
        rec = "  ".join(f"recall@{k} ef {ef} {x:.4f}" for ef, x in recall[s].items())
        print(f"{s[0]:>4} expansion_add {s[1]:4}: build s {spread(secs[s])}  vectors/s "
              f"{spread([len(base) / x for x in secs[s]], '.0f')}  speed-up vs {first[0]}:{first[1]} "
              f"{spread(ratio)}  {rec}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
