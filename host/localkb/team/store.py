"""The team store: the store seam (``store.base``) on PostgreSQL + pgvector, seen through one user's access.

Every read is restricted inside its own SQL statement to the knowledge bases the user's
roles are granted and, within them, to passages at or below their clearance: the vector
leg's ``ORDER BY embedding <=> q`` and the keyword leg's BM25 both run over
``WHERE kb_id = … AND access_level <= …``, so a passage above the user's level is never
a candidate, never fetched, and never counted in the statistics that rank the others
(BM25's document count, average length and document frequencies are those of what the
user may see).

Vector leg: exact below ``Settings.exact_search_below`` visible passages (as the local
store), otherwise the knowledge base's dimension's HNSW index with pgvector's iterative
scan (``hnsw.iterative_scan = relaxed_order``), so a filter that leaves few rows near the
query still fills k; if the walk still returns fewer than asked, an exact filtered scan
answers instead, and the trace says which path ran.

Keyword leg: a ``tsvector`` of ``store.analysis``'s terms (``analyze``: the lexemes
written literally, positions kept — PostgreSQL's own parser and dictionaries never run)
under a GIN index, queried with the same ``QueryPlan`` terms as the local side; ranked by
BM25 with Lucene's idf and Whoosh's defaults (k1 1.2, b 0.75), computed in SQL, so both
stores rank keyword hits alike. The exact-term lookups (document frequency, adjacent
phrase with ``<->``, passages holding a term) run on the same tsvector with the same
filter, so a name held only above the user's clearance is missing for that user.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from psycopg import sql

from localkb.config import Settings
from localkb.embedding.embedder import Embedder, EmbedderRegistry
from localkb.errors import (
    Conflict,
    EmbeddingUnavailable,
    Forbidden,
    InvalidInput,
    KnowledgeBaseNotFound,
    ModelMismatch,
    SourceNotFound,
    TeamUnavailable,
)
from localkb.ingest.chunk import passage_text
from localkb.store.analysis import analyze
from localkb.store.base import (
    ChunkWrite,
    FileFingerprint,
    FileState,
    ItemLocks,
    KnowledgeBaseHandle,
    KnowledgeStore,
    Legs,
    PassageRow,
    Snapshot,
    SourceWrite,
    StagedPassage,
    Stored,
    paged,
    source_listing,
)
from localkb.store.catalog import KBRecord, chunk_id, source_id, vector_key
from localkb.store.keywords import KeywordHit
from localkb.store.vectors import EXPANSION_PER_CANDIDATE, VectorHits
from localkb.strings import have
from localkb.team.access import Access, require_admin
from localkb.team.db import Database
from localkb.team.schema import LEVELS, hnsw_index_sql

PRIVACY = ("device", "cloud")
BM25_K1 = 1.2  # Whoosh's BM25F defaults, which the local keyword index uses
BM25_B = 0.75
#: pgvector's hnsw.ef_search is at most 1000.
MAX_EF_SEARCH = 1000
#: Rows the iterative scan may visit before giving up (pgvector's default is 20,000).
MAX_SCAN_TUPLES = 40_000
MAX_LEXEME_BYTES = 2046  # PostgreSQL's limit for one lexeme is 2 KB
#: Which of several sources at one key (URL or path) a writer's add, change or removal reaches,
#: among those they may see: their own, then the most restricted, then the oldest. A source
#: above their clearance is never among them (``TeamKnowledgeBase.source_id_for``).
_REACH_ORDER = "added_by = %s DESC, access_level DESC, added_at, id"


def _quote(term: str) -> str:
    """A lexeme as a tsvector/tsquery literal: quoted, quotes and backslashes escaped."""
    return "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"


def tsvector_literal(text: str) -> tuple[str, int]:
    """The ``tsvector`` of a passage (our terms with their positions) and its length in terms."""
    positions: dict[str, list[int]] = {}
    length = 0
    for term, pos in analyze(text):
        length += 1
        if len(term.encode()) > MAX_LEXEME_BYTES:
            continue
        slot = positions.setdefault(term, [])
        p = min(pos + 1, 16383)
        if len(slot) < 256 and (not slot or slot[-1] != p):
            slot.append(p)
    literal = " ".join(f"{_quote(t)}:{','.join(map(str, ps))}" for t, ps in positions.items())
    return literal, length


def tsquery_literal(term: str) -> str:
    return _quote(term)


#: Passages re-analysed per transaction by ``reanalyze``.
REANALYZE_BATCH = 2000


def reanalyze(conn) -> int:
    """Rewrite every passage's tsvector if the database was written with another keyword analysis.

    The local store rebuilds a Whoosh index analysed with another ``keywords.SCHEMA`` on
    open; this is the team store's same step, run when the server connects (one server at
    a time: the migrations' advisory lock). Each batch is one transaction; the knowledge
    bases' generations are bumped at the end, so cached statistics are dropped. A database
    without the fact (written before it was kept) counts as schema 1. Returns how many
    passages were rewritten.
    """
    from localkb.store.keywords import SCHEMA

    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(72190001)")
        row = conn.execute("SELECT value FROM meta WHERE key = 'keyword_schema'").fetchone()
        if row is not None and int(row[0]) == SCHEMA:
            return 0
        if not conn.execute("SELECT 1 FROM chunks LIMIT 1").fetchone():
            conn.execute("INSERT INTO meta VALUES ('keyword_schema', %s) ON CONFLICT (key) "
                         "DO UPDATE SET value = excluded.value", (str(SCHEMA),))
            return 0
    done, last = 0, ""
    while True:
        with conn.transaction():
            rows = conn.execute(
                "SELECT c.id, c.text, s.title FROM chunks c JOIN sources s ON s.id = c.source_id "
                "WHERE c.id > %s ORDER BY c.id LIMIT %s", (last, REANALYZE_BATCH)).fetchall()
            if not rows:
                break
            updates = []
            for cid, text, title in rows:
                tsv, length = tsvector_literal(passage_text(title, text))
                updates.append((tsv, length, cid))
            with conn.cursor() as cur:
                cur.executemany("UPDATE chunks SET tsv = %s::tsvector, kw_len = %s WHERE id = %s", updates)
            done += len(rows)
            last = rows[-1][0]
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(72190001)")
        conn.execute("UPDATE kbs SET generation = generation + 1")
        conn.execute("INSERT INTO meta VALUES ('keyword_schema', %s) ON CONFLICT (key) "
                     "DO UPDATE SET value = excluded.value", (str(SCHEMA),))
    return done


def _array(raw) -> np.ndarray:
    """A pgvector value as float32 numpy (the adapter gives numpy; a ``Vector`` object has ``to_numpy``)."""
    return np.asarray(raw.to_numpy() if hasattr(raw, "to_numpy") else raw, dtype=np.float32)


class AdvisoryLocks(ItemLocks):
    """Per-source locks of one ingest job: PostgreSQL session advisory locks on a connection of
    the job's own (not the pool's), so they hold across transactions and are released when the
    job ends, or by the server when its connection dies with the process."""

    NAMESPACE = 72190019  # keys are (this, a 32-bit hash of the source key): other locks never meet them

    def __init__(self, url: str) -> None:
        import threading

        self.url = url
        self._conn = None
        self._held: dict[int, int] = {}
        self._mutex = threading.Lock()

    @staticmethod
    def _key(key: str) -> int:
        import hashlib

        return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big", signed=True)

    def _connection(self):
        import psycopg

        from localkb.team.db import mapped

        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=15)
            except psycopg.Error as err:
                raise mapped(err) from err
        return self._conn

    def acquire(self, key: str) -> bool:
        k = self._key(key)
        with self._mutex:
            if k in self._held:  # the job's own hold (a key sharing the hash shares it, as stripes do)
                self._held[k] += 1
                return True
            row = self._run("SELECT pg_try_advisory_lock(%s, %s)", k).fetchone()
            if not row[0]:
                return False
            self._held[k] = 1
            return True

    def release(self, key: str) -> None:
        k = self._key(key)
        with self._mutex:
            if k not in self._held:
                return
            self._held[k] -= 1
            if self._held[k] == 0:
                del self._held[k]
                with contextlib.suppress(TeamUnavailable):  # a lost session took its locks with it
                    self._run("SELECT pg_advisory_unlock(%s, %s)", k)

    def _run(self, statement: str, k: int):
        """One statement on the lock session; a lost session is forgotten with its locks, and
        its error mapped as every other team database error is."""
        import psycopg

        from localkb.team.db import mapped

        try:
            return self._connection().execute(statement, (self.NAMESPACE, k))
        except psycopg.Error as err:
            self._held.clear()
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            raise mapped(err) from err

    def release_all(self) -> None:
        with self._mutex:
            self._held.clear()
            if self._conn is not None:
                self._conn.close()  # the session's advisory locks go with it
                self._conn = None


def _record(row: dict) -> KBRecord:
    # The keyword leg is PostgreSQL's full-text search, whatever a local store would choose.
    return KBRecord(row["id"], row["name"], row["privacy"], row["model"], row["dim"], row["created"],
                    row["generation"],
                    settings={"keyword_index": "postgresql", "keyword_engine": "postgresql"})


class TeamStore(KnowledgeStore):
    """The team database as one user sees it (``Access.system()``: the server's own view)."""

    history_is_local = False  # a chat's history comes from the client's machine
    concurrent = True  # each knowledge base's search takes its own connections: run side by side

    def __init__(self, db: Database, settings: Settings, access: Access, *,
                 models: EmbedderRegistry | None = None, write_level: int | None = None) -> None:
        self.db = db
        self.settings = settings
        self.access = access
        self.models = models or EmbedderRegistry(settings)
        #: The level sources written through this view get (None: kept, or the default for new ones).
        self.write_level = write_level

    def for_access(self, access: Access) -> TeamStore:
        """The same database and models, seen by another user."""
        return TeamStore(self.db, self.settings, access, models=self.models)

    # -- knowledge bases -------------------------------------------------------------------
    def _visible_clause(self) -> tuple[str, list]:
        if self.access.everything:
            return "TRUE", []
        return "id = ANY(%s)", [list(self.access.kbs)]

    def kbs(self) -> list[KBRecord]:
        clause, args = self._visible_clause()
        with self.db.conn() as conn:
            rows = conn.execute(f"SELECT * FROM kbs WHERE {clause} ORDER BY created, name",
                                args).fetchall()
        return [_record(r) for r in rows]

    def record(self, kb_id: str) -> KBRecord | None:
        if not isinstance(kb_id, str) or self.access.grant(kb_id) is None:
            return None
        with self.db.conn() as conn:
            row = conn.execute("SELECT * FROM kbs WHERE id = %s", (kb_id,)).fetchone()
        return _record(row) if row else None

    def resolve(self, ref: str) -> KBRecord:
        import unicodedata

        if not isinstance(ref, str) or not ref or len(ref) > 200:
            raise InvalidInput("a knowledge base id or name is required")
        name = unicodedata.normalize("NFC", ref)  # names are stored in NFC (check_name)
        with self.db.conn() as conn:
            rows = conn.execute("SELECT * FROM kbs WHERE id = %s OR lower(name) = lower(%s)",
                                (ref, name)).fetchall()
        for row in sorted(rows, key=lambda r: r["id"] != ref):
            if self.access.grant(row["id"]) is not None:
                return _record(row)
        # The same answer whether it does not exist or is not granted: no existence leaks.
        raise KnowledgeBaseNotFound(f"no knowledge base named or with id {ref!r}")

    def describe(self, rec: KBRecord) -> dict:
        """The listing entry: the record, what this user sees of it, and the team marks."""
        grant = self.access.grant(rec.id)
        level = grant.level if grant else 0
        with self.db.conn() as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM sources WHERE kb_id = %(kb)s AND access_level <= %(l)s) AS s, "
                "(SELECT count(*) FROM chunks WHERE kb_id = %(kb)s AND access_level <= %(l)s) AS c, "
                "(SELECT default_access FROM kbs WHERE id = %(kb)s) AS d",
                {"kb": rec.id, "l": level}).fetchone()
        return {**rec.public(), "sources": row["s"], "chunks": row["c"], "origin": "team",
                "access": {"level": LEVELS[level], "write": bool(grant and grant.can_write)},
                "default_access": LEVELS[row["d"] or 0]}

    def create_kb(self, name: str, *, privacy: str = "device", model: str | None = None,
                  default_access: int = 0) -> KBRecord:
        return self._create(name, privacy=privacy, model=model, default_access=default_access)

    def create_imported(self, name: str, *, privacy: str, model: str, sources: Sequence[dict],
                        chunks: Sequence[dict], vectors: np.ndarray) -> KBRecord:
        """A new knowledge base holding an archive's rows, made in one transaction: a kill
        leaves it whole or absent, never listed half-filled."""
        return self._create(name, privacy=privacy, model=model, default_access=0,
                            fill=lambda conn, kb: kb._insert_rows(conn, sources, chunks, vectors))

    def _create(self, name: str, *, privacy: str, model: str | None, default_access: int,
                fill: Callable[[Any, TeamKnowledgeBase], None] | None = None) -> KBRecord:
        from localkb.store.kb import check_name

        require_admin(self.access)
        name = check_name(name)
        if privacy not in PRIVACY:
            raise InvalidInput(f"privacy must be 'device' or 'cloud', not {privacy!r}")
        spec = self.models.spec(model or self.settings.default_model)
        kb_id = "tkb_" + uuid.uuid4().hex[:12]
        self._ensure_vector_index(spec.dim)  # first: its rows are written beside the index
        with self.db.tx() as conn:
            if conn.execute("SELECT 1 FROM kbs WHERE lower(name) = lower(%s)", (name,)).fetchone():
                raise Conflict(f"a knowledge base named {name!r} already exists")
            row = conn.execute("INSERT INTO kbs (id, name, privacy, model, dim, created, default_access) "
                               "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING *",
                               (kb_id, name, privacy, spec.id, spec.dim, time.time(),
                                int(default_access))).fetchone()
            if fill is not None:
                fill(conn, TeamKnowledgeBase(self, _record(row), write_level=self.write_level))
        return self.resolve(kb_id)

    def _ensure_vector_index(self, dim: int) -> None:
        with self.db.conn() as conn:
            conn.autocommit = True
            try:
                conn.execute(hnsw_index_sql(dim))
            finally:
                conn.autocommit = False

    def update_kb(self, ref: str, *, name: str | None = None, privacy: str | None = None,
                  default_access: int | None = None) -> KBRecord:
        from localkb.store.kb import check_name

        require_admin(self.access)
        rec = self.resolve(ref)
        if privacy is not None and privacy not in PRIVACY:
            raise InvalidInput(f"privacy must be 'device' or 'cloud', not {privacy!r}")
        with self.db.tx() as conn:
            if name is not None:
                name = check_name(name)
                if conn.execute("SELECT 1 FROM kbs WHERE lower(name) = lower(%s) AND id <> %s",
                                (name, rec.id)).fetchone():
                    raise Conflict(f"a knowledge base named {name!r} already exists")
                conn.execute("UPDATE kbs SET name = %s WHERE id = %s", (name, rec.id))
            if privacy is not None:
                conn.execute("UPDATE kbs SET privacy = %s WHERE id = %s", (privacy, rec.id))
            if default_access is not None:
                conn.execute("UPDATE kbs SET default_access = %s WHERE id = %s",
                             (int(default_access), rec.id))
        return self.resolve(rec.id)

    def delete_kb(self, ref: str) -> KBRecord:
        require_admin(self.access)
        rec = self.resolve(ref)
        with self.db.tx() as conn:
            conn.execute("DELETE FROM kbs WHERE id = %s", (rec.id,))
        return rec

    def open_kb(self, ref: str, *, write_level: int | None = None) -> TeamKnowledgeBase:
        """A knowledge base; ``write_level`` is the level new or re-added sources get (else kept)."""
        level = self.write_level if write_level is None else write_level
        return TeamKnowledgeBase(self, self.resolve(ref), write_level=level)

    def generation(self, kb_id: str) -> int | None:
        rec = self.record(kb_id)
        return rec.generation if rec else None

    def counts(self, kb_id: str) -> dict:
        rec = self.record(kb_id)
        if rec is None:
            raise KnowledgeBaseNotFound(f"no knowledge base with id {kb_id!r}")
        d = self.describe(rec)
        return {"sources": d["sources"], "chunks": d["chunks"]}

    def level(self, kb_id: str) -> int:
        grant = self.access.grant(kb_id)
        if grant is None:
            raise KnowledgeBaseNotFound(f"no knowledge base with id {kb_id!r}")
        return grant.level

    def passage_window(self, kb_id: str, source_id: str, idx: int, radius: int) -> list[dict]:
        level = self.level(kb_id)
        with self.db.conn() as conn:
            return conn.execute(
                "SELECT idx, text, page FROM chunks WHERE kb_id = %s AND source_id = %s "
                "AND access_level <= %s AND idx BETWEEN %s AND %s ORDER BY idx",
                (kb_id, source_id, level, idx - radius, idx + radius)).fetchall()

    def log_query(self, kind: str, query: str, kb_ids: list[str], trace: dict) -> None:
        """The team query log is issue 20's (per user, with the access set used); not kept here yet."""

    def log_error(self, source: str, code: str, message: str, *, kb_id: str | None = None,
                  ref: str | None = None, detail: dict | None = None) -> None:
        import json

        try:
            with self.db.tx() as conn:
                conn.execute("INSERT INTO errors (at, source, code, message, kb_id, ref, detail) "
                             "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                             (time.time(), source, code, message[:2000], kb_id, ref,
                              json.dumps(detail) if detail else None))
        except Exception:  # noqa: S110 - a failure to log never hides the original error
            pass

    def errors(self, *, source: str | None = None, kb: str | None = None, offset: int = 0,
               limit: int = 20) -> tuple[list[dict], int]:
        """The error log, newest first; ``kb`` (an id or a name) is resolved only for an admin,
        so nobody else learns from the refusal whether it exists."""
        require_admin(self.access)
        kb_id = self.resolve(kb).id if kb else None
        with self.db.conn() as conn:
            where = "WHERE (%(s)s::text IS NULL OR source = %(s)s) AND (%(k)s::text IS NULL OR kb_id = %(k)s)"
            args = {"s": source, "k": kb_id, "o": offset, "l": limit}
            total = conn.execute(f"SELECT count(*) AS n FROM errors {where}", args).fetchone()["n"]
            rows = conn.execute(f"SELECT * FROM errors {where} ORDER BY id DESC LIMIT %(l)s "
                                "OFFSET %(o)s", args).fetchall()
        return [{"id": r["id"], "at": r["at"], "source": r["source"], "code": r["code"],
                 "message": r["message"], "kb": r["kb_id"], "ref": r["ref"], "detail": r["detail"]}
                for r in rows], total


