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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from localkb.atomic import sweep_tmp
from localkb.config import Settings
from localkb.embedding.embedder import Embedder, EmbedderRegistry
from localkb.errors import (
    Conflict,
    InvalidInput,
    KnowledgeBaseNotFound,
    LocalKBError,
    ModelMismatch,
)
from localkb.ingest.chunk import passage_text
from localkb.locks import FileLock
from localkb.perms import private_dir, tighten
from localkb.staging import Staging
from localkb.store import keyword_engine as keyword_engine_mod
from localkb.store.catalog import Catalog, KBRecord, blob_vector, valid_vector
from localkb.store.keyword_engine import KeywordEngine
from localkb.store.vectors import VectorIndex
from localkb.strings import clean_name, string_problem

PRIVACY = ("device", "cloud")
#: Chunks read at a time when the derived indexes catch up with a write, and per keyword commit.
APPLY_SLICE = 2048
APPLY_COMMIT = 8192


@dataclass
class Change:
    """What one write did, by chunk id and vector key, for the derived indexes."""

    upserted: list[tuple[str, int]] = field(default_factory=list)
    deleted: list[tuple[str, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.upserted or self.deleted)


class Store:
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
        Staging(self.root / "imports").sweep()
        sweep_tmp(self.root, self.root / "kbs")
        self.catalog = Catalog(self.root / "catalog.sqlite")
        self.lock = FileLock(self.root / "store.lock")
        self.models = EmbedderRegistry(settings)
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
        name = _check_name(name)
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
                        db.execute("UPDATE kbs SET name = ? WHERE id = ?", (_check_name(name), rec.id))
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


def _check_name(name: object) -> str:
    """A knowledge base name: NFC, 1-80 characters, no / or \\, nothing deceptive (``clean_name``)."""
    return clean_name(name, what="a knowledge base name", max_len=80, forbid="/\\")


class KnowledgeBase:
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
        return self.dir / f"vectors-{self.record.model}.usearch"

    @property
    def keyword_path(self) -> Path:
        """The folder of the keyword index, for the engine it was last built with."""
        return keyword_engine_mod.folder_for(self.dir, self.record.keyword_engine)

    def wanted_engine(self, passages: int | None = None) -> str:
        """The keyword engine this knowledge base's choice names at its size."""
        choice = self.record.settings.get("keyword_engine", "auto")
        if passages is None:
            passages = self.catalog.counts(self.id)["chunks"]
        return keyword_engine_mod.effective(choice, passages, self.record.keyword_engine)

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
        return (self._vectors is not None and self._keywords is not None
                and self._vectors.generation == gen and self._keywords.generation == gen)

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
        return done

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
        texts, vectors or postings in memory at once. Only the last commit records ``gen``:
        a crash in between leaves the index at its old generation, and the next open catches
        it up from the change log (upserts and deletes are idempotent).
        """
        db = self.catalog.db
        for group_start in range(0, max(len(touched), 1), APPLY_COMMIT):
            group = touched[group_start : group_start + APPLY_COMMIT]
            last = group_start + APPLY_COMMIT >= len(touched)
            gone: list[tuple[str, int]] = []
            for start in range(0, len(group), APPLY_SLICE):
                part = group[start : start + APPLY_SLICE]
                marks = ",".join("?" * len(part))
                present = {r[0] for r in db.execute(f"SELECT id FROM chunks WHERE id IN ({marks})",  # noqa: S608
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
        if vi is not None:
            vi.save(gen)

    def _rebuild_vectors(self, gen: int) -> VectorIndex:
        # Rows are streamed into arrays sized once: a rebuild holds the vectors once, not a list
        # of them and then a stacked copy (an import of a big knowledge base ends here).
        vi = VectorIndex(self.vector_path, self.record.model, self.record.dim)
        n = self.catalog.counts(self.id)["chunks"]
        keys = np.empty(n, dtype=np.uint64)
        vecs = np.empty((n, self.record.dim), dtype=np.float32)
        i = 0
        for row in self.catalog.db.execute("SELECT vkey, vector FROM chunks WHERE kb_id = ?",
                                           (self.id,)):
            if i == n:  # rows added since the count (not under our lock): the next open catches up
                break
            keys[i] = row[0]
            vecs[i] = blob_vector(row[1])
            i += 1
        vi.build(keys[:i], vecs[:i], gen)
        return vi

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
            if change:
                with self._lock:
                    try:
                        touched = change.upserted + change.deleted
                        engine = self._keywords.engine
                        if self.wanted_engine(self._keywords.doc_count() + len(change.upserted)) != engine:
                            engine = self.wanted_engine()  # ``auto`` may cross its line: count exactly
                        if engine == self._keywords.engine:
                            self._apply(self._vectors, self._keywords, touched, gen)
                        else:  # the other engine, built from the catalogue, not this one updated
                            self._apply(self._vectors, None, touched, gen)
                            self._keywords.close()
                            self._keywords = self._rebuild_keywords(gen, engine)
                        self._prune(gen)
                    except LocalKBError as err:
                        self.close()
                        self.catalog.log_error("index", err.code, str(err), kb_id=self.id)
            self.record = self.store.resolve(self.id)
            return gen

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
                if not (self.keyword_path if "keyword" in label else self.vector_path).exists():
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
            return len(vi), vi.generation, all(vi.contains(r[0]) for r in rows), {"log": vi.log_size()}

        def keywords() -> tuple[int, int, bool, dict]:
            ki = keyword_engine_mod.load(self.record.keyword_engine, self.keyword_path)
            try:
                return ki.doc_count(), ki.generation, True, {"engine": ki.engine,
                                                             "segments": ki.segment_count()}
            finally:
                ki.close()

        check("vector index", vectors)
        check("keyword index", keywords)
        wanted = self.wanted_engine(len(rows))
        if report["keyword_index"].get("engine", wanted) != wanted:
            report["problems"].append(f"keyword index is {report['keyword_index']['engine']}, "
                                      f"the knowledge base asks for {wanted}")
        if repair and report["notes"] and not report["problems"]:
            self.indexes()  # behind: catching up is the repair
            report["repaired"] = True
            report["problems_after_repair"] = self.health()["problems"]
        if repair and report["problems"]:
            with self.store.lock.hold():
                self.close()
                shutil.rmtree(self.keyword_path, ignore_errors=True)
                self.keyword_path.with_suffix(".json").unlink(missing_ok=True)
                self.vector_path.unlink(missing_ok=True)
                self.vector_path.with_suffix(".json").unlink(missing_ok=True)
                self.vector_path.with_suffix(".log").unlink(missing_ok=True)
                with self.catalog.tx() as db:
                    bad = [r[0] for r in rows if not valid_vector(r[1], self.record.dim)]
                    db.executemany("DELETE FROM chunks WHERE kb_id = ? AND vkey = ?",
                                   [(self.id, k) for k in bad])
                self._repair()
            report["repaired"] = True
            after = self.health()
            report["problems_after_repair"] = after["problems"]
        return report
