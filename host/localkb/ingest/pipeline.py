"""Honest, idempotent ingestion: extract, chunk, embed, write, and report real rows.

The one pipeline of both stores: every read and write it does goes through the store seam's
ingestion methods (``store.base``), so the local store (SQLite + usearch + Whoosh) and the
team store (PostgreSQL + pgvector, at the writer's access level) ingest alike.

One job (an add of files, folders and URLs, a sync, a page from the extension) runs as
two threads joined by a bounded queue:

- the *reader* walks the job's items in order. For each source it takes the source's
  lock (one job at a time works on a source, across processes), recognises an unchanged
  file from its size and mtime or, failing that, the sha256 of its bytes, without
  extracting it; otherwise it extracts and chunks the source *as a stream* (a text file
  by segments, a PDF by pages) and hands the passages on, each marked with whether its
  stored vector can be kept;
- the *writer* (the calling thread) embeds what needs embedding in length-sorted model
  batches and writes. Small sources are written together, one catalogue transaction per
  batch of about ``BATCH_TOKENS`` model tokens, each source whole in one of them. A
  source bigger than a batch is staged (the store's ``stage_passages``): embedded and
  committed batch by batch out of sight, then published with one transaction, so an
  interrupt keeps the old version or the new one whole and the next add resumes from the
  staged batches.

- the *committer* (one more thread) runs each small-source batch's write, its row counts
  and every source's outcome, in order, while the writer embeds the next batch; at most
  one write is in flight. Big sources' staged batches and their switch are still written
  by the writer itself.

So the model waits neither for text nor for the catalogue: while it embeds one batch, the
reader prepares the next and the committer writes the one before. Memory stays bounded
whatever the input: the queue, two batches (one embedding, one being written), and a big
source's per-passage hashes.

Re-adding a source upserts the same deterministic chunk ids, keeps the vectors of passages
whose text did not change (or copies them from an identical passage elsewhere in the
knowledge base, which makes a renamed file cost no embedding), and deletes chunks past
the new end. Every report is counted from the rows in the catalogue after the write.
Ctrl-C (or a ``cancel``) stops at the next safe point: what is written stays, what is
staged waits for the next run, and the report says which sources were kept.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from localkb.errors import (
    AmbiguousReference,
    Cancelled,
    EmbeddingUnavailable,
    EmptyDocument,
    FetchFailed,
    InvalidDocument,
    InvalidInput,
    LocalKBError,
    NothingWritten,
    SourceNotFound,
    SourceTooLarge,
)
from localkb.ingest.chunk import Chunk, iter_chunks, passage_text
from localkb.ingest.documents import DOCUMENT_TYPES
from localkb.ingest.extract import (
    TEXT_SEGMENT_CHARS,
    Document,
    extract_bytes,
    extract_html,
    extract_text,
    open_file,
)
from localkb.ingest.files import (
    DEFAULT_EXCLUDES,
    Fingerprint,
    hash_file,
    too_large_reason,
    walk_folder,
)
from localkb.ingest.progress import JobProgress
from localkb.store.base import ChunkWrite, FileFingerprint, SourceWrite, StagedPassage
from localkb.store.base import KnowledgeBaseHandle as KnowledgeBase
from localkb.store.catalog import chunk_id
from localkb.strings import plural

CHUNKER_VERSION = "1"
CAPTURED_BY = ("cli", "folder", "url", "context-menu", "side-panel", "toolbar", "import", "chat",
               "api", "sync")
FETCH_TYPES = ("text/html", "application/xhtml+xml", "text/plain", "text/markdown", "application/pdf",
               *DOCUMENT_TYPES)
__all__ = ["DEFAULT_EXCLUDES", "add_capture", "add_document", "add_paths", "ingest_documents",
           "list_sources", "remove_source"]

#: Model tokens per write batch: about 680 passages of 96 tokens. Sized in tokens, not
#: passages, so that the per-commit cost (one SQLite transaction, one Whoosh segment)
#: stays small against the embedding time whatever the passage size. A source with more
#: passages than fit in one batch is staged (see the module docstring).
BATCH_TOKENS = 65_536
#: The most tokens the writer gathers before it embeds them ahead of the batch's write:
#: the window its model batches are length-sorted over. Passages of mixed lengths in a
#: window of 8,192 tokens (~90 passages, three model batches, each spanning a third of
#: the lengths) padded the model's work by 7 % on the Python library pages; over 32,768
#: tokens by 2.6 % (one sort of everything: 0.3 %).
EMBED_WINDOW = 32_768
#: When the reader has nothing more ready (its queue is empty), the writer embeds what it
#: has once it is this much rather than let the model wait for a full window.
EMBED_MIN = 8_192
#: How far the reader may run ahead of the writer, in model tokens of passages (a message
#: is one section's passages: a page, a text segment of ``TEXT_SEGMENT_CHARS``, a small
#: file). Two windows: while the model embeds one, the next is being read, however small
#: the sources are. One message always fits, whatever its size.
QUEUE_TOKENS = 2 * EMBED_WINDOW

Progress = Callable[[dict], None]
CancelCheck = Callable[[], None]


# == reports ===============================================================================
@dataclass
class SourceReport:
    """What one source's write really stored (or why nothing was)."""

    name: str
    status: str  # added | updated | unchanged | partial | failed | skipped
    source_id: str | None = None
    title: str | None = None
    url: str | None = None
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0
    total: int = 0
    failures: list[dict] = field(default_factory=list)
    error: dict | None = None
    #: Why a file was skipped (``unsupported type: image/png``, ``empty``, ``too large: ...``).
    reason: str | None = None
    #: Passages whose vectors came from an earlier, interrupted run's staged batches.
    resumed: int = 0
    #: Passages whose vectors were copied from an identical passage already stored.
    reused: int = 0

    @property
    def summary(self) -> str:
        if self.status == "skipped":
            return f"skipped: {self.reason}"
        if self.error:
            return f"not saved: {self.error['message']}"
        if self.status == "unchanged":
            return "unchanged"
        parts = []
        if self.failed:
            parts.append(f"{self.failed} of {self.total} passages could not be saved")
        for label in ("added", "updated", "removed"):
            if getattr(self, label):
                parts.append(f"{getattr(self, label)} {label}")
        if self.unchanged and (self.added or self.updated):
            parts.append(f"{self.unchanged} unchanged")
        if self.resumed:
            parts.append(f"{self.resumed} from the interrupted run")
        return " · ".join(parts) or "unchanged"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["summary"] = self.summary
        return out


SOURCE_STATUSES = ("added", "updated", "unchanged", "partial", "skipped", "failed")


