"""The catalogue: one SQLite database (WAL) that is the source of truth.

Knowledge bases, sources, chunks with their float32 vectors, a change log the
derived indexes catch up from, an error log and a query log. The derived
indexes (usearch, Whoosh) can always be rebuilt from here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from localkb.errors import StoreError
from localkb.perms import private_dir

if TYPE_CHECKING:
    import numpy as np

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kbs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE COLLATE NOCASE,
    privacy TEXT NOT NULL CHECK (privacy IN ('device', 'cloud')),
    model TEXT NOT NULL,
    dim INTEGER NOT NULL,
    created REAL NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    settings TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS sources (
    id TEXT PRIMARY KEY,
    kb_id TEXT NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    type TEXT NOT NULL,
    title TEXT NOT NULL,
    url TEXT,
    file_name TEXT,
    content_hash TEXT NOT NULL,
    captured_by TEXT NOT NULL,
    chunk_count INTEGER NOT NULL,
    pages INTEGER,
    lang TEXT,
    added_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (kb_id, key)
);
CREATE TABLE IF NOT EXISTS chunks (
    id TEXT PRIMARY KEY,
    vkey INTEGER NOT NULL,
    kb_id TEXT NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    source_id TEXT NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    text TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    page INTEGER,
    tokens INTEGER NOT NULL,
    vector BLOB NOT NULL,
    indexed_by TEXT NOT NULL,
    indexed_at REAL NOT NULL,
    UNIQUE (kb_id, vkey),
    UNIQUE (source_id, idx)
);
CREATE INDEX IF NOT EXISTS chunks_kb ON chunks (kb_id);
CREATE TABLE IF NOT EXISTS changes (
    kb_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    chunk_id TEXT NOT NULL,
    vkey INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS changes_kb ON changes (kb_id, generation);
CREATE TABLE IF NOT EXISTS errors (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    source TEXT NOT NULL,
    code TEXT NOT NULL,
    message TEXT NOT NULL,
    kb_id TEXT,
    ref TEXT,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS errors_source ON errors (source, id);
CREATE TABLE IF NOT EXISTS queries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    query TEXT NOT NULL,
    kb_ids TEXT NOT NULL,
    trace TEXT NOT NULL
);
"""


def chunk_id(kb_id: str, source_id: str, index: int) -> str:
    """The deterministic id of a chunk: re-adding a source upserts the same rows."""
    return hashlib.sha256(f"{kb_id}\x1f{source_id}\x1f{index}".encode()).hexdigest()[:32]


def vector_key(cid: str) -> int:
    """A 63-bit integer key for the vector index, derived from the chunk id."""
    return int(cid[:16], 16) >> 1


def source_id(kb_id: str, key: str) -> str:
    return "s" + hashlib.sha256(f"{kb_id}\x1f{key}".encode()).hexdigest()[:23]


# numpy is imported inside these helpers so that opening the catalogue (the host's
# cold-start ``status``) does not pay for it.
def vector_blob(vec: np.ndarray) -> bytes:
    import numpy as np

    return np.ascontiguousarray(vec, dtype="<f4").tobytes()


def blob_vector(blob: bytes) -> np.ndarray:
    import numpy as np

    return np.frombuffer(blob, dtype="<f4")


def valid_vector(blob: bytes, dim: int) -> bool:
    """A real row: the knowledge base's dimension, finite values, non-zero norm."""
    if len(blob) != dim * 4:
        return False
    import numpy as np

    v = blob_vector(blob)
    return bool(np.isfinite(v).all()) and float(np.dot(v, v)) > 1e-12


@dataclass(frozen=True)
class KBRecord:
    id: str
    name: str
    privacy: str
    model: str
    dim: int
    created: float
    generation: int
    settings: dict = field(default_factory=dict)

    @property
    def keyword_engine(self) -> str:
        """The engine the knowledge base's keyword index was last built with."""
        return self.settings.get("keyword_index", "whoosh")

    def public(self) -> dict:
        return {"id": self.id, "name": self.name, "privacy": self.privacy, "model": self.model,
                "dim": self.dim, "created": self.created, "generation": self.generation,
                "keyword_engine": self.keyword_engine,
                "keyword_engine_choice": self.settings.get("keyword_engine", "auto")}


