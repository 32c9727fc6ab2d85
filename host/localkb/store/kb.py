"""The store: the catalogue, the store-wide write lock, and ``open_kb``.

``Store.open_kb`` is the one way any reader or writer reaches a knowledge
base: it routes to that knowledge base's model, vector index and keyword
index. Derived indexes carry the catalogue generation they reflect; when it
lags, they are caught up from the change log (or rebuilt) before use, so a
search never runs on a stale or partial index without saying so.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from localkb.atomic import sweep_tmp
from localkb.config import Settings
from localkb.embedding.embedder import Embedder, EmbedderRegistry
from localkb.errors import (
    Conflict,
    IndexUnavailable,
    InvalidInput,
    KnowledgeBaseNotFound,
    LocalKBError,
    ModelMismatch,
    SourceNotFound,
    StoreError,
)
from localkb.ingest.chunk import passage_text
from localkb.locks import FileLock, StripedLocks
from localkb.perms import private_dir, tighten
from localkb.staging import import_staging
from localkb.store import ingest_staging
from localkb.store import keyword_engine as keyword_engine_mod
from localkb.store.base import (
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
from localkb.store.catalog import (
    UPSERT_SOURCE,
    Catalog,
    KBRecord,
    blob_vector,
    chunk_id,
    source_id,
    valid_vector,
    vector_blob,
    vector_key,
)
from localkb.store.keyword_engine import KeywordEngine
from localkb.store.keywords import KeywordHit
from localkb.store.listing import vector_file
from localkb.store.vectors import VectorHits, VectorIndex, remove_index, remove_other_models
from localkb.store.vectors import compact as compact_vectors
from localkb.strings import KB_NAME_MAX, clean_name, string_problem

PRIVACY = ("device", "cloud")
#: The orders sources are listed in (fixed ORDER BY clauses).
SOURCE_SORTS = {"title": "s.title COLLATE NOCASE, s.id", "added": "s.added_at, s.id",
                "updated": "s.updated_at DESC, s.id"}
_UPSERT_CHUNK = (
    "INSERT INTO chunks (id, vkey, kb_id, source_id, idx, text, text_hash, page, tokens, vector, "
    "indexed_by, indexed_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
    "text=excluded.text, text_hash=excluded.text_hash, page=excluded.page, tokens=excluded.tokens, "
    "vector=excluded.vector, indexed_by=excluded.indexed_by, indexed_at=excluded.indexed_at")
ItemLocks.register(StripedLocks)
#: Chunks read at a time when the derived indexes catch up with a write, and per keyword commit.
APPLY_SLICE = 2048
APPLY_COMMIT = 8192
#: Vectors a rebuild reads from the catalogue and writes to the flat base at a time (8,192 of
#: 384 dims: 12.6 MB): it read all of them into one array first (300,000 passages of 256 dims:
#: 307 MB of an import's 558 MiB peak).
REBUILD_PART = 8192
_STAGING = """
CREATE TABLE IF NOT EXISTS reembed_staging (
    kb_id TEXT NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    chunk_id TEXT NOT NULL,
    model TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (kb_id, chunk_id)
)
"""
_MISSING = (
    "SELECT c.id FROM chunks c LEFT JOIN reembed_staging r ON r.kb_id = c.kb_id AND r.chunk_id = c.id "
    "AND r.model = ? AND r.text_hash = c.text_hash WHERE c.kb_id = ? AND r.chunk_id IS NULL "
    "ORDER BY c.rowid")


@dataclass
class Change:
    """What one write did, by chunk id and vector key, for the derived indexes."""

    upserted: list[tuple[str, int]] = field(default_factory=list)
    deleted: list[tuple[str, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.upserted or self.deleted)


class Store(KnowledgeStore):
    """A data directory: the catalogue plus one folder of derived indexes per knowledge base."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = settings.data_dir
        # The user's alone: 0700, and anything an older version (or a looser umask) left
        # readable by others is tightened now, before the catalogue is read.
        private_dir(self.root)
        tighten(self.root)
        # What a killed import left (its staging files; the catalogue never saw it) and the
        # temporary files of index saves a kill cut short go now.
        import_staging(self.root).sweep()
        sweep_tmp(self.root, self.root / "kbs")
        self.catalog = Catalog(self.root / "catalog.sqlite")
        self.lock = FileLock(self.root / "store.lock")
        self.models = EmbedderRegistry(settings)
        #: Knowledge bases a write of this process left with vector compaction due; and who is
        #: told at once (the host starts its background compaction; the CLI looks at the end).
        self.compaction_due: set[str] = set()
        self.on_compaction_due: Callable[[str], None] | None = None
        self._open: dict[str, KnowledgeBase] = {}
        self._open_lock = threading.Lock()

    # -- knowledge bases -------------------------------------------------------
    def kbs(self) -> list[KBRecord]:
        return self.catalog.kbs()

    def resolve(self, ref: str) -> KBRecord:
        """A knowledge base by id or by name (case-insensitive)."""
        if not isinstance(ref, str) or not ref:
            raise InvalidInput("a knowledge base id or name is required")
        rec = self.catalog.kb(ref) or self.catalog.kb_by_name(
            unicodedata.normalize("NFC", ref) if not string_problem(ref) else ref)
        if rec is None:
            raise KnowledgeBaseNotFound(f"no knowledge base named or with id {ref!r}")
        return rec

    def create_kb(self, name: str, *, privacy: str = "device", model: str | None = None,
                  keyword_engine: str | None = None) -> KBRecord:
        name = check_name(name)
        engine = keyword_engine_mod.check_choice(keyword_engine or self.settings.keyword_engine)
        if privacy not in PRIVACY:
            raise InvalidInput(f"privacy must be 'device' or 'cloud', not {privacy!r}")
        model = model or self.settings.default_model
        spec = self.models.spec(model)
        kb_id = "kb_" + uuid.uuid4().hex[:12]
        with self.lock.hold():
            try:
                with self.catalog.tx() as db:
                    db.execute(
                        "INSERT INTO kbs (id, name, privacy, model, dim, created, settings) "
                        "VALUES (?,?,?,?,?,?,?)",
                        (kb_id, name, privacy, spec.id, spec.dim, time.time(),
                         json.dumps({"keyword_engine": engine})))
            except LocalKBError as err:
                if isinstance(err.__cause__, sqlite3.IntegrityError):
                    raise Conflict(f"a knowledge base named {name!r} already exists") from err
                raise
            self.open_kb(kb_id).indexes()  # empty derived indexes exist from the start
        return self.resolve(kb_id)

    def update_kb(self, ref: str, *, name: str | None = None, privacy: str | None = None,
                  keyword_engine: str | None = None) -> KBRecord:
        """Rename, change privacy, or choose the keyword engine (its index is rebuilt on a switch)."""
        rec = self.resolve(ref)
        if privacy is not None and privacy not in PRIVACY:
            raise InvalidInput(f"privacy must be 'device' or 'cloud', not {privacy!r}")
        if keyword_engine is not None:
            keyword_engine_mod.check_choice(keyword_engine)
        with self.lock.hold():
            try:
                with self.catalog.tx() as db:
                    if name is not None:
                        db.execute("UPDATE kbs SET name = ? WHERE id = ?", (check_name(name), rec.id))
                    if privacy is not None:
                        db.execute("UPDATE kbs SET privacy = ? WHERE id = ?", (privacy, rec.id))
            except LocalKBError as err:
                if isinstance(err.__cause__, sqlite3.IntegrityError):
                    raise Conflict(f"a knowledge base named {name!r} already exists") from err
                raise
            if keyword_engine is not None:
                self.catalog.update_settings(rec.id, keyword_engine=keyword_engine)
                kb = self.open_kb(rec.id)
                with kb._lock:
                    kb.close()
                    kb._repair()  # builds the index the new choice names, from the catalogue
        return self.resolve(rec.id)

    def delete_kb(self, ref: str) -> KBRecord:
        rec = self.resolve(ref)
        with self.lock.hold():
            with self.catalog.tx() as db:
                db.execute("DELETE FROM changes WHERE kb_id = ?", (rec.id,))
                db.execute("DELETE FROM kbs WHERE id = ?", (rec.id,))
            with self._open_lock:
                kb = self._open.pop(rec.id, None)
            if kb is not None:
                kb.close()
            shutil.rmtree(self.kb_dir(rec.id), ignore_errors=True)
        return rec

    def record(self, kb_id: str) -> KBRecord | None:
        return self.catalog.kb(kb_id) if isinstance(kb_id, str) else None

    def generation(self, kb_id: str) -> int | None:
        return self.catalog.generation(kb_id)

    def counts(self, kb_id: str) -> dict:
        return self.catalog.counts(kb_id)

    def passage_window(self, kb_id: str, source_id: str, idx: int, radius: int) -> list[dict]:
        return [dict(r) for r in self.catalog.passage_window(source_id, idx, radius)]

    def log_error(self, source: str, code: str, message: str, *, kb_id: str | None = None,
                  ref: str | None = None, detail: dict | None = None) -> None:
        self.catalog.log_error(source, code, message, kb_id=kb_id, ref=ref, detail=detail)

    def log_query(self, kind: str, query: str, kb_ids: list[str], trace: dict) -> None:
        self.catalog.log_query(kind, query, kb_ids, trace)

    def kb_dir(self, kb_id: str) -> Path:
        return self.root / "kbs" / kb_id

    def open_kb(self, ref: str) -> KnowledgeBase:
        """The single route from a knowledge base to its model and indexes."""
        rec = self.resolve(ref)
        with self._open_lock:
            kb = self._open.get(rec.id)
            if kb is None or kb.record.model != rec.model:
                if kb is not None:
                    kb.close()
                kb = KnowledgeBase(self, rec)
                self._open[rec.id] = kb
            kb.record = rec
            return kb

    def close(self) -> None:
        with self._open_lock:
            for kb in self._open.values():
                kb.close()
            self._open.clear()
        self.catalog.close()