@dataclass
class IngestReport:
    """The reports of every source of one job, and how the job ended."""

    sources: list[SourceReport] = field(default_factory=list)
    #: Stopped early (Ctrl-C, ``cancel``): ``pending`` names what was not reached.
    interrupted: bool = False
    pending: list[str] = field(default_factory=list)
    #: Sources with staged batches left for the next run (name -> passages staged).
    staged: dict[str, int] = field(default_factory=dict)
    excluded: int = 0
    elapsed_s: float = 0.0
    tokens: int = 0  # embedded by this job
    passages: int = 0  # embedded by this job
    #: Seconds the writer spent waiting for text, in the model, and writing (and waiting for
    #: the committer); the CPU seconds of the reader and committer threads (``read_cpu_s``,
    #: ``commit_cpu_s``); and ``model``: the model's work (batches, texts, tokens, padded
    #: tokens; MiniLM only).
    timings: dict = field(default_factory=dict)

    def totals(self) -> dict:
        keys = ("added", "updated", "unchanged", "removed", "failed", "total")
        out = {k: sum(getattr(s, k) for s in self.sources) for k in keys}
        out["sources"] = len(self.sources)
        by = {st: sum(1 for s in self.sources if s.status == st) for st in SOURCE_STATUSES}
        out["sources_failed"] = by["failed"]
        out["skipped"] = by["skipped"]
        out["by_status"] = by
        out["files_seen"] = len(self.sources) + len(self.pending)
        out["pending"] = len(self.pending)
        return out

    def to_dict(self) -> dict:
        return {"sources": [s.to_dict() for s in self.sources], "totals": self.totals(),
                "interrupted": self.interrupted, "pending": self.pending, "staged": self.staged,
                "excluded": self.excluded, "elapsed_s": round(self.elapsed_s, 2),
                "tokens": self.tokens, "passages": self.passages, "timings": self.timings,
                "summary": self.summary}

    @property
    def summary(self) -> str:
        """The final line: counts of sources by outcome, passages, time and rate."""
        t = self.totals()
        seen = t["files_seen"]
        parts = self.outcomes(t["by_status"])
        if self.pending:
            parts.append(f"{len(self.pending)} not reached")
        line = f"{plural(seen, 'source')}: " + (" · ".join(parts) or "nothing to do")
        rate = f", {self.tokens / self.elapsed_s:,.0f} tokens/s" if self.tokens and self.elapsed_s else ""
        line += (f" — {plural(self.passages, 'passage')} embedded in {clock(self.elapsed_s)}{rate}")
        return line

    def outcomes(self, by: dict[str, int]) -> list[str]:
        """The summary's counts of sources by outcome (``3 added``, ``1 skipped``)."""
        return [f"{by[st]} {st}" for st in SOURCE_STATUSES if by[st]]

    @property
    def kept_line(self) -> str | None:
        """After an interrupt: what was kept and how to finish."""
        if not self.interrupted:
            return None
        t = self.totals()
        kept = t["files_seen"] - t["pending"]
        line = f"interrupted: kept {kept} of {plural(t['files_seen'], 'source')}"
        if self.staged:
            n = sum(self.staged.values())
            line += (f"; {plural(len(self.staged), 'big source')} staged with {plural(n, 'passage')} "
                     "(the next run continues from there)")
        return line + "; run the same command to finish"


def clock(seconds: float) -> str:
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02}:{s:02}" if h else f"{m}:{s:02}"


def content_hash(doc: Document, chunks: list[Chunk], model: str) -> str:
    h = _digest_start(doc, model)
    for c in chunks:
        _digest_add(h, c)
    return h.hexdigest()


def _digest_start(doc: Document, model: str):
    return hashlib.sha256(f"{CHUNKER_VERSION}\x1f{model}\x1f{doc.title}\x1f{doc.url or ''}".encode())


def _digest_add(h, c: Chunk) -> None:
    h.update(f"\x1e{c.page}\x1f{c.text}".encode())


def _text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# == the items of a job ======================================================================
@dataclass
class _Item:
    """One source to ingest, as the reader will meet it."""

    name: str  # what reports and errors call it (a path, a URL, a document id)
    display: str  # what progress shows
    captured_by: str
    path: Path | None = None  # a file
    size: int = 0
    load: Callable[[], tuple[Document, str]] | None = None  # a URL, a capture, a document
    skip: str | None = None  # decided while walking: skipped with this reason
    counted: int = 0  # bytes of it reported to the progress as read so far


@dataclass
class _Source:
    """A source on its way through the job: what is stored, what the new version holds."""

    item: _Item
    sid: str
    key: str
    doc: Document
    lock_key: str
    before: dict[int, tuple[str, str, bool]]  # idx -> (chunk id, text hash, valid vector) stored now
    digest: object
    fingerprint: Fingerprint | None = None
    hashes: list[str] = field(default_factory=list)  # text hash of every passage, by idx
    chunks: list[Chunk] = field(default_factory=list)  # every passage (small sources only)
    pending: list[tuple[Chunk, str]] = field(default_factory=list)  # (passage, text) to embed
    vectors: dict[int, np.ndarray] = field(default_factory=dict)  # small sources: new vectors
    failures: dict[int, str] = field(default_factory=dict)
    staged: bool = False
    staged_before: dict[int, str] = field(default_factory=dict)  # idx -> hash staged by a run before
    resumed: int = 0
    reused: int = 0
    tokens: int = 0  # all passages
    pending_tokens: int = 0  # waiting for the model now
    need_tokens: int = 0  # all that needed vectors (small sources: the batch size it adds)

    @property
    def name(self) -> str:
        return self.item.name


# == the reader ==============================================================================
class _Reader(threading.Thread):
    """Walks the items, skips what is unchanged, streams the rest's passages into ``out``."""

    def __init__(self, job: _Job, items: list[_Item]) -> None:
        super().__init__(name="localkb-ingest-reader", daemon=True)
        self.job = job
        self.items = items
        self.out = _TokenQueue(QUEUE_TOKENS)
        self.stop = threading.Event()
        self.started_items = 0

    def put(self, msg: tuple) -> None:
        tokens = sum(c.tokens for c, *_rest in msg[2]) if msg[0] == "chunks" else 0
        if not self.out.put(msg, tokens, self.stop):
            raise _Stopped

    def run(self) -> None:
        try:
            self._run()
        finally:  # this thread's CPU: extraction, chunking, fingerprints (what competes with the model)
            self.job.timings["read_cpu_s"] = time.thread_time()

    def _run(self) -> None:
        try:
            deferred: list[_Item] = []
            for item in self.items:
                if self.stop.is_set():
                    raise _Stopped
                if not self.job.try_lock_item(item):
                    deferred.append(item)
                    continue
                self._one(item)
            for item in deferred:
                # Another job holds this source: wait for it holding nothing else (no deadlock),
                # then it is usually unchanged.
                done = threading.Event()
                self.put(("barrier", done))
                while not done.wait(0.1):
                    if self.stop.is_set():
                        raise _Stopped
                self.job.progress.emit("extract", self.started_items, len(self.items),
                                       current=f"waiting for another add of {item.display}", force=True)
                while not self.job.try_lock_item(item):
                    if self.stop.wait(0.2):
                        raise _Stopped
                self._one(item)
            self.put(("done",))
        except _Stopped:
            return
        except BaseException as err:  # hand anything unexpected to the writer, which re-raises it
            try:
                self.put(("crash", err))
            except _Stopped:
                return

    def _one(self, item: _Item) -> None:
        job = self.job
        self.started_items += 1
        job.progress.emit("extract", self.started_items, len(self.items), current=item.display)
        try:
            src = job.open_source(item)
        except _Stopped:
            raise
        except LocalKBError as err:
            job.release_item(item)
            self.put(("report", item, job.failed_report(item, err)))
            return
        if isinstance(src, SourceReport):
            job.release_item(item)
            self.put(("report", item, src))
            return
        self.put(("start", src))
        try:
            job.stream_source(src, self.put)
        except _Stopped:
            raise
        except LocalKBError as err:
            self.put(("fail", src, err))
            return
        self.put(("end", src))


class _Stopped(Exception):
    """The writer asked the reader to stop."""