#: A source row written whole (its ``added_at`` kept from the row it replaces by the caller):
#: the one statement both local writers use (the pipeline's and the store seam's).
UPSERT_SOURCE = (
    "INSERT INTO sources (id, kb_id, key, type, title, url, file_name, content_hash, "
    "captured_by, chunk_count, pages, lang, added_at, updated_at) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
    "type=excluded.type, title=excluded.title, url=excluded.url, "
    "file_name=excluded.file_name, content_hash=excluded.content_hash, "
    "captured_by=excluded.captured_by, chunk_count=excluded.chunk_count, "
    "pages=excluded.pages, lang=excluded.lang, updated_at=excluded.updated_at")

class Catalog:
    """Thin, typed access to ``catalog.sqlite``; one connection per thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        private_dir(path.parent)
        try:
            self.db.executescript(SCHEMA)  # executescript commits on its own; the DDL is idempotent
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                            (str(SCHEMA_VERSION),))
        except sqlite3.Error as err:
            raise StoreError(f"cannot initialise the catalogue {path}: {err}") from err

    @property
    def db(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=60, isolation_level=None,
                                       check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA foreign_keys=ON")
                conn.execute("PRAGMA busy_timeout=60000")
            except sqlite3.Error as err:
                raise StoreError(f"cannot open the catalogue {self.path}: {err}") from err
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of it lands, or none of it."""
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
            yield db
            db.execute("COMMIT")
        except BaseException as err:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if isinstance(err, sqlite3.Error):
                raise StoreError(f"the catalogue write failed: {err}") from err
            raise

    # -- knowledge bases -------------------------------------------------------
    def kbs(self) -> list[KBRecord]:
        rows = self.db.execute("SELECT * FROM kbs ORDER BY created, name").fetchall()
        return [self._kb(r) for r in rows]

    def kb(self, kb_id: str) -> KBRecord | None:
        row = self.db.execute("SELECT * FROM kbs WHERE id = ?", (kb_id,)).fetchone()
        return self._kb(row) if row else None

    def kb_by_name(self, name: str) -> KBRecord | None:
        row = self.db.execute("SELECT * FROM kbs WHERE name = ?", (name,)).fetchone()
        return self._kb(row) if row else None

    @staticmethod
    def _kb(row: sqlite3.Row) -> KBRecord:
        try:
            settings = json.loads(row["settings"] or "{}")
        except ValueError:
            settings = {}
        return KBRecord(row["id"], row["name"], row["privacy"], row["model"], row["dim"],
                        row["created"], row["generation"],
                        settings if isinstance(settings, dict) else {})

    def update_settings(self, kb_id: str, **values: object) -> None:
        """Merge ``values`` into the knowledge base's settings JSON (its own small transaction)."""
        with self.tx() as db:
            row = db.execute("SELECT settings FROM kbs WHERE id = ?", (kb_id,)).fetchone()
            if row is None:
                return
            try:
                current = json.loads(row[0] or "{}")
            except ValueError:
                current = {}
            current = {**(current if isinstance(current, dict) else {}), **values}
            db.execute("UPDATE kbs SET settings = ? WHERE id = ?", (json.dumps(current), kb_id))

    def generation(self, kb_id: str) -> int | None:
        row = self.db.execute("SELECT generation FROM kbs WHERE id = ?", (kb_id,)).fetchone()
        return row[0] if row else None

    def counts(self, kb_id: str) -> dict:
        db = self.db
        sources = db.execute("SELECT COUNT(*) FROM sources WHERE kb_id = ?", (kb_id,)).fetchone()[0]
        chunks = db.execute("SELECT COUNT(*) FROM chunks WHERE kb_id = ?", (kb_id,)).fetchone()[0]
        return {"sources": sources, "chunks": chunks}

    # -- chunks ----------------------------------------------------------------
    def chunk_rows(self, kb_id: str, chunk_ids: Iterable[str] | None = None) -> list[sqlite3.Row]:
        if chunk_ids is None:
            return self.db.execute(
                "SELECT c.*, s.title AS title FROM chunks c JOIN sources s ON s.id = c.source_id "
                "WHERE c.kb_id = ? ORDER BY c.rowid", (kb_id,)).fetchall()
        ids = list(chunk_ids)
        rows: list[sqlite3.Row] = []
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            marks = ",".join("?" * len(part))
            rows += self.db.execute(
                "SELECT c.*, s.title AS title FROM chunks c JOIN sources s ON s.id = c.source_id "
                f"WHERE c.id IN ({marks})", part).fetchall()
        return rows

    def passage_window(self, source_id: str, idx: int, radius: int) -> list[sqlite3.Row]:
        """The passages of one source from ``idx - radius`` to ``idx + radius``, in order."""
        return self.db.execute(
            "SELECT idx, text, page FROM chunks WHERE source_id = ? AND idx BETWEEN ? AND ? "
            "ORDER BY idx", (source_id, idx - radius, idx + radius)).fetchall()

    def sources_of(self, kb_id: str, chunk_ids: Iterable[str]) -> dict[str, str]:
        """The source id of each of ``chunk_ids`` (those that exist)."""
        ids = list(chunk_ids)
        out: dict[str, str] = {}
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            marks = ",".join("?" * len(part))
            out.update(self.db.execute(
                f"SELECT id, source_id FROM chunks WHERE kb_id = ? AND id IN ({marks})",
                [kb_id, *part]).fetchall())
        return out

    def hits_by_vkey(self, kb_id: str, vkeys: list[int]) -> dict[int, sqlite3.Row]:
        out: dict[int, sqlite3.Row] = {}
        for start in range(0, len(vkeys), 500):
            part = [int(k) for k in vkeys[start : start + 500]]
            marks = ",".join("?" * len(part))
            for row in self.db.execute(
                "SELECT c.id, c.vkey, c.idx, c.text, c.page, c.vector, c.source_id, "
                "s.title, s.url, s.file_name, s.type, s.chunk_count "
                "FROM chunks c JOIN sources s ON s.id = c.source_id "
                f"WHERE c.kb_id = ? AND c.vkey IN ({marks})", [kb_id, *part]):
                out[row["vkey"]] = row
        return out

    # -- logs ------------------------------------------------------------------
    def log_error(self, source: str, code: str, message: str, *, kb_id: str | None = None,
                  ref: str | None = None, detail: dict | None = None) -> None:
        """Append to the error log; a failure to log never hides the original error.

        Key shapes (``Bearer …``, ``sk-…``) are masked: a quoted server message may echo one.
        """
        from localkb.redact import redact

        with contextlib.suppress(sqlite3.Error):
            self.db.execute(
                "INSERT INTO errors (at, source, code, message, kb_id, ref, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (time.time(), source, code, redact(message[:2000]), kb_id, ref,
                 redact(json.dumps(detail)) if detail else None))

    def errors(self, *, source: str | None = None, kb_id: str | None = None, offset: int = 0,
               limit: int = 20) -> tuple[list[dict], int]:
        where, args = [], []
        if source:
            where.append("source = ?")
            args.append(source)
        if kb_id:
            where.append("kb_id = ?")
            args.append(kb_id)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        total = self.db.execute(f"SELECT COUNT(*) FROM errors {clause}", args).fetchone()[0]
        rows = self.db.execute(
            f"SELECT * FROM errors {clause} ORDER BY id DESC LIMIT ? OFFSET ?",
            [*args, limit, offset]).fetchall()
        return [{"id": r["id"], "at": r["at"], "source": r["source"], "code": r["code"],
                 "message": r["message"], "kb": r["kb_id"], "ref": r["ref"],
                 "detail": json.loads(r["detail"]) if r["detail"] else None} for r in rows], total

    def log_query(self, kind: str, query: str, kb_ids: list[str], trace: dict) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.execute("INSERT INTO queries (at, kind, query, kb_ids, trace) VALUES (?,?,?,?,?)",
                            (time.time(), kind, query, json.dumps(kb_ids), json.dumps(trace)))

    def queries(self, *, limit: int = 20, offset: int = 0) -> tuple[list[dict], int]:
        total = self.db.execute("SELECT COUNT(*) FROM queries").fetchone()[0]
        rows = self.db.execute("SELECT * FROM queries ORDER BY id DESC LIMIT ? OFFSET ?",
                               (limit, offset)).fetchall()
        return [{"id": r["id"], "at": r["at"], "kind": r["kind"], "query": r["query"],
                 "kbs": json.loads(r["kb_ids"]), "trace": json.loads(r["trace"])} for r in rows], total
