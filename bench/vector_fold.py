"""The write that folds the vector log, at the size of a real knowledge base: seconds and peak RSS.

    python bench/vector_fold.py --index KB_DIR/vectors-all-MiniLM-L6-v2.usearch \
        [--compare OTHER_CHECKOUT] [--rounds 2] [--folds 4] [--queries 200]

Per round and per checkout (this one, and ``--compare``'s ``host/`` on PYTHONPATH, in
rotating order), the index files (base, listing, log) are copied into a temporary folder
and a new process opens them, then ``--folds`` times: fills the log up to its fold line
with random unit vectors (batches of 256, each saved as a write would), and times the next
"add one note" (7 vectors and a save: the write that folds). Peak RSS is VmHWM, reset
before each folding write (``/proc/self/clear_refs``), so it is that write's own peak; the
process holds no model. After the folds, vector searches (top 40, random unit queries) are
timed over what the folds left (segments, or a new base) and over the files as copied,
interleaved query by query: the search cost of the segments. Printed: min/median/max per
fold number of each checkout, and the per-round ratio.

With ``--compact`` (this checkout's API: compaction off the write path), after each folding
write the compaction it left due runs as the host's thread would, between writes, timed and
its peak RSS taken apart from the write's; the worst and median "add one note" over all
folds are printed beside the compactions' own seconds and peak.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import rotated, spread

_RUN = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from localkb.store.vectors import VectorIndex, fold_threshold

path, folds, nq, with_compact = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[5] == '1'
compactions = []
meta = json.loads(path.with_suffix('.json').read_text())
def hwm_mb():
    return int([l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]) / 1024
def rss_mb():
    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS:')][0].split()[1]) / 1024
rng = np.random.default_rng(11)
def unit(n):
    v = rng.standard_normal((n, meta['dim'])).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)
t = time.perf_counter()
vi = VectorIndex.load(path, meta['model'], meta['dim'])
opened = time.perf_counter() - t
gen, key, out = vi.generation, 2**40, []
for _ in range(folds):
    while vi.log_size()['records'] + 256 + 7 <= fold_threshold(vi.base_count):
        gen += 1
        vi.upsert(np.arange(key, key + 256, dtype=np.uint64), unit(256)); key += 256
        vi.save(gen)
    need = fold_threshold(vi.base_count) - vi.log_size()['records']
    if need > 0:
        gen += 1
        vi.upsert(np.arange(key, key + need, dtype=np.uint64), unit(need)); key += need
        vi.save(gen)
    logged = vi.log_size()['records']
    note = unit(7)
    open('/proc/self/clear_refs', 'w').write('5')
    before = rss_mb()
    gen += 1
    t = time.perf_counter()
    vi.upsert(np.arange(key, key + 7, dtype=np.uint64), note); key += 7
    vi.save(gen)
    secs = time.perf_counter() - t
    out.append({'fold': secs, 'logged': logged, 'rss_before_mb': before, 'peak_mb': hwm_mb(),
                'after': vi.log_size().get('segments', []), 'base': vi.base_count,
                'records': vi.log_size()['records']})
    if with_compact and vi.compaction_plan() is not None:
        from localkb.store.vectors import compact
        open('/proc/self/clear_refs', 'w').write('5')
        before = rss_mb()
        t = time.perf_counter()
        res = compact(path, meta['model'], meta['dim'])
        compactions.append({'after_fold': len(out), 'seconds': time.perf_counter() - t,
                            'rss_before_mb': before, 'peak_mb': hwm_mb(),
                            'steps': [(x['kind'], x['inputs'], x['vectors']) for x in res['steps']]})
fresh = VectorIndex.load(path, meta['model'], meta['dim'])
copied = VectorIndex.load(Path(sys.argv[4]), meta['model'], meta['dim'])
lat = {'after folds': [], 'as copied': []}
for i, q in enumerate(unit(nq)):
    for name, ix in ((('after folds', fresh), ('as copied', copied)) if i % 2 else
                     (('as copied', copied), ('after folds', fresh))):
        t = time.perf_counter()
        ix.search(q, 40, exact_below=5000)
        lat[name].append((time.perf_counter() - t) * 1000)
print(json.dumps({'open': opened, 'folds': out, 'count': len(fresh), 'search_ms': lat,
                  'compactions': compactions}))
"""