class _TokenQueue:
    """A FIFO bounded by the model tokens it holds, and by 1,024 messages (one always fits)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: list[tuple[tuple, int]] = []
        self._tokens = 0
        self._cond = threading.Condition()

    def put(self, msg: tuple, tokens: int, stop: threading.Event) -> bool:
        """Wait for room; False if ``stop`` was set meanwhile."""
        with self._cond:
            while self._items and (self._tokens + tokens > self.limit or len(self._items) >= 1024):
                if stop.is_set():
                    return False
                self._cond.wait(0.1)
            if stop.is_set():
                return False
            self._items.append((msg, tokens))
            self._tokens += tokens
            self._cond.notify_all()
            return True

    def empty(self) -> bool:
        with self._cond:
            return not self._items

    def get(self, timeout: float) -> tuple:
        """The oldest message; ``queue.Empty`` after ``timeout`` seconds without one."""
        with self._cond:
            if not self._items and not self._cond.wait_for(lambda: bool(self._items), timeout):
                raise queue.Empty
            msg, tokens = self._items.pop(0)
            self._tokens -= tokens
            self._cond.notify_all()
            return msg


# == the job =================================================================================
class _Job:
    """Everything one ingest run shares between its reader and its writer."""

    def __init__(self, kb: KnowledgeBase, *, progress: Progress | None, check_cancelled: CancelCheck | None,
                 batch_tokens: int, max_bytes: int) -> None:
        self.kb = kb
        self.settings = kb.store.settings
        self.progress = JobProgress(progress)
        self.check_cancelled = check_cancelled
        self.batch_tokens = batch_tokens
        self.max_bytes = max_bytes
        self.locks = kb.item_locks()
        self.recipe = _recipe(kb)
        self.report = IngestReport()
        #: Where the writer's time went: waiting for the reader, in the model, in writes.
        #: ``read_cpu_s`` and ``commit_cpu_s``: the CPU seconds of the reader and the committer
        #: threads (what the job computes besides the model, on the cores the model uses).
        self.timings = {"wait_s": 0.0, "embed_s": 0.0, "write_s": 0.0, "commit_wait_s": 0.0,
                        "read_cpu_s": 0.0, "commit_cpu_s": 0.0}
        #: The model's work for this job: batches, texts, tokens and padded tokens.
        self.model_work: dict[str, int] = {}
        self._done_items: set[int] = set()
        self._item_keys: dict[int, str] = {}
        self._model_lock = threading.Lock()
        self._model_prepared = False

    # -- locks ---------------------------------------------------------------------------
    def _lock_key(self, item: _Item) -> str | None:
        if item.path is None or item.skip:
            return None  # URLs and captures lock once their key is known (open_source)
        return f"{self.kb.id}\x1f{_file_key(item.path)}"

    def try_lock_item(self, item: _Item) -> bool:
        key = self._lock_key(item)
        if key is None:
            return True
        if self.locks.acquire(key):
            self._item_keys[id(item)] = key
            return True
        return False

    def release_item(self, item: _Item) -> None:
        key = self._item_keys.pop(id(item), None)
        if key is not None:
            self.locks.release(key)

    # -- reading (on the reader thread) --------------------------------------------------------
    def failed_report(self, item: _Item, err: LocalKBError) -> SourceReport:
        self.kb.log_error("ingest", err.code, f"{item.name}: {err}", ref=item.name)
        return SourceReport(name=item.name, status="failed", error={"code": err.code, "message": str(err)})

    def skipped_report(self, item: _Item, reason: str) -> SourceReport:
        self.kb.log_skip(item.name, reason)
        return SourceReport(name=item.name, status="skipped", reason=reason)

    def open_source(self, item: _Item) -> _Source | SourceReport:
        """The unchanged and skipped outcomes, decided without extracting; else the opened source."""
        kb = self.kb
        if item.skip:
            return self.skipped_report(item, item.skip)
        fingerprint = None
        if item.path is not None:
            path = item.path
            try:
                st = path.stat()
            except OSError as err:
                raise InvalidDocument(f"cannot read the file: {err.strerror}") from err
            if st.st_size == 0:
                return self.skipped_report(item, "empty")
            if self.max_bytes and st.st_size > self.max_bytes:
                raise SourceTooLarge(too_large_reason(st.st_size, self.max_bytes),
                                     detail={"bytes": st.st_size, "cap": self.max_bytes})
            key = _file_key(path)
            sid = kb.source_id_for(key)
            fingerprint = Fingerprint(st.st_size, st.st_mtime_ns)
            stored = kb.file_state(sid)
            if stored is not None and stored.recipe == self.recipe and \
                    stored.stored == stored.chunk_count and stored.size == st.st_size:
                same = stored.mtime_ns == st.st_mtime_ns
                if not same:
                    digest = _hash(path)
                    fingerprint = Fingerprint(st.st_size, st.st_mtime_ns, digest)
                    same = digest == stored.sha256
                    if same:  # touched, not changed: remember the new mtime so next time is a stat
                        kb.save_file_state(sid, FileFingerprint(str(path), st.st_size, st.st_mtime_ns,
                                                                digest, self.recipe))
                if same:
                    return SourceReport(name=item.name, status="unchanged", source_id=sid,
                                        title=stored.title, url=stored.url,
                                        unchanged=stored.chunk_count, total=stored.chunk_count)
            if fingerprint.sha256 is None:
                fingerprint = Fingerprint(st.st_size, st.st_mtime_ns, _hash(path))
            per_unit: dict[str, float] = {}
            item.size = st.st_size

            def on_read(n: int) -> None:
                step = min(round(n * per_unit.get("f", 1.0)), max(0, item.size - item.counted))
                item.counted += step
                self.progress.chunked(step, 0, 0)

            try:
                doc, unit = open_file(path, on_read=on_read)
            except EmptyDocument:  # blank: empty, as a 0-byte file is
                return self.skipped_report(item, "empty")
            if unit == "pages" and doc.page_count:
                per_unit["f"] = st.st_size / doc.page_count
            elif unit == "bytes":
                per_unit["f"] = 1.0
        else:
            doc, key = item.load()
            lock_key = f"{kb.id}\x1f{key}"
            while not self.locks.acquire(lock_key):
                time.sleep(0.1)  # a capture or URL: one source, nothing else held
            self._item_keys[id(item)] = lock_key
            sid = kb.source_id_for(key)  # under the lock: a concurrent add of it has landed
        src = _Source(item=item, sid=sid, key=key, doc=doc, lock_key=self._item_keys.get(id(item), ""),
                      before=kb.stored_passages(sid), digest=_digest_start(doc, kb.record.model),
                      fingerprint=fingerprint)
        src.staged_before = kb.staged_passages(sid, kb.record.model)
        return src

    def prepare_model(self) -> None:
        """The model, before the first source is chunked: its own ``model`` stage when this
        process does not hold it yet (the first add after an install builds it, a minute or
        more), so a save says what it waits for and the rate starts after it."""
        with self._model_lock:
            if self._model_prepared:
                return
            if not self.kb.store.models.ready(self.kb.record.model):
                self.progress.emit("model", 0, 1, force=True)
                _ = self.kb.embedder  # builds (first use) and selects the model
                self.progress.model_ready()
                self.progress.emit("model", 1, 1, force=True)
            self._model_prepared = True

    def stream_source(self, src: _Source, put: Callable[[tuple], None]) -> None:
        """Chunk the source section by section, marking each passage to keep or to embed."""
        self.prepare_model()
        settings = self.settings
        title = src.doc.title
        for block in iter_chunks(src.doc, self.kb.embedder.count_tokens,
                                 max_tokens=settings.max_chunk_tokens,
                                 overlap=settings.chunk_overlap_tokens):
            marked = []
            to_embed = 0
            for c in block:
                text = passage_text(title, c.text)
                h = _text_hash(text)
                _digest_add(src.digest, c)
                stored = src.before.get(c.index)
                keep = stored is not None and stored[1] == h and stored[2]
                marked.append((c, text, h, keep))
                if not keep:
                    to_embed += c.tokens
            self.progress.chunked(0, to_embed, sum(c.tokens for c in block))
            made = block[-1].index + 1 if block else len(src.before)
            self.progress.emit("chunk", made, made)
            put(("chunks", src, marked))
        item = src.item
        if item.path is not None:  # square the bytes up: the estimate is exact for this source now
            self.progress.chunked(max(0, item.size - item.counted), 0, 0)
            item.counted = item.size

    # -- writing (on the calling thread) -------------------------------------------------------
    def cancelled(self) -> None:
        if self.check_cancelled:
            self.check_cancelled()


def give_back_memory() -> None:
    """After a write batch: collect the cycles extraction left (lxml trees of pages read since)
    and hand the C heap's free pages back to the OS (glibc ``malloc_trim``; nothing elsewhere).

    Without it the RSS of a first add of the 317 Python library pages rose with every batch
    (451 MB at 747 passages, 668 MB at 24,000, peak 710 MB): free memory the reader thread's
    malloc arena kept, and garbage waiting for Python's oldest generation. A batch is tens of
    seconds of model work; this takes milliseconds.
    """
    import gc

    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list = []


def _malloc_trim():
    if not _TRIM:
        try:
            import ctypes

            _TRIM.append(ctypes.CDLL("libc.so.6").malloc_trim)
        except (OSError, AttributeError):  # not glibc (macOS, musl): the OS gets pages back as usual
            _TRIM.append(None)
    return _TRIM[0]


def _hash(path: Path) -> str:
    try:
        return hash_file(path)
    except OSError as err:
        raise InvalidDocument(f"cannot read the file: {err.strerror}") from err


def _file_key(path: Path) -> str:
    return "file:" + str(path.resolve())


# == the committer ===========================================================================
class _Committer:
    """One thread that runs the job's small-source batch writes and every source's outcome, in order.

    The writer hands it a batch once the batch is embedded and goes on embedding the next
    one, so the model does not wait for the catalogue and index commit. At most one write
    is in flight (the next waits for it: memory stays one batch ahead); outcomes
    (``finish``) are queued behind it, so reports come in the order they always did.
    ``drain`` waits for everything handed over; an unexpected error of a task is re-raised
    there, on the writer's thread.
    """

    def __init__(self, timings: dict) -> None:
        self.timings = timings
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._write_slot = threading.Semaphore(1)
        self._cond = threading.Condition()
        self._queued = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="localkb-ingest-committer", daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None], *, write: bool = False) -> None:
        self._raise()
        if write:
            t0 = time.perf_counter()
            self._write_slot.acquire()
            self.timings["commit_wait_s"] += time.perf_counter() - t0
        with self._cond:
            self._queued += 1
        self._tasks.put((task, write))

    def _work(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                self.timings["commit_cpu_s"] = time.thread_time()
                return
            task, write = item
            try:
                if self._error is None:
                    task()
            except BaseException as err:  # handed to the writer's thread at its next submit or drain
                self._error = err
            finally:
                if write:
                    self._write_slot.release()
                with self._cond:
                    self._queued -= 1
                    self._cond.notify_all()

    def drain(self) -> None:
        """Wait until every task handed over has run; re-raise a task's unexpected error."""
        t0 = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: self._queued == 0)
        self.timings["commit_wait_s"] += time.perf_counter() - t0
        self._raise()

    def close(self) -> None:
        """Drain (however the job ended) and stop the thread; an error waits for ``check``."""
        with self._cond:
            self._cond.wait_for(lambda: self._queued == 0)
        self._tasks.put(None)
        self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    check = _raise


