"""Build a BEIR-layout eval set from SQLite's hand-written HTML docs, judged by their keyword index.

    python evals/sqlite/make.py OUT [--docs DIR] [--pages N] [--identifiers N] [--concepts N]

The pages are SQLite 3.40's documentation (the SQL language pages, the C interface
pages of ``c3ref/``, the session extension, syntax diagrams and release logs; the index
and list pages left out) as a user would save them, a fixed sample of ``--pages`` by a
hash of their paths. Relevance comes from the docs, never from LocalKB:

- ``identifier``: entries of ``keyword_index.html`` whose first word is shaped like an
  identifier (``sqlite3_prepare_v2``, ``SQLITE_ENABLE_FTS5``, ``journal_mode`` of
  "journal_mode pragma", ``json_extract()``), and every function of the C interface's
  function list (``c3ref/funclist.html``), relevant: the pages they link to;
- ``concept``: the other keyword index entries ("atomic commit", "Appropriate Uses For
  SQLite"), relevant: the pages they link to (syntax-diagram entries left out);
- ``absent``: later SQLite releases' functions and settings, other products' names and
  typos of real names, checked against every page of the corpus and dropped, loudly, if
  found.

The docs are Debian's ``sqlite3-doc`` (``/usr/share/doc/sqlite3``); SQLite and its docs
are in the public domain.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from beirset import assemble, by_hash, cli, is_redirect, norm, parse, words

DOCS = Path("/usr/share/doc/sqlite3")
PAGES = 150
IDENTIFIERS = 300
CONCEPTS = 150
#: The index and list pages: where relevance comes from, not documents.
LISTS = {"keyword_index.html", "doc_keyword_crossref.html", "doclist.html", "sitemap.html",
         "c3ref/funclist.html", "c3ref/objlist.html", "c3ref/constlist.html"}
_IDENT = re.compile(r"[A-Za-z_][\w.]*(\(\))?")

#: Names not in SQLite 3.40's docs, with where they come from.
ABSENT = {
    "sqlite3_setlk_timeout": "SQLite 3.50",
    "sqlite3_stmt_explain": "SQLite 3.43",
    "sqlite3_is_interrupted": "SQLite 3.41",
    "sqlite3_db_status64": "never in SQLite",
    "json_pretty()": "SQLite 3.46",
    "jsonb_extract()": "SQLite 3.45",
    "octet_length()": "SQLite 3.43",
    "timediff()": "SQLite 3.43",
    "string_agg()": "SQLite 3.44",
    "concat_ws()": "SQLite 3.44",
    "unistr()": "SQLite 3.50",
    "SQLITE_DBCONFIG_ENABLE_ATTACH_CREATE": "SQLite 3.49",
    "pg_stat_activity": "PostgreSQL",
    "innodb_buffer_pool_size": "MySQL",
    "mysql_real_escape_string": "MySQL C API",
    "sp_executesql": "SQL Server",
    "dbms_output.put_line": "Oracle PL/SQL",
    "sqlite3_prepare_v22": "typo of sqlite3_prepare_v2",
    "sqlite3_bind_txt": "typo of sqlite3_bind_text",
    "sqlite3_colum_text": "typo of sqlite3_column_text",
    "sqlite3_exex": "typo of sqlite3_exec",
    "sqlite3_busy_timout": "typo of sqlite3_busy_timeout",
    "wal_autocheckpiont": "typo of wal_autocheckpoint",
    "SQLITE_ENABLE_FTS55": "typo of SQLITE_ENABLE_FTS5",
    "json_extarct()": "typo of json_extract()",
}


def keyword_index(docs: Path) -> list[dict]:
    """The keyword index's entries: identifier-shaped first words as identifiers, the rest as written."""
    out = []
    for a in parse(docs / "keyword_index.html").xpath("//a[@href]"):
        href, text = a.get("href"), words(a)
        if "://" in href or not re.search(r"[A-Za-z]{3}", text) or text.endswith("syntax diagram"):
            continue
        first = text.split(" ")[0]
        page = norm(href)
        if _IDENT.fullmatch(first) and re.search(r"[_.\d]|\(\)$", first):
            out.append({"text": first, "kind": "identifier", "pages": [page]})
        elif not re.fullmatch(r"[a-z]+(-[a-z]+)+", text):  # a grammar rule's name (alter-table-stmt)
            out.append({"text": text, "kind": "concept", "pages": [page]})
    return out


def functions(docs: Path) -> list[dict]:
    """The C interface's function list: each function and the page that documents it."""
    return [{"text": words(a), "kind": "identifier", "pages": [norm("c3ref/" + a.get("href"))]}
            for a in parse(docs / "c3ref" / "funclist.html").xpath("//a[@href]")
            if re.fullmatch(r"sqlite3_\w+", words(a))]


def build(docs: Path, out: Path, *, pages: int | None, identifiers: int, concepts: int) -> dict:
    every = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.html")
                   if p.relative_to(docs).as_posix() not in LISTS and not is_redirect(p))
    chosen = sorted(by_hash(every, pages))
    return assemble(docs, out, chosen, keyword_index(docs) + functions(docs), ABSENT,
                    identifiers=identifiers, concepts=concepts)


if __name__ == "__main__":
    cli(__doc__, build, DOCS, "keyword_index.html", "sqlite3-doc", pages=PAGES,
        identifiers=IDENTIFIERS, concepts=CONCEPTS)
