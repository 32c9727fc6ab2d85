"""Honest, idempotent ingestion: extract, chunk, embed, write, and report real rows.

A source is written in one catalogue transaction, so a crash leaves either all
of it or none of it. Re-adding a source upserts the same deterministic chunk
ids, reuses vectors of passages whose text did not change, deletes chunks past
the new end, and skips the source entirely when its content hash is unchanged.
Every report is counted from the rows that are in the catalogue after the
write, never from what was intended.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from localkb.errors import (
    Cancelled,
    EmbeddingUnavailable,
    FetchFailed,
    InvalidDocument,
    InvalidInput,
    LocalKBError,
    NothingWritten,
    SourceNotFound,
)
from localkb.ingest.chunk import Chunk, chunk_document, passage_text
from localkb.ingest.extract import SUPPORTED_SUFFIXES, Document, extract_bytes, extract_html, extract_text
from localkb.store.catalog import chunk_id, source_id, valid_vector, vector_blob, vector_key
from localkb.store.kb import Change, KnowledgeBase

CHUNKER_VERSION = "1"
EMBED_GROUP = 64
CAPTURED_BY = ("cli", "folder", "url", "context-menu", "side-panel", "toolbar", "import", "chat",
               "api")
DEFAULT_EXCLUDES = (".*", "node_modules", "__pycache__", "*.pyc", ".git")
FETCH_TYPES = ("text/html", "application/xhtml+xml", "text/plain", "text/markdown", "application/pdf")

Progress = Callable[[dict], None]
CancelCheck = Callable[[], None]


@dataclass
class SourceReport:
    """What one source's write really stored."""

    name: str
    status: str  # added | updated | unchanged | partial | failed
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

    @property
    def summary(self) -> str:
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
        return " · ".join(parts) or "unchanged"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["summary"] = self.summary
        return out


@dataclass
class IngestReport:
    """The reports of every source in one add."""

    sources: list[SourceReport] = field(default_factory=list)

    def totals(self) -> dict:
        keys = ("added", "updated", "unchanged", "removed", "failed", "total")
        out = {k: sum(getattr(s, k) for s in self.sources) for k in keys}
        out["sources"] = len(self.sources)
        out["sources_failed"] = sum(1 for s in self.sources if s.status == "failed")
        return out

    def to_dict(self) -> dict:
        return {"sources": [s.to_dict() for s in self.sources], "totals": self.totals()}


def content_hash(doc: Document, chunks: list[Chunk], model: str) -> str:
    h = hashlib.sha256(f"{CHUNKER_VERSION}\x1f{model}\x1f{doc.title}\x1f{doc.url or ''}".encode())
    for c in chunks:
        h.update(f"\x1e{c.page}\x1f{c.text}".encode())
    return h.hexdigest()


def _text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _emit(progress: Progress | None, **event: object) -> None:
    if progress is not None:
        progress(event)


@dataclass
class _Prepared:
    """A document chunked and compared with what is stored, waiting for vectors."""

    doc: Document
    name: str
    sid: str
    key: str
    captured_by: str
    digest: str
    chunks: list[Chunk]
    texts: list[str]
    hashes: list[str]
    cids: list[str]
    need: list[int]
    vectors: dict[int, np.ndarray] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    before: dict[str, tuple[str, bool]] = field(default_factory=dict)


def _prepare(kb: KnowledgeBase, doc: Document, key: str, captured_by: str,
             progress: Progress | None) -> _Prepared | SourceReport:
    """Chunk and hash ``doc``; an unchanged source returns its (real-row) report at once."""
    if captured_by not in CAPTURED_BY:
        raise InvalidInput(f"captured_by must be one of {', '.join(CAPTURED_BY)}")
    name = doc.url or doc.file_name or doc.title
    settings = kb.store.settings
    chunks = chunk_document(doc, kb.embedder.count_tokens, max_tokens=settings.max_chunk_tokens,
                            overlap=settings.chunk_overlap_tokens)
    _emit(progress, stage="chunk", done=len(chunks), total=len(chunks), source=name)
    if not chunks:
        raise InvalidDocument(f"{name}: no passages could be made from the text")
    sid = source_id(kb.id, key)
    digest = content_hash(doc, chunks, kb.record.model)
    texts = [passage_text(doc.title, c.text) for c in chunks]
    hashes = [_text_hash(t) for t in texts]
    cids = [chunk_id(kb.id, sid, c.index) for c in chunks]
    existing = _existing_chunks(kb, sid)
    src = kb.catalog.db.execute("SELECT content_hash, chunk_count FROM sources WHERE id = ?",
                                (sid,)).fetchone()
    valid_now = sum(1 for _h, ok in existing.values() if ok)
    if src and src["content_hash"] == digest and src["chunk_count"] == len(chunks) == valid_now:
        return SourceReport(name=name, status="unchanged", source_id=sid, title=doc.title,
                            url=doc.url, unchanged=valid_now, total=len(chunks))
    # Embed only passages whose text changed; the others keep their stored vectors.
    need = [i for i, cid in enumerate(cids)
            if not (cid in existing and existing[cid] == (hashes[i], True))]
    return _Prepared(doc, name, sid, key, captured_by, digest, chunks, texts, hashes, cids, need)


