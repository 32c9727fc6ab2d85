"""Ingestion: pipeline throughput against the raw model, peak memory of big sources, unchanged re-adds.

    python bench/ingest.py                      # throughput, 600 SciFact abstracts, 3 rounds
    python bench/ingest.py --rounds 3 --docs 600
    python bench/ingest.py --big-text-mb 30     # peak RSS adding a generated 30 MB text file
    python bench/ingest.py --pdf-pages 1000     # peak RSS adding a generated 1,000-page PDF
    python bench/ingest.py --python-docs        # re-adding the 317 Python library pages unchanged
    python bench/ingest.py --all                # everything above

Throughput: the same passages are embedded by the full pipeline (extract, chunk, embed,
write: ``add_paths`` on a folder of Markdown files, into a fresh store each round) and by
the bare embedder, interleaved over the rounds with the order alternating (A/B, B/A, ...)
so load on a shared machine hits both alike; it prints min/median/max of each and of the
per-round ratio raw/pipeline.

Peak RSS is measured in a fresh subprocess per case (its VmHWM, ``_common.peak_rss_mb``:
the model, the tokenizer, onnxruntime's arenas and the store included; not ``ru_maxrss``,
which in a child starts at the bench's own RSS). The unchanged re-add
is a fresh ``localkb add`` process, timed from start to exit.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import rotated, scifact_docs, spread

from localkb.config import Settings
from localkb.ingest.chunk import passage_text
from localkb.ingest.pipeline import add_paths
from localkb.store.kb import Store

PYTHON_DOCS = Path("/usr/share/doc/python3.11/html/library")
WORDS = ("storage network quota error retry cable proxy backup archive restore invoice customer ledger "
         "payment refund shipment router switch firmware kernel module driver sensor valve pump motor "
         "bearing gasket filter relay fuse breaker panel meter the a of and to in for on with").split()


def _cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def row(label: str, xs: list[float], note: str = "") -> None:
    print(f"{label:28} {spread(xs):>24}{note}")


def throughput(docs: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "corpus"
        folder.mkdir()
        for d in scifact_docs(docs):
            (folder / f"{d['_id']}.md").write_text(f"# {d['title']}\n\n{d['text']}\n", encoding="utf-8")
        pipe_s: list[float] = []
        raw_s: list[float] = []
        pipe_cpu: list[float] = []
        raw_cpu: list[float] = []
        waits: list[dict] = []
        texts: list[str] = []
        tokens = 0
        variant = None
        for r in range(rounds):
            store = Store(Settings.from_env({**os.environ, "LOCALKB_HOME": str(Path(tmp) / f"data{r}")}))
            store.create_kb("bench")
            kb = store.open_kb("bench")
            kb.embedder.load()
            kb.embedder.embed(["warm up the session"] * 8)
            variant = kb.embedder.describe()["variant"]

            def pipeline(kb=kb, store=store) -> None:
                nonlocal texts, tokens
                t0, c0 = time.perf_counter(), _cpu()
                report = add_paths(kb, [str(folder)])
                pipe_s.append(time.perf_counter() - t0)
                pipe_cpu.append(_cpu() - c0)
                waits.append(report.timings)
                if not texts:
                    rows = store.catalog.db.execute(
                        "SELECT s.title, c.text FROM chunks c JOIN sources s ON s.id = c.source_id "
                        "ORDER BY s.key, c.idx").fetchall()
                    texts = [passage_text(t, x) for t, x in rows]
                    tokens = sum(len(e.ids) for e in kb.embedder.tokenizer.encode_batch(texts))
                    assert report.totals()["added"] == len(texts), report.totals()

            def raw(kb=kb) -> None:
                t0, c0 = time.perf_counter(), _cpu()
                kb.embedder.embed(texts)
                raw_s.append(time.perf_counter() - t0)
                raw_cpu.append(_cpu() - c0)

            for step in rotated([pipeline, raw], r):  # round 0 runs the pipeline first: its passages
                step()
            store.close()
        ratios = [raw / pipe for raw, pipe in zip(raw_s, pipe_s, strict=True)]
        print(f"throughput: {docs} documents -> {len(texts)} passages, {tokens:,} model tokens; "
              f"model {variant}; {rounds} rounds interleaved (pipeline/raw, raw/pipeline, ...); "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"{'':28} {'min/median/max':>24}")
        row("pipeline seconds", pipe_s)
        row("raw model seconds", raw_s)
        row("pipeline tokens/s", [tokens / s for s in pipe_s])
        row("raw model tokens/s", [tokens / s for s in raw_s])
        row("pipeline / raw (per round)", ratios, "   (target >= 0.85)")
        row("CPU s: pipeline", pipe_cpu)
        row("CPU s: raw model", raw_cpu)
        row("CPU raw / pipeline", [r / p for r, p in zip(raw_cpu, pipe_cpu, strict=True)],
            "   (the work besides the model; load on the machine does not move it)")
        for key in ("wait_s", "embed_s", "write_s"):
            row("pipeline " + key, [w[key] for w in waits])
        print("rounds: " + ", ".join(f"{p:.1f}s/{r:.1f}s = {x:.2f}" for p, r, x in
                                      zip(pipe_s, raw_s, ratios, strict=True)))


_PEAK = ("import sys, time; sys.path.insert(0, sys.argv[2]); from _common import peak_rss_mb; "
         "from localkb.cli import main; t = time.perf_counter(); "
         "rc = main(['add', 'Big', sys.argv[1], '--json']); "
         "print('PEAK', round(peak_rss_mb()), round(time.perf_counter() - t, 1), file=sys.stderr); "
         "sys.exit(rc)")


def peak_rss(label: str, path: Path, home: Path, model: str) -> None:
    env = {**os.environ, "LOCALKB_HOME": str(home)}
    subprocess.run([sys.executable, "-m", "localkb", "kb", "create", "Big", "--model", model], env=env,
                   check=True, capture_output=True)
    res = subprocess.run([sys.executable, "-c", _PEAK, str(path), str(Path(__file__).resolve().parent)],
                         env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        print(f"{label}: the add failed ({res.returncode}): {res.stderr[-800:]}")
        return
    import json

    report = json.loads(res.stdout)
    src = report["sources"][0]
    mb, secs = res.stderr.rsplit("PEAK", 1)[1].split()[:2]
    print(f"{label} ({model}): {path.stat().st_size / 1e6:.1f} MB -> {src['total']:,} passages "
          f"({src['status']}), "
          f"peak RSS {mb} MB (bound 600 MB), {secs} s, {report['tokens'] / float(secs):,.0f} tokens/s")


def big_text(mb: int, model: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.txt"
        rng = random.Random(30)
        with open(path, "w", encoding="utf-8") as fh:
            i = 0
            while fh.tell() < mb * 1_000_000:
                fh.write(" ".join(rng.choice(WORDS) for _ in range(60)) + f". Line {i}.\n\n")
                i += 1
        peak_rss(f"{mb} MB text file", path, Path(tmp) / "data", model)


def big_pdf(pages: int, model: str) -> None:
    from fpdf import FPDF

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.pdf"
        rng = random.Random(1000)
        pdf = FPDF()
        pdf.set_font("helvetica", size=10)
        for p in range(pages):
            pdf.add_page()
            pdf.multi_cell(0, 5, f"Page {p + 1}. " + " ".join(rng.choice(WORDS) for _ in range(380)))
        pdf.output(str(path))
        peak_rss(f"{pages}-page PDF", path, Path(tmp) / "data", model)


def python_docs(model: str) -> None:
    if not PYTHON_DOCS.is_dir():
        print(f"python docs: {PYTHON_DOCS} is not installed (Debian's python3.11-doc)")
        return
    import shutil

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "LOCALKB_HOME": str(Path(tmp) / "data")}
        folder = Path(tmp) / "library"
        shutil.copytree(PYTHON_DOCS, folder)  # a copy: the touch below must not change system files

        def add() -> tuple[float, str]:
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "localkb", "add", "Py", str(folder)], env=env,
                                 capture_output=True, text=True, check=False)
            return time.perf_counter() - t0, res.stdout.strip().splitlines()[-1]

        subprocess.run([sys.executable, "-m", "localkb", "kb", "create", "Py", "--model", model], env=env,
                       check=True, capture_output=True)
        first_s, first = add()
        print(f"python docs ({model}), first add: {first_s:.1f} s — {first}")
        again = [add() for _ in range(3)]
        print("python docs, re-added unchanged (a fresh process each): "
              + ", ".join(f"{s:.2f} s" for s, _ in again) + f" — {again[-1][1]}")
        later = time.time() + 10
        for p in folder.rglob("*"):
            if p.is_file():
                os.utime(p, (later, later))
        touched_s, touched = add()
        print(f"python docs, every file touched (mtime changed, bytes the same): {touched_s:.2f} s "
              f"— {touched}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-text-mb", type=int, default=0)
    ap.add_argument("--pdf-pages", type=int, default=0)
    ap.add_argument("--python-docs", action="store_true")
    ap.add_argument("--big-model", default="all-MiniLM-L6-v2",
                    help="model of the big-file and Python-docs cases (hashing-256: the same streaming "
                         "and unchanged path without the model's time, for a loaded machine)")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--all", action="store_true")
    args = ap.parse_args()
    if args.all:
        args.big_text_mb = args.big_text_mb or 30
        args.pdf_pages = args.pdf_pages or 1000
        args.python_docs = True
    if not args.no_throughput:
        throughput(args.docs, args.rounds)
    if args.pdf_pages:
        big_pdf(args.pdf_pages, args.big_model)
    if args.big_text_mb:
        big_text(args.big_text_mb, args.big_model)
    if args.python_docs:
        python_docs(args.big_model)


if __name__ == "__main__":
    main()