# == the writer ==============================================================================
class _Writer:
    """Takes the reader's messages: embeds in batches, writes small sources together, stages big ones."""

    def __init__(self, job: _Job) -> None:
        self.job = job
        self.kb = job.kb
        self.ready: list[_Source] = []  # complete small sources waiting for their batch
        self.open: _Source | None = None
        self.dead: set[int] = set()  # big sources that failed half-way: their last messages are dropped
        self.embed_broken = False
        self.committer = _Committer(job.timings)
        #: text hash -> vector of the batch handed to the committer last: an identical passage
        #: in the next batch copies it whether or not that write has landed yet.
        self.in_flight: dict[str, np.ndarray] = {}

    def _small(self) -> list[_Source]:
        """The small sources of the batch being gathered: the complete ones and the open one."""
        out = list(self.ready)
        if self.open is not None and not self.open.staged:
            out.append(self.open)
        return out

    def pending_tokens(self) -> int:
        """Tokens of the gathered batch still waiting for the model."""
        return sum(s.pending_tokens for s in self._small())

    def batch_tokens(self) -> int:
        """Tokens of the gathered batch that need vectors (embedded ahead or not): its size."""
        return sum(s.need_tokens for s in self._small())

    def embed_ahead(self, *, idle: bool = False) -> None:
        """Embed what the batch has so far once it fills a window (``EMBED_WINDOW``), or, when
        the reader has nothing more ready (``idle``), ``EMBED_MIN``: the model works while the
        reader reads, over windows wide enough to batch passages of like length together.
        The batch is still written in one transaction later."""
        if self.embed_broken or self.pending_tokens() < (EMBED_MIN if idle else EMBED_WINDOW):
            return
        sources = self._small()
        try:
            vectors = self.embed(sources)
        except Cancelled:
            raise
        except LocalKBError:
            self.embed_broken = True  # the flush meets the same error and reports it per source
            return
        for src in sources:
            src.vectors.update(vectors[id(src)])

    def take(self, msg: tuple) -> None:
        """Handle one message; a store or model failure of one big source fails that source only."""
        src = msg[1] if msg[0] in ("start", "chunks", "end", "fail") else None
        if src is not None and id(src) in self.dead:
            if msg[0] in ("end", "fail"):
                self.dead.discard(id(src))
            return
        try:
            self._take(msg)
        except Cancelled:
            raise
        except LocalKBError as err:
            if src is None or not src.staged:
                raise
            self.open = None
            self.dead.add(id(src))
            self.job.progress.discount(src.pending_tokens)
            self.finish(src.item, self.job.failed_report(src.item, err), src)

    def _take(self, msg: tuple) -> None:
        kind = msg[0]
        job = self.job
        if kind == "report":
            self.finish(msg[1], msg[2])
        elif kind == "start":
            self.open = msg[1]
            job.progress.current = msg[1].item.display
        elif kind == "chunks":
            self.add_chunks(msg[1], msg[2])
        elif kind == "end":
            src = msg[1]
            self.open = None
            if not src.hashes:
                err = InvalidDocument("no passages could be made from the text")
                self.take(("fail", src, err))
            elif src.staged:
                self.stage(src, final=True)
                self.finish(src.item, self.switch(src), src)
            else:
                self.ready.append(src)
                if self.batch_tokens() >= job.batch_tokens:
                    self.flush()
                else:
                    self.embed_ahead()
        elif kind == "fail":
            src, err = msg[1], msg[2]
            self.open = None
            if src.staged:  # a source that breaks half-way is not resumed: drop what it staged
                self.kb.unstage(src.sid)
            job.progress.discount(src.pending_tokens)
            self.finish(src.item, job.failed_report(src.item, err), src)
        elif kind == "barrier":
            self.flush()
            self.committer.drain()  # this job's sources finished (their locks released) first
            msg[1].set()
        elif kind == "crash":
            raise msg[1]

    def add_chunks(self, src: _Source, marked: list) -> None:
        job = self.job
        for c, text, h, keep in marked:
            src.hashes.append(h)
            src.tokens += c.tokens
            if not src.staged:
                src.chunks.append(c)
            if keep:
                if c.index in src.staged_before:  # stored text is current: a stale staged row must go
                    src.staged_before.pop(c.index)
                    self.kb.unstage(src.sid, [c.index])
                continue
            if src.staged_before.get(c.index) == h:
                src.resumed += 1
                job.progress.discount(c.tokens)
                continue
            src.pending.append((c, text))
            src.pending_tokens += c.tokens
            src.need_tokens += c.tokens
        if src.staged:
            if src.pending_tokens >= job.batch_tokens:
                self.stage(src)
        elif src.tokens >= job.batch_tokens or src.need_tokens >= job.batch_tokens or src.resumed:
            # Too big for one batch (or already half staged by a run before): stage it.
            self.open = None
            self.flush()
            self.open = src
            src.staged = True
            if src.vectors:  # embedded ahead while it still looked small
                self._stage_vectors(src, src.vectors, {c.index: c for c in src.chunks}, src.vectors)
                src.vectors = {}
            src.chunks = []
            if src.pending_tokens >= job.batch_tokens:
                self.stage(src)
        elif self.batch_tokens() >= job.batch_tokens:
            self.flush()
        else:
            self.embed_ahead()

    # -- embedding ------------------------------------------------------------------------
    def embed(self, sources: list[_Source]) -> dict[int, dict[int, np.ndarray]]:
        """Vectors for every pending passage of ``sources``: copied where an identical passage is
        stored, else from the model. Failures are recorded on the source; pending is emptied."""
        job = self.job
        kb = self.kb
        wanted = [(s, c, text) for s in sources for c, text in s.pending]
        out: dict[int, dict[int, np.ndarray]] = {id(s): {} for s in sources}
        if not wanted:
            return out
        hashes = [_text_hash(t) for _s, _c, t in wanted]
        copies = kb.vectors_by_text_hash(hashes)
        copies.update((h, self.in_flight[h]) for h in hashes if h not in copies and h in self.in_flight)
        todo = [(s, c, text) for s, c, text in wanted if _text_hash(text) not in copies]
        if todo:
            kb.embedder.load()  # a model that cannot load raises here, before anything is taken
        for s in sources:
            s.pending, s.pending_tokens = [], 0
        for s, c, text in wanted:
            vec = copies.get(_text_hash(text))
            if vec is not None:
                out[id(s)][c.index] = vec
                s.reused += 1
                job.progress.discount(c.tokens)
        if not todo:
            return out
        total_tokens = sum(c.tokens for _s, c, _t in todo)
        seen = [0, 0]

        def tick(done: int, total: int) -> None:
            job.cancelled()
            tokens = round(total_tokens * done / total)
            job.progress.embedded(done - seen[0], tokens - seen[1])
            seen[0], seen[1] = done, tokens
            job.progress.emit("embed", done, total)

        try:
            t0 = time.perf_counter()
            vecs = kb.embedder.embed([t for _s, _c, t in todo], progress=tick, work=job.model_work)
            job.timings["embed_s"] += time.perf_counter() - t0
            for (s, c, _t), vec in zip(todo, vecs, strict=True):
                out[id(s)][c.index] = vec
            return out
        except EmbeddingUnavailable:
            pass
        # One by one, so only the passages that really fail do (a batch's NaN, say).
        job.progress.embedded(-seen[0], -seen[1])
        for n, (s, c, text) in enumerate(todo):
            job.cancelled()
            try:
                out[id(s)][c.index] = kb.embedder.embed([text])[0]
                job.progress.embedded(1, c.tokens)
            except EmbeddingUnavailable as err:
                s.failures[c.index] = str(err)
                job.progress.discount(c.tokens)
            job.progress.emit("embed", n + 1, len(todo))
        return out

    # -- small sources: one transaction per batch ---------------------------------------------
    def flush(self) -> None:
        if not self.ready:
            return
        batch, self.ready = self.ready, []
        try:
            vectors = self.embed(batch)
            for s in batch:
                s.vectors.update(vectors[id(s)])
            self.job.cancelled()
            writable = [s for s in batch if len(s.failures) < len(s.chunks) and not _unchanged(self.kb, s)]
        except LocalKBError as err:
            if isinstance(err, Cancelled):
                raise
            for s in batch:
                self.finish(s.item, self.job.failed_report(s.item, err), s)
            return
        # The write, the row counts and the outcomes run on the committer; the model goes on.
        self.in_flight = {s.hashes[i]: v for s in writable for i, v in s.vectors.items()}
        self.committer.submit(lambda: self._commit(batch, writable), write=True)

    def _commit(self, batch: list[_Source], writable: list[_Source]) -> None:
        """On the committer: write the batch in one transaction, then count and report each source."""
        try:
            if writable:
                self.write(writable)
            reports = [_count(self.kb, s) for s in batch]
        except LocalKBError as err:
            for s in batch:
                self._finish(s.item, self.job.failed_report(s.item, err), s)
            return
        for s, rep in zip(batch, reports, strict=True):
            self._finish(s.item, rep, s)

    def write(self, batch: list[_Source]) -> None:
        """One transaction for the whole batch: each source lands whole or not at all."""
        kb = self.kb
        total = sum(len(s.chunks) for s in batch)
        self.job.progress.emit("write", 0, total, force=True)
        writes = []
        for s in batch:
            chunks = []
            for c in s.chunks:
                vec = s.vectors.get(c.index)
                if vec is not None:
                    chunks.append(ChunkWrite(chunk_id(kb.id, s.sid, c.index), c.index, c.text,
                                             s.hashes[c.index], c.page, c.tokens, vec, s.item.captured_by))
            writes.append(_source_write(kb, s, len(s.chunks), chunks))
        t0 = time.perf_counter()
        befores = kb.write_sources(writes)
        self.job.timings["write_s"] += time.perf_counter() - t0
        for s in batch:
            s.before = befores[s.sid]
        give_back_memory()
        self.job.progress.emit("write", total, total, force=True)

    # -- big sources: staged batches, then one switch ----------------------------------------
    def stage(self, src: _Source, *, final: bool = False) -> None:
        """Embed the big source's pending passages a batch at a time, committing each batch to
        the staging table; with ``final`` also the last, shorter batch."""
        limit = self.job.batch_tokens
        while src.pending and (final or src.pending_tokens >= limit):
            take, tokens = 0, 0
            while take < len(src.pending) and (take == 0 or tokens + src.pending[take][0].tokens <= limit):
                tokens += src.pending[take][0].tokens
                take += 1
            rest, rest_tokens = src.pending[take:], src.pending_tokens - tokens
            src.pending, src.pending_tokens = src.pending[:take], tokens
            self._stage_batch(src)
            src.pending, src.pending_tokens = rest, rest_tokens

    def _stage_batch(self, src: _Source) -> None:
        chunks = {c.index: c for c, _t in src.pending}
        vectors = self.embed([src])[id(src)]
        self.job.cancelled()
        self._stage_vectors(src, vectors, chunks, chunks)

    def _stage_vectors(self, src: _Source, vectors: dict, chunks: dict, tried: Iterable[int]) -> None:
        """Commit these vectors of a big source to staging; ``tried`` ones without a vector failed."""
        kb = self.kb
        rows = []
        for idx, vec in sorted(vectors.items()):
            c = chunks[idx]
            rows.append(StagedPassage(idx, chunk_id(kb.id, src.sid, idx), c.text, src.hashes[idx], c.page,
                                      c.tokens, vec))
        stale = [i for i in tried if i not in vectors and i in src.staged_before]
        if stale:  # failed now: an older staged text at that place must not be switched in
            kb.unstage(src.sid, stale)
            for i in stale:
                src.staged_before.pop(i)
        if rows:
            kb.stage_passages(src.sid, kb.record.model, rows)
            for idx in vectors:
                src.staged_before[idx] = src.hashes[idx]
        self.job.progress.emit("write", len(src.staged_before), len(src.hashes), force=True)

    def switch(self, src: _Source) -> SourceReport:
        """The one transaction that makes a staged source's new version visible."""
        kb = self.kb
        n = len(src.hashes)
        if len(src.failures) == n:
            kb.unstage(src.sid)
            return _count(kb, src)
        self.job.cancelled()
        self.job.progress.emit("write", 0, n, force=True)
        give_back_memory()  # the switch's buffers start from a trimmed heap, not beside staging's
        t0 = time.perf_counter()
        src.before = kb.publish_staged(_source_write(kb, src, n, []))
        self.job.timings["write_s"] += time.perf_counter() - t0
        give_back_memory()
        self.job.progress.emit("write", n, n, force=True)
        return _count(kb, src)

    # -- outcomes ----------------------------------------------------------------------------
    def finish(self, item: _Item, rep: SourceReport, src: _Source | None = None) -> None:
        """Record an outcome, behind any write still in flight (reports keep their order)."""
        self.committer.submit(lambda: self._finish(item, rep, src))

    def _finish(self, item: _Item, rep: SourceReport, src: _Source | None = None) -> None:
        job = self.job
        rep.name = item.name
        if src is not None:
            rep.resumed, rep.reused = src.resumed, src.reused
        job.report.sources.append(rep)
        job._done_items.add(id(item))
        job.release_item(item)
        job.progress.source_done(unread_bytes=max(0, item.size - item.counted))
        job.progress.emit("write" if src else "extract", job.progress.sources_done,
                          job.progress.sources_total, current=item.display, force=src is not None)