def _embed(kb: KnowledgeBase, batch: list[_Prepared], progress: Progress | None,
           check_cancelled: CancelCheck | None) -> None:
    """Embed every needed passage of the batch together, in length-sorted model batches.

    If the model cannot load, every source fails with that reason. If a batch
    fails, its passages are retried one by one so only the bad ones fail.
    """
    wanted = [(p, i) for p in batch for i in p.need]
    if not wanted:
        return
    kb.embedder.load()
    names = ", ".join(p.name for p in batch[:3]) + (" ..." if len(batch) > 3 else "")

    def tick(done: int, total: int) -> None:
        if check_cancelled:
            check_cancelled()
        _emit(progress, stage="embed", done=done, total=total, source=names)

    try:
        out = kb.embedder.embed([p.texts[i] for p, i in wanted], progress=tick)
        for (p, i), vec in zip(wanted, out, strict=True):
            p.vectors[i] = vec
        return
    except EmbeddingUnavailable:
        pass
    for n, (p, i) in enumerate(wanted):
        if check_cancelled:
            check_cancelled()
        try:
            p.vectors[i] = kb.embedder.embed([p.texts[i]])[0]
        except EmbeddingUnavailable as err:
            p.failures[i] = str(err)
        _emit(progress, stage="embed", done=n + 1, total=len(wanted), source=names)


def _write(kb: KnowledgeBase, batch: list[_Prepared], progress: Progress | None) -> None:
    """One transaction for the whole batch: each source lands whole or not at all."""
    now = time.time()
    total = sum(len(p.chunks) for p in batch)
    _emit(progress, stage="write", done=0, total=total, source=batch[0].name)

    def mutate(db: sqlite3.Connection) -> Change:
        change = Change()
        for p in batch:
            p.before = _existing_chunks(kb, p.sid, db)
            row = db.execute("SELECT added_at FROM sources WHERE id = ?", (p.sid,)).fetchone()
            db.execute(
                "INSERT INTO sources (id, kb_id, key, type, title, url, file_name, content_hash, "
                "captured_by, chunk_count, pages, lang, added_at, updated_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
                "type=excluded.type, title=excluded.title, url=excluded.url, "
                "file_name=excluded.file_name, content_hash=excluded.content_hash, "
                "captured_by=excluded.captured_by, chunk_count=excluded.chunk_count, "
                "pages=excluded.pages, lang=excluded.lang, updated_at=excluded.updated_at",
                (p.sid, kb.id, p.key, p.doc.type, p.doc.title, p.doc.url, p.doc.file_name, p.digest,
                 p.captured_by, len(p.chunks), p.doc.pages, p.doc.lang,
                 row["added_at"] if row else now, now))
            keep: set[str] = set()
            for i, c in enumerate(p.chunks):
                if i in p.failures:
                    continue
                cid = p.cids[i]
                keep.add(cid)
                if i in p.vectors:
                    db.execute(
                        "INSERT INTO chunks (id, vkey, kb_id, source_id, idx, text, text_hash, page, "
                        "tokens, vector, indexed_by, indexed_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) "
                        "ON CONFLICT(id) DO UPDATE SET text=excluded.text, "
                        "text_hash=excluded.text_hash, page=excluded.page, tokens=excluded.tokens, "
                        "vector=excluded.vector, indexed_by=excluded.indexed_by, "
                        "indexed_at=excluded.indexed_at",
                        (cid, vector_key(cid), kb.id, p.sid, c.index, c.text, p.hashes[i], c.page,
                         c.tokens, vector_blob(p.vectors[i]), p.captured_by, now))
                    change.upserted.append((cid, vector_key(cid)))
            stale = [cid for cid in p.before if cid not in keep]
            db.executemany("DELETE FROM chunks WHERE id = ?", [(cid,) for cid in stale])
            change.deleted.extend((cid, vector_key(cid)) for cid in stale)
        return change

    kb.write(mutate)
    _emit(progress, stage="write", done=total, total=total, source=batch[-1].name)


