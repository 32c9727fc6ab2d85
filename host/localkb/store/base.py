"""The store seam: what ingestion, search, chat, export and re-embed ask of a store.

Two stores implement it: the local one (``store.kb``: SQLite + usearch + Whoosh in the
user's data directory) and the team one (``team.store``: PostgreSQL + pgvector, every
read already restricted to what the asking user may see). Everything above the seam —
the ingest pipeline and its honest reports, the search statuses, floor, fusion and
per-source results, the chat turn, the ``.awkb`` format — is one copy of code that runs
on either.

Ingestion (``ingest.pipeline``, the one pipeline for both stores) asks a handle for:

- ``item_locks()``: per-source locks that ``acquire`` without waiting (False: another
  job, in this or another process or server, works on that source), so two adds of one
  source never embed it twice; locally striped file locks, on PostgreSQL session advisory
  locks;
- what is stored: ``source_state`` (content hash, chunk count), ``stored_passages``
  (idx -> chunk id, text hash, whether its vector is valid: what a re-add keeps),
  ``vectors_by_text_hash`` (vectors of identical passages anywhere in the knowledge base,
  copied instead of embedded), ``file_state`` (a file's size, mtime, sha256 and the recipe
  its passages were made with: an unchanged file is known from a stat);
- small sources: ``write_sources``, many whole sources in one transaction, each returning
  what it held before (the report is counted from ``stored_passages`` afterwards);
- big sources (more passages than one write batch): ``stage_passages`` commits one batch
  out of sight, ``staged_passages`` tells a resumed run what an interrupted one staged,
  ``publish_staged`` is the one transaction that makes the staged version visible (the old
  version whole until then), ``unstage`` drops staged rows, ``staged_sources`` lists what
  waits for the next run;
- ``log_skip``: a skipped file is logged once, not on every re-add.

    KnowledgeStore            kbs, resolve, record, create/update/delete, open_kb, generation,
                              counts, passage_window, log_error, log_query
      open_kb -> KnowledgeBaseHandle
                              ingestion: before_ingest, item_locks, source_state, stored_passages,
                                         vectors_by_text_hash, file_state, save_file_state,
                                         write_sources, log_skip; big sources staged:
                                         staged_passages, stage_passages, unstage,
                                         publish_staged, staged_sources
                              sources:   list_sources, remove_source
                              search:    legs() -> Legs (vector, keyword, rows, and the
                                         keyword lookups of exact terms: doc_count,
                                         doc_frequency, phrase, chunks_with, sources_of)
                              portable:  snapshot(), import_rows
                              re-embed:  staged_count, clear_staging, reembed_missing, chunk_texts,
                                         stage_vectors, writers_paused(), switch_model, after_switch
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from localkb.config import Settings
    from localkb.embedding.embedder import Embedder, EmbedderRegistry
    from localkb.store.catalog import KBRecord
    from localkb.store.keywords import KeywordHit
    from localkb.store.vectors import VectorHits


@dataclass
class PassageRow:
    """A stored passage as a search hit shows it; ``cosine`` against the query when one was given."""

    vkey: int
    id: str
    source_id: str
    idx: int
    text: str
    page: int | None
    title: str
    url: str | None
    file_name: str | None
    type: str
    chunk_count: int
    cosine: float | None = None


@dataclass
class ChunkWrite:
    """One passage to insert or update, with its new vector."""

    id: str
    idx: int
    text: str
    text_hash: str
    page: int | None
    tokens: int
    vector: np.ndarray
    indexed_by: str


@dataclass
class SourceWrite:
    """One source written whole: its row, the passages to upsert, and every passage id it keeps.

    Stored passages of the source not in ``keep`` are deleted in the same transaction.
    """

    id: str
    key: str
    type: str
    title: str
    url: str | None
    file_name: str | None
    content_hash: str
    captured_by: str
    chunk_count: int
    pages: int | None
    lang: str | None
    chunks: list[ChunkWrite] = field(default_factory=list)
    keep: set[str] = field(default_factory=set)
    #: A file source's fingerprint, saved in the same transaction.
    file: FileFingerprint | None = None


def source_listing(r: Any, stored: int) -> dict:
    """A source row as ``iter_sources`` yields it (both stores; the team adds access and author)."""
    key = r["key"]
    return {"id": r["id"], "title": r["title"], "url": r["url"], "file_name": r["file_name"],
            "path": key[5:] if key.startswith("file:") else None, "type": r["type"], "chunks": stored,
            "chunk_count": r["chunk_count"], "pages": r["pages"], "captured_by": r["captured_by"],
            "added_at": r["added_at"], "updated_at": r["updated_at"]}


def paged(fetch: Callable[[int, int], list], offset: int, limit: int | None, page: int = 500) -> Iterator:
    """Rows from ``fetch(count, offset)`` a page at a time, ``limit`` in all (None: every row)."""
    left = limit
    while left is None or left > 0:
        n = page if left is None else min(page, left)
        rows = fetch(n, offset)
        yield from rows
        if len(rows) < n:
            return
        offset += len(rows)
        if left is not None:
            left -= len(rows)


class ItemLocks(ABC):
    """Non-blocking locks on sources, held by one ingest job (across threads, processes, servers)."""

    @abstractmethod
    def acquire(self, key: str) -> bool:
        """Take ``key`` if no other job holds it; False (at once) if one does."""

    @abstractmethod
    def release(self, key: str) -> None: ...

    @abstractmethod
    def release_all(self) -> None:
        """Release everything this job holds (at its end, however it ends)."""


@dataclass
class FileFingerprint:
    """A file source as it was read: what tells an unchanged file from a stat (or its hash)."""

    path: str
    size: int
    mtime_ns: int
    sha256: str
    recipe: str  # chunker version, passage sizes, model: passages made another way are not kept


@dataclass
class FileState:
    """A stored file source's fingerprint, with its source's title, URL and passage counts."""

    size: int
    mtime_ns: int
    sha256: str
    recipe: str
    title: str
    url: str | None
    chunk_count: int
    stored: int


@dataclass
class StagedPassage:
    """One passage of a big source, embedded and staged until its source is published."""

    idx: int
    id: str
    text: str
    text_hash: str
    page: int | None
    tokens: int
    vector: np.ndarray


#: idx -> (chunk id, text hash, whether its stored vector is valid): a source's passages as
#: ingestion compares them.
Stored = dict[int, tuple[str, str, bool]]


@dataclass
class Snapshot:
    """One consistent read of a knowledge base for export: its record, counts and rows in order.

    ``sources`` and ``chunks`` are iterators of dicts (the chunk's ``vector`` is
    little-endian float32 bytes), valid while the snapshot's context is open.
    """

    record: dict
    n_sources: int
    n_chunks: int
    sources: Iterator[dict]
    chunks: Iterator[dict]


class Legs(ABC):
    """One knowledge base's two retrieval legs and its rows, limited to what the caller may see.

    Both keyword legs index and query the same terms, those of ``store.analysis`` (Whoosh
    locally, a ``tsvector`` of those terms with their positions in PostgreSQL), so exact
    terms, their back-off and the statuses come out alike on both stores.

    ``trace`` collects what a leg wants to show about how it ran (the team store records
    the filter it applied and the ids each leg fetched).
    """

    trace: dict

    @abstractmethod
    def is_empty(self) -> bool:
        """Whether the caller can see no passage at all here (the ``empty`` status)."""

    @abstractmethod
    def vector(self, qvec: np.ndarray, count: int) -> VectorHits:
        """The ``count`` passages nearest to ``qvec`` (cosine), best first."""

    @abstractmethod
    def keyword(self, terms: list[str], count: int) -> list[KeywordHit]:
        """BM25 over ``store.analysis`` terms, any term may match, best first, with the terms each holds."""

    @abstractmethod
    def doc_count(self) -> int:
        """How many passages the keyword leg holds (that the caller may see)."""

    @abstractmethod
    def doc_frequency(self, term: str) -> int:
        """How many of those passages hold ``term`` (0: none)."""

    @abstractmethod
    def phrase(self, terms: Sequence[str], limit: int = 1000) -> list[str]:
        """Chunk ids of passages holding ``terms`` at adjacent positions, in order (one term: holding it)."""

    @abstractmethod
    def chunks_with(self, term: str, limit: int = 20_000) -> list[str]:
        """Chunk ids of (at most ``limit``) passages holding ``term``."""

    @abstractmethod
    def sources_of(self, chunk_ids: Sequence[str]) -> dict[str, str]:
        """The source id of each of ``chunk_ids`` (those that exist and may be seen)."""

    @abstractmethod
    def rows(self, keys: Sequence[int], qvec: np.ndarray | None) -> dict[int, PassageRow]:
        """The passages with these vector keys (missing ones are left out), cosine filled in."""


class KnowledgeBaseHandle(ABC):
    """One open knowledge base of a store."""

    store: KnowledgeStore
    record: KBRecord
    embedder: Embedder

    @property
    def id(self) -> str:
        return self.record.id

    # -- ingestion (ingest/pipeline.py) ----------------------------------------------------
    def before_ingest(self) -> None:
        """Whatever the store does before a job reads what is stored (catch derived indexes up)."""
        return

    @abstractmethod
    def item_locks(self) -> ItemLocks:
        """A fresh set of per-source locks for one job."""

    def source_id_for(self, key: str) -> str:
        """The id of the source an add at ``key`` writes: one source per key here; the team
        store picks among the sources the writer may see (``TeamKnowledgeBase``)."""
        from localkb.store.catalog import source_id

        return source_id(self.id, key)

    @abstractmethod
    def source_state(self, sid: str) -> tuple[str, int] | None:
        """(content hash, chunk count) of a stored source, or None."""

    @abstractmethod
    def stored_passages(self, sid: str) -> Stored:
        """The stored passages of a source, by idx."""

    @abstractmethod
    def vectors_by_text_hash(self, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        """A stored, valid vector for each of ``hashes`` some passage of this knowledge base has."""

    @abstractmethod
    def file_state(self, sid: str) -> FileState | None:
        """The fingerprint of a stored file source, None if it has none (or is not stored)."""

    @abstractmethod
    def save_file_state(self, sid: str, fp: FileFingerprint) -> None:
        """Remember a file's new fingerprint (a touched, unchanged file: the next add is a stat)."""

    @abstractmethod
    def write_sources(self, writes: Sequence[SourceWrite]) -> dict[str, Stored]:
        """Write the sources in one transaction; return each one's passages as they were before.

        Each source's row is upserted (its first ``added_at`` kept), its ``chunks`` upserted,
        and its stored passages whose id is not in ``keep`` deleted.
        """

    @abstractmethod
    def staged_passages(self, sid: str, model: str) -> dict[int, str]:
        """idx -> text hash of what an earlier run staged for ``sid`` (other models' rows dropped)."""

    @abstractmethod
    def stage_passages(self, sid: str, model: str, rows: Sequence[StagedPassage]) -> None:
        """Commit one batch of a big source's passages to staging, in its own transaction."""

    @abstractmethod
    def unstage(self, sid: str, idxs: Sequence[int] | None = None) -> None:
        """Drop a source's staged rows (all, or those at ``idxs``)."""

    @abstractmethod
    def publish_staged(self, write: SourceWrite) -> Stored:
        """One transaction: the source row, every staged passage of it below ``chunk_count`` into
        the knowledge base (``indexed_by`` = ``captured_by``), stored ones not in ``keep``
        deleted, staging emptied; returns what the source held before."""

    @abstractmethod
    def staged_sources(self) -> dict[str, int]:
        """source id -> staged passages, of the sources with a staged version waiting."""

    @abstractmethod
    def log_skip(self, ref: str, reason: str) -> None:
        """Log a skipped file, unless its last skip was logged with the same reason."""

    @abstractmethod
    def find_sources(self, ref: str) -> list[dict]:
        """``{id, title, url, file_name, key}`` of the sources ``ref`` names: an id, a URL, a path
        (as given or resolved), a file name or a title (case-insensitive), or a path's end."""

    @abstractmethod
    def iter_sources(self, *, offset: int = 0, limit: int | None = None,
                     sort: str = "title") -> Iterator[dict]:
        """The sources one by one (by ``title``, ``added`` or ``updated``), read in pages."""

    @abstractmethod
    def remove_source(self, ref: str) -> dict:
        """Delete a source by id, URL or file key: ``{source_id, title, removed_chunks}``."""

    @abstractmethod
    def list_sources(self, *, offset: int = 0, limit: int = 100) -> tuple[list[dict], int]:
        """A page of the sources, oldest first, with their stored passage counts."""

    @abstractmethod
    def source_total(self) -> int:
        """How many sources there are (that the caller may see)."""

    # -- search ----------------------------------------------------------------------
    @abstractmethod
    def legs(self) -> Legs:
        """The retrieval legs, at the store's current generation."""

    # -- portable --------------------------------------------------------------------
    @abstractmethod
    def snapshot(self) -> AbstractContextManager[Snapshot]:
        """A consistent read of everything, for export."""

    @abstractmethod
    def import_rows(self, sources: Sequence[dict], chunks: Sequence[dict],
                    vectors: np.ndarray) -> None:
        """Write an archive's sources and passages into this (new, empty) knowledge base."""

    # -- re-embedding (ingest/reembed.py: stage, catch up with writers paused, switch) -------
    @abstractmethod
    def staged_count(self) -> int:
        """Vectors staged for a re-embedding of this knowledge base."""

    @abstractmethod
    def clear_staging(self, keep_model: str | None) -> None:
        """Drop staged vectors of every model but ``keep_model`` (None: all)."""

    @abstractmethod
    def reembed_missing(self, model: str) -> list[str]:
        """Chunk ids with no staged ``model`` vector for their current text."""

    @abstractmethod
    def chunk_texts(self, ids: Sequence[str]) -> list[dict]:
        """``{id, title, text, text_hash}`` of these passages."""

    @abstractmethod
    def stage_vectors(self, model: str, rows: Sequence[tuple[str, str, np.ndarray]]) -> None:
        """Stage (chunk id, text hash, vector) rows; each call commits on its own."""

    @abstractmethod
    def writers_paused(self) -> AbstractContextManager[None]:
        """While open, no other writer changes this knowledge base."""

    @abstractmethod
    def switch_model(self, model: str, dim: int) -> int:
        """One transaction: every vector from staging and the new model, or nothing; the generation."""

    @abstractmethod
    def after_switch(self, old_model: str) -> None:
        """Whatever the store derives from vectors, for the new model."""

    def log_error(self, source: str, code: str, message: str, *, ref: str | None = None,
                  detail: dict | None = None) -> None:
        self.store.log_error(source, code, message, kb_id=self.id, ref=ref, detail=detail)