#: The sources of an export, oldest first. An archive holds one source per key; several at one
#: key (writers of different clearances at one URL) keep the oldest's key, the others get their
#: id appended to theirs, so the file imports whole.
_EXPORT_SOURCES = (
    "SELECT id, kb_id, CASE WHEN row_number() OVER (PARTITION BY key ORDER BY added_at, id) > 1 "
    "THEN key || '#' || id ELSE key END AS key, type, title, url, file_name, content_hash, "
    "captured_by, chunk_count, pages, lang, added_at, updated_at, access_level, added_by "
    "FROM sources WHERE kb_id = %s AND access_level <= %s ORDER BY added_at, id")


class TeamKnowledgeBase(KnowledgeBaseHandle):
    """One team knowledge base at the user's level."""

    def __init__(self, store: TeamStore, record: KBRecord, *, write_level: int | None = None) -> None:
        self.store = store
        self.record = record
        self.db = store.db
        grant = store.access.grant(record.id)
        if grant is None:
            raise KnowledgeBaseNotFound(f"no knowledge base with id {record.id!r}")
        self.level = grant.level
        self.can_write = grant.can_write
        if write_level is not None and not 0 <= write_level < len(LEVELS):
            raise InvalidInput("the access level is out of range", detail={"field": "access"})
        if write_level is not None and write_level > self.level:
            raise Forbidden(f"you may not add sources above your clearance ({LEVELS[self.level]}) "
                            f"in {record.name!r}")
        self.write_level = write_level
        self.embedder: Embedder = store.models.get(record.model)
        if self.embedder.dim != record.dim:
            raise ModelMismatch(f"model {record.model} has {self.embedder.dim} dimensions, "
                                f"the knowledge base was created with {record.dim}")

    def check_writable(self) -> None:
        if not self.can_write:
            raise Forbidden(f"your roles may read {self.record.name!r} but not write to it")

    # -- ingestion (ingest/pipeline.py) -----------------------------------------------------
    def before_ingest(self) -> None:
        self.check_writable()  # a reader's add is refused before anything is read or embedded

    def item_locks(self) -> ItemLocks:
        return AdvisoryLocks(self.db.url)

    def source_id_for(self, key: str) -> str:
        """The source an add at ``key`` writes: one the caller may see at that key, else a new
        one of their own, whatever is stored above their clearance there.

        A writer's add at the URL of a source they cannot see neither overwrites it nor is
        refused (which would say it exists): it makes a separate source, whose id is derived
        from the key and the writer, so their next add at that URL reaches it again. Their
        replies are those of a knowledge base without the hidden source.
        """
        import itertools

        access = self.store.access
        with self.db.conn() as conn:
            row = conn.execute(
                "SELECT id FROM sources WHERE kb_id = %s AND key = %s AND access_level <= %s "
                f"ORDER BY {_REACH_ORDER} LIMIT 1",
                (self.id, key, self.level, access.user)).fetchone()
            if row is not None:
                return row["id"]
            if access.everything:
                return source_id(self.id, key)  # they see every source: none is at this key
            for n in itertools.count():
                # Taken only by their own earlier source there, since raised above them.
                sid = source_id(self.id, f"{key}\x1f{access.user_id}\x1f{n}")
                if conn.execute("SELECT 1 FROM sources WHERE id = %s", (sid,)).fetchone() is None:
                    return sid
        raise AssertionError("unreachable")

    def source_state(self, sid: str) -> tuple[str, int] | None:
        with self.db.conn() as conn:
            row = conn.execute("SELECT content_hash, chunk_count FROM sources WHERE id = %s "
                               "AND kb_id = %s AND access_level <= %s",
                               (sid, self.id, self.level)).fetchone()
        return (row["content_hash"], row["chunk_count"]) if row else None

    def stored_passages(self, sid: str, conn=None) -> Stored:
        def read(c) -> Stored:
            return {r["idx"]: (r["id"], r["text_hash"], bool(r["ok"])) for r in c.execute(
                "SELECT idx, id, text_hash, (dim = %s AND vector_norm(embedding) > 1e-6) AS ok "
                "FROM chunks WHERE source_id = %s AND kb_id = %s AND access_level <= %s",
                (self.record.dim, sid, self.id, self.level))}

        if conn is not None:
            return read(conn)
        with self.db.conn() as c:
            return read(c)

    def vectors_by_text_hash(self, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        uniq = list(dict.fromkeys(hashes))
        if not uniq:
            return {}
        with self.db.conn() as conn:
            rows = conn.execute(
                "SELECT DISTINCT ON (text_hash) text_hash, embedding FROM chunks WHERE kb_id = %s "
                "AND access_level <= %s AND text_hash = ANY(%s) AND dim = %s "
                "AND vector_norm(embedding) > 1e-6 ORDER BY text_hash, id",
                (self.id, self.level, uniq, self.record.dim)).fetchall()
        return {r["text_hash"]: _array(r["embedding"]) for r in rows}

    def file_state(self, sid: str) -> FileState | None:
        with self.db.conn() as conn:
            r = conn.execute(
                "SELECT f.size, f.mtime_ns, f.sha256, f.recipe, s.title, s.url, s.chunk_count, "
                "(SELECT count(*) FROM chunks c WHERE c.source_id = s.id) AS stored "
                "FROM sources s JOIN source_files f ON f.source_id = s.id WHERE s.id = %s "
                "AND s.kb_id = %s AND s.access_level <= %s", (sid, self.id, self.level)).fetchone()
        if r is None:
            return None
        return FileState(size=r["size"], mtime_ns=r["mtime_ns"], sha256=r["sha256"], recipe=r["recipe"],
                         title=r["title"], url=r["url"], chunk_count=r["chunk_count"], stored=r["stored"])

    def save_file_state(self, sid: str, fp: FileFingerprint) -> None:
        self.check_writable()
        with self.db.tx() as conn:
            self._save_file(conn, sid, fp)

    def _save_file(self, conn, sid: str, fp: FileFingerprint) -> None:
        conn.execute(
            "INSERT INTO source_files (source_id, kb_id, path, size, mtime_ns, sha256, recipe) "
            "SELECT %s, %s, %s, %s, %s, %s, %s WHERE EXISTS (SELECT 1 FROM sources WHERE id = %s "
            "AND access_level <= %s) ON CONFLICT (source_id) DO UPDATE SET path = excluded.path, "
            "size = excluded.size, mtime_ns = excluded.mtime_ns, sha256 = excluded.sha256, "
            "recipe = excluded.recipe",
            (sid, self.id, fp.path, fp.size, fp.mtime_ns, fp.sha256, fp.recipe, sid, self.level))

    def _lock(self, conn) -> int:
        """Serialise this knowledge base's writers (and see the deletion of the knowledge base)."""
        row = conn.execute("SELECT generation, default_access FROM kbs WHERE id = %s FOR UPDATE",
                           (self.id,)).fetchone()
        if row is None:
            raise KnowledgeBaseNotFound(f"knowledge base {self.record.name!r} was deleted")
        self._default_access = row["default_access"]
        return row["generation"]

    def _bump(self, conn) -> None:
        conn.execute("UPDATE kbs SET generation = generation + 1 WHERE id = %s", (self.id,))

    def _stored_level(self, conn, sid: str) -> int | None:
        """The access level of a stored source; Forbidden when it is above the writer's clearance."""
        row = conn.execute("SELECT access_level FROM sources WHERE id = %s", (sid,)).fetchone()
        if row is not None and row["access_level"] > self.level:
            raise Forbidden("you may not overwrite this source: it is above your clearance")
        return None if row is None else row["access_level"]

    def _upsert_source(self, conn, w: SourceWrite, now: float) -> int:
        """The source row (its first ``added_at`` kept) at the level it gets; returns that level."""
        row = conn.execute("SELECT access_level, added_at FROM sources WHERE id = %s", (w.id,)).fetchone()
        if row is not None and row["access_level"] > self.level:
            raise Forbidden("you may not overwrite this source: it is above your clearance")
        level = (self.write_level if self.write_level is not None
                 else row["access_level"] if row is not None else self._default_access)
        if level > self.level:
            raise Forbidden(f"new sources of {self.record.name!r} are "
                            f"{LEVELS[level]}, above your clearance")
        conn.execute(
            "INSERT INTO sources (id, kb_id, key, type, title, url, file_name, content_hash, "
            "captured_by, chunk_count, pages, lang, added_at, updated_at, access_level, added_by) "
            "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (id) DO UPDATE SET "
            "type = excluded.type, title = excluded.title, url = excluded.url, "
            "file_name = excluded.file_name, content_hash = excluded.content_hash, "
            "captured_by = excluded.captured_by, chunk_count = excluded.chunk_count, "
            "pages = excluded.pages, lang = excluded.lang, updated_at = excluded.updated_at, "
            "access_level = excluded.access_level",
            (w.id, self.id, w.key, w.type, w.title, w.url, w.file_name, w.content_hash,
             w.captured_by, w.chunk_count, w.pages, w.lang,
             row["added_at"] if row else now, now, level, self.store.access.user))
        if row is not None and row["access_level"] != level:
            conn.execute("UPDATE chunks SET access_level = %s WHERE source_id = %s", (level, w.id))
        if w.file is not None:
            self._save_file(conn, w.id, w.file)
        return level

    @staticmethod
    def _delete_unkept(conn, before: Stored, keep: set[str]) -> None:
        stale = [cid for cid, _h, _ok in before.values() if cid not in keep]
        if stale:
            conn.execute("DELETE FROM chunks WHERE id = ANY(%s)", (stale,))

    def write_sources(self, writes: Sequence[SourceWrite]) -> dict[str, Stored]:
        self.check_writable()
        befores: dict[str, Stored] = {}
        now = time.time()
        with self.db.tx() as conn:
            self._lock(conn)
            for w in writes:
                befores[w.id] = self.stored_passages(w.id, conn)
                level = self._upsert_source(conn, w, now)
                self._upsert_chunks(conn, w.id, w.title, level, w.chunks, now=now)
                self._delete_unkept(conn, befores[w.id], w.keep)
            if writes:
                self._bump(conn)
        return befores

    def staged_passages(self, sid: str, model: str) -> dict[int, str]:
        with self.db.tx() as conn:
            if conn.execute("SELECT 1 FROM sources WHERE id = %s AND access_level > %s",
                            (sid, self.level)).fetchone():
                return {}  # what is staged for a source above the caller's clearance is not theirs
            conn.execute("DELETE FROM ingest_staging WHERE source_id = %s AND model <> %s", (sid, model))
            return {r["idx"]: r["text_hash"] for r in conn.execute(
                "SELECT idx, text_hash FROM ingest_staging WHERE source_id = %s", (sid,))}

    def stage_passages(self, sid: str, model: str, rows: Sequence[StagedPassage]) -> None:
        self.check_writable()
        now = time.time()
        data = []
        for r in rows:
            vec = self._checked(r.vector, "staged")
            data.append((self.id, sid, r.idx, r.id, model, r.text, r.text_hash, r.page, r.tokens, vec, now))
        with self.db.tx() as conn:
            self._stored_level(conn, sid)  # refused before the whole source is embedded
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO ingest_staging (kb_id, source_id, idx, chunk_id, model, text, text_hash, "
                    "page, tokens, embedding, staged_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) "
                    "ON CONFLICT (source_id, idx) DO UPDATE SET chunk_id = excluded.chunk_id, "
                    "model = excluded.model, text = excluded.text, text_hash = excluded.text_hash, "
                    "page = excluded.page, tokens = excluded.tokens, embedding = excluded.embedding, "
                    "staged_at = excluded.staged_at", data)

    def unstage(self, sid: str, idxs: Sequence[int] | None = None) -> None:
        with self.db.tx() as conn:
            if idxs is None:
                conn.execute("DELETE FROM ingest_staging WHERE source_id = %s", (sid,))
            else:
                conn.execute("DELETE FROM ingest_staging WHERE source_id = %s AND idx = ANY(%s)",
                             (sid, list(idxs)))

    def publish_staged(self, write: SourceWrite) -> Stored:
        self.check_writable()
        now = time.time()
        with self.db.tx() as conn:
            self._lock(conn)
            before = self.stored_passages(write.id, conn)
            level = self._upsert_source(conn, write, now)
            conn.execute("DELETE FROM ingest_staging WHERE source_id = %s AND idx >= %s",
                         (write.id, write.chunk_count))
            staged = [ChunkWrite(id=r["chunk_id"], idx=r["idx"], text=r["text"], text_hash=r["text_hash"],
                                 page=r["page"], tokens=r["tokens"], vector=_array(r["embedding"]),
                                 indexed_by=write.captured_by)
                      for r in conn.execute("SELECT * FROM ingest_staging WHERE source_id = %s ORDER BY idx",
                                            (write.id,))]
            self._upsert_chunks(conn, write.id, write.title, level, staged + list(write.chunks), now=now)
            self._delete_unkept(conn, before, write.keep)
            conn.execute("DELETE FROM ingest_staging WHERE source_id = %s", (write.id,))
            self._bump(conn)
        return before

    def staged_sources(self) -> dict[str, int]:
        with self.db.conn() as conn:
            return {r["source_id"]: r["n"] for r in conn.execute(
                "SELECT source_id, count(*) AS n FROM ingest_staging WHERE kb_id = %s GROUP BY source_id",
                (self.id,))}

    def log_skip(self, ref: str, reason: str) -> None:
        message = f"{ref}: skipped: {reason}"
        with self.db.conn() as conn:
            last = conn.execute("SELECT message FROM errors WHERE kb_id = %s AND ref = %s "
                                "AND code = 'skipped' ORDER BY id DESC LIMIT 1", (self.id, ref)).fetchone()
        if last is None or last["message"] != message:
            self.log_error("ingest", "skipped", message, ref=ref)

    def _checked(self, vector, done: str) -> np.ndarray:
        """The vector as float32, or EmbeddingUnavailable if it is not one of this knowledge base's."""
        vec = np.asarray(vector, dtype=np.float32)
        if vec.shape != (self.record.dim,) or not np.isfinite(vec).all():
            raise EmbeddingUnavailable(f"a vector of shape {vec.shape} for a {self.record.dim}-d "
                                       f"knowledge base (or not finite): nothing was {done}")
        return vec

    def _upsert_chunks(self, conn, sid: str, title: str, level: int, chunks, *, now: float) -> None:
        rows = []
        for c in chunks:
            vec = self._checked(c.vector, "written")
            tsv, length = tsvector_literal(passage_text(title, c.text))
            rows.append((c.id, vector_key(c.id), self.id, sid, c.idx, c.text, c.text_hash, c.page,
                         c.tokens, self.record.dim, vec, level, tsv, length, c.indexed_by, now))
        if not rows:
            return
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO chunks (id, vkey, kb_id, source_id, idx, text, text_hash, page, tokens, "
                "dim, embedding, access_level, tsv, kw_len, indexed_by, indexed_at) "
                "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s::tsvector,%s,%s,%s) "
                "ON CONFLICT (id) DO UPDATE SET text = excluded.text, text_hash = excluded.text_hash, "
                "page = excluded.page, tokens = excluded.tokens, dim = excluded.dim, "
                "embedding = excluded.embedding, access_level = excluded.access_level, "
                "tsv = excluded.tsv, kw_len = excluded.kw_len, indexed_by = excluded.indexed_by, "
                "indexed_at = excluded.indexed_at", rows)

    def _find_source(self, conn, ref: str) -> dict:
        from pathlib import Path

        file_key = "file:" + str(Path(ref).expanduser().resolve()) if len(ref) < 4096 else ref
        row = conn.execute(
            "SELECT id, title, access_level FROM sources WHERE kb_id = %s AND access_level <= %s "
            "AND (id = %s OR key = %s OR url = %s OR key = %s) "
            f"ORDER BY id = %s DESC, {_REACH_ORDER} LIMIT 1",
            (self.id, self.level, ref, ref, ref, file_key, ref, self.store.access.user)).fetchone()
        if row is None:
            raise SourceNotFound(f"no source {ref!r} in {self.record.name!r}")
        return row

    def remove_source(self, ref: str) -> dict:
        self.check_writable()
        with self.db.tx() as conn:
            self._lock(conn)
            row = self._find_source(conn, ref)
            n = conn.execute("DELETE FROM chunks WHERE source_id = %s", (row["id"],)).rowcount
            conn.execute("DELETE FROM sources WHERE id = %s", (row["id"],))
            self._bump(conn)
        return {"source_id": row["id"], "title": row["title"], "removed_chunks": n}

    def set_access(self, ref: str, level: int) -> dict:
        """Change a source's access level (and so its passages'), at most to the user's own."""
        self.check_writable()
        if not 0 <= level < len(LEVELS):
            raise InvalidInput("the access level is out of range", detail={"field": "access"})
        if level > self.level:
            raise Forbidden(f"you may not raise a source above your clearance ({LEVELS[self.level]})")
        with self.db.tx() as conn:
            self._lock(conn)
            row = self._find_source(conn, ref)
            conn.execute("UPDATE sources SET access_level = %s WHERE id = %s", (level, row["id"]))
            n = conn.execute("UPDATE chunks SET access_level = %s WHERE source_id = %s",
                             (level, row["id"])).rowcount
            self._bump(conn)
        return {"source_id": row["id"], "title": row["title"], "access": LEVELS[level],
                "was": LEVELS[row["access_level"]], "chunks": n}

    def source_access(self, sid: str) -> str | None:
        """The access level of a visible source, by name."""
        with self.db.conn() as conn:
            row = conn.execute("SELECT access_level FROM sources WHERE id = %s AND kb_id = %s "
                               "AND access_level <= %s", (sid, self.id, self.level)).fetchone()
        return LEVELS[row["access_level"]] if row else None

    def list_sources(self, *, offset: int = 0, limit: int = 100) -> tuple[list[dict], int]:
        with self.db.conn() as conn:
            total = conn.execute("SELECT count(*) AS n FROM sources WHERE kb_id = %s AND access_level <= %s",
                                 (self.id, self.level)).fetchone()["n"]
            rows = conn.execute(
                "SELECT s.*, (SELECT count(*) FROM chunks c WHERE c.source_id = s.id) AS stored "
                "FROM sources s WHERE kb_id = %s AND access_level <= %s ORDER BY added_at, id "
                "LIMIT %s OFFSET %s", (self.id, self.level, limit, offset)).fetchall()
        return [{"id": r["id"], "title": r["title"], "url": r["url"], "file_name": r["file_name"],
                 "type": r["type"], "chunks": r["stored"], "chunk_count": r["chunk_count"],
                 "pages": r["pages"], "captured_by": r["captured_by"], "added_at": r["added_at"],
                 "updated_at": r["updated_at"], "access": LEVELS[r["access_level"]],
                 "added_by": r["added_by"]} for r in rows], total

    def source_total(self) -> int:
        with self.db.conn() as conn:
            return conn.execute("SELECT count(*) AS n FROM sources WHERE kb_id = %s AND access_level <= %s",
                                (self.id, self.level)).fetchone()["n"]

    def find_sources(self, ref: str) -> list[dict]:
        from pathlib import Path

        resolved = "file:" + str(Path(ref).expanduser().resolve()) if len(ref) < 4096 else ref
        cols = "SELECT id, title, url, file_name, key FROM sources WHERE kb_id = %s AND access_level <= %s "
        with self.db.conn() as conn:
            exact = conn.execute(cols + "AND (id = %s OR key = %s OR url = %s OR key = %s)",
                                 (self.id, self.level, ref, ref, ref, resolved)).fetchall()
            if exact:
                return [dict(r) for r in exact]
            tail = "%/" + ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_").lstrip("/")
            return [dict(r) for r in conn.execute(
                cols + "AND (lower(file_name) = lower(%s) OR lower(title) = lower(%s) "
                "OR key LIKE %s ESCAPE '\\')", (self.id, self.level, ref, ref, tail))]

    def iter_sources(self, *, offset: int = 0, limit: int | None = None,
                     sort: str = "title") -> Iterator[dict]:
        orders = {"title": "lower(s.title), s.id", "added": "s.added_at, s.id",
                  "updated": "s.updated_at DESC, s.id"}
        if sort not in orders:
            raise InvalidInput(f"sort must be one of {', '.join(orders)}")
        query = ("SELECT s.*, (SELECT count(*) FROM chunks c WHERE c.source_id = s.id) AS stored "
                 f"FROM sources s WHERE kb_id = %s AND access_level <= %s ORDER BY {orders[sort]} "
                 "LIMIT %s OFFSET %s")

        def fetch(n: int, at: int) -> list:
            with self.db.conn() as conn:
                return conn.execute(query, (self.id, self.level, n, at)).fetchall()

        for r in paged(fetch, offset, limit):
            yield {**source_listing(r, r["stored"]), "access": LEVELS[r["access_level"]],
                   "added_by": r["added_by"]}

    # -- search ----------------------------------------------------------------------------
    def legs(self) -> TeamLegs:
        return TeamLegs(self)

    # -- portable --------------------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        """One REPEATABLE READ transaction: the export is one consistent state, at the user's level."""
        with self.db.conn() as conn:
            conn.isolation_level = 3  # psycopg IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            try:
                with conn.transaction():
                    rec = conn.execute("SELECT * FROM kbs WHERE id = %s", (self.id,)).fetchone()
                    if rec is None:
                        raise KnowledgeBaseNotFound(f"knowledge base {self.record.name!r} was deleted")
                    args = (self.id, self.level)
                    n_s = conn.execute("SELECT count(*) AS n FROM sources WHERE kb_id = %s "
                                       "AND access_level <= %s", args).fetchone()["n"]
                    n_c = conn.execute("SELECT count(*) AS n FROM chunks WHERE kb_id = %s "
                                       "AND access_level <= %s", args).fetchone()["n"]
                    yield Snapshot(record=dict(rec), n_sources=n_s, n_chunks=n_c,
                                   sources=self._stream(conn, _EXPORT_SOURCES, args),
                                   chunks=self._chunk_stream(conn, args))
            finally:
                conn.isolation_level = None
                conn.read_only = False

    @staticmethod
    def _stream(conn, query: str, args) -> Iterator[dict]:
        with conn.cursor(name="localkb_export_" + uuid.uuid4().hex[:8]) as cur:
            cur.itersize = 500
            cur.execute(query, args)
            yield from cur

    def _chunk_stream(self, conn, args) -> Iterator[dict]:
        for row in self._stream(conn, "SELECT id, source_id, idx, text, page, tokens, text_hash, "
                                "indexed_by, indexed_at, embedding FROM chunks WHERE kb_id = %s AND "
                                "access_level <= %s ORDER BY source_id, idx", args):
            vec = _array(row.pop("embedding")).astype("<f4", copy=False)
            yield {**row, "vector": vec.tobytes()}

    def import_rows(self, sources: Sequence[dict], chunks: Sequence[dict], vectors: np.ndarray) -> None:
        self.check_writable()
        with self.db.tx() as conn:
            self._lock(conn)
            self._insert_rows(conn, sources, chunks, vectors)

    def _insert_rows(self, conn, sources: Sequence[dict], chunks: Sequence[dict],
                     vectors: np.ndarray) -> None:
        """An archive's sources and passages, in the caller's transaction."""
        level = self.write_level if self.write_level is not None else 0
        new_sid = {s["id"]: source_id(self.id, s["key"]) for s in sources}
        titles = {s["id"]: s["title"] for s in sources}
        now = time.time()
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO sources (id, kb_id, key, type, title, url, file_name, content_hash, "
                "captured_by, chunk_count, pages, lang, added_at, updated_at, access_level, added_by) "
                "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                [(new_sid[s["id"]], self.id, s["key"], s["type"], s["title"], s["url"], s["file_name"],
                  s["content_hash"], s["captured_by"], s["chunk_count"], s["pages"], s["lang"],
                  s["added_at"], s["updated_at"], level, self.store.access.user) for s in sources])
        by_source: dict[str, list[ChunkWrite]] = {}
        for c, vec in zip(chunks, vectors, strict=True):
            sid = new_sid[c["source"]]
            by_source.setdefault(c["source"], []).append(ChunkWrite(
                id=chunk_id(self.id, sid, c["index"]), idx=c["index"], text=c["text"],
                text_hash=c["text_hash"], page=c["page"], tokens=c["tokens"], vector=vec,
                indexed_by=c["indexed_by"]))
        for old_sid, rows in by_source.items():
            self._upsert_chunks(conn, new_sid[old_sid], titles[old_sid], level, rows, now=now)
        self._bump(conn)

    # -- re-embedding (ingest/reembed.py), administrators only -------------------------------
    @contextmanager
    def _conn(self):
        """The connection of ``writers_paused`` while it is open (its transaction), else a pooled one."""
        held = getattr(self, "_held", None)
        if held is not None:
            yield held
            return
        with self.db.tx() as conn:
            yield conn

    def staged_count(self) -> int:
        with self._conn() as conn:
            return conn.execute("SELECT count(*) AS n FROM reembed_staging WHERE kb_id = %s",
                                (self.id,)).fetchone()["n"]

    def clear_staging(self, keep_model: str | None) -> None:
        require_admin(self.store.access)
        with self._conn() as conn:
            conn.execute("DELETE FROM reembed_staging WHERE kb_id = %s AND model <> %s",
                         (self.id, keep_model or ""))

    def reembed_missing(self, model: str) -> list[str]:
        with self._conn() as conn:
            return [r["id"] for r in conn.execute(
                "SELECT c.id FROM chunks c LEFT JOIN reembed_staging r ON r.kb_id = c.kb_id "
                "AND r.chunk_id = c.id AND r.model = %s AND r.text_hash = c.text_hash "
                "WHERE c.kb_id = %s AND r.chunk_id IS NULL ORDER BY c.id", (model, self.id))]

    def chunk_texts(self, ids: Sequence[str]) -> list[dict]:
        with self._conn() as conn:
            return conn.execute(
                "SELECT c.id, c.text, c.text_hash, s.title FROM chunks c JOIN sources s "
                "ON s.id = c.source_id WHERE c.kb_id = %s AND c.id = ANY(%s)",
                (self.id, list(ids))).fetchall()

    def stage_vectors(self, model: str, rows) -> None:
        require_admin(self.store.access)
        with self._conn() as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO reembed_staging (kb_id, chunk_id, model, text_hash, embedding) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (kb_id, chunk_id) DO UPDATE SET "
                "model = excluded.model, text_hash = excluded.text_hash, embedding = excluded.embedding",
                [(self.id, cid, model, h, np.asarray(v, np.float32)) for cid, h, v in rows])

    @contextmanager
    def writers_paused(self):
        """One transaction holding this knowledge base's row lock: every writer waits for it."""
        require_admin(self.store.access)
        with self.db.tx() as conn:
            self._lock(conn)
            self._held = conn
            try:
                yield
            finally:
                self._held = None

    def switch_model(self, model: str, dim: int) -> int:
        require_admin(self.store.access)
        with self._conn() as conn:
            self._lock(conn)
            left = conn.execute(
                "SELECT count(*) AS n FROM chunks c LEFT JOIN reembed_staging r ON r.kb_id = c.kb_id "
                "AND r.chunk_id = c.id AND r.model = %s AND r.text_hash = c.text_hash "
                "WHERE c.kb_id = %s AND r.chunk_id IS NULL", (model, self.id)).fetchone()["n"]
            if left:
                raise EmbeddingUnavailable(f"{have(left, 'chunk')} no {model} vector; nothing was switched")
            conn.execute("UPDATE chunks c SET embedding = r.embedding, dim = %s FROM reembed_staging r "
                         "WHERE r.kb_id = c.kb_id AND r.chunk_id = c.id AND c.kb_id = %s", (dim, self.id))
            conn.execute("UPDATE kbs SET model = %s, dim = %s, generation = generation + 1 WHERE id = %s",
                         (model, dim, self.id))
            conn.execute("DELETE FROM reembed_staging WHERE kb_id = %s", (self.id,))
            row = conn.execute("SELECT generation FROM kbs WHERE id = %s", (self.id,)).fetchone()
            return row["generation"]

    def after_switch(self, old_model: str) -> None:
        self.store._ensure_vector_index(self.store.models.spec(self.store.resolve(self.id).model).dim)