def _report(kb: KnowledgeBase, p: _Prepared) -> SourceReport:
    """Count what is really in the catalogue now, passage by passage."""
    after = _existing_chunks(kb, p.sid)
    rep = SourceReport(name=p.name, status="", source_id=p.sid, title=p.doc.title, url=p.doc.url,
                       total=len(p.chunks))
    for i, cid in enumerate(p.cids):
        row = after.get(cid)
        if not row or not row[1] or row[0] != p.hashes[i]:
            rep.failed += 1
            reason = p.failures.get(i, "the passage is not in the catalogue after the write")
            rep.failures.append({"chunk_index": i, "page": p.chunks[i].page, "reason": reason})
        elif cid not in p.before:
            rep.added += 1
        elif p.before[cid] == (p.hashes[i], True):
            rep.unchanged += 1
        else:
            rep.updated += 1
    rep.removed = sum(1 for cid in p.before if cid not in after)
    if rep.failed == rep.total:
        rep.status = "failed"
        reasons = sorted({f["reason"] for f in rep.failures})
        rep.error = {"code": NothingWritten.code,
                     "message": f"none of its {rep.total} passages could be saved "
                                f"({'; '.join(reasons)[:400]})"}
    elif rep.failed:
        rep.status = "partial"
    elif not p.before:
        rep.status = "added"
    else:
        rep.status = "updated" if (rep.added or rep.updated or rep.removed) else "unchanged"
    if rep.failed:
        kb.catalog.log_error("ingest", "nothing_written" if rep.status == "failed" else "partial_write",
                             f"{p.name}: {rep.summary}", kb_id=kb.id, ref=p.sid,
                             detail={"failures": rep.failures[:50]})
    return rep


def _flush(kb: KnowledgeBase, batch: list[_Prepared], progress: Progress | None,
           check_cancelled: CancelCheck | None) -> list[SourceReport]:
    _embed(kb, batch, progress, check_cancelled)
    if check_cancelled:
        check_cancelled()
    writable = [p for p in batch if len(p.failures) < len(p.chunks)]
    if writable:
        _write(kb, writable, progress)
    # A source none of whose passages embedded is not written at all: what was stored stays.
    return [_report(kb, p) for p in batch]


#: Model tokens per write batch: about 680 passages of 96 tokens. Sized in tokens, not
#: passages, so that the per-commit cost (one SQLite transaction, one Whoosh segment)
#: stays small against the embedding time whatever the passage size.
BATCH_TOKENS = 65_536


def ingest_documents(kb: KnowledgeBase, items: Iterable[tuple[str, Callable[[], tuple[Document, str]]]],
                     *, captured_by: str = "cli", progress: Progress | None = None,
                     check_cancelled: CancelCheck | None = None, batch_tokens: int = BATCH_TOKENS,
                     ) -> list[SourceReport]:
    """Extract, chunk, embed and write many sources, embedding and writing them in batches.

    A batch closes once its passages to embed hold ``batch_tokens`` model tokens; each
    batch is one catalogue transaction and one keyword-index commit.

    ``items`` yields (name, loader) where the loader returns (document, source key)
    or raises; a failing item is reported by name and never stops the others.
    """
    reports: list[SourceReport] = []
    batch: list[_Prepared] = []
    pending = 0
    items = list(items)
    for n, (name, load) in enumerate(items):
        if check_cancelled:
            check_cancelled()
        _emit(progress, stage="extract", done=n, total=len(items), source=name)
        try:
            doc, key = load()
            prepared = _prepare(kb, doc, key, captured_by, progress)
        except Cancelled:
            raise
        except LocalKBError as err:
            kb.catalog.log_error("ingest", err.code, f"{name}: {err}", kb_id=kb.id, ref=name)
            reports.append(_failed(name, err))
            continue
        if isinstance(prepared, SourceReport):
            prepared.name = name
            reports.append(prepared)
            continue
        prepared.name = name
        batch.append(prepared)
        pending += sum(prepared.chunks[i].tokens for i in prepared.need)
        if pending >= batch_tokens:
            reports += _flush_or_fail(kb, batch, progress, check_cancelled)
            batch, pending = [], 0
    if batch:
        reports += _flush_or_fail(kb, batch, progress, check_cancelled)
    return reports


