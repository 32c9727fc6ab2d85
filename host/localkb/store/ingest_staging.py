"""The local store's ingest tables: staged passages of big sources, and the fingerprints of files.

``store.kb``'s handle implements the seam's ingestion methods (``store.base``) with these;
the team store has the same tables in PostgreSQL (``team.schema``).

A source bigger than one write batch is not written in one transaction that would hold
all of it in memory and lose all of it to a late interrupt. Its passages are embedded in
bounded batches and each batch is committed to ``ingest_staging`` on its own; the
knowledge base does not see them. When the last batch is staged, one catalogue
transaction (``publish_staged``) moves them into ``chunks``, deletes what the new version
no longer has, and updates the source row: readers see the old version whole until that
commit and the new version whole after it. A run that is interrupted or killed leaves its
staged batches; the next add of the same source reuses every staged passage whose text
(hash) is unchanged at the same position, so it continues instead of starting over.
This is the same staging as a re-embed (``reembed.py``), per source instead of per
knowledge base.

``source_files`` keeps each file source's fingerprint (size, mtime, sha256) and the
recipe (chunker version, passage sizes, model) its passages were made with, so an
unchanged file is recognised from a stat, or at worst a hash, without extracting it.

Two indexes serve ingest: passages by text hash (a vector copied from an identical passage)
and errors by ref (a skipped file is logged once, not on every re-add).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable

from localkb.errors import StoreError

TABLES = """
CREATE TABLE IF NOT EXISTS ingest_staging (
    kb_id TEXT NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    source_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    chunk_id TEXT NOT NULL,
    vkey INTEGER NOT NULL,
    model TEXT NOT NULL,
    text TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    page INTEGER,
    tokens INTEGER NOT NULL,
    vector BLOB NOT NULL,
    staged_at REAL NOT NULL,
    PRIMARY KEY (source_id, idx)
);
CREATE TABLE IF NOT EXISTS source_files (
    source_id TEXT PRIMARY KEY REFERENCES sources(id) ON DELETE CASCADE,
    kb_id TEXT NOT NULL,
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    recipe TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_text_hash ON chunks (kb_id, text_hash);
CREATE INDEX IF NOT EXISTS errors_ref ON errors (ref, id);
"""


def ensure_tables(store) -> None:
    """Create ingest's tables once per store (idempotent DDL)."""
    if getattr(store, "_ingest_tables", False):
        return
    try:
        with store.lock.hold():
            store.catalog.db.executescript(TABLES)
    except sqlite3.Error as err:
        raise StoreError(f"cannot create the ingest tables: {err}") from err
    store._ingest_tables = True


# -- staging ---------------------------------------------------------------------------
def staged_hashes(db: sqlite3.Connection, sid: str, model: str) -> dict[int, str]:
    """idx -> text_hash of what an earlier run staged for this source (other models' rows dropped)."""
    db.execute("DELETE FROM ingest_staging WHERE source_id = ? AND model != ?", (sid, model))
    return {r[0]: r[1] for r in db.execute(
        "SELECT idx, text_hash FROM ingest_staging WHERE source_id = ?", (sid,))}


def stage_rows(catalog, rows: Iterable[tuple]) -> None:
    """Commit one batch of (kb_id, source_id, idx, chunk_id, vkey, model, text, text_hash, page,
    tokens, vector) to the staging table, in its own transaction."""
    now = time.time()
    with catalog.tx() as db:
        db.executemany(
            "INSERT OR REPLACE INTO ingest_staging (kb_id, source_id, idx, chunk_id, vkey, model, text, "
            "text_hash, page, tokens, vector, staged_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [(*r, now) for r in rows])


def unstage(db: sqlite3.Connection, sid: str, idxs: Iterable[int] | None = None) -> None:
    """Drop staged rows of a source (all of them, or those at ``idxs``)."""
    if idxs is None:
        db.execute("DELETE FROM ingest_staging WHERE source_id = ?", (sid,))
    else:
        db.executemany("DELETE FROM ingest_staging WHERE source_id = ? AND idx = ?",
                       [(sid, i) for i in idxs])


def staged_vectors(db: sqlite3.Connection, sid: str, idxs: list[int]) -> dict[int, tuple[str, bytes]]:
    out: dict[int, tuple[str, bytes]] = {}
    for start in range(0, len(idxs), 500):
        part = idxs[start : start + 500]
        marks = ",".join("?" * len(part))
        for r in db.execute(f"SELECT idx, text_hash, vector FROM ingest_staging "  # noqa: S608 - placeholders only
                            f"WHERE source_id = ? AND idx IN ({marks})", [sid, *part]):
            out[r[0]] = (r[1], r[2])
    return out


def staged_sources(db: sqlite3.Connection, kb_id: str) -> dict[str, int]:
    """source_id -> staged passages, for the sources of ``kb_id`` that have a staged version."""
    return {r[0]: r[1] for r in db.execute(
        "SELECT source_id, COUNT(*) FROM ingest_staging WHERE kb_id = ? GROUP BY source_id", (kb_id,))}


def move_staged(db: sqlite3.Connection, sid: str, n_total: int, indexed_by: str) -> list[tuple[str, int]]:
    """Inside the switch transaction: staged rows -> chunks; returns their (chunk id, vector key)."""
    db.execute("DELETE FROM ingest_staging WHERE source_id = ? AND idx >= ?", (sid, n_total))
    moved = [(r[0], r[1]) for r in db.execute(
        "SELECT chunk_id, vkey FROM ingest_staging WHERE source_id = ? ORDER BY idx", (sid,))]
    db.execute(
        "INSERT INTO chunks (id, vkey, kb_id, source_id, idx, text, text_hash, page, tokens, vector, "
        "indexed_by, indexed_at) SELECT chunk_id, vkey, kb_id, source_id, idx, text, text_hash, page, "
        "tokens, vector, ?, ? FROM ingest_staging WHERE source_id = ? ORDER BY idx "
        "ON CONFLICT(id) DO UPDATE SET text=excluded.text, text_hash=excluded.text_hash, "
        "page=excluded.page, tokens=excluded.tokens, vector=excluded.vector, "
        "indexed_by=excluded.indexed_by, indexed_at=excluded.indexed_at",
        (indexed_by, time.time(), sid))
    db.execute("DELETE FROM ingest_staging WHERE source_id = ?", (sid,))
    return moved


# -- fingerprints ----------------------------------------------------------------------
def stored_fingerprint(db: sqlite3.Connection, sid: str) -> sqlite3.Row | None:
    """The file's fingerprint and recipe with its source's counts, or None for a source never stored."""
    return db.execute(
        "SELECT f.size, f.mtime_ns, f.sha256, f.recipe, s.title, s.url, s.chunk_count, "
        "(SELECT COUNT(*) FROM chunks c WHERE c.source_id = s.id) AS stored "
        "FROM sources s JOIN source_files f ON f.source_id = s.id WHERE s.id = ?", (sid,)).fetchone()


def save_fingerprint(db: sqlite3.Connection, sid: str, kb_id: str, fp) -> None:
    """Upsert a file source's ``FileFingerprint`` (``store.base``)."""
    db.execute(
        "INSERT INTO source_files (source_id, kb_id, path, size, mtime_ns, sha256, recipe) "
        "VALUES (?,?,?,?,?,?,?) ON CONFLICT(source_id) DO UPDATE SET path=excluded.path, "
        "size=excluded.size, mtime_ns=excluded.mtime_ns, sha256=excluded.sha256, recipe=excluded.recipe",
        (sid, kb_id, fp.path, fp.size, fp.mtime_ns, fp.sha256, fp.recipe))