def _usable(load: Callable[[], VectorIndex | KeywordEngine], gen: int, pruned: int):
    """The saved index if the change log can bring it to ``gen``; None means rebuild it."""
    try:
        index = load()
    except LocalKBError:
        return None
    return index if pruned <= index.generation <= gen else None


def check_name(name: object) -> str:
    """A knowledge base name: NFC, 1-80 characters, no / or \\, nothing deceptive (``clean_name``).

    The team store names its knowledge bases by the same rule.
    """
    return clean_name(name, what="a knowledge base name", max_len=KB_NAME_MAX, forbid="/\\")


class KnowledgeBase(KnowledgeBaseHandle):
    """One knowledge base: its record, its embedder and its two derived indexes."""

    def __init__(self, store: Store, record: KBRecord) -> None:
        self.store = store
        self.record = record
        self.catalog = store.catalog
        # The embedder is chosen on first use (choosing MiniLM checks the model files' hashes):
        # re-adding an unchanged folder never needs it.
        self._embedder: Embedder | None = None
        spec_dim = store.models.spec(record.model).dim
        if spec_dim != record.dim:
            raise ModelMismatch(f"model {record.model} has {spec_dim} dimensions, "
                                f"the knowledge base was created with {record.dim}")
        self.dir = store.kb_dir(record.id)
        self._vectors: VectorIndex | None = None
        self._keywords: KeywordEngine | None = None
        self._lock = threading.RLock()

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = self.store.models.get(self.record.model)
        return self._embedder

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def vector_path(self) -> Path:
        return vector_file(self.dir, self.record.model)

    @property
    def keyword_path(self) -> Path:
        """The folder of the keyword index, for the engine it was last built with."""
        return keyword_engine_mod.folder_for(self.dir, self.record.keyword_engine)

    def wanted_engine(self) -> str:
        """The keyword engine this knowledge base's choice names."""
        return keyword_engine_mod.effective(self.record.settings.get("keyword_engine", "auto"))

    def close(self) -> None:
        with self._lock:
            if self._keywords is not None:
                self._keywords.close()
            self._vectors = self._keywords = None

    # -- freshness -------------------------------------------------------------
    def indexes(self) -> tuple[VectorIndex, KeywordEngine]:
        """Both derived indexes, at the catalogue's current generation."""
        gen = self.catalog.generation(self.id)
        if gen is None:
            raise KnowledgeBaseNotFound(f"knowledge base {self.record.name!r} was deleted")
        with self._lock:
            if self._fresh(gen):
                return self._vectors, self._keywords
        # Locks are always taken store first, then this knowledge base's: ``write`` holds the
        # store lock when it asks for the indexes, so the other order could deadlock two threads
        # of one host (an add catching up while another add writes).
        with self.store.lock.hold(), self._lock:
            gen = self.catalog.generation(self.id)
            if gen is None:
                raise KnowledgeBaseNotFound(f"knowledge base {self.record.name!r} was deleted")
            if self._fresh(gen):
                return self._vectors, self._keywords
            self._check_model()
            self.close()
            try:
                self._vectors = VectorIndex.load(self.vector_path, self.record.model, self.record.dim)
                self._keywords = keyword_engine_mod.load(self.record.keyword_engine, self.keyword_path)
            except LocalKBError:
                self.close()
            if self._fresh(gen):
                return self._vectors, self._keywords
            self._repair()
            return self._vectors, self._keywords

    def _check_model(self) -> None:
        """Refuse to go on with a model the catalogue no longer names (a re-embed switched it)."""
        now = self.catalog.kb(self.id)
        if now is not None and (now.model, now.dim) != (self.record.model, self.record.dim):
            raise ModelMismatch(
                f"knowledge base {self.record.name!r} switched from {self.record.model} to {now.model} "
                "while this was under way; open it again and retry")

    def _fresh(self, gen: int) -> bool:
        # An index of another engine than the choice names (an ``auto`` knowledge base that
        # an earlier rule wrote with Whoosh) is not fresh: the repair rebuilds it in that engine.
        # Nor is a vector index whose files a compaction swapped since it was opened: a write
        # through it would list files the compaction deleted (a stat of the listing).
        return (self._vectors is not None and self._keywords is not None
                and self._vectors.generation == gen and self._keywords.generation == gen
                and self._keywords.engine == self.wanted_engine()
                and not self._vectors.layout_changed())

    def _repair(self) -> dict:
        """Catch the indexes up from the change log, or rebuild them; call under the store lock."""
        self._check_model()
        self.close()
        gen = self.catalog.generation(self.id)
        pruned = self._pruned_through()
        done = {"vectors": "ok", "keywords": "ok"}
        vi = _usable(lambda: VectorIndex.load(self.vector_path, self.record.model, self.record.dim),
                     gen, pruned)
        engine = self.wanted_engine()
        ki = None
        if engine == self.record.keyword_engine:
            ki = _usable(lambda: keyword_engine_mod.load(engine, self.keyword_path), gen, pruned)
        if vi is None:
            vi = self._rebuild_vectors(gen)
            done["vectors"] = "rebuilt"
        elif vi.generation < gen:
            self._catch_up(vi, None, vi.generation, gen)
            done["vectors"] = "caught up"
        if ki is None:
            ki = self._rebuild_keywords(gen, engine)
            done["keywords"] = "rebuilt"
        elif ki.generation < gen:
            self._catch_up(None, ki, ki.generation, gen)
            done["keywords"] = "caught up"
        self._vectors, self._keywords = vi, ki
        self._prune(gen)
        if done["vectors"] == "rebuilt" and vi.compaction_plan() is not None:
            self._compaction_due()  # its graph: a rebuild of any vectors lists them flat
        return done

    def _compaction_due(self) -> None:
        """Say this knowledge base's vector index has compaction due: the host starts it on its
        thread, the CLI detached once the command's work is done (``cli._compact_after``)."""
        self.store.compaction_due.add(self.id)
        if self.store.on_compaction_due is not None:
            self.store.on_compaction_due(self.id)

    def _pruned_through(self) -> int:
        row = self.catalog.db.execute("SELECT value FROM meta WHERE key = ?",
                                      (f"pruned:{self.id}",)).fetchone()
        return int(row[0]) if row else 0

    def _prune(self, gen: int) -> None:
        with self.catalog.tx() as db:
            db.execute("DELETE FROM changes WHERE kb_id = ? AND generation <= ?", (self.id, gen))
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"pruned:{self.id}", str(gen)))

    def _catch_up(self, vi: VectorIndex | None, ki: KeywordEngine | None, since: int, gen: int) -> None:
        touched = self.catalog.db.execute(
            "SELECT DISTINCT chunk_id, vkey FROM changes WHERE kb_id = ? AND generation > ?",
            (self.id, since)).fetchall()
        self._apply(vi, ki, [(r[0], r[1]) for r in touched], gen)

    def _apply(self, vi: VectorIndex | None, ki: KeywordEngine | None,
               touched: list[tuple[str, int]], gen: int) -> None:
        """Make the indexes agree with the catalogue for ``touched`` chunks, then save.

        Rows are read in slices of ``APPLY_SLICE`` and the keyword index commits every
        ``APPLY_COMMIT`` chunks, so a big source's switch (100k passages) never holds all its
        texts, vectors or postings in memory at once: the vector index spills what it holds
        to a flat segment between groups (``VectorIndex.spill``). Only the last commit and the
        last save record ``gen``: a crash in between leaves both indexes at their old
        generation, and the next open catches them up from the change log (upserts and
        deletes are idempotent).
        """
        db = self.catalog.db
        spill_at = vi.spill_bound(len(touched)) if vi is not None else 0
        for group_start in range(0, max(len(touched), 1), APPLY_COMMIT):
            group = touched[group_start : group_start + APPLY_COMMIT]
            last = group_start + APPLY_COMMIT >= len(touched)
            gone: list[tuple[str, int]] = []
            for start in range(0, len(group), APPLY_SLICE):
                part = group[start : start + APPLY_SLICE]
                marks = ",".join("?" * len(part))
                present = {r[0] for r in db.execute(f"SELECT id FROM chunks WHERE id IN ({marks})",
                                                    [c for c, _ in part])}
                gone += [(c, k) for c, k in part if c not in present]
            if vi is not None:
                vi.remove(np.array([k for _, k in gone], dtype=np.uint64))

            def live(group=group) -> Iterator[tuple[str, str]]:
                for start in range(0, len(group), APPLY_SLICE):
                    ids = [c for c, _ in group[start : start + APPLY_SLICE]]
                    rows = self.catalog.chunk_rows(self.id, ids)
                    if vi is not None and rows:
                        vi.upsert(np.array([r["vkey"] for r in rows], dtype=np.uint64),
                                  np.stack([blob_vector(r["vector"]) for r in rows]))
                    for r in rows:
                        yield r["id"], passage_text(r["title"], r["text"])

            if ki is not None:
                ki.write(live(), [c for c, _ in gone], gen if last else ki.generation)
            else:
                for _ in live():
                    pass
            if vi is not None and not last:
                vi.spill(spill_at)  # a big switch holds one spill of vectors, not all of them
        if vi is not None:
            vi.save(gen)

    def _rebuild_vectors(self, gen: int) -> VectorIndex:
        """The vector index from the catalogue, listed flat (``VectorIndex.build_flat``): no
        graph, which compaction builds after (``_repair`` says it is due). The rows stream from
        the cursor a ``REBUILD_PART`` at a time, so the rebuild holds one part and the keys."""
        remove_other_models(self.dir, self.record.model)  # a switch's old model: derived from nothing now
        vi = VectorIndex(self.vector_path, self.record.model, self.record.dim)
        vi.build_flat(self._catalog_vectors(), gen)
        return vi

    def _catalog_vectors(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every chunk's vector key and vector from the catalogue, ``REBUILD_PART`` at a time."""
        rows = self.catalog.db.execute("SELECT vkey, vector FROM chunks WHERE kb_id = ?", (self.id,))
        while part := rows.fetchmany(REBUILD_PART):
            keys = np.fromiter((r[0] for r in part), dtype=np.uint64, count=len(part))
            yield keys, np.stack([blob_vector(r[1]) for r in part])

    def _rebuild_keywords(self, gen: int, engine: str) -> KeywordEngine:
        """A fresh keyword index of ``engine`` from the catalogue; the other engine's folder goes."""
        folder = keyword_engine_mod.folder_for(self.dir, engine)
        ki = keyword_engine_mod.create(engine, folder)
        rows = self.catalog.db.execute(
            "SELECT c.id, c.text, s.title FROM chunks c JOIN sources s ON s.id = c.source_id "
            "WHERE c.kb_id = ? ORDER BY c.rowid", (self.id,))
        # Streamed from the cursor, as a big switch's catch-up streams its slices: the engine
        # bounds its own buffers (Whoosh's limitmb, tantivy's writer heap), so a rebuild never
        # holds every passage's text in a list first.
        ki.write(((r["id"], passage_text(r["title"], r["text"])) for r in rows), [], gen)
        if engine != self.record.keyword_engine:
            self.catalog.update_settings(self.id, keyword_index=engine)
            self.record = self.store.resolve(self.id)
        for other in keyword_engine_mod.ENGINES:
            if other != engine:
                old = keyword_engine_mod.folder_for(self.dir, other)
                shutil.rmtree(old, ignore_errors=True)
                old.with_suffix(".json").unlink(missing_ok=True)
        return ki

    # -- writing ---------------------------------------------------------------
    def write(self, mutate: Callable[[sqlite3.Connection], Change]) -> int:
        """Run ``mutate`` in one catalogue transaction, bump the generation, update the indexes.

        Returns the new generation. The catalogue commit is the point of truth:
        if updating a derived index fails afterwards, the error is logged and
        the next open catches the index up from the change log.
        """
        with self.store.lock.hold():
            self.indexes()
            with self.catalog.tx() as db:
                change = mutate(db)
                gen = db.execute("SELECT generation FROM kbs WHERE id = ?", (self.id,)).fetchone()
                if gen is None:
                    raise KnowledgeBaseNotFound(f"knowledge base {self.record.name!r} was deleted")
                gen = gen[0]
                if change:
                    gen += 1
                    db.execute("UPDATE kbs SET generation = ? WHERE id = ?", (gen, self.id))
                    db.executemany(
                        "INSERT INTO changes (kb_id, generation, chunk_id, vkey) VALUES (?,?,?,?)",
                        [(self.id, gen, c, k) for c, k in change.upserted + change.deleted])
            due = False
            if change:
                with self._lock:
                    try:
                        # ``indexes()`` above left the keyword index in the engine the choice names.
                        self._apply(self._vectors, self._keywords, change.upserted + change.deleted, gen)
                        self._prune(gen)
                        due = self._vectors is not None and self._vectors.compaction_plan() is not None
                    except LocalKBError as err:
                        self.close()
                        self.catalog.log_error("index", err.code, str(err), kb_id=self.id)
                if due:
                    self._compaction_due()
            self.record = self.store.resolve(self.id)
            return gen

    # -- compaction ------------------------------------------------------------
    def compaction_plan(self) -> dict | None:
        """The vector compaction due (``VectorIndex.compaction_plan``), or None."""
        vi, _ki = self.indexes()
        return vi.compaction_plan()

    def compact(self, *, hook: Callable[[str], None] | None = None) -> dict:
        """Run the vector compaction due: built outside the store lock, swapped under it.

        Returns ``vectors.compact``'s report (state: compacted / nothing due / already running /
        discarded). Copies of the index opened before it (this process's, another's) notice the
        new layout on their next use.
        """
        self.indexes()  # caught up first: compaction reads the listed files
        try:
            result = compact_vectors(self.vector_path, self.record.model, self.record.dim,
                                     swap_lock=self.store.lock.hold, hook=hook)
        except (OSError, RuntimeError, ValueError) as err:
            raise IndexUnavailable(f"vector compaction of {self.record.name!r} failed: {err}") from err
        if result["state"] != "already running":
            self.store.compaction_due.discard(self.id)
        return result

    # -- the store seam: ingestion ----------------------------------------------
    def before_ingest(self) -> None:
        """Create ingest's tables once, and catch the derived indexes up: a kill between an
        earlier commit and its index save is repaired by the next add, even one that finds
        every source unchanged."""
        ingest_staging.ensure_tables(self.store)
        self.indexes()

    def item_locks(self) -> ItemLocks:
        return StripedLocks(self.store.root / "locks" / "sources")

    def source_state(self, sid: str) -> tuple[str, int] | None:
        row = self.catalog.db.execute("SELECT content_hash, chunk_count FROM sources WHERE id = ?",
                                      (sid,)).fetchone()
        return (row["content_hash"], row["chunk_count"]) if row else None

    def stored_passages(self, sid: str, db: sqlite3.Connection | None = None) -> Stored:
        db = db or self.catalog.db
        dim = self.record.dim
        return {r[0]: (r[1], r[2], valid_vector(r[3], dim))
                for r in db.execute("SELECT idx, id, text_hash, vector FROM chunks WHERE source_id = ?",
                                    (sid,))}

    def vectors_by_text_hash(self, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        uniq = list(dict.fromkeys(hashes))
        db = self.catalog.db
        for start in range(0, len(uniq), 500):
            part = uniq[start : start + 500]
            marks = ",".join("?" * len(part))
            for h, blob in db.execute(f"SELECT text_hash, vector FROM chunks WHERE kb_id = ? "
                                      f"AND text_hash IN ({marks})", [self.id, *part]):
                if h not in out and valid_vector(blob, self.record.dim):
                    out[h] = blob_vector(blob).copy()
        return out

    def file_state(self, sid: str) -> FileState | None:
        row = ingest_staging.stored_fingerprint(self.catalog.db, sid)
        if row is None:
            return None
        return FileState(size=row["size"], mtime_ns=row["mtime_ns"], sha256=row["sha256"],
                         recipe=row["recipe"], title=row["title"], url=row["url"],
                         chunk_count=row["chunk_count"], stored=row["stored"])

    def save_file_state(self, sid: str, fp: FileFingerprint) -> None:
        with self.store.lock.hold(), self.catalog.tx() as db:
            ingest_staging.save_fingerprint(db, sid, self.id, fp)

    def _upsert_source(self, db: sqlite3.Connection, w: SourceWrite, now: float) -> None:
        row = db.execute("SELECT added_at FROM sources WHERE id = ?", (w.id,)).fetchone()
        db.execute(
            UPSERT_SOURCE,
            (w.id, self.id, w.key, w.type, w.title, w.url, w.file_name, w.content_hash,
             w.captured_by, w.chunk_count, w.pages, w.lang, row["added_at"] if row else now, now))
        if w.file is not None:
            ingest_staging.save_fingerprint(db, w.id, self.id, w.file)

    def _delete_unkept(self, db: sqlite3.Connection, before: Stored, keep: set[str]) -> list[tuple[str, int]]:
        stale = [(cid, vector_key(cid)) for cid, _h, _ok in before.values() if cid not in keep]
        db.executemany("DELETE FROM chunks WHERE id = ?", [(cid,) for cid, _k in stale])
        return stale

    def write_sources(self, writes: Sequence[SourceWrite]) -> dict[str, Stored]:
        """One catalogue transaction for all of ``writes``: each source lands whole or not at all."""
        now = time.time()
        befores: dict[str, Stored] = {}

        def mutate(db: sqlite3.Connection) -> Change:
            change = Change()
            for w in writes:
                befores[w.id] = self.stored_passages(w.id, db)
                self._upsert_source(db, w, now)
                rows = []
                for c in w.chunks:
                    key = vector_key(c.id)
                    rows.append((c.id, key, self.id, w.id, c.idx, c.text, c.text_hash, c.page,
                                 c.tokens, vector_blob(c.vector), c.indexed_by, now))
                    change.upserted.append((c.id, key))
                db.executemany(_UPSERT_CHUNK, rows)
                change.deleted.extend(self._delete_unkept(db, befores[w.id], w.keep))
            return change

        self.write(mutate)
        return befores

    def staged_passages(self, sid: str, model: str) -> dict[int, str]:
        return ingest_staging.staged_hashes(self.catalog.db, sid, model)

    def stage_passages(self, sid: str, model: str, rows: Sequence[StagedPassage]) -> None:
        ingest_staging.stage_rows(self.catalog, [
            (self.id, sid, r.idx, r.id, vector_key(r.id), model, r.text, r.text_hash, r.page, r.tokens,
             vector_blob(r.vector)) for r in rows])

    def unstage(self, sid: str, idxs: Sequence[int] | None = None) -> None:
        with self.catalog.tx() as db:
            ingest_staging.unstage(db, sid, idxs)

    def publish_staged(self, write: SourceWrite) -> Stored:
        now = time.time()
        before: Stored = {}

        def mutate(db: sqlite3.Connection) -> Change:
            before.update(self.stored_passages(write.id, db))
            self._upsert_source(db, write, now)
            change = Change()
            change.upserted.extend(ingest_staging.move_staged(db, write.id, write.chunk_count,
                                                              write.captured_by))
            change.deleted.extend(self._delete_unkept(db, before, write.keep))
            return change

        self.write(mutate)
        return before

    def staged_sources(self) -> dict[str, int]:
        return ingest_staging.staged_sources(self.catalog.db, self.id)

    def log_skip(self, ref: str, reason: str) -> None:
        last = self.catalog.db.execute(
            "SELECT message FROM errors WHERE kb_id = ? AND ref = ? AND code = 'skipped' "
            "ORDER BY id DESC LIMIT 1", (self.id, ref)).fetchone()
        message = f"{ref}: skipped: {reason}"
        if last is None or last[0] != message:
            self.catalog.log_error("ingest", "skipped", message, kb_id=self.id, ref=ref)

    def find_sources(self, ref: str) -> list[dict]:
        db = self.catalog.db
        resolved = "file:" + str(Path(ref).expanduser().resolve())
        exact = db.execute(
            "SELECT id, title, url, file_name, key FROM sources WHERE kb_id = ? AND "
            "(id = ? OR key = ? OR url = ? OR key = ?)", (self.id, ref, ref, ref, resolved)).fetchall()
        if exact:
            return [dict(r) for r in exact]
        tail = "%/" + ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_").lstrip("/")
        rows = db.execute(
            "SELECT id, title, url, file_name, key FROM sources WHERE kb_id = ? AND "
            "(file_name = ? COLLATE NOCASE OR title = ? COLLATE NOCASE OR key LIKE ? ESCAPE '\\')",
            (self.id, ref, ref, tail)).fetchall()
        return [dict(r) for r in rows]

    def iter_sources(self, *, offset: int = 0, limit: int | None = None,
                     sort: str = "title") -> Iterator[dict]:
        if sort not in SOURCE_SORTS:
            raise InvalidInput(f"sort must be one of {', '.join(SOURCE_SORTS)}")
        order = SOURCE_SORTS[sort]  # one of the fixed ORDER BY clauses
        sql = ("SELECT s.*, (SELECT COUNT(*) FROM chunks c WHERE c.source_id = s.id) AS stored "
               f"FROM sources s WHERE kb_id = ? ORDER BY {order} LIMIT ? OFFSET ?")
        db = self.catalog.db
        for r in paged(lambda n, at: db.execute(sql, (self.id, n, at)).fetchall(), offset, limit):
            yield source_listing(r, r["stored"])

    def source_total(self) -> int:
        return self.catalog.db.execute("SELECT COUNT(*) FROM sources WHERE kb_id = ?",
                                       (self.id,)).fetchone()[0]

    def remove_source(self, ref: str) -> dict:
        row = self.catalog.db.execute(
            "SELECT id, title FROM sources WHERE kb_id = ? AND (id = ? OR key = ? OR url = ? OR key = ?)",
            (self.id, ref, ref, ref, "file:" + str(Path(ref).expanduser().resolve()))).fetchone()
        if row is None:
            raise SourceNotFound(f"no source {ref!r} in {self.record.name!r}")
        sid = row["id"]
        removed: list[tuple[str, int]] = []

        def mutate(db: sqlite3.Connection) -> Change:
            ids = [(r[0], r[1]) for r in db.execute("SELECT id, vkey FROM chunks WHERE source_id = ?",
                                                    (sid,))]
            removed.extend(ids)
            db.execute("DELETE FROM chunks WHERE source_id = ?", (sid,))
            db.execute("DELETE FROM sources WHERE id = ?", (sid,))
            return Change(deleted=ids)

        self.write(mutate)
        return {"source_id": sid, "title": row["title"], "removed_chunks": len(removed)}

    def list_sources(self, *, offset: int = 0, limit: int = 100) -> tuple[list[dict], int]:
        db = self.catalog.db
        total = db.execute("SELECT COUNT(*) FROM sources WHERE kb_id = ?", (self.id,)).fetchone()[0]
        rows = db.execute(
            "SELECT s.*, (SELECT COUNT(*) FROM chunks c WHERE c.source_id = s.id) AS stored "
            "FROM sources s WHERE kb_id = ? ORDER BY added_at, id LIMIT ? OFFSET ?",
            (self.id, limit, offset)).fetchall()
        return [{"id": r["id"], "title": r["title"], "url": r["url"], "file_name": r["file_name"],
                 "type": r["type"], "chunks": r["stored"], "chunk_count": r["chunk_count"],
                 "pages": r["pages"], "captured_by": r["captured_by"], "added_at": r["added_at"],
                 "updated_at": r["updated_at"]} for r in rows], total

    # -- the store seam: search ---------------------------------------------------
    def legs(self) -> LocalLegs:
        vi, ki = self.indexes()
        return LocalLegs(self, vi, ki)

    # -- the store seam: portable -------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        """A read-only connection of its own: one transaction on it is one consistent snapshot (WAL)."""
        uri = self.catalog.path.resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout=60000")
        try:
            conn.execute("BEGIN")
            rec = conn.execute("SELECT * FROM kbs WHERE id = ?", (self.id,)).fetchone()
            if rec is None:
                raise InvalidInput(f"knowledge base {self.record.name!r} was deleted")
            n_sources = conn.execute("SELECT COUNT(*) FROM sources WHERE kb_id = ?", (self.id,)).fetchone()[0]
            n_chunks = conn.execute("SELECT COUNT(*) FROM chunks WHERE kb_id = ?", (self.id,)).fetchone()[0]
            sources = (dict(r) for r in conn.execute(
                "SELECT * FROM sources WHERE kb_id = ? ORDER BY added_at, id", (self.id,)))
            chunks = (dict(r) for r in conn.execute(
                "SELECT id, source_id, idx, text, page, tokens, text_hash, indexed_by, indexed_at, "
                "vector FROM chunks WHERE kb_id = ? ORDER BY source_id, idx", (self.id,)))
            yield Snapshot(record=dict(rec), n_sources=n_sources, n_chunks=n_chunks,
                           sources=sources, chunks=chunks)
            conn.execute("COMMIT")
        finally:
            conn.close()

    def import_rows(self, sources: Sequence[dict], chunks: Sequence[dict], vectors: np.ndarray) -> None:
        new_sid = {s["id"]: source_id(self.id, s["key"]) for s in sources}

        def mutate(db: sqlite3.Connection) -> Change:
            db.executemany(
                "INSERT INTO sources (id, kb_id, key, type, title, url, file_name, content_hash, "
                "captured_by, chunk_count, pages, lang, added_at, updated_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [(new_sid[s["id"]], self.id, s["key"], s["type"], s["title"], s["url"],
                  s["file_name"], s["content_hash"], s["captured_by"], s["chunk_count"],
                  s["pages"], s["lang"], s["added_at"], s["updated_at"]) for s in sources])
            change = Change()
            rows = []
            for c, vec in zip(chunks, vectors, strict=True):
                sid = new_sid[c["source"]]
                cid = chunk_id(self.id, sid, c["index"])
                rows.append((cid, vector_key(cid), self.id, sid, c["index"], c["text"],
                             c["text_hash"], c["page"], c["tokens"], vector_blob(vec),
                             c["indexed_by"], c["indexed_at"]))
                change.upserted.append((cid, vector_key(cid)))
            db.executemany(
                "INSERT INTO chunks (id, vkey, kb_id, source_id, idx, text, text_hash, page, "
                "tokens, vector, indexed_by, indexed_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            return change

        self.write(mutate)

    # -- the store seam: re-embedding (ingest/reembed.py) --------------------------------
    def _staging(self) -> sqlite3.Connection:
        db = self.catalog.db
        try:
            db.execute(_STAGING)  # idempotent DDL: catalogues from before re-embedding have none
        except sqlite3.Error as err:
            raise StoreError(f"cannot create the re-embedding staging table: {err}") from err
        return db

    def staged_count(self) -> int:
        return self._staging().execute("SELECT COUNT(*) FROM reembed_staging WHERE kb_id = ?",
                                       (self.id,)).fetchone()[0]

    def clear_staging(self, keep_model: str | None) -> None:
        self._staging()
        with self.catalog.tx() as db:
            db.execute("DELETE FROM reembed_staging WHERE kb_id = ? AND model != ?",
                       (self.id, keep_model or ""))

    def reembed_missing(self, model: str) -> list[str]:
        return [r[0] for r in self._staging().execute(_MISSING, (model, self.id))]

    def chunk_texts(self, ids: Sequence[str]) -> list[dict]:
        out: list[dict] = []
        ids = list(ids)
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            marks = ",".join("?" * len(part))  # only placeholders are interpolated
            out += [dict(r) for r in self.catalog.db.execute(
                "SELECT c.id, c.text, c.text_hash, s.title FROM chunks c JOIN sources s "
                f"ON s.id = c.source_id WHERE c.kb_id = ? AND c.id IN ({marks})", [self.id, *part])]
        return out

    def stage_vectors(self, model: str, rows: Sequence[tuple[str, str, np.ndarray]]) -> None:
        self._staging()
        with self.catalog.tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO reembed_staging (kb_id, chunk_id, model, text_hash, vector) "
                "VALUES (?,?,?,?,?)", [(self.id, cid, model, h, vector_blob(v)) for cid, h, v in rows])

    @contextmanager
    def writers_paused(self) -> Iterator[None]:
        with self.store.lock.hold():
            yield

    def switch_model(self, model: str, dim: int) -> int:
        """One transaction: every vector from staging, the new model, a new generation; or nothing.

        The keyword index holds the same passages before and after, so it stays and catches up
        (the change log is kept). The new model's vector index is built after the commit: any
        file of that model an earlier stint left is removed first, so none is ever caught up
        from the log over vectors the switch replaced. A kill before the commit leaves the old
        model whole; after it, the next open builds what is missing (``_repair``).
        """
        from localkb.errors import EmbeddingUnavailable

        remove_index(vector_file(self.dir, model))  # no reader opens it: the catalogue names the old model
        with self.catalog.tx() as db:
            left = db.execute(_MISSING.replace("SELECT c.id", "SELECT COUNT(*)"),
                              (model, self.id)).fetchone()[0]
            if left:
                raise EmbeddingUnavailable(f"{left} chunks have no {model} vector; nothing was switched")
            db.execute(
                "UPDATE chunks SET vector = (SELECT r.vector FROM reembed_staging r "
                "WHERE r.kb_id = chunks.kb_id AND r.chunk_id = chunks.id) "
                "WHERE kb_id = ?", (self.id,))
            db.execute("UPDATE kbs SET model = ?, dim = ?, generation = generation + 1 WHERE id = ?",
                       (model, dim, self.id))
            gen = db.execute("SELECT generation FROM kbs WHERE id = ?", (self.id,)).fetchone()[0]
            db.execute("DELETE FROM reembed_staging WHERE kb_id = ?", (self.id,))
        return gen

    def after_switch(self, old_model: str) -> None:
        """Build the new model's vector index (its rebuild removes ``old_model``'s files first)."""
        self.indexes()

    # -- health ----------------------------------------------------------------
    def health(self, *, repair: bool = False) -> dict:
        """Counts across SQLite, usearch and the keyword engine, and whether they agree."""
        db = self.catalog.db
        rows = db.execute("SELECT vkey, vector FROM chunks WHERE kb_id = ?", (self.id,)).fetchall()
        valid = sum(1 for r in rows if valid_vector(r[1], self.record.dim))
        report = {"kb": self.id, "name": self.record.name, "chunks": len(rows), "valid_vectors": valid,
                  "generation": self.catalog.generation(self.id), "problems": []}
        if valid != len(rows):
            report["problems"].append(f"{len(rows) - valid} chunks have invalid vectors")
        orphan = db.execute(
            "SELECT COUNT(*) FROM chunks c LEFT JOIN sources s ON s.id = c.source_id "
            "WHERE c.kb_id = ? AND s.id IS NULL", (self.id,)).fetchone()[0]
        if orphan:
            report["problems"].append(f"{orphan} chunks belong to no source")
        over = db.execute(
            "SELECT COUNT(*) FROM sources s WHERE s.kb_id = ? AND "
            "(SELECT COUNT(*) FROM chunks c WHERE c.source_id = s.id) > s.chunk_count",
            (self.id,)).fetchone()[0]
        if over:
            report["problems"].append(f"{over} sources have more chunks than they should")
        gen = report["generation"]
        pruned = self._pruned_through()
        report["notes"] = []

        def check(label: str, load: Callable[[], tuple[int, int, bool, dict]]) -> None:
            # An index behind a complete catalogue is not broken: every open catches it up from
            # the change log (a kill between the commit and the index save leaves exactly that).
            key = label.replace(" ", "_")
            try:
                count, generation, keys_ok, more = load()
            except LocalKBError as err:
                if not (self.keyword_path if "keyword" in label
                        else self.vector_path.with_suffix(".json")).exists():
                    report[key] = {"error": "missing"}
                    report["notes"].append(f"{label} is missing: it is built on next use")
                    return
                report[key] = {"error": str(err)}
                report["problems"].append(f"{label}: {err}")
                return
            report[key] = {"count": count, "generation": generation, **more}
            if generation != gen:
                if pruned <= generation < gen:
                    report["notes"].append(f"{label} is behind the catalogue (generation "
                                           f"{generation} of {gen}): it catches up on next use")
                else:
                    report["problems"].append(f"{label} is at generation {generation}, the "
                                              f"catalogue at {gen}")
            elif count != len(rows) or not keys_ok:
                report["problems"].append(
                    f"{label} holds {count} entries, the catalogue {len(rows)} chunks")

        def vectors() -> tuple[int, int, bool, dict]:
            vi = VectorIndex.load(self.vector_path, self.record.model, self.record.dim)
            plan = vi.compaction_plan()
            due = (None if plan is None else
                   f"graph of {len(vi)} vectors searched exactly until then" if plan["kind"] == "graph"
                   else f"{plan['kind']} of {len(plan['seqs'])} segments")
            return len(vi), vi.generation, all(vi.contains(r[0]) for r in rows), {
                "log": vi.log_size(), "base_graph": vi.base_graph,
                "graph_segments": sum(s.graph for s in vi.segments),
                "flat_segments": sum(not s.graph for s in vi.segments), "compaction_due": due}

        def keywords() -> tuple[int, int, bool, dict]:
            ki = keyword_engine_mod.load(self.record.keyword_engine, self.keyword_path)
            try:
                return ki.doc_count(), ki.generation, True, {"engine": ki.engine,
                                                             "segments": ki.segment_count()}
            finally:
                ki.close()

        check("vector index", vectors)
        check("keyword index", keywords)
        wanted = self.wanted_engine()
        built = report["keyword_index"].get("engine", wanted)
        if built != wanted and self.record.settings.get("keyword_engine", "auto") == "auto":
            # Written by an earlier ``auto`` rule: the next open rebuilds it, as it would a stale one.
            report["notes"].append(f"keyword index is {built}: auto now uses {wanted}, and it "
                                   f"moves to {wanted} on next use (rebuilt from the catalogue)")
        elif built != wanted:
            report["problems"].append(f"keyword index is {built}, the knowledge base asks for {wanted}")
        if repair and report["notes"] and not report["problems"]:
            self.indexes()  # behind: catching up is the repair
            report["repaired"] = True
            report["problems_after_repair"] = self.health()["problems"]
        if repair and report["problems"]:
            with self.store.lock.hold():
                self.close()
                shutil.rmtree(self.keyword_path, ignore_errors=True)
                self.keyword_path.with_suffix(".json").unlink(missing_ok=True)
                remove_index(self.vector_path)
                with self.catalog.tx() as db:
                    bad = [r[0] for r in rows if not valid_vector(r[1], self.record.dim)]
                    db.executemany("DELETE FROM chunks WHERE kb_id = ? AND vkey = ?",
                                   [(self.id, k) for k in bad])
                self._repair()
            report["repaired"] = True
            after = self.health()
            report["problems_after_repair"] = after["problems"]
        return report