def _flush_or_fail(kb: KnowledgeBase, batch: list[_Prepared], progress: Progress | None,
                   check_cancelled: CancelCheck | None) -> list[SourceReport]:
    try:
        return _flush(kb, batch, progress, check_cancelled)
    except Cancelled:
        raise
    except LocalKBError as err:
        for p in batch:
            kb.catalog.log_error("ingest", err.code, f"{p.name}: {err}", kb_id=kb.id, ref=p.sid)
        return [_failed(p.name, err) for p in batch]


def add_document(kb: KnowledgeBase, doc: Document, *, key: str, captured_by: str = "cli",
                 progress: Progress | None = None, check_cancelled: CancelCheck | None = None,
                 ) -> SourceReport:
    """Chunk, embed and write one document as one source; raise if nothing could be stored."""
    prepared = _prepare(kb, doc, key, captured_by, progress)
    if isinstance(prepared, SourceReport):
        return prepared
    rep = _flush(kb, [prepared], progress, check_cancelled)[0]
    if rep.status == "failed":
        raise NothingWritten(f"{rep.name}: {rep.error['message']}",
                             detail={"failures": rep.failures[:50]})
    return rep


def _existing_chunks(kb: KnowledgeBase, sid: str,
                     db: sqlite3.Connection | None = None) -> dict[str, tuple[str, bool]]:
    db = db or kb.catalog.db
    return {r[0]: (r[1], valid_vector(r[2], kb.record.dim))
            for r in db.execute("SELECT id, text_hash, vector FROM chunks WHERE source_id = ?",
                                (sid,))}


# -- inputs --------------------------------------------------------------------------------
def _matches(path: Path, root: Path, patterns: Iterable[str]) -> bool:
    rel = path.relative_to(root).as_posix() if path != root else path.name
    return any(fnmatch.fnmatch(path.name, p) or fnmatch.fnmatch(rel, p) for p in patterns)


def walk_folder(root: Path, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> Iterator[Path]:
    """Files under ``root`` (sorted), honouring include/exclude globs; hidden folders skipped."""
    include, exclude = list(include), list(exclude) + list(DEFAULT_EXCLUDES)
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not _matches(here / d, root, exclude))
        for name in sorted(filenames):
            path = here / name
            if _matches(path, root, exclude):
                continue
            if include:
                if not _matches(path, root, include):
                    continue
            elif path.suffix.lower() not in SUPPORTED_SUFFIXES:
                continue
            yield path


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
                raise FetchFailed(f"{url}: content type {ctype} is not a page, text or PDF")
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


def add_paths(kb: KnowledgeBase, items: Iterable[str], *, captured_by: str = "cli",
              include: Iterable[str] = (), exclude: Iterable[str] = (),
              progress: Progress | None = None, check_cancelled: CancelCheck | None = None,
              ) -> IngestReport:
    """Add files, folders and URLs; a bad item is reported by name and never stops the rest."""
    report = IngestReport()
    settings = kb.store.settings
    for item in items:
        via = captured_by
        if item.startswith(("http://", "https://")):
            jobs = [(item, _url_job(item, settings))]
            via = "url" if captured_by == "cli" else captured_by
        else:
            path = Path(item).expanduser()
            if path.is_dir():
                jobs = [(str(p), _file_job(p)) for p in walk_folder(path, include, exclude)]
                via = "folder" if captured_by == "cli" else captured_by
                if not jobs:
                    report.sources.append(_failed(item, InvalidInput("the folder has no files to add")))
            elif path.is_file():
                jobs = [(str(path), _file_job(path))]
            else:
                report.sources.append(_failed(item, InvalidInput("no such file or folder")))
                jobs = []
        report.sources += ingest_documents(kb, jobs, captured_by=via, progress=progress,
                                           check_cancelled=check_cancelled)
    return report


def _failed(name: str, err: LocalKBError) -> SourceReport:
    return SourceReport(name=name, status="failed", error={"code": err.code, "message": str(err)})