def _source_write(kb: KnowledgeBase, s: _Source, n: int, chunks: list[ChunkWrite]) -> SourceWrite:
    """The source row of ``s`` with ``n`` passages: it keeps every one of them but those whose
    new text failed to embed (those, and any past the new end, are deleted)."""
    doc = s.doc
    fp = s.fingerprint
    file = (FileFingerprint(str(s.item.path), fp.size, fp.mtime_ns, fp.sha256, _recipe(kb))
            if fp is not None and fp.sha256 and s.item.path is not None else None)
    keep = {chunk_id(kb.id, s.sid, idx) for idx in range(n) if idx not in s.failures}
    return SourceWrite(id=s.sid, key=s.key, type=doc.type, title=doc.title, url=doc.url,
                       file_name=doc.file_name, content_hash=s.digest.hexdigest(),
                       captured_by=s.item.captured_by, chunk_count=n, pages=doc.pages, lang=doc.lang,
                       chunks=chunks, keep=keep, file=file)


def _recipe(kb: KnowledgeBase) -> str:
    st = kb.store.settings
    return (f"{CHUNKER_VERSION}/{st.max_chunk_tokens}/{st.chunk_overlap_tokens}/{kb.record.model}/"
            f"{TEXT_SEGMENT_CHARS}")


def _unchanged(kb: KnowledgeBase, s: _Source) -> bool:
    """Nothing to write: every passage kept, none past the end, the same content hash."""
    if s.vectors or s.failures or len(s.before) != len(s.hashes):
        return False
    row = kb.source_state(s.sid)
    same = row is not None and row[0] == s.digest.hexdigest() and row[1] == len(s.hashes)
    if same and s.fingerprint is not None and s.fingerprint.sha256 and s.item.path is not None:
        fp = s.fingerprint
        kb.save_file_state(s.sid, FileFingerprint(str(s.item.path), fp.size, fp.mtime_ns, fp.sha256,
                                                  _recipe(kb)))
    return same