class LocalLegs(Legs):
    """usearch and Whoosh at the catalogue's generation; rows from the catalogue."""

    def __init__(self, kb: KnowledgeBase, vi: VectorIndex, ki: KeywordEngine) -> None:
        self.kb = kb
        self.vi = vi
        self.ki = ki
        self.trace: dict = {}

    def is_empty(self) -> bool:
        return len(self.vi) == 0 and self.ki.doc_count() == 0

    def vector(self, qvec: np.ndarray, count: int) -> VectorHits:
        return self.vi.search(qvec, count, exact_below=self.kb.store.settings.exact_search_below)

    def keyword(self, terms: list[str], count: int) -> list[KeywordHit]:
        return self.ki.search(terms, count)

    def doc_count(self) -> int:
        return self.ki.doc_count()

    def doc_frequency(self, term: str) -> int:
        return self.ki.doc_frequency(term)

    def phrase(self, terms: Sequence[str], limit: int = 1000) -> list[str]:
        return self.ki.phrase(tuple(terms), limit)

    def chunks_with(self, term: str, limit: int = 20_000) -> list[str]:
        return self.ki.chunks_with(term, limit)

    def sources_of(self, chunk_ids: Sequence[str]) -> dict[str, str]:
        return self.kb.catalog.sources_of(self.kb.id, chunk_ids)

    def rows(self, keys: Sequence[int], qvec: np.ndarray | None) -> dict[int, PassageRow]:
        out = {}
        for key, r in self.kb.catalog.hits_by_vkey(self.kb.id, list(keys)).items():
            cos = None if qvec is None else float(np.dot(blob_vector(r["vector"]), qvec))
            out[key] = PassageRow(vkey=key, id=r["id"], source_id=r["source_id"], idx=r["idx"],
                                  text=r["text"], page=r["page"], title=r["title"], url=r["url"],
                                  file_name=r["file_name"], type=r["type"],
                                  chunk_count=r["chunk_count"], cosine=cos)
        return out
