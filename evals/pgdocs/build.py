"""Build a BEIR-layout eval set from the PostgreSQL 15 HTML manual, judged by the manual's own index.

    python evals/pgdocs/build.py OUT [--manual DIR] [--sample]

Relevance comes from the authors, never from LocalKB: every top-level entry of the
manual's index (``bookindex.html``) links to the pages it is about, and those pages are
the relevant documents for a query made of the entry's words. Entries whose first word
is shaped like an identifier (letters with digits, an underscore, or a dotted name:
``jsonb_set``, ``max_wal_size``, ``pg_trgm.similarity_threshold``) are asked as that
identifier (``kind: identifier``); the others as written (``kind: concept``: "autovacuum",
"ABORT"). One query in three (by a hash of its text) goes to the dev split, the others to
test: rules are chosen on dev, figures reported on test.

``kind: absent`` queries name things that occur nowhere in this manual (settings and
functions of other PostgreSQL versions, other products' names, typos of real names).
Each is checked against every page's text, in any case, with its parts joined by any
punctuation or space, and dropped (loudly) if found: the right answer for every one
that stays is "no passage mentions it".

``--sample`` writes the small set the test suite runs: a fixed sample of pages (chosen
by a hash of their file names among the pages the index links identifier entries to),
the queries judged on those pages, and every absent query.

The manual is Debian's ``postgresql-doc-15`` (``/usr/share/doc/postgresql-doc-15/html``),
under the PostgreSQL Licence (see ``legal.html`` in it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from beirset import absent_pattern, stable_hash, truly_absent, write_set  # noqa: F401 (absent_pattern: the tests check it here)

MANUAL = Path("/usr/share/doc/postgresql-doc-15/html")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*")
SAMPLE_PAGES = 24
SAMPLE_DISTRACTORS = 8

#: Names that are not in the PostgreSQL 15 manual, with where they come from.
ABSENT = {
    # settings, functions and views of later PostgreSQL releases
    "vacuum_buffer_usage_limit": "PostgreSQL 16 setting",
    "icu_validation_level": "PostgreSQL 16 setting",
    "scram_iterations": "PostgreSQL 16 setting",
    "createrole_self_grant": "PostgreSQL 16 setting",
    "reserved_connections": "PostgreSQL 16 setting",
    "debug_io_direct": "PostgreSQL 16 setting",
    "gss_accept_delegation": "PostgreSQL 16 setting",
    "pg_stat_io": "PostgreSQL 16 view",
    "pg_input_is_valid": "PostgreSQL 16 function",
    "pg_input_error_info": "PostgreSQL 16 function",
    "array_shuffle": "PostgreSQL 16 function",
    "random_normal": "PostgreSQL 16 function",
    "pg_log_standby_snapshot": "PostgreSQL 16 function",
    "summarize_wal": "PostgreSQL 17 setting",
    "wal_summary_keep_time": "PostgreSQL 17 setting",
    "transaction_timeout": "PostgreSQL 17 setting",
    "allow_alter_system": "PostgreSQL 17 setting",
    "sync_replication_slots": "PostgreSQL 17 setting",
    "io_combine_limit": "PostgreSQL 17 setting",
    "pg_stat_checkpointer": "PostgreSQL 17 view",
    "pg_wait_events": "PostgreSQL 17 view",
    "pg_basetype": "PostgreSQL 17 function",
    "pg_column_toast_chunk_id": "PostgreSQL 17 function",
    # removed long before 15
    "checkpoint_segments": "removed in PostgreSQL 9.5",
    "pg_xlog_replay_pause": "renamed in PostgreSQL 10",
    "replacement_sort_tuples": "removed in PostgreSQL 11",
    "operator_precedence_warning": "removed in PostgreSQL 14",
    # other products
    "innodb_buffer_pool_size": "MySQL",
    "max_allowed_packet": "MySQL",
    "mysql_real_escape_string": "MySQL C API",
    "sp_executesql": "SQL Server",
    "dbms_output.put_line": "Oracle PL/SQL",
    "sqlite3_prepare_v2": "SQLite C API",
    "pathlib.Path.walk": "Python 3.12",
    "numpy.einsum": "NumPy",
    # typos of real names
    "jsonb_sett": "typo of jsonb_set",
    "max_wal_sise": "typo of max_wal_size",
    "pg_stat_activty": "typo of pg_stat_activity",
    "shared_bufers": "typo of shared_buffers",
    "effective_cache_sze": "typo of effective_cache_size",
    "autovacuum_naptiem": "typo of autovacuum_naptime",
    "pg_terminate_backnd": "typo of pg_terminate_backend",
    "jsonb_path_querry": "typo of jsonb_path_query",
}


def _parse(path: Path):
    import lxml.html

    return lxml.html.fromstring(path.read_bytes())


def _plain(tree) -> str:
    body = tree.find("body")
    return re.sub(r"\s+", " ", (body if body is not None else tree).text_content()).strip()


def index_entries(manual: Path) -> list[dict]:
    """Top-level entries of bookindex.html: words, the pages they link to, identifier or concept."""
    tree = _parse(manual / "bookindex.html")
    out = []
    for dt in tree.xpath('//div[contains(@class, "indexdiv")]/dl/dt'):
        words = (dt.text or "").strip().rstrip(",").strip()
        pages = sorted({a.get("href").split("#")[0] for a in dt.xpath('./a[@class="indexterm"]')
                        if a.get("href")})
        if not words or not pages:
            continue
        first = words.split(" ")[0]
        ident = (IDENTIFIER.fullmatch(first) and re.search(r"[A-Za-z]", first)
                 and ("_" in first or "." in first or re.search(r"\d", first)))
        if ident:
            out.append({"text": first, "kind": "identifier", "pages": pages})
        elif re.search(r"[A-Za-z]{3}", words):
            out.append({"text": words, "kind": "concept", "pages": pages})
    seen: dict[str, dict] = {}
    for e in out:  # the same identifier indexed twice ("x function", "x configuration parameter")
        if e["text"] in seen:
            seen[e["text"]]["pages"] = sorted(set(seen[e["text"]]["pages"]) | set(e["pages"]))
        else:
            seen[e["text"]] = e
    return list(seen.values())


def build(manual: Path, out: Path, *, sample: bool) -> dict:
    pages = sorted(p.name for p in manual.glob("*.html") if p.name != "bookindex.html")
    entries = [e for e in index_entries(manual) if all(p in pages for p in e["pages"])]
    texts = {name: _plain(_parse(manual / name)) for name in pages}
    absent = truly_absent(ABSENT, texts)
    if sample:
        linked = sorted({p for e in entries if e["kind"] == "identifier" for p in e["pages"]
                         if len(texts[p]) < 30_000}, key=stable_hash)
        chosen = set(linked[:SAMPLE_PAGES])
        others = sorted((p for p in pages if p not in chosen and len(texts[p]) < 30_000), key=stable_hash)
        chosen |= set(others[:SAMPLE_DISTRACTORS])
        pages = sorted(chosen)
        entries = [e for e in entries if all(p in chosen for p in e["pages"])]
    rows = []
    for name in pages:
        tree = _parse(manual / name)
        rows.append((name, (tree.findtext(".//title") or name).strip(), texts[name],
                     (manual / name).read_text(encoding="utf-8")))
    return write_set(out, rows, entries, absent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--manual", type=Path, default=MANUAL)
    ap.add_argument("--sample", action="store_true", help="the small set the test suite runs")
    args = ap.parse_args()
    if not (args.manual / "bookindex.html").exists():
        sys.exit(f"no PostgreSQL manual at {args.manual} (Debian: apt-get install postgresql-doc-15)")
    print(json.dumps(build(args.manual, args.out, sample=args.sample)))


if __name__ == "__main__":
    main()