def _count(kb: KnowledgeBase, s: _Source) -> SourceReport:
    """Count what is really in the catalogue now, passage by passage."""
    n = len(s.hashes)
    rep = SourceReport(name=s.name, status="", source_id=s.sid, title=s.doc.title, url=s.doc.url, total=n)
    seen: set[int] = set()
    for idx, (_cid, h, ok) in kb.stored_passages(s.sid).items():
        if idx >= n:
            continue
        if h != s.hashes[idx] or not ok:
            continue
        seen.add(idx)
        before = s.before.get(idx)
        if before is None:
            rep.added += 1
        elif before[1] == h and before[2]:
            rep.unchanged += 1
        else:
            rep.updated += 1
    for idx in range(n):
        if idx not in seen:
            rep.failed += 1
            if len(rep.failures) < 200:
                reason = s.failures.get(idx, "the passage is not in the catalogue after the write")
                rep.failures.append({"chunk_index": idx, "reason": reason})
    rep.removed = sum(1 for idx in s.before if idx >= n or idx in s.failures)
    settle_status(rep, new=not s.before)
    if rep.failed:
        kb.log_error("ingest", "nothing_written" if rep.status == "failed" else "partial_write",
                     f"{s.name}: {rep.summary}", ref=s.sid, detail={"failures": rep.failures[:50]})
    return rep


def settle_status(rep: SourceReport, *, new: bool) -> None:
    """A source report's status from its row counts: failed, partial, added, updated or unchanged."""
    if rep.failed == rep.total:
        rep.status = "failed"
        reasons = sorted({f["reason"] for f in rep.failures})
        rep.error = {"code": NothingWritten.code,
                     "message": ("its passage could not be saved" if rep.total == 1 else
                                 f"none of its {rep.total:,} passages could be saved")
                                + f" ({'; '.join(reasons)[:400]})"}
        rep.removed = 0  # nothing of it was written, so nothing was removed either
    elif rep.failed:
        rep.status = "partial"
    elif new:
        rep.status = "added"
    else:
        rep.status = "updated" if (rep.added or rep.updated or rep.removed) else "unchanged"