class TeamLegs(Legs):
    """The two legs over one knowledge base, every statement filtered by ``kb_id`` and level.

    The planner may answer the approximate query with an exact plan (a B-tree on
    ``(kb_id, access_level)`` and a sort) when few rows pass the filter; either way k
    rows come back. ``session_settings`` adds ``SET LOCAL`` options to it (tests force
    the HNSW walk with ``enable_sort = off``).
    """

    session_settings: dict[str, object] = {}  # noqa: RUF012 - a class-wide hook, replaced, never mutated
    #: Each call takes its own pooled connection, so the Searcher could run the two legs side by
    #: side; off: under load (bench/team_load.py, 50 users, real vectors) it cost throughput
    #: (17.5 req/s against 20.6 without it, the release before 19-23) on a saturated machine.
    concurrent = False

    def __init__(self, kb: TeamKnowledgeBase) -> None:
        self.kb = kb
        self.db = kb.db
        self.kb_id = kb.id
        self.level = kb.level
        self.dim = kb.record.dim
        with self.db.conn() as conn:
            row = conn.execute("SELECT generation FROM kbs WHERE id = %s", (self.kb_id,)).fetchone()
        if row is None:
            raise KnowledgeBaseNotFound(f"knowledge base {kb.record.name!r} was deleted")
        self.generation = row["generation"]
        self.trace = {"access": {"level": LEVELS[self.level],
                                 "filter": f"kb_id = {self.kb_id} AND access_level <= {self.level}"}}

    def _stats(self) -> tuple[int, float]:
        """(visible passages, their mean length in terms), cached per generation and level."""
        def compute() -> tuple[int, float]:
            with self.db.conn() as conn:
                row = conn.execute("SELECT count(*) AS n, coalesce(avg(kw_len), 0) AS avg FROM chunks "
                                   "WHERE kb_id = %s AND access_level <= %s",
                                   (self.kb_id, self.level)).fetchone()
            return int(row["n"]), float(row["avg"])

        return self.db.cached(("stats", self.kb_id, self.generation, self.level), compute)

    def is_empty(self) -> bool:
        return self._stats()[0] == 0

    def vector(self, qvec: np.ndarray, count: int) -> VectorHits:
        n = self._stats()[0]
        if n == 0 or count <= 0:
            return VectorHits(np.zeros(0, np.uint64), np.zeros(0, np.float32), True)
        count = min(count, n)
        q = np.asarray(qvec, dtype=np.float32)
        exact = n < self.kb.store.settings.exact_search_below
        path = "exact"
        rows: list[dict] = []
        if not exact:
            cast = sql.SQL("vector({})").format(sql.Literal(self.dim))
            query = sql.SQL(
                "SELECT vkey, id, (embedding::{cast}) <=> %(q)s::{cast} AS d FROM chunks "
                "WHERE dim = {dim} AND kb_id = %(kb)s AND access_level <= %(lvl)s "
                "ORDER BY (embedding::{cast}) <=> %(q)s::{cast} LIMIT %(n)s").format(
                    cast=cast, dim=sql.Literal(self.dim))
            ef = min(MAX_EF_SEARCH, max(64, EXPANSION_PER_CANDIDATE * count))
            options = {"hnsw.ef_search": ef, "hnsw.iterative_scan": "relaxed_order",
                       "hnsw.max_scan_tuples": MAX_SCAN_TUPLES, **self.session_settings}
            with self.db.conn() as conn, conn.transaction():
                for name, value in options.items():
                    conn.execute("SELECT set_config(%s, %s, true)", (name, str(value)))
                rows = conn.execute(query, {"q": q, "kb": self.kb_id, "lvl": self.level,
                                            "n": count}).fetchall()
            path = "hnsw"
            self.trace["hnsw_returned"] = len(rows)
            if len(rows) < count:
                exact, path = True, "hnsw, then exact (the filtered walk returned too few)"
        if exact:
            with self.db.conn() as conn:
                rows = conn.execute(
                    "SELECT vkey, id, embedding <=> %(q)s AS d FROM chunks WHERE kb_id = %(kb)s "
                    "AND access_level <= %(lvl)s ORDER BY embedding <=> %(q)s LIMIT %(n)s",
                    {"q": q, "kb": self.kb_id, "lvl": self.level, "n": count}).fetchall()
        rows.sort(key=lambda r: (r["d"], r["id"]))  # relaxed order: sort the k found exactly
        self.trace["vector_path"] = path
        self.trace["vector_fetched"] = [r["id"] for r in rows]
        return VectorHits(np.array([r["vkey"] for r in rows], dtype=np.uint64),
                          1.0 - np.array([r["d"] for r in rows], dtype=np.float32), exact)

    def _df(self, terms: Sequence[str]) -> dict[str, int]:
        """How many passages this user may see hold each term (cached per generation and level)."""
        key = ("df", self.kb_id, self.generation, self.level)
        known = {t: self.db.peek((*key, t)) for t in terms}
        missing = [t for t, v in known.items() if v is None and len(t.encode()) <= MAX_LEXEME_BYTES]
        for t in terms:
            if len(t.encode()) > MAX_LEXEME_BYTES:
                known[t] = 0  # never indexed (PostgreSQL's lexeme limit), so held by none
        if missing:
            with self.db.conn() as conn:
                rows = conn.execute(
                    "SELECT q.term, (SELECT count(*) FROM chunks c WHERE c.kb_id = %(kb)s AND "
                    "c.access_level <= %(lvl)s AND c.tsv @@ q.tq) AS df "
                    "FROM unnest(%(terms)s::text[], %(tqs)s::tsquery[]) AS q(term, tq)",
                    {"kb": self.kb_id, "lvl": self.level, "terms": missing,
                     "tqs": [tsquery_literal(t) for t in missing]}).fetchall()
            for r in rows:
                known[r["term"]] = int(r["df"])
                self.db.put((*key, r["term"]), int(r["df"]))
        return known

    def _idf(self, terms: list[str], n: int) -> list[float]:
        """Lucene's idf of each term over the passages this user may see."""
        from math import log

        df = self._df(terms)
        return [log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms]

    def doc_count(self) -> int:
        return self._stats()[0]

    def doc_frequency(self, term: str) -> int:
        return self._df([term])[term]

    def _ids(self, tsquery: str, limit: int) -> list[str]:
        """Ids of visible passages matching a tsquery (in id order, at most ``limit``)."""
        with self.db.conn() as conn:
            ids = [r["id"] for r in conn.execute(
                "SELECT id FROM chunks WHERE kb_id = %s AND access_level <= %s AND tsv @@ %s::tsquery "
                "ORDER BY id LIMIT %s", (self.kb_id, self.level, tsquery, int(limit)))]
        self.trace["exact_lookups"] = self.trace.get("exact_lookups", 0) + 1
        return ids

    def phrase(self, terms: Sequence[str], limit: int = 1000) -> list[str]:
        if not terms or limit <= 0 or any(len(t.encode()) > MAX_LEXEME_BYTES for t in terms):
            return []
        # <-> is "followed by": each term at the position after the previous one's.
        return self._ids(" <-> ".join(tsquery_literal(t) for t in terms), limit)

    def chunks_with(self, term: str, limit: int = 20_000) -> list[str]:
        if limit <= 0 or len(term.encode()) > MAX_LEXEME_BYTES:
            return []
        return self._ids(tsquery_literal(term), limit)

    def sources_of(self, chunk_ids: Sequence[str]) -> dict[str, str]:
        if not chunk_ids:
            return {}
        with self.db.conn() as conn:
            return {r["id"]: r["source_id"] for r in conn.execute(
                "SELECT id, source_id FROM chunks WHERE kb_id = %s AND access_level <= %s "
                "AND id = ANY(%s)", (self.kb_id, self.level, list(chunk_ids)))}

    def keyword(self, terms: list[str], count: int) -> list[KeywordHit]:
        n, avgdl = self._stats()
        terms = [t for t in terms if len(t.encode()) <= MAX_LEXEME_BYTES]
        if not terms or count <= 0 or n == 0:
            self.trace["keyword_fetched"] = []
            return []
        idf = self._idf(terms, n)
        any_term = " | ".join(tsquery_literal(t) for t in terms)
        with self.db.conn() as conn:
            rows = conn.execute(
                "WITH w AS (SELECT * FROM unnest(%(terms)s::text[], %(idf)s::float8[]) AS w(term, idf)), "
                "cand AS (SELECT id, tsv, kw_len FROM chunks WHERE kb_id = %(kb)s "
                "AND access_level <= %(lvl)s AND tsv @@ %(q)s::tsquery) "
                "SELECT cand.id, sum(w.idf * (cardinality(u.positions) * (%(k1)s + 1.0)) / "
                "(cardinality(u.positions) + %(k1)s * (1.0 - %(b)s + %(b)s * cand.kw_len / %(avg)s))) "
                "AS score, "
                "array_agg(u.lexeme) AS matched "
                # Only the query's lexemes are unnested: setweight marks them A, ts_filter keeps them.
                "FROM cand CROSS JOIN LATERAL unnest(ts_filter(setweight(cand.tsv, 'A', %(terms)s::text[]), "
                "'{a}')) AS u(lexeme, positions, weights) "
                "JOIN w ON w.term = u.lexeme GROUP BY cand.id ORDER BY score DESC, cand.id LIMIT %(n)s",
                {"terms": terms, "idf": idf, "kb": self.kb_id, "lvl": self.level, "q": any_term,
                 "k1": BM25_K1, "b": BM25_B, "avg": max(avgdl, 1e-9), "n": count}).fetchall()
        self.trace["keyword_fetched"] = [r["id"] for r in rows]
        return [KeywordHit(r["id"], float(r["score"]), frozenset(r["matched"])) for r in rows]

    def rows(self, keys: Sequence[int], qvec: np.ndarray | None) -> dict[int, PassageRow]:
        if not keys:
            return {}
        q = None if qvec is None else np.asarray(qvec, dtype=np.float32)
        with self.db.conn() as conn:
            rows = conn.execute(
                "SELECT c.vkey, c.id, c.source_id, c.idx, c.text, c.page, s.title, s.url, s.file_name, "
                "s.type, s.chunk_count, CASE WHEN %(q)s::vector IS NULL THEN NULL "
                "ELSE 1 - (c.embedding <=> %(q)s::vector) END AS cos "
                "FROM chunks c JOIN sources s ON s.id = c.source_id WHERE c.kb_id = %(kb)s "
                "AND c.access_level <= %(lvl)s AND c.vkey = ANY(%(keys)s)",
                {"q": q, "kb": self.kb_id, "lvl": self.level,
                 "keys": [int(k) for k in keys]}).fetchall()
        return {r["vkey"]: PassageRow(vkey=r["vkey"], id=r["id"], source_id=r["source_id"], idx=r["idx"],
                                      text=r["text"], page=r["page"], title=r["title"], url=r["url"],
                                      file_name=r["file_name"], type=r["type"],
                                      chunk_count=r["chunk_count"],
                                      cosine=None if r["cos"] is None else float(r["cos"]))
                for r in rows}
