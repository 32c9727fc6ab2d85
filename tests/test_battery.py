"""The real-docs battery's builders (evals/*/make.py): valid BEIR-layout sets judged by the docs' links."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Each set, the Debian package it is built from, and where that installs it. (pydocs/make.py
#: is left to tests/test_exact.py's test of its rules: reading Python's whole general index
#: takes a minute here.)
SETS = {
    "rustdoc": ("rust-doc", "/usr/share/doc/rust-doc/html/std/all.html"),
    "scipy": ("python-scipy-doc", "/usr/share/doc/python-scipy-doc/html/genindex.html"),
    "pandas": ("python-pandas-doc", "/usr/share/doc/python-pandas-doc/html/genindex.html"),
    "gitdocs": ("git-doc", "/usr/share/doc/git-doc/git.html"),
    "sqlite": ("sqlite3-doc", "/usr/share/doc/sqlite3/keyword_index.html"),
    "pgdocs": ("postgresql-doc-15", "/usr/share/doc/postgresql-doc-15/html/bookindex.html"),
}


def _make(name: str, out: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(REPO / "evals" / name / "make.py"), str(out), *args],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _read(out: Path) -> tuple[dict, list[dict], dict[str, list[tuple[str, str]]]]:
    corpus = {}
    for line in (out / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        assert d["_id"] not in corpus, f"corpus id twice: {d['_id']}"
        corpus[d["_id"]] = d
    queries = [json.loads(line) for line in (out / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    qrels = {}
    for split in ("dev", "test"):
        lines = (out / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        assert lines[0] == "query-id\tcorpus-id\tscore"
        qrels[split] = [tuple(line.split("\t")[:2]) for line in lines[1:]]
    return corpus, queries, qrels


def _check_layout(out: Path) -> tuple[dict, list[dict]]:
    """Every judged query names pages of the corpus, lands in the split its hash says, and
    absent names have no judgements."""
    corpus, queries, qrels = _read(out)
    assert corpus and all(d["html"] and d["title"] for d in corpus.values())
    by_id = {q["_id"]: q for q in queries}
    assert len(by_id) == len(queries), "query ids repeat"
    for split, rows in qrels.items():
        for qid, doc in rows:
            assert doc in corpus, f"{qid} judged on {doc}, not in the corpus"
            assert by_id[qid]["kind"] in ("identifier", "concept") and by_id[qid]["split"] == split
    judged = {qid for rows in qrels.values() for qid, _ in rows}
    assert judged == {q["_id"] for q in queries if q["kind"] != "absent"}
    assert {q["kind"] for q in queries} == {"identifier", "concept", "absent"}
    return corpus, queries


@pytest.mark.parametrize("name", sorted(SETS))
def test_each_set_builds_from_its_installed_package_in_beir_layout(name, tmp_path):
    package, marker = SETS[name]
    if not Path(marker).exists():
        pytest.skip(f"{package} is not installed (apt-get install {package})")
    got = _make(name, tmp_path / name, "--pages", "60", "--identifiers", "30", "--concepts", "15")
    corpus, _ = _check_layout(tmp_path / name)
    assert got["pages"] == len(corpus) == 60
    assert 0 < got["queries"] <= 45 and got["absent"] >= 15


def test_sqlite_set_is_judged_by_the_keyword_index_and_checks_its_absent_names(tmp_path):
    """evals/sqlite/make.py on a three-page tree: identifier-shaped entries and the C function
    list as identifiers, the other entries as concepts, grammar names left out, a link to a
    page outside the corpus not judged, an absent name a page holds dropped."""
    docs = tmp_path / "sqlite3"
    (docs / "c3ref").mkdir(parents=True)
    page = "<html><head><title>{}</title></head><body><h1>{}</h1><p>{}</p></body></html>"
    (docs / "pragma.html").write_text(page.format("Pragma statements", "PRAGMA",
                                                  "PRAGMA journal_mode; see timediff() later."))
    (docs / "atomiccommit.html").write_text(page.format("Atomic Commit", "Atomic Commit In SQLite",
                                                        "How a commit is made atomic."))
    (docs / "c3ref" / "prepare.html").write_text(page.format("Compiling An SQL Statement",
                                                             "sqlite3_prepare_v2", "Compile SQL."))
    (docs / "c3ref" / "funclist.html").write_text(
        "<html><body><a href='../c3ref/prepare.html'>sqlite3_prepare_v2</a>"
        "<a href='../c3ref/exec.html'>sqlite3_exec</a></body></html>")
    (docs / "keyword_index.html").write_text(
        '<html><body><a href="pragma.html#pragma_journal_mode">journal_mode pragma</a>'
        '<a href="atomiccommit.html">atomic commit</a>'
        '<a href="syntax/alter-table-stmt.html">alter-table-stmt</a>'
        '<a href="lang_altertable.html">ALTER TABLE</a></body></html>')
    got = _make("sqlite", tmp_path / "set", "--docs", str(docs))
    corpus, queries = _check_layout(tmp_path / "set")
    by_kind = {k: sorted(q["text"] for q in queries if q["kind"] == k) for k in ("identifier", "concept")}
    assert by_kind == {"identifier": ["journal_mode", "sqlite3_prepare_v2"], "concept": ["atomic commit"]}
    absent = {q["text"] for q in queries if q["kind"] == "absent"}
    assert "timediff()" not in absent and "concat_ws()" in absent
    assert sorted(corpus) == ["atomiccommit.html", "c3ref/prepare.html", "pragma.html"]
    assert got["queries"] == 3


def test_the_battery_pools_every_query_and_pairs_hybrid_with_whole_page_bm25():
    """evals/battery.py's pooled row: each query once, hybrid - BM25 query by query, in the table."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("battery", REPO / "evals" / "battery.py")
    battery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(battery)

    def result(name, bm25, hybrid):
        modes = {m: {"overall": {"ndcg@10": sum(v) / len(v)}, "by_kind": {"identifier": {"recall@1": 1.0}},
                     "absent_reported": 0} for m, v in (("bm25", bm25), ("vector", bm25), ("keyword", bm25),
                                                        ("hybrid", hybrid))}
        return {"set": name, "documents": 3, "passages": 9, "queries": len(bm25), "absent_queries": 2,
                "modes": modes, "name_recall": (4, 5),
                "compare": {f"hybrid - {m}": {"ndcg@10": 0.0, "ci95": [0.0, 0.0]}
                            for m in ("bm25", "vector", "keyword")},
                "per_query_ndcg": {"bm25": bm25, "vector": bm25, "keyword": bm25, "hybrid": hybrid}}

    results = [result("a", [1.0, 0.0], [1.0, 1.0]), result("b", [0.5, 0.5, 0.5], [0.5, 0.5, 0.0])]
    pool = battery.pooled(results)
    assert pool["queries"] == 5 and pool["better"] == 1 and pool["worse"] == 1
    assert pool["hybrid - bm25"] == round((1.0 - 0.5) / 5, 4)
    text = battery.table(results, pool)
    assert "pooled" in text and "+0.100" in text and "0.800 (4/5)" in text
