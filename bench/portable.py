"""Export and import speed of .awkb files, and their size against vectors written as JSON numbers.

    python bench/portable.py [--chunks 5000] [--model all-MiniLM-L6-v2]
    python bench/portable.py --random-vectors --chunks 30000 --compare OTHER_CHECKOUT [--repeat 3]
    python bench/portable.py --chunks 10000 --real-vectors-from KB_DIR/vectors-<model>.usearch [--repeat 3]
    python bench/portable.py --chunks 10000 --compare OTHER_CHECKOUT --archive /tmp/bench.awkb

Builds a knowledge base in a temporary data dir by importing generated passages
(real vectors from the chosen model), then times export and import and prints
MB/s of the file written/read. The size ratio compares the same document with
vectors as base64 of float32 (the format) and as JSON numbers (shortest float32
repr, and Python's float repr of the same values).

With ``--compare``, the same file is imported by this checkout and by another one (its
``host/`` on PYTHONPATH), each import a ``localkb import`` process of its own into an empty
data dir, the two in rotating order over ``--repeat`` rounds: MB/s and peak RSS min/median/max
of each, and the per-round speed ratio.

With ``--real-vectors-from`` (a knowledge base's vector index, e.g. the SciFact eval's), the
same passages are written twice, once with random unit vectors and once with that index's
real passage vectors, and both files are imported by this checkout in rotating order: the
HNSW graph an import builds costs more on random unit vectors (no clusters to descend) than
on real ones, so the random-vector figure is the slow case, not the typical one.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from localkb.config import Settings
from localkb.ingest.chunk import passage_text
from localkb.portable.archive import export_kb, import_kb
from localkb.store.kb import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import rotated, spread

_TIMED = ("import sys, time\nfrom localkb.cli import main\nt = time.perf_counter()\n"
          "c = time.process_time()\nrc = main(['import', sys.argv[1], '--json'])\n"
          "secs = time.perf_counter() - t\ncpu = time.process_time() - c\n"
          "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
          "print('TIMED', secs, int(hwm) / 1024, cpu, file=sys.stderr)\nsys.exit(rc)\n")


def timed_import(host: Path, path: Path, home: Path) -> tuple[float, float, float]:
    """Seconds of one ``localkb import`` (the call, not the process start), its peak RSS in MiB,
    and the CPU seconds of all its threads in the call (less moved by other load than the wall time)."""
    # Compaction off: an import leaves the graph to a detached ``kb compact --auto``, which would
    # run beside the next round's import (the graph is timed on its own: see ``main``).
    env = {**os.environ, "LOCALKB_HOME": str(home), "PYTHONPATH": str(host), "LOCALKB_COMPACT": "off"}
    res = subprocess.run([sys.executable, "-c", _TIMED, str(path)], capture_output=True, text=True,
                         env=env, check=False)
    line = [x for x in res.stderr.splitlines() if x.startswith("TIMED ")]
    if res.returncode != 0 or not line:
        raise SystemExit(f"import with {host} failed: {res.stderr[-500:]}")
    secs, peak, cpu = line[0].split()[1:]
    return float(secs), float(peak), float(cpu)


def real_vectors(path: Path, n: int, dim: int) -> np.ndarray:
    """The first ``n`` vectors of a saved usearch index (real passage vectors of some model)."""
    import onnxruntime  # noqa: F401  (before usearch's extension: see store/vectors.py)
    from usearch.index import Index

    ix = Index(ndim=dim, metric="cos")
    ix.view(str(path))
    if len(ix) < n:
        raise SystemExit(f"{path} holds {len(ix):,} vectors, fewer than --chunks {n:,}")
    keys = np.asarray(ix.keys, dtype=np.uint64)[:n]
    return np.asarray(ix.get(keys), dtype=np.float32).reshape(n, dim)


def compare_vectors(files: dict[str, bytes], rounds: int) -> None:
    here = Path(__file__).resolve().parents[1] / "host"
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in files}
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            (Path(tmp) / f"{name}.awkb").write_bytes(data)
        for r in range(rounds):
            for name in rotated(list(files), r):
                home = Path(tmp) / f"home-{name}-{r}"
                got[name].append(timed_import(here, Path(tmp) / f"{name}.awkb", home))
    for name, runs in got.items():
        mb = len(files[name]) / 1e6
        print(f"import, {name} vectors ({mb:.1f} MB file): MB/s {spread([mb / s for s, _, _ in runs])}, "
              f"seconds {spread([s for s, _, _ in runs])}, "
              f"peak RSS MiB {spread([p for _, p, _ in runs], '.0f')}")
    ratio = [a[0] / b[0] for a, b in zip(got["random"], got["real"], strict=True)]
    print(f"import seconds random/real per round min/med/max {spread(ratio)} over {rounds} rounds")


def compare(data: bytes, other: Path, rounds: int) -> None:
    here = Path(__file__).resolve().parents[1] / "host"
    hosts = {"this": here, "other": other / "host"}
    mb = len(data) / 1e6
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in hosts}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.awkb"
        path.write_bytes(data)
        for r in range(rounds):
            for name in rotated(list(hosts), r):
                got[name].append(timed_import(hosts[name], path, Path(tmp) / f"home-{name}-{r}"))
    for name, runs in got.items():
        print(f"import ({name}: {hosts[name]}): MB/s {spread([mb / s for s, _, _ in runs])}, "
              f"seconds {spread([s for s, _, _ in runs])}, CPU seconds {spread([c for _, _, c in runs])}, "
              f"peak RSS MiB {spread([p for _, p, _ in runs], '.0f')}")
    ratio = [o[0] / t[0] for t, o in zip(got["this"], got["other"], strict=True)]
    print(f"import speed this/other per round min/med/max {spread(ratio)} over {rounds} rounds")
    ratio = [o[2] / t[2] for t, o in zip(got["this"], got["other"], strict=True)]
    print(f"import CPU other/this per round min/med/max {spread(ratio)}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")

WORDS = ("the of and a to in is was for on that with as by at from his her it an were are which "
         "river mill engine valve harbour garden letter winter market bridge signal copper "
         "lantern orchard voyage ledger furnace meadow")


def generated(store: Store, model: str, n: int, seed: int = 1, *, random_vectors: bool = False,
              vectors: np.ndarray | None = None) -> bytes:
    """An .awkb with ``n`` passages of English-like filler and the model's vectors (or random unit ones)."""
    rng = random.Random(seed)
    words = WORDS.split()
    emb = store.models.get(model)
    sources, chunks = [], []
    per = 50
    for start in range(0, n, per):
        sid, title = f"s{start}", f"Generated document {start}"
        count = min(per, n - start)
        sources.append({"id": sid, "key": f"gen:{start}", "type": "text", "title": title, "url": None,
                        "file_name": None, "content_hash": "0" * 64, "captured_by": "cli",
                        "chunk_count": count, "pages": None, "lang": "en", "added_at": 1.7e9,
                        "updated_at": 1.7e9})
        for i in range(count):
            text = " ".join(rng.choice(words) for _ in range(150))
            chunks.append({"id": f"{sid}-{i}", "source": sid, "index": i, "text": text, "page": None,
                           "tokens": 150,
                           "text_hash": hashlib.sha256(passage_text(title, text).encode()).hexdigest()[:32],
                           "indexed_by": "cli", "indexed_at": 1.7e9, "_p": passage_text(title, text)})
    texts = [c.pop("_p") for c in chunks]
    if vectors is not None:
        vecs = vectors[:n]
    elif random_vectors:  # import never re-embeds, but the graph it builds is slower on these
        vecs = np.random.default_rng(seed).standard_normal((n, emb.dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    else:
        vecs = emb.embed(texts)
    for c, v in zip(chunks, vecs, strict=True):
        c["vector"] = base64.b64encode(v.astype("<f4").tobytes()).decode()
    doc = {"format": "awkb", "version": 1, "model": {"id": model, "dim": emb.dim, "normalised": True},
           "kb": {"name": "Bench", "privacy": "device"}, "sources": sources, "chunks": chunks,
           "counts": {"sources": len(sources), "chunks": len(chunks)}}
    return gzip.compress(json.dumps(doc).encode(), 6)


def as_numbers(data: bytes, *, float32_repr: bool) -> bytes:
    doc = json.loads(gzip.decompress(data))
    for c in doc["chunks"]:
        vec = np.frombuffer(base64.b64decode(c["vector"]), "<f4")
        if float32_repr:  # shortest text that reads back as the same float32
            c["vector"] = [json.loads(np.format_float_positional(x, unique=True, trim="-")) for x in vec]
        else:
            c["vector"] = [float(x) for x in vec]
    return gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=5000)
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--random-vectors", action="store_true",
                    help="random unit vectors instead of embedding the passages (import speed is the same)")
    ap.add_argument("--keyword-engine", choices=["auto", "whoosh", "tantivy"], default="auto")
    ap.add_argument("--compare", type=Path, help="another checkout: its import, interleaved with this one's")
    ap.add_argument("--real-vectors-from", type=Path,
                    help="a vector index: import its real vectors and random ones, interleaved")
    ap.add_argument("--archive", type=Path,
                    help="with --compare: import this file if it exists, else write the generated one "
                         "there (so repeated comparisons embed the passages once)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Settings.from_env({**os.environ, "LOCALKB_HOME": tmp,
                                         "LOCALKB_KEYWORD_ENGINE": args.keyword_engine}))
        if args.real_vectors_from:
            dim = store.models.get(args.model).dim
            files = {"random": generated(store, args.model, args.chunks, random_vectors=True),
                     "real": generated(store, args.model, args.chunks,
                                       vectors=real_vectors(args.real_vectors_from, args.chunks, dim))}
            print(f"{args.chunks} chunks, the same passages; real vectors from {args.real_vectors_from}")
            compare_vectors(files, args.repeat)
            store.close()
            return 0
        t = time.perf_counter()
        if args.archive and args.archive.exists():
            seed_file = args.archive.read_bytes()
            print(f"archive {args.archive} (generated earlier)")
        else:
            seed_file = generated(store, args.model, args.chunks, random_vectors=args.random_vectors)
            kind = "random unit vectors" if args.random_vectors else args.model
            print(f"generated {args.chunks} chunks ({kind}) in {time.perf_counter() - t:.1f} s; "
                  f"keyword engine {args.keyword_engine}")
            if args.archive:
                args.archive.write_bytes(seed_file)
        if args.compare:
            print(f"file: {len(seed_file):,} bytes, {len(gzip.decompress(seed_file)) / 1e6:.1f} MB of JSON")
            compare(seed_file, args.compare, args.repeat)
            store.close()
            return 0
        import_kb(store, io.BytesIO(seed_file), name="Bench")
        kb = store.open_kb("Bench")
        exports, imports, graphs = [], [], []
        for _ in range(args.repeat):
            buf = io.BytesIO()
            t = time.perf_counter()
            report = export_kb(kb, buf)
            exports.append(time.perf_counter() - t)
            data = buf.getvalue()
            t = time.perf_counter()
            made = import_kb(store, io.BytesIO(data))
            imports.append(time.perf_counter() - t)
            # The graph the import leaves to compaction (the host's thread, a detached process).
            t = time.perf_counter()
            done = store.open_kb(made.knowledge_base["id"]).compact()
            graphs.append(time.perf_counter() - t)
            assert done["state"] == "compacted", done
            store.delete_kb(made.knowledge_base["id"])
        mb = len(data) / 1e6
        raw_mb = len(gzip.decompress(data)) / 1e6
        print(f"file: {len(data):,} bytes ({raw_mb:.1f} MB of JSON), {report.chunks} chunks, "
              f"{report.sources} sources")
        print(f"export: {mb / min(exports):.1f} MB/s of file ({min(exports):.2f} s best of {args.repeat})")
        print(f"import: {mb / min(imports):.1f} MB/s of file ({min(imports):.2f} s best of {args.repeat}, "
              f"median {statistics.median(imports):.2f} s; validation + one transaction + derived "
              f"indexes, the vectors listed flat; keyword engine {made.knowledge_base['keyword_engine']})")
        both = statistics.median([a + b for a, b in zip(imports, graphs, strict=True)])
        print(f"graph: {statistics.median(graphs):.2f} s median (min {min(graphs):.2f}) of compaction "
              f"after each import, off its path (searched exactly until then); import + graph "
              f"{mb / both:.1f} MB/s median")
        for label, f32 in (("float32 shortest repr", True), ("Python float repr", False)):
            numbers = as_numbers(data, float32_repr=f32)
            raw_numbers = len(gzip.decompress(numbers))
            print(f"vectors as JSON numbers ({label}): {len(numbers):,} bytes gzipped, "
                  f"{len(numbers) / len(data):.2f}x the base64 file; uncompressed "
                  f"{raw_numbers / 1e6:.1f} MB, {raw_numbers / (raw_mb * 1e6):.2f}x")
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
