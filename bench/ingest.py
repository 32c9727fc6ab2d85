"""Ingestion: pipeline throughput against the raw model, peak memory of big sources, unchanged re-adds.

    python bench/ingest.py                      # throughput: 40 Python library pages, 3 rounds
    python bench/ingest.py --pages 20 --rounds 3
    python bench/ingest.py --pages 40 --rounds 3 --keyword-engine whoosh tantivy   # the job per engine
    python bench/ingest.py --corpus scifact --docs 600
    python bench/ingest.py --big-text-mb 30     # peak RSS adding a generated 30 MB text file
    python bench/ingest.py --pdf-pages 1000     # peak RSS adding a generated 1,000-page PDF
    python bench/ingest.py --python-docs        # first add and re-adds of the 317 Python library pages
    python bench/ingest.py --all                # everything above

Throughput is the issue's question: what a whole ``localkb add`` job (``add_paths`` on a
folder: walk, fingerprint, extract, chunk, embed, write the catalogue and both indexes,
count the rows) gets out of the model, against the bare model embedding the same
passages. The corpus is the Python library reference's HTML (Debian's python3.11-doc,
every k-th of its 317 pages; trafilatura's extraction is part of the job), or SciFact
abstracts as Markdown files. Each round uses a fresh store and the same loaded model;
the model, loaded before the clock starts, is the one both sides use.

The bare model is timed twice on the same passages (their ``passage_text``, in the order
the job met them):

- *same batching*: cut into windows of ``pipeline.EMBED_WINDOW`` tokens, each embedded
  with one ``embed`` call (length-sorted model batches within the window): the best a
  streaming job can batch, since it cannot sort passages it has not read yet. The
  headline ratio, ``job / bare (same batching)``, is job tokens/s over bare tokens/s.
- *one sort*: all passages in one ``embed`` call, sorted by length at once; the ratio
  against it is printed too (the cost of streaming included).

The three are interleaved within each round with the order rotating (A/B/C, B/C/A, ...)
so load on a shared machine hits all alike; min/median/max over the rounds. The model's
padded tokens (batch rows x the longest row) show what each side really computed. The
job's CPU is split by thread (its reader and committer time their own; the rest is the
model and the writer), so the bench says which part of the job competes with the model.

Peak RSS is measured in a fresh subprocess per case (its VmHWM, ``_common.peak_rss_mb``:
the model, the tokenizer, onnxruntime's arenas and the store included; not ``ru_maxrss``,
which in a child starts at the bench's own RSS). The model is built and chosen before (the
models folder is ``LOCALKB_MODEL_DIR``, by default this checkout's), so the add measured is
the add. The unchanged re-add is a fresh ``localkb add`` process, timed from start to exit.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, rotated, scifact_docs, spread

# Built models are shared by every round and subprocess (as in the tests): a fresh data
# folder per round must not rebuild them, nor time the variants again under other load.
os.environ.setdefault("LOCALKB_MODEL_DIR", str(REPO / ".venv" / "localkb-models"))

from localkb.config import Settings
from localkb.ingest import pipeline as pipeline_mod
from localkb.ingest.chunk import passage_text
from localkb.ingest.pipeline import add_paths
from localkb.store import keyword_engine
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
    print(f"{label:34} {spread(xs):>26}{note}")


def _corpus(folder: Path, corpus: str, docs: int, pages: int) -> str:
    folder.mkdir()
    if corpus == "python-docs":
        every = sorted(PYTHON_DOCS.glob("*.html"))
        step = max(1, len(every) // pages)
        chosen = every[::step][:pages]
        for p in chosen:
            shutil.copy(p, folder / p.name)
        return f"{len(chosen)} Python library pages (every {step}th of {len(every)})"
    for d in scifact_docs(docs):
        (folder / f"{d['_id']}.md").write_text(f"# {d['title']}\n\n{d['text']}\n", encoding="utf-8")
    return f"{docs} SciFact abstracts"


def _windows(texts: list[str], lengths: list[int], window: int) -> list[list[str]]:
    """``texts`` in stream order, cut where a window reaches ``window`` tokens."""
    out: list[list[str]] = [[]]
    tokens = 0
    for text, n in zip(texts, lengths, strict=True):
        out[-1].append(text)
        tokens += n
        if tokens >= window:
            out.append([])
            tokens = 0
    return [w for w in out if w]


def throughput(corpus: str, docs: int, pages: int, rounds: int, engines: list[str] | None = None) -> None:
    if corpus == "python-docs" and not PYTHON_DOCS.is_dir():
        print(f"throughput: {PYTHON_DOCS} is not installed (Debian's python3.11-doc); --corpus scifact")
        return
    # One job per keyword engine asked for (None: the knowledge base's default, ``auto``), each
    # in its own fresh store, interleaved with the bare model within every round.
    jobs = [f"job {e}" for e in engines] if engines else ["job"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "corpus"
        described = _corpus(folder, corpus, docs, pages)
        names = [*jobs, "same", "sorted"]
        secs: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        padded: dict[str, list[float]] = {n: [] for n in names}
        waits: dict[str, list[dict]] = {n: [] for n in jobs}
        used: dict[str, str] = {}
        texts: list[str] = []
        lengths: list[int] = []
        tokens = 0
        variant = None
        embedder = None
        for r in range(rounds):
            stores = []
            for j, name in enumerate(jobs):
                home = Path(tmp) / f"data{r}-{j}"
                store = Store(Settings.from_env({**os.environ, "LOCALKB_HOME": str(home)}))
                store.create_kb("bench", keyword_engine=engines[j] if engines else None)
                stores.append((name, store, store.open_kb("bench")))
            for _, _, kb in stores:
                if embedder is not None:
                    kb._embedder = embedder  # one loaded model for every side of every round
                kb.embedder.load()
                embedder = kb.embedder
            embedder.embed(["warm up the session"] * 8)
            variant = embedder.describe()["variant"]

            def job(name: str, kb, store) -> None:
                nonlocal texts, lengths, tokens
                t0, c0 = time.perf_counter(), _cpu()
                report = add_paths(kb, [str(folder)])
                secs[name].append(time.perf_counter() - t0)
                cpu[name].append(_cpu() - c0)
                waits[name].append(report.timings)
                used[name] = store.resolve("bench").keyword_engine
                work = report.timings["model"]
                padded[name].append(work["padded_tokens"] / work["tokens"] - 1)
                if not texts:
                    rows = store.catalog.db.execute(
                        "SELECT s.title, c.text FROM chunks c JOIN sources s ON s.id = c.source_id "
                        "ORDER BY s.key, c.idx").fetchall()
                    texts = [passage_text(t, x) for t, x in rows]
                    lengths = [len(e.ids) for e in kb.embedder.tokenizer.encode_batch(texts)]
                    tokens = sum(lengths)
                assert report.totals()["added"] == len(texts), report.totals()

            def bare(name: str, embedder=embedder) -> None:
                parts = ([texts] if name == "sorted" else
                         _windows(texts, lengths, pipeline_mod.EMBED_WINDOW))
                work: dict = {}
                t0, c0 = time.perf_counter(), _cpu()
                for part in parts:
                    embedder.embed(part, work=work)
                secs[name].append(time.perf_counter() - t0)
                cpu[name].append(_cpu() - c0)
                padded[name].append(work["padded_tokens"] / work["tokens"] - 1)

            steps = [(lambda n=n, kb=kb, s=s: job(n, kb, s)) for n, s, kb in stores]
            steps += [lambda: bare("same"), lambda: bare("sorted")]
            for step in rotated(steps, r) if texts else steps:  # a job first once: its passages
                step()
            for _, store, _ in stores:
                store.close()
        print(f"throughput: {described} -> {len(texts):,} passages, {tokens:,} model tokens; "
              f"model {variant}; {rounds} rounds, the {len(names)} interleaved with the order rotating; "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"{'':34} {'min/median/max':>26}")
        for name in jobs:
            row(f"{name} seconds (add_paths)", secs[name], f"   (keyword index: {used[name]})")
        row("bare seconds, same batching", secs["same"])
        row("bare seconds, one sort", secs["sorted"])
        row("bare tokens/s, same batching", [tokens / s for s in secs["same"]])
        for name in jobs:
            print(f"-- {name} (keyword index {used[name]})")
            same = [b / j for b, j in zip(secs["same"], secs[name], strict=True)]
            row("job tokens/s", [tokens / s for s in secs[name]])
            row("job / bare, same batching", same, "   (target >= 0.85)")
            row("job / bare, one sort", [b / j for b, j in zip(secs["sorted"], secs[name], strict=True)])
            row("CPU s: job", cpu[name])
            row("CPU bare (same) / job", [b / j for b, j in zip(cpu["same"], cpu[name], strict=True)],
                "   (the work besides the model; load does not move it)")
            # Where the job's CPU went: its reader and committer threads time themselves; the rest
            # is the writer thread and the model's own threads (onnxruntime's pool, the tokenizer).
            read = [w["read_cpu_s"] for w in waits[name]]
            commit = [w["commit_cpu_s"] for w in waits[name]]
            rest = [c - r - m for c, r, m in zip(cpu[name], read, commit, strict=True)]
            row("CPU s: job reader thread", read, "   (walk, fingerprints, extraction, chunking)")
            row("CPU s: job committer thread", commit, "   (catalogue, keyword and vector index writes)")
            row("CPU s: job model + writer", rest)
            row("CPU model + writer / bare (same)", [r / b for r, b in zip(rest, cpu["same"], strict=True)],
                "   (the model slowed by the threads beside it)")
            row("padding: job", padded[name], "   (padded tokens / tokens - 1)")
            for key in ("wait_s", "embed_s", "write_s", "commit_wait_s"):
                row("job " + key, [w[key] for w in waits[name]])
            print("rounds (job/same/one sort): " + ", ".join(
                f"{j:.1f}s/{a:.1f}s/{b:.1f}s = {a / j:.2f}" for j, a, b in
                zip(secs[name], secs["same"], secs["sorted"], strict=True)))
        row("CPU s: bare, same batching", cpu["same"])
        row("padding: bare, same batching", padded["same"])
        row("padding: bare, one sort", padded["sorted"])
        if len(jobs) == 2:
            a, b = jobs
            print(f"-- {a} against {b}, per round")
            row(f"seconds {a} / {b}", [x / y for x, y in zip(secs[a], secs[b], strict=True)])
            row(f"CPU {a} / {b}", [x / y for x, y in zip(cpu[a], cpu[b], strict=True)])
            row(f"committer CPU {a} / {b}", [x["commit_cpu_s"] / y["commit_cpu_s"]
                                            for x, y in zip(waits[a], waits[b], strict=True)])


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
    ap.add_argument("--corpus", choices=("python-docs", "scifact"), default="python-docs")
    ap.add_argument("--pages", type=int, default=40, help="Python library pages of the throughput case")
    ap.add_argument("--docs", type=int, default=600, help="SciFact abstracts (--corpus scifact)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-text-mb", type=int, default=0)
    ap.add_argument("--pdf-pages", type=int, default=0)
    ap.add_argument("--python-docs", action="store_true")
    ap.add_argument("--big-model", default="all-MiniLM-L6-v2",
                    help="model of the big-file and Python-docs cases (hashing-256: the same streaming "
                         "and unchanged path without the model's time, for a loaded machine)")
    ap.add_argument("--keyword-engine", nargs="+", choices=keyword_engine.CHOICES, default=None,
                    help="the throughput job once per engine named, interleaved (default: the knowledge "
                         "base's default, auto); e.g. --keyword-engine whoosh tantivy")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--all", action="store_true")
    args = ap.parse_args()
    if args.all:
        args.big_text_mb = args.big_text_mb or 30
        args.pdf_pages = args.pdf_pages or 1000
        args.python_docs = True
    if not args.no_throughput:
        throughput(args.corpus, args.docs, args.pages, args.rounds, args.keyword_engine)
    if args.pdf_pages:
        big_pdf(args.pdf_pages, args.big_model)
    if args.big_text_mb:
        big_text(args.big_text_mb, args.big_model)
    if args.python_docs:
        python_docs(args.big_model)


if __name__ == "__main__":
    main()
