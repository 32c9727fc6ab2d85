"""Run the real-docs battery: every set built once, indexed once, scored against whole-page BM25, one table.

    python evals/battery.py [--split dev|test] [--sets NAME ...] [--cache DIR] [--reindex] [--rebuild]
                            [--json FILE]

Each set is rebuilt by its ``evals/NAME/make.py`` from the installed Debian package into
the cache folder (``$TMPDIR/localkb-battery`` unless ``--cache``), at the page sample the
table below fixes, and indexed there once (``localkb eval --index-dir``); a later run
scores the kept indexes. ``--reindex`` drops them first: run it after a change to
extraction, chunking or the model, or the figures are the old build's.

Every set is scored by ``localkb eval --baseline bm25`` (``run_eval``) on one split,
for vector, keyword, hybrid and plain BM25 over whole pages; the table has per set
nDCG@10 of each, identifier recall@1 (BM25 and hybrid), absent names reported as
passages, hybrid against the best other mode (paired 95 % bootstrap interval), the
extraction's name recall, and a pooled row over every query of the battery: hybrid -
BM25 with its paired interval.

Name recall: of the (page, name) pairs the set's identifier queries judge where the name
(its last part: ``retain`` of ``Vec::retain``, ``--keep-base`` of ``git rebase
--keep-base``) is in the page's own text, the share where some stored passage of that
page holds it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))
from _common import add_record_flag, recorded  # noqa: E402 - the bench folder, not a package

#: The battery: each set and its fixed page sample (by a hash of the pages' paths).
SETS = {
    "rustdoc": 400,    # rustdoc, Rust 1.63 std, rust-doc
    "scipy": 300,      # Sphinx + numpydoc, SciPy 1.10, python-scipy-doc
    "pandas": 300,     # Sphinx + numpydoc, pandas 1.5, python-pandas-doc
    "gitdocs": 120,    # AsciiDoc man pages, Git 2.39, git-doc
    "sqlite": 150,     # hand-written HTML, SQLite 3.40, sqlite3-doc
    "pydocs": 60,      # Sphinx, Python 3.11 library reference, python3.11-doc
    "pgdocs": 200,     # DocBook, PostgreSQL 15 manual, postgresql-doc-15
}
MODES = ("vector", "keyword", "hybrid")


def make(name: str, out: Path, pages: int | None, *, again: bool = False) -> None:
    """Build one set with its own make.py (its kept index dropped), unless the cache holds it as asked.

    The stamp is the command and a hash of the builder's code: a changed rule rebuilds the set.
    """
    args = [sys.executable, str(HERE / name / "make.py"), str(out)]
    if pages is not None:
        args += ["--pages", str(pages)]
    code = hashlib.sha1()
    for f in sorted([*(HERE / name).glob("*.py"), *HERE.glob("*.py")]):
        code.update(f.read_bytes())
    stamp = " ".join(args[2:]) + " " + code.hexdigest()
    if not again and (out / ".made").exists() and (out / ".made").read_text() == stamp \
            and (out / "corpus.jsonl").exists():
        return
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(_index(out), ignore_errors=True)
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    (out / ".made").write_text(stamp)


def _index(set_dir: Path) -> Path:
    return set_dir.with_name(set_dir.name + ".index")


def _last_part(text: str) -> str:
    return re.split(r"::|\.|\s", text.removesuffix("()"))[-1]


def name_recall(set_dir: Path, index_dir: Path) -> tuple[int, int]:
    """(pairs whose name some stored passage of the page holds, pairs whose name the page's text holds)."""
    from localkb.config import Settings
    from localkb.store.kb import Store

    texts = {}
    with open(set_dir / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            texts[d["_id"]] = d["text"]
    names = {}
    with open(set_dir / "queries.jsonl", encoding="utf-8") as fh:
        for line in fh:
            q = json.loads(line)
            if q["kind"] == "identifier":
                names[q["_id"]] = _last_part(q["text"])
    pairs = set()
    for split in ("dev", "test"):
        for line in (set_dir / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]:
            qid, doc, _ = line.split("\t")
            if qid in names:
                pairs.add((doc, names[qid]))
    store = Store(replace(Settings.from_env(), data_dir=index_dir))
    try:
        kb = store.open_kb("eval")
        passages: dict[str, list[str]] = {}
        for key, text in store.catalog.db.execute(
                "SELECT s.key, c.text FROM chunks c JOIN sources s ON s.id = c.source_id WHERE s.kb_id = ?",
                (kb.id,)):
            passages.setdefault(key.removeprefix("doc:"), []).append(text)
    finally:
        store.close()
    held = kept = 0
    for doc, name in pairs:
        pattern = re.compile(r"(?<![\w-])" + re.escape(name) + r"(?![\w-])")
        if pattern.search(texts.get(doc, "")):
            held += 1
            kept += any(pattern.search(p) for p in passages.get(doc, ()))
    return kept, held


def score(name: str, set_dir: Path, split: str) -> dict:
    """``localkb eval SET --baseline bm25 --index-dir SET.index --split SPLIT``, with per-query nDCG@10."""
    from localkb.retrieval.evaluate import run_eval

    index_dir = _index(set_dir)
    if index_dir.exists() and not (index_dir / ".complete").exists():
        shutil.rmtree(index_dir)  # a build that did not finish: never scored as if it had
    res = run_eval(set_dir, modes=MODES, baseline="bm25", split=split, index_dir=index_dir,
                   per_query=True)
    if res["failed_documents"]:
        raise SystemExit(f"{name}: {len(res['failed_documents'])} pages could not be indexed: "
                         + ", ".join(res["failed_documents"][:5]))
    (index_dir / ".complete").touch()
    res["name_recall"] = name_recall(set_dir, index_dir)
    res["set"] = name
    return res


def pooled(results: list[dict]) -> dict:
    """Every query of the battery as one sample: mean nDCG@10 per mode, hybrid - BM25 paired."""
    from localkb.retrieval.evaluate import bootstrap_ci

    per_mode: dict[str, list[float]] = {}
    for res in results:
        for mode, vals in res["per_query_ndcg"].items():
            per_mode.setdefault(mode, []).extend(vals)
    diffs = [h - b for h, b in zip(per_mode["hybrid"], per_mode["bm25"], strict=True)]
    return {"queries": len(diffs), "ndcg@10": {m: round(sum(v) / len(v), 4) for m, v in per_mode.items()},
            "hybrid - bm25": round(sum(diffs) / len(diffs), 4), "ci95": list(bootstrap_ci(diffs)),
            "better": sum(d > 0 for d in diffs), "worse": sum(d < 0 for d in diffs)}


def table(results: list[dict], pool: dict) -> str:
    """One row per set and a pooled row."""
    order = ("bm25", *MODES)
    head = (f"{'set':9} {'pages':>5} {'passages':>8} {'queries':>7} | "
            f"nDCG@10 {'bm25':>5} {'vec':>5} {'kw':>5} {'hyb':>5} | id R@1 {'bm25':>5} {'hyb':>5} | "
            f"absent b/v/k/h      | "
            f"hybrid - best other (95% CI)      | name recall")
    lines = [head, "-" * len(head)]
    for r in results:
        m = r["modes"]
        nd = " ".join(f"{m[o]['overall']['ndcg@10']:5.3f}" for o in order)
        idr = " ".join(f"{m[o]['by_kind'].get('identifier', {}).get('recall@1', 0):5.3f}"
                       for o in ("bm25", "hybrid"))
        absent = "/".join(str(m[o].get("absent_reported", "-")) for o in order) + f" of {r['absent_queries']}"
        best = max(("bm25", "vector", "keyword"), key=lambda o: m[o]["overall"]["ndcg@10"])
        c = r["compare"][f"hybrid - {best}"]
        cmp_ = f"{c['ndcg@10']:+.3f} vs {best} ({c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f})"
        kept, held = r["name_recall"]
        nr = f"{kept / held:.3f} ({kept}/{held})" if held else "-"
        lines.append(f"{r['set']:9} {r['documents']:>5} {r['passages']:>8} {r['queries']:>7} | "
                     f"        {nd} |        {idr} | {absent:18} | {cmp_:33} | {nr}")
    nd = " ".join(f"{pool['ndcg@10'][o]:5.3f}" for o in order)
    lines.append("-" * len(head))
    lo, hi = pool["ci95"]
    lines.append(f"{'pooled':9} {'':>5} {'':>8} {pool['queries']:>7} |         {nd} | hybrid - bm25 "
                 f"{pool['hybrid - bm25']:+.3f} (paired 95% CI {lo:+.3f} to {hi:+.3f}; "
                 f"better on {pool['better']} queries, worse on {pool['worse']})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--split", default="dev", choices=["dev", "test"])
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    ap.add_argument("--cache", type=Path,
                    default=Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / "localkb-battery")
    ap.add_argument("--reindex", action="store_true",
                    help="drop the kept indexes first (after a change to extraction, chunking or the model)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the sets from the docs too")
    ap.add_argument("--json", type=Path, help="also write every set's figures there")
    add_record_flag(ap)
    args = ap.parse_args()
    with recorded(args.record):
        args.cache.mkdir(parents=True, exist_ok=True)
        results = []
        for name in args.sets:
            set_dir = args.cache / name
            make(name, set_dir, SETS[name], again=args.rebuild)
            if args.reindex:
                shutil.rmtree(_index(set_dir), ignore_errors=True)
            print(f"{name}: scoring ({args.split})", file=sys.stderr, flush=True)
            results.append(score(name, set_dir, args.split))
        pool = pooled(results)
        if args.json:
            args.json.write_text(json.dumps({"sets": results, "pooled": pool}, indent=1))
        print(f"real-docs battery, {args.split} split; index kept under {args.cache}")
        print(table(results, pool))


if __name__ == "__main__":
    main()