def run(host: Path, index: Path, folds: int, queries: int, with_compact: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="localkb-bench-fold-") as tmp:
        copies = []
        for name in ("work", "asis"):
            folder = Path(tmp) / name
            folder.mkdir()
            for src in index.parent.glob(f"{index.stem}*"):
                shutil.copy2(src, folder / src.name)
            copies.append(folder / index.name)
        env = {**os.environ, "PYTHONPATH": str(host)}
        res = subprocess.run([sys.executable, "-c", _RUN, str(copies[0]), str(folds), str(queries),
                              str(copies[1]), "1" if with_compact else "0"], capture_output=True, text=True,
                             env=env, check=False)
        if res.returncode != 0:
            raise SystemExit(f"fold bench with {host} failed: {res.stderr[-800:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=Path, required=True, help="a knowledge base's vectors-<model>.usearch")
    ap.add_argument("--compare", type=Path, help="another checkout, interleaved with this one")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--compact", action="store_true",
                    help="run the compaction each fold leaves due between writes (this checkout only)")
    args = ap.parse_args()
    hosts = {"this": Path(__file__).resolve().parents[1] / "host"}
    if args.compare:
        hosts["other"] = args.compare / "host"
    meta = json.loads(args.index.with_suffix(".json").read_text())
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{meta['count']:,} vectors in the base ({meta['dim']}-d), random unit vectors logged")
    got: dict[str, list[dict]] = {k: [] for k in hosts}
    for r in range(args.rounds):
        for name in rotated(list(hosts), r):
            got[name].append(run(hosts[name], args.index, args.folds, args.queries,
                                 args.compact and name == "this"))
    for name, runs in got.items():
        print(f"{name} ({hosts[name]}): open {spread([x['open'] * 1000 for x in runs])} ms")
        for i in range(args.folds):
            f = [x["folds"][i] for x in runs]
            print(f"  fold {i + 1}: the add of 7 vectors that folds {f[0]['logged']:,} logged records: "
                  f"{spread([x['fold'] for x in f])} s, "
                  f"peak RSS {spread([x['peak_mb'] for x in f], '.0f')} MB "
                  f"(before {statistics.median([x['rss_before_mb'] for x in f]):.0f} MB); after: "
                  f"segments {f[-1]['after']}, base {f[-1]['base']:,}")
        adds = [f["fold"] for x in runs for f in x["folds"]]
        peaks = [f["peak_mb"] for x in runs for f in x["folds"]]
        print(f"  add one note (the folding write), all folds: median {statistics.median(adds):.3f} s, "
              f"worst {max(adds):.3f} s; peak RSS median {statistics.median(peaks):.0f} MB, "
              f"worst {max(peaks):.0f} MB")
        for x in runs:
            for c in x.get("compactions", []):
                print(f"  compaction after fold {c['after_fold']}: {c['steps']}: {c['seconds']:.2f} s, "
                      f"peak RSS {c['peak_mb']:.0f} MB (before {c['rss_before_mb']:.0f} MB)")
        for label in ("as copied", "after folds"):
            p50 = [statistics.median(x["search_ms"][label]) for x in runs]
            p95 = [sorted(x["search_ms"][label])[int(0.95 * len(x["search_ms"][label]))] for x in runs]
            print(f"  vector search top 40, {label}: p50 {spread(p50)} ms, p95 {spread(p95)} ms")
    if "other" in got:
        for i in range(args.folds):
            ratio = [o["folds"][i]["fold"] / t["folds"][i]["fold"]
                     for t, o in zip(got["this"], got["other"], strict=True)]
            print(f"fold {i + 1} time other/this per round min/med/max {spread(ratio)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
