"""Re-embedding a knowledge base with another model, safe against writes, failures and kills.

1. Stage: every chunk's passage is embedded with the target model in batches and
   the vector is stored in ``reembed_staging`` with the chunk's ``text_hash``.
   Each batch commits on its own, so a killed run loses at most one batch and a
   rerun reuses every staged vector whose ``text_hash`` still matches. Writers are
   not blocked: chunks added or changed meanwhile are caught by the next pass.
2. Catch up and switch, holding the store's write lock: embed what is still
   missing (what changed since the last pass), then ONE catalogue transaction
   sets the knowledge base's model and dimension, replaces every chunk's vector
   and bumps the generation.
3. Build the new model's vector index (its file name carries the model id, so the
   old file is never read for the new model; the local store removes any earlier
   file of the new model before the commit, and the rebuild removes the old
   model's first); the keyword index, the same passages, only catches up. A kill
   after the commit leaves the new model's index missing, and the next open
   builds it.

The steps run on either store of the seam (``store.base``): the local one stages in its
SQLite catalogue and pauses writers with its store lock; the team one stages in
PostgreSQL and pauses the knowledge base's writers with its row lock, in the same
transaction as the switch.

Until step 2 commits, the catalogue and every index are exactly the old model's:
searches read the old index, and any failure or kill leaves the knowledge base
usable on the old model. Staged rows are only a cache; they are dropped when the
switch commits, when the knowledge base is deleted, or when a run for a
different target model starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from localkb.errors import Conflict
from localkb.ingest.chunk import passage_text
from localkb.store.base import KnowledgeBaseHandle, KnowledgeStore

Progress = Callable[[dict], None]
CancelCheck = Callable[[], None]

# A pass that leaves no more than this many chunks to embed ends the unlocked
# phase: the rest is embedded while writers wait, which must stay short.
SMALL_REMAINDER = 256
MAX_UNLOCKED_PASSES = 4


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


def staged_count(store: KnowledgeStore, kb_id: str) -> int:
    """Rows staged for ``kb_id`` (0 when no run ever started)."""
    return store.open_kb(kb_id).staged_count()


def _stage(kb: KnowledgeBaseHandle, model: str, ids: list[str], *, batch_size: int, stage: str,
           progress: Progress | None, check_cancelled: CancelCheck | None) -> int:
    """Embed the chunks ``ids`` with ``model`` and stage their vectors; returns how many."""
    embedder = kb.store.models.get(model)
    done = 0
    _emit(progress, stage=stage, done=0, total=len(ids))
    for start in range(0, len(ids), batch_size):
        if check_cancelled:
            check_cancelled()
        part = ids[start : start + batch_size]
        rows = kb.chunk_texts(part)
        if rows:
            vecs = embedder.embed([passage_text(r["title"], r["text"]) for r in rows])
            kb.stage_vectors(model, [(r["id"], r["text_hash"], v) for r, v in zip(rows, vecs, strict=True)])
        done += len(part)
        _emit(progress, stage=stage, done=done, total=len(ids))
    return len(ids)


def reembed(store: KnowledgeStore, ref: str, model: str, *, batch_size: int = 64,
            lock_below: int = SMALL_REMAINDER, progress: Progress | None = None,
            check_cancelled: CancelCheck | None = None) -> ReembedReport:
    """Move knowledge base ``ref`` to ``model``; resumes an interrupted run for the same model.

    Chunks are embedded without blocking writers until at most ``lock_below``
    remain; those are embedded with the knowledge base's writers paused, then the
    switch commits.
    """
    spec = store.models.spec(model)
    rec = store.resolve(ref)
    kb = store.open_kb(rec.id)
    report = ReembedReport(kb=rec.id, name=rec.name, from_model=rec.model, to_model=spec.id)
    if rec.model == spec.id:
        kb.clear_staging(None)
        report.chunks = store.counts(rec.id)["chunks"]
        report.generation = rec.generation
        return report
    store.models.get(spec.id).load()  # a model that cannot load fails before any work
    kb.clear_staging(keep_model=spec.id)
    total = store.counts(rec.id)["chunks"]
    missing = kb.reembed_missing(spec.id)
    report.reused = total - len(missing)

    for _ in range(MAX_UNLOCKED_PASSES):
        if len(missing) <= lock_below:
            break
        report.embedded += _stage(kb, spec.id, missing, batch_size=batch_size, stage="embed",
                                  progress=progress, check_cancelled=check_cancelled)
        missing = kb.reembed_missing(spec.id)

    with kb.writers_paused():
        now = store.resolve(rec.id)
        if now.model != rec.model:
            raise Conflict(f"{rec.name} was switched to {now.model} by another run meanwhile")
        missing = kb.reembed_missing(spec.id)
        report.caught_up = _stage(kb, spec.id, missing, batch_size=batch_size, stage="catch-up",
                                  progress=progress, check_cancelled=check_cancelled)
        report.embedded += report.caught_up
        if check_cancelled:
            check_cancelled()
        _emit(progress, stage="switch", done=0, total=1)
        report.generation = kb.switch_model(spec.id, spec.dim)
        report.switched = True
    _emit(progress, stage="switch", done=1, total=1)
    # After the commit: the new model's indexes (a write meanwhile is caught up as any other).
    _emit(progress, stage="index", done=0, total=1)
    store.open_kb(rec.id).after_switch(rec.model)
    _emit(progress, stage="index", done=1, total=1)
    report.chunks = store.counts(rec.id)["chunks"]
    return report