class KnowledgeStore(ABC):
    """A set of knowledge bases: the local data directory, or one user's view of a team database."""

    settings: Settings
    models: EmbedderRegistry
    #: Whether the chat history this store is asked about was written on this machine. The local
    #: store's is (the side panel's): text of unknown provenance is this device's own. A team
    #: server's comes from its clients' machines: text it cannot trace to its own knowledge bases
    #: is ``privacy.ELSEWHERE`` and reaches no model.
    history_is_local: bool = True

    @abstractmethod
    def kbs(self) -> list[KBRecord]: ...

    @abstractmethod
    def resolve(self, ref: str) -> KBRecord:
        """A knowledge base by id or name, or ``KnowledgeBaseNotFound``."""

    @abstractmethod
    def record(self, kb_id: str) -> KBRecord | None:
        """The record of a knowledge base id, None when there is none (or it is not visible)."""

    @abstractmethod
    def create_kb(self, name: str, *, privacy: str = "device", model: str | None = None) -> KBRecord: ...

    @abstractmethod
    def delete_kb(self, ref: str) -> KBRecord: ...

    @abstractmethod
    def open_kb(self, ref: str) -> KnowledgeBaseHandle: ...

    @abstractmethod
    def generation(self, kb_id: str) -> int | None: ...

    @abstractmethod
    def counts(self, kb_id: str) -> dict: ...

    @abstractmethod
    def passage_window(self, kb_id: str, source_id: str, idx: int, radius: int) -> list[dict]:
        """``{idx, text, page}`` of a source's passages from ``idx - radius`` to ``idx + radius``."""

    @abstractmethod
    def log_error(self, source: str, code: str, message: str, *, kb_id: str | None = None,
                  ref: str | None = None, detail: dict | None = None) -> None: ...

    @abstractmethod
    def log_query(self, kind: str, query: str, kb_ids: list[str], trace: dict[str, Any]) -> None:
        """Record a chat turn's trace."""

    def confirm_privacy(self) -> None:
        """Read again any privacy setting held elsewhere, before text may leave this machine.

        The local store holds its own (nothing to do); the ``Library`` of attached teams asks
        each team, since its listing may be older than an administrator's change.
        """
        return