def _file_job(path: Path) -> Callable[[], tuple[Document, str]]:
    def job() -> tuple[Document, str]:
        try:
            data = path.read_bytes()
        except OSError as err:
            raise InvalidDocument(f"cannot read the file: {err.strerror}") from err
        doc = extract_bytes(data, name=path.name)
        return doc, "file:" + str(path.resolve())

    return job


def _url_job(url: str, settings) -> Callable[[], tuple[Document, str]]:
    def job() -> tuple[Document, str]:
        body, ctype, final = fetch_url(url, max_bytes=settings.fetch_url_max_bytes,
                                       timeout=settings.fetch_timeout_s)
        return extract_bytes(body, name=final, content_type=ctype, url=final), canonical_key(final)

    return job


def canonical_key(url: str) -> str:
    """Source key of a web page: its URL without the fragment."""
    return url.split("#", 1)[0]


def add_capture(kb: KnowledgeBase, *, url: str | None, title: str | None = None,
                html: str | None = None, text: str | None = None, pdf: bytes | None = None,
                captured_by: str = "api", canonical_url: str | None = None, lang: str | None = None,
                progress: Progress | None = None, check_cancelled: CancelCheck | None = None,
                ) -> SourceReport:
    """A page handed over by the extension (rendered HTML, plain text or PDF bytes)."""
    given = [x for x in (html, text, pdf) if x is not None]
    if len(given) != 1:
        raise InvalidInput("give exactly one of html, text or pdf")
    page_url = canonical_url or url
    _emit(progress, stage="extract", done=0, total=1, source=page_url or title)
    if pdf is not None:
        doc = extract_bytes(pdf, name=page_url or "document.pdf", content_type="application/pdf",
                            url=page_url, title=title)
    elif html is not None:
        doc = extract_html(html, url=page_url, title=title)
    else:
        doc = extract_text(text or "", title=title, url=page_url)
    if lang and not doc.lang:
        doc.lang = lang
    key = canonical_key(page_url) if page_url else "text:" + hashlib.sha256(doc.text.encode()).hexdigest()
    return add_document(kb, doc, key=key, captured_by=captured_by, progress=progress,
                        check_cancelled=check_cancelled)


def remove_source(kb: KnowledgeBase, ref: str) -> dict:
    """Delete a source (by id, URL or file key) and its chunks; returns what was removed."""
    row = kb.catalog.db.execute(
        "SELECT id, title FROM sources WHERE kb_id = ? AND (id = ? OR key = ? OR url = ? OR key = ?)",
        (kb.id, ref, ref, ref, "file:" + str(Path(ref).expanduser().resolve()))).fetchone()
    if row is None:
        raise SourceNotFound(f"no source {ref!r} in {kb.record.name!r}")
    sid = row["id"]
    removed: list[tuple[str, int]] = []

    def mutate(db: sqlite3.Connection) -> Change:
        ids = [(r[0], r[1]) for r in db.execute("SELECT id, vkey FROM chunks WHERE source_id = ?",
                                                (sid,))]
        removed.extend(ids)
        db.execute("DELETE FROM chunks WHERE source_id = ?", (sid,))
        db.execute("DELETE FROM sources WHERE id = ?", (sid,))
        return Change(deleted=ids)

    kb.write(mutate)
    return {"source_id": sid, "title": row["title"], "removed_chunks": len(removed)}


def list_sources(kb: KnowledgeBase, *, offset: int = 0, limit: int = 100) -> tuple[list[dict], int]:
    db = kb.catalog.db
    total = db.execute("SELECT COUNT(*) FROM sources WHERE kb_id = ?", (kb.id,)).fetchone()[0]
    rows = db.execute(
        "SELECT s.*, (SELECT COUNT(*) FROM chunks c WHERE c.source_id = s.id) AS stored "
        "FROM sources s WHERE kb_id = ? ORDER BY added_at, id LIMIT ? OFFSET ?",
        (kb.id, limit, offset)).fetchall()
    return [{"id": r["id"], "title": r["title"], "url": r["url"], "file_name": r["file_name"],
             "type": r["type"], "chunks": r["stored"], "chunk_count": r["chunk_count"],
             "pages": r["pages"], "captured_by": r["captured_by"], "added_at": r["added_at"],
             "updated_at": r["updated_at"]} for r in rows], total
