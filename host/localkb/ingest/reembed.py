"""Re-embedding a knowledge base with another model, safe against writes, failures and kills.

1. Stage: every chunk's passage is embedded with the target model in batches and
   the vector is stored in ``reembed_staging`` with the chunk's ``text_hash``.
   Each batch commits on its own, so a killed run loses at most one batch and a
   rerun reuses every staged vector whose ``text_hash`` still matches. Writers are
   not blocked: chunks added or changed meanwhile are caught by the next pass.
2. Catch up and switch, holding the store's write lock: embed what is still
   missing (what changed since the last pass), then ONE catalogue transaction
   sets the knowledge base's model and dimension, replaces every chunk's vector,
   bumps the generation and marks all older derived indexes as unusable.
3. Build the derived indexes for the new model (the vector index file name
   carries the model id, so the old file is never read for the new model), and
   remove the old model's vector index.

Until step 2 commits, the catalogue and every index are exactly the old model's:
searches read the old index, and any failure or kill leaves the knowledge base
usable on the old model. Staged rows are only a cache; they are dropped when the
switch commits, when the knowledge base is deleted, or when a run for a
different target model starts.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass

from localkb.errors import Conflict, EmbeddingUnavailable, StoreError
from localkb.ingest.chunk import passage_text
from localkb.store.catalog import vector_blob
from localkb.store.kb import Store

Progress = Callable[[dict], None]
CancelCheck = Callable[[], None]

STAGING = """
CREATE TABLE IF NOT EXISTS reembed_staging (
    kb_id TEXT NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    chunk_id TEXT NOT NULL,
    model TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (kb_id, chunk_id)
)
"""
# A pass that leaves no more than this many chunks to embed ends the unlocked
# phase: the rest is embedded while writers wait, which must stay short.
SMALL_REMAINDER = 256
MAX_UNLOCKED_PASSES = 4

_MISSING = (
    "SELECT c.id FROM chunks c LEFT JOIN reembed_staging r ON r.kb_id = c.kb_id AND r.chunk_id = c.id "
    "AND r.model = ? AND r.text_hash = c.text_hash WHERE c.kb_id = ? AND r.chunk_id IS NULL "
    "ORDER BY c.rowid")
_TEXTS = ("SELECT c.id, c.text, c.text_hash, s.title FROM chunks c JOIN sources s ON s.id = c.source_id "
          "WHERE c.kb_id = ?")


@dataclass
class ReembedReport:
    """What one re-embedding run did."""

    kb: str
    name: str
    from_model: str
    to_model: str
    chunks: int = 0
    embedded: int = 0  # vectors computed by this run
    reused: int = 0  # staged by an earlier, interrupted run and still valid
    caught_up: int = 0  # embedded while holding the lock: written meanwhile
    switched: bool = False
    generation: int | None = None

    @property
    def summary(self) -> str:
        if not self.switched:
            return f"{self.name} already uses {self.to_model}"
        return (f"{self.name}: {self.from_model} -> {self.to_model}, {self.chunks} chunks "
                f"({self.embedded} embedded, {self.reused} reused from an earlier run, "
                f"{self.caught_up} caught up)")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["summary"] = self.summary
        return out


def _emit(progress: Progress | None, **event: object) -> None:
    if progress is not None:
        progress(event)


def ensure_staging(store: Store) -> None:
    """Create the staging table if this catalogue has none yet (idempotent DDL)."""
    try:
        store.catalog.db.execute(STAGING)
    except sqlite3.Error as err:
        raise StoreError(f"cannot create the re-embedding staging table: {err}") from err


def staged_count(store: Store, kb_id: str) -> int:
    """Rows staged for ``kb_id`` (0 when no run ever started)."""
    ensure_staging(store)
    return store.catalog.db.execute("SELECT COUNT(*) FROM reembed_staging WHERE kb_id = ?",
                                    (kb_id,)).fetchone()[0]


def _missing(store: Store, kb_id: str, model: str) -> list[str]:
    return [r[0] for r in store.catalog.db.execute(_MISSING, (model, kb_id))]


def _stage(store: Store, kb_id: str, model: str, ids: list[str], *, batch_size: int, stage: str,
           progress: Progress | None, check_cancelled: CancelCheck | None) -> int:
    """Embed the chunks ``ids`` with ``model`` and store their vectors; returns how many."""
    embedder = store.models.get(model)
    done = 0
    _emit(progress, stage=stage, done=0, total=len(ids))
    for start in range(0, len(ids), batch_size):
        if check_cancelled:
            check_cancelled()
        part = ids[start : start + batch_size]
        marks = ",".join("?" * len(part))
        sql = _TEXTS + f" AND c.id IN ({marks})"  # only placeholders are interpolated
        rows = store.catalog.db.execute(sql, [kb_id, *part]).fetchall()
        if rows:
            vecs = embedder.embed([passage_text(r["title"], r["text"]) for r in rows])
            with store.catalog.tx() as db:
                db.executemany(
                    "INSERT OR REPLACE INTO reembed_staging (kb_id, chunk_id, model, text_hash, vector) "
                    "VALUES (?,?,?,?,?)",
                    [(kb_id, r["id"], model, r["text_hash"], vector_blob(v))
                     for r, v in zip(rows, vecs, strict=True)])
        done += len(part)
        _emit(progress, stage=stage, done=done, total=len(ids))
    return len(ids)


def reembed(store: Store, ref: str, model: str, *, batch_size: int = 64,
            lock_below: int = SMALL_REMAINDER, progress: Progress | None = None,
            check_cancelled: CancelCheck | None = None) -> ReembedReport:
    """Move knowledge base ``ref`` to ``model``; resumes an interrupted run for the same model.

    Chunks are embedded without blocking writers until at most ``lock_below``
    remain; those are embedded holding the write lock, then the switch commits.
    """
    spec = store.models.spec(model)
    rec = store.resolve(ref)
    report = ReembedReport(kb=rec.id, name=rec.name, from_model=rec.model, to_model=spec.id)
    ensure_staging(store)
    if rec.model == spec.id:
        with store.catalog.tx() as db:
            db.execute("DELETE FROM reembed_staging WHERE kb_id = ?", (rec.id,))
        report.chunks = store.catalog.counts(rec.id)["chunks"]
        report.generation = rec.generation
        return report
    store.models.get(spec.id).load()  # a model that cannot load fails before any work
    with store.catalog.tx() as db:
        db.execute("DELETE FROM reembed_staging WHERE kb_id = ? AND model != ?", (rec.id, spec.id))
    total = store.catalog.counts(rec.id)["chunks"]
    missing = _missing(store, rec.id, spec.id)
    report.reused = total - len(missing)

    for _ in range(MAX_UNLOCKED_PASSES):
        if len(missing) <= lock_below:
            break
        report.embedded += _stage(store, rec.id, spec.id, missing, batch_size=batch_size,
                                  stage="embed", progress=progress, check_cancelled=check_cancelled)
        missing = _missing(store, rec.id, spec.id)

    with store.lock.hold():
        now = store.resolve(rec.id)
        if now.model != rec.model:
            raise Conflict(f"{rec.name} was switched to {now.model} by another run meanwhile")
        missing = _missing(store, rec.id, spec.id)
        report.caught_up = _stage(store, rec.id, spec.id, missing, batch_size=batch_size,
                                  stage="catch-up", progress=progress, check_cancelled=check_cancelled)
        report.embedded += report.caught_up
        if check_cancelled:
            check_cancelled()
        _emit(progress, stage="switch", done=0, total=1)
        with store.catalog.tx() as db:
            left = db.execute(_MISSING.replace("SELECT c.id", "SELECT COUNT(*)"),
                              (spec.id, rec.id)).fetchone()[0]
            if left:
                raise EmbeddingUnavailable(f"{left} chunks have no {spec.id} vector; nothing was switched")
            db.execute(
                "UPDATE chunks SET vector = (SELECT r.vector FROM reembed_staging r "
                "WHERE r.kb_id = chunks.kb_id AND r.chunk_id = chunks.id) "
                "WHERE kb_id = ?", (rec.id,))
            db.execute("UPDATE kbs SET model = ?, dim = ?, generation = generation + 1 WHERE id = ?",
                       (spec.id, spec.dim, rec.id))
            gen = db.execute("SELECT generation FROM kbs WHERE id = ?", (rec.id,)).fetchone()[0]
            # No index built before this generation may be caught up: all are rebuilt.
            db.execute("DELETE FROM changes WHERE kb_id = ?", (rec.id,))
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"pruned:{rec.id}", str(gen)))
            db.execute("DELETE FROM reembed_staging WHERE kb_id = ?", (rec.id,))
        report.switched, report.generation = True, gen
        _emit(progress, stage="switch", done=1, total=1)
        _emit(progress, stage="index", done=0, total=1)
        kb = store.open_kb(rec.id)
        kb.indexes()
        old = store.kb_dir(rec.id) / f"vectors-{rec.model}.usearch"
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)
        old.with_suffix(".log").unlink(missing_ok=True)
        _emit(progress, stage="index", done=1, total=1)
    report.chunks = store.catalog.counts(rec.id)["chunks"]
    return report