# == running a job ===========================================================================
def _run(kb: KnowledgeBase, items: list[_Item], *, progress: Progress | None,
         check_cancelled: CancelCheck | None, batch_tokens: int = BATCH_TOKENS,
         max_bytes: int | None = None, report: IngestReport | None = None) -> IngestReport:
    """Run the reader and the writer over ``items``; an interrupt returns what was kept."""
    kb.before_ingest()  # the local store catches its derived indexes up (a kill after a commit)
    job = _Job(kb, progress=progress, check_cancelled=check_cancelled, batch_tokens=batch_tokens,
               max_bytes=kb.store.settings.max_source_bytes if max_bytes is None else max_bytes)
    if report is not None:
        job.report = report
    job.progress.add_sources(len(items), sum(i.size for i in items if not i.skip))
    reader = _Reader(job, items)
    writer = _Writer(job)
    reader.start()
    try:
        while True:
            job.cancelled()
            if reader.out.empty():  # the reader is behind: give the model what there is
                writer.embed_ahead(idle=True)
            t0 = time.perf_counter()
            try:
                msg = reader.out.get(timeout=0.2)
            except queue.Empty:
                continue
            finally:
                job.timings["wait_s"] += time.perf_counter() - t0
            if msg[0] == "done":
                writer.flush()
                writer.committer.drain()
                break
            writer.take(msg)
    except Cancelled:
        job.report.interrupted = True
    finally:
        reader.stop.set()
        writer.committer.close()  # a write in flight lands (and is reported) before the job ends
        reader.join(timeout=30)
        job.locks.release_all()
        job.report.elapsed_s = job.progress.elapsed()
        job.report.tokens = job.progress.tokens_embedded
        job.report.passages = job.progress.passages
        job.report.timings = {**{k: round(v, 2) for k, v in job.timings.items()},
                              "model": dict(job.model_work)}
    writer.committer.check()
    if job.report.interrupted:
        job.report.pending = [i.name for i in items if id(i) not in job._done_items]
        with_staged = kb.staged_sources()
        names = {kb.source_id_for(_file_key(i.path)): i.name for i in items if i.path is not None}
        job.report.staged = {names.get(sid, sid): n for sid, n in with_staged.items()}
    return job.report


def ingest_documents(kb: KnowledgeBase, items: Iterable[tuple[str, Callable[[], tuple[Document, str]]]],
                     *, captured_by: str = "cli", progress: Progress | None = None,
                     check_cancelled: CancelCheck | None = None, batch_tokens: int = BATCH_TOKENS,
                     ) -> list[SourceReport]:
    """Extract, chunk, embed and write many sources, embedding and writing them in batches.

    ``items`` yields (name, loader) where the loader returns (document, source key)
    or raises; a failing item is reported by name and never stops the others.
    """
    _check_captured_by(captured_by)
    jobs = [_Item(name=name, display=name, captured_by=captured_by, load=load) for name, load in items]
    report = _run(kb, jobs, progress=progress, check_cancelled=check_cancelled, batch_tokens=batch_tokens)
    if report.interrupted:
        raise Cancelled("the add was cancelled; what was written before stays",
                        detail={"kept": len(report.sources), "pending": len(report.pending)})
    return report.sources


def add_document(kb: KnowledgeBase, doc: Document, *, key: str, captured_by: str = "cli",
                 progress: Progress | None = None, check_cancelled: CancelCheck | None = None,
                 ) -> SourceReport:
    """Chunk, embed and write one document as one source; raise if nothing could be stored."""
    _check_captured_by(captured_by)
    name = doc.url or doc.file_name or doc.title
    item = _Item(name=name, display=name, captured_by=captured_by, load=lambda: (doc, key))
    report = _run(kb, [item], progress=progress, check_cancelled=check_cancelled)
    if report.interrupted:
        raise Cancelled("the add was cancelled; the store is as it was")
    rep = report.sources[0]
    if rep.status == "failed":
        if rep.error and rep.error.get("code") != NothingWritten.code:
            raise _error_from(rep.error)
        raise NothingWritten(f"{rep.name}: {rep.error['message']}", detail={"failures": rep.failures[:50]})
    return rep


def _error_from(error: dict) -> LocalKBError:
    from localkb import errors

    for cls in vars(errors).values():
        if isinstance(cls, type) and issubclass(cls, LocalKBError) and cls.code == error.get("code"):
            return cls(error["message"])
    return LocalKBError(error.get("message", "failed"))


def _check_captured_by(captured_by: str) -> None:
    if captured_by not in CAPTURED_BY:
        raise InvalidInput(f"captured_by must be one of {', '.join(CAPTURED_BY)}")


# -- inputs --------------------------------------------------------------------------------
def fetch_url(url: str, *, max_bytes: int, timeout: float) -> tuple[bytes, str, str]:
    """GET a public URL: (body, content type, final URL); size, type and status checked."""
    import httpx

    try:
        with httpx.Client(follow_redirects=True, timeout=httpx.Timeout(timeout, connect=10.0),
                          headers={"User-Agent": "LocalKB/0.1 (+personal knowledge base)"}) as client, \
                client.stream("GET", url) as resp:
            if resp.status_code >= 400:
                raise FetchFailed(f"{url}: the server answered HTTP {resp.status_code}")
            ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype and ctype not in FETCH_TYPES:
                raise FetchFailed(f"{url}: content type {ctype} is not a type LocalKB reads")
            declared = int(resp.headers.get("content-length") or 0)
            if declared > max_bytes:
                raise FetchFailed(f"{url}: {declared:,} bytes is over the {max_bytes:,}-byte cap")
            body = bytearray()
            for part in resp.iter_bytes():
                body += part
                if len(body) > max_bytes:
                    raise FetchFailed(f"{url}: the body is over the {max_bytes:,}-byte cap")
            return bytes(body), ctype, str(resp.url)
    except httpx.HTTPError as err:
        raise FetchFailed(f"{url}: {type(err).__name__}: {err}") from err


def plan_items(kb: KnowledgeBase, items: Iterable[str], *, captured_by: str = "cli",
               include: Iterable[str] = (), exclude: Iterable[str] = (), max_bytes: int | None = None,
               report: IngestReport) -> list[_Item]:
    """The job's sources, in order: files of folders (walked now), files, URLs. A missing path
    is reported (and logged) at once."""
    settings = kb.store.settings
    cap = settings.max_source_bytes if max_bytes is None else max_bytes
    out: list[_Item] = []
    for item in items:
        if item.startswith(("http://", "https://")):
            via = "url" if captured_by == "cli" else captured_by
            out.append(_Item(name=item, display=item, captured_by=via, load=_url_job(item, settings)))
            continue
        path = Path(item).expanduser()
        if path.is_dir():
            via = "folder" if captured_by == "cli" else captured_by
            walk = walk_folder(path, include, exclude, max_bytes=cap)
            report.excluded += walk.excluded
            entries = [(p, size, None) for p, size in walk.files] + [(p, 0, why) for p, why in walk.skipped]
            entries.sort(key=lambda e: str(e[0]))
            for p, size, why in entries:
                out.append(_Item(name=str(p), display=p.relative_to(path).as_posix(), captured_by=via,
                                 path=p, size=size, skip=why))
            if not entries:
                why = "the folder has no files to add" + (
                    f" ({plural(walk.excluded, 'file')} excluded by the rules)" if walk.excluded else "")
                report.sources.append(_failed(kb, item, InvalidInput(why)))
        elif path.is_file():
            size = path.stat().st_size
            out.append(_Item(name=str(path), display=path.name, captured_by=captured_by, path=path,
                             size=size))
        else:
            report.sources.append(_failed(kb, item, InvalidInput("no such file or folder")))
    return out


def add_paths(kb: KnowledgeBase, items: Iterable[str], *, captured_by: str = "cli",
              include: Iterable[str] = (), exclude: Iterable[str] = (),
              progress: Progress | None = None, check_cancelled: CancelCheck | None = None,
              max_bytes: int | None = None, batch_tokens: int | None = None) -> IngestReport:
    """Add files, folders and URLs; a bad item is reported by name and never stops the rest.

    ``max_bytes`` is the per-source size cap (``Settings.max_source_bytes`` by default;
    0 lifts it). An interrupt returns the report with ``interrupted`` set.
    """
    report = IngestReport()
    jobs = plan_items(kb, items, captured_by=captured_by, include=include, exclude=exclude,
                      max_bytes=max_bytes, report=report)
    return _run(kb, jobs, progress=progress, check_cancelled=check_cancelled, max_bytes=max_bytes,
                batch_tokens=batch_tokens or kb.store.settings.ingest_batch_tokens, report=report)


def _failed(kb: KnowledgeBase, name: str, err: LocalKBError) -> SourceReport:
    kb.log_error("ingest", err.code, f"{name}: {err}", ref=name)
    return SourceReport(name=name, status="failed", error={"code": err.code, "message": str(err)})


def _url_job(url: str, settings) -> Callable[[], tuple[Document, str]]:
    def job() -> tuple[Document, str]:
        body, ctype, final = fetch_url(url, max_bytes=settings.fetch_url_max_bytes,
                                       timeout=settings.fetch_timeout_s)
        return extract_bytes(body, name=final, content_type=ctype, url=final), canonical_key(final)

    return job


def canonical_key(url: str) -> str:
    """Source key of a web page: its URL without the fragment.

    A text fragment (``#:~:text=``) stays: the extension saves a selection under its page's
    URL with one, and a selection is its own source, never a new version of its page.
    """
    base, _, fragment = url.partition("#")
    return url if fragment.startswith(":~:") else base


def trusted_canonical(page_url: str | None, canonical: str | None) -> str | None:
    """``canonical`` when a page may name it as its own address, else ``None``.

    A page's ``<link rel="canonical">`` is the page's claim; any page can claim any URL. It is
    believed only for an http(s) URL of the page's own origin (scheme, host and port), so no
    page can become another site's source key, overwrite its saved page, or borrow its citations.
    """
    from urllib.parse import urlsplit

    if not page_url or not canonical:
        return None
    try:
        page, claim = urlsplit(page_url), urlsplit(canonical)
        same = (claim.scheme.lower() in ("http", "https") and bool(claim.hostname)
                and (page.scheme.lower(), page.hostname, page.port)
                == (claim.scheme.lower(), claim.hostname, claim.port))
    except ValueError:
        return None
    return canonical if same else None


def capture_document(kb, *, url: str | None, title: str | None = None, html: str | None = None,
                     text: str | None = None, pdf: bytes | None = None, canonical_url: str | None = None,
                     lang: str | None = None, progress: Progress | None = None,
                     file: bytes | None = None, file_name: str | None = None) -> tuple[Document, str]:
    """The document and source key of a page handed over as rendered HTML, plain text, PDF bytes,
    or a file's bytes with its name (any type ``localkb add`` reads, chosen by the name, then
    by the bytes).

    Any store's knowledge base (``store.base``): the team store's writer uses it too.
    """
    given = [x for x in (html, text, pdf, file) if x is not None]
    if len(given) != 1:
        raise InvalidInput("give exactly one of html, text, pdf or file")
    if file is not None and not file_name:
        raise InvalidInput("a file needs its file_name (its type is read from it)",
                           detail={"field": "file_name"})
    cap = kb.store.settings.max_source_bytes
    raw = pdf if pdf is not None else file
    size = len(raw) if raw is not None else len((html if html is not None else text or "").encode())
    if cap and size > cap:
        raise SourceTooLarge(too_large_reason(size, cap), detail={"bytes": size, "cap": cap})
    page_url = trusted_canonical(url, canonical_url) or url
    if progress is not None:  # extraction runs before the job starts: say so in the job's terms
        early = JobProgress(progress)
        early.add_sources(1)
        early.emit("extract", 0, 1, current=page_url or title or "page")
    if pdf is not None:
        doc = extract_bytes(pdf, name=page_url or "document.pdf", content_type="application/pdf",
                            url=page_url, title=title)
    elif file is not None:
        doc = extract_bytes(file, name=Path(file_name).name, url=page_url, title=title)
    elif html is not None:
        doc = extract_html(html, url=page_url, title=title)
    else:
        doc = extract_text(text or "", title=title, url=page_url)
    if lang and not doc.lang:
        doc.lang = lang
    key = canonical_key(page_url) if page_url else \
        ("upload:" if file is not None else "text:") + hashlib.sha256(raw or doc.text.encode()).hexdigest()
    return doc, key


def add_capture(kb: KnowledgeBase, *, url: str | None, title: str | None = None,
                html: str | None = None, text: str | None = None, pdf: bytes | None = None,
                captured_by: str = "api", canonical_url: str | None = None, lang: str | None = None,
                progress: Progress | None = None, check_cancelled: CancelCheck | None = None,
                file: bytes | None = None, file_name: str | None = None) -> SourceReport:
    """A page handed over by the extension (rendered HTML, plain text, PDF or a file's bytes)."""
    doc, key = capture_document(kb, url=url, title=title, html=html, text=text, pdf=pdf,
                                canonical_url=canonical_url, lang=lang, progress=progress,
                                file=file, file_name=file_name)
    return add_document(kb, doc, key=key, captured_by=captured_by, progress=progress,
                        check_cancelled=check_cancelled)


# == removing and listing ====================================================================
def find_sources(kb: KnowledgeBase, ref: str) -> list[dict]:
    """Sources that ``ref`` names: an id, a URL, a path (as given or resolved), a file name or a
    title (case-insensitive), or the end of a stored path (``library/os.html``)."""
    return kb.find_sources(ref)


def remove_source(kb: KnowledgeBase, ref: str) -> dict:
    """Delete a source (by id, URL, path, file name or title) and its chunks; returns what was removed."""
    found = find_sources(kb, ref)
    if not found:
        raise SourceNotFound(f"no source {ref!r} in {kb.record.name!r} "
                             "(by id, title, file name, URL or path)")
    if len(found) > 1:
        listed = "; ".join(f"{r['id']} {r['title']!r} ({_where(r)})" for r in found[:10])
        more = f" and {len(found) - 10} more" if len(found) > 10 else ""
        raise AmbiguousReference(
            f"{len(found)} sources in {kb.record.name!r} match {ref!r}: {listed}{more}; "
            "give the id or the full path", detail={"matches": [r["id"] for r in found]})
    return kb.remove_source(found[0]["id"])


def _where(row: dict) -> str:
    key = row.get("key") or ""
    return row.get("url") or (key[5:] if key.startswith("file:") else row.get("file_name") or key)


def list_sources(kb: KnowledgeBase, *, offset: int = 0, limit: int | None = 100,
                 sort: str = "title") -> tuple[list[dict], int]:
    """A page of the sources (sorted by title, or ``added`` / ``updated``) and how many there are."""
    rows = list(iter_sources(kb, offset=offset, limit=limit, sort=sort))
    return rows, kb.source_total()


def iter_sources(kb: KnowledgeBase, *, offset: int = 0, limit: int | None = None, sort: str = "title"):
    """Sources one by one, read in pages (``--json`` streams them)."""
    return kb.iter_sources(offset=offset, limit=limit, sort=sort)
