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

from .catalog import chunk_id, source_id, valid_vector, vector_blob, vector_key
from .chunk import Chunk, chunk_document, passage_text
from .errors import (
    Cancelled,
    EmbeddingUnavailable,
    FetchFailed,
    InvalidDocument,
    InvalidInput,
    LocalKBError,
    NothingWritten,
    SourceNotFound,
)
from .extract import SUPPORTED_SUFFIXES, Document, extract_bytes, extract_html, extract_text
from .kb import Change, KnowledgeBase

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


def add_document(kb: KnowledgeBase, doc: Document, *, key: str, captured_by: str = "cli",
                 progress: Progress | None = None, check_cancelled: CancelCheck | None = None,
                 ) -> SourceReport:
    """Chunk, embed and write one document as one source; raise if nothing could be stored."""
    if captured_by not in CAPTURED_BY:
        raise InvalidInput(f"captured_by must be one of {', '.join(CAPTURED_BY)}")
    name = doc.url or doc.file_name or doc.title
    chunks = chunk_document(doc, kb.embedder.count_tokens, max_tokens=kb.store.settings.max_chunk_tokens,
                            overlap=kb.store.settings.chunk_overlap_tokens)
    _emit(progress, stage="chunk", done=len(chunks), total=len(chunks), source=name)
    if not chunks:
        raise InvalidDocument(f"{name}: no passages could be made from the text")
    sid = source_id(kb.id, key)
    digest = content_hash(doc, chunks, kb.record.model)
    dim = kb.record.dim
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

    # Embed only passages whose text changed; reuse the stored vectors of the rest.
    need = [i for i, cid in enumerate(cids)
            if not (cid in existing and existing[cid] == (hashes[i], True))]
    vectors: dict[int, np.ndarray] = {}
    failures: dict[int, str] = {}
    if need:
        kb.embedder.load()  # a model that cannot load fails the whole source with its reason
    for start in range(0, len(need), EMBED_GROUP):
        if check_cancelled:
            check_cancelled()
        group = need[start : start + EMBED_GROUP]
        try:
            out = kb.embedder.embed([texts[i] for i in group])
            vectors.update(zip(group, out, strict=True))
        except EmbeddingUnavailable:
            for i in group:  # isolate the passages that fail from those that embed
                try:
                    vectors[i] = kb.embedder.embed([texts[i]])[0]
                except EmbeddingUnavailable as err:
                    failures[i] = str(err)
        _emit(progress, stage="embed", done=min(start + EMBED_GROUP, len(need)), total=len(need),
              source=name)
    if check_cancelled:
        check_cancelled()
    reused = [i for i in range(len(chunks)) if i not in vectors and i not in failures]
    if not vectors and not reused:
        reasons = sorted(set(failures.values()))
        raise NothingWritten(f"{name}: none of its {len(chunks)} passages could be embedded "
                             f"({'; '.join(reasons)[:500]})", detail={"failures": len(failures)})

    now = time.time()
    before: dict[str, tuple[str, bool]] = {}

    def mutate(db: sqlite3.Connection) -> Change:
        before.update(_existing_chunks(kb, sid, db))
        change = Change()
        row = db.execute("SELECT added_at FROM sources WHERE id = ?", (sid,)).fetchone()
        db.execute(
            "INSERT INTO sources (id, kb_id, key, type, title, url, file_name, content_hash, "
            "captured_by, chunk_count, pages, lang, added_at, updated_at) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
            "type=excluded.type, title=excluded.title, url=excluded.url, "
            "file_name=excluded.file_name, content_hash=excluded.content_hash, "
            "captured_by=excluded.captured_by, chunk_count=excluded.chunk_count, "
            "pages=excluded.pages, lang=excluded.lang, updated_at=excluded.updated_at",
            (sid, kb.id, key, doc.type, doc.title, doc.url, doc.file_name, digest, captured_by,
             len(chunks), doc.pages, doc.lang, row["added_at"] if row else now, now))
        keep: set[str] = set()
        for i, c in enumerate(chunks):
            if i in failures:
                continue
            keep.add(cids[i])
            if i in vectors:
                db.execute(
                    "INSERT INTO chunks (id, vkey, kb_id, source_id, idx, text, text_hash, page, "
                    "tokens, vector, indexed_by, indexed_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) "
                    "ON CONFLICT(id) DO UPDATE SET text=excluded.text, text_hash=excluded.text_hash, "
                    "page=excluded.page, tokens=excluded.tokens, vector=excluded.vector, "
                    "indexed_by=excluded.indexed_by, indexed_at=excluded.indexed_at",
                    (cids[i], vector_key(cids[i]), kb.id, sid, c.index, c.text, hashes[i], c.page,
                     c.tokens, vector_blob(vectors[i]), captured_by, now))
                change.upserted.append((cids[i], vector_key(cids[i])))
        stale = [cid for cid in before if cid not in keep]
        db.executemany("DELETE FROM chunks WHERE id = ?", [(cid,) for cid in stale])
        change.deleted.extend((cid, vector_key(cid)) for cid in stale)
        return change

    _emit(progress, stage="write", done=0, total=len(chunks), source=name)
    kb.write(mutate)
    _emit(progress, stage="write", done=len(chunks), total=len(chunks), source=name)

    # Count what is really there now.
    after = _existing_chunks(kb, sid)
    report = SourceReport(name=name, status="", source_id=sid, title=doc.title, url=doc.url,
                          total=len(chunks))
    for i, cid in enumerate(cids):
        now_row = after.get(cid)
        if not now_row or not now_row[1] or now_row[0] != hashes[i]:
            report.failed += 1
            reason = failures.get(i, "the passage is not in the catalogue after the write")
            report.failures.append({"chunk_index": i, "page": chunks[i].page, "reason": reason})
        elif cid not in before:
            report.added += 1
        elif before[cid] == (hashes[i], True):
            report.unchanged += 1
        else:
            report.updated += 1
    report.removed = sum(1 for cid in before if cid not in after)
    if report.failed == report.total:
        raise NothingWritten(f"{name}: no passage was stored")
    if report.failed:
        report.status = "partial"
        kb.catalog.log_error("ingest", "partial_write", f"{name}: {report.summary}", kb_id=kb.id,
                             ref=sid, detail={"failures": report.failures[:50]})
    elif not before:
        report.status = "added"
    else:
        report.status = "updated" if (report.added or report.updated or report.removed) else "unchanged"
    return report


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
                          headers={"User-Agent": "LocalKB/0.1 (+personal knowledge base)"}) as client:
            with client.stream("GET", url) as resp:
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
        if item.startswith(("http://", "https://")):
            jobs: list[tuple[str, Callable[[], tuple[Document, str]]]] = [(item, _url_job(item, settings))]
        else:
            path = Path(item).expanduser()
            if path.is_dir():
                jobs = [(str(p), _file_job(p)) for p in walk_folder(path, include, exclude)]
                if not jobs:
                    report.sources.append(_failed(item, InvalidInput("the folder has no files to add")))
            elif path.is_file():
                jobs = [(str(path), _file_job(path))]
            else:
                report.sources.append(_failed(item, InvalidInput("no such file or folder")))
                jobs = []
        via = captured_by
        for n, (name, job) in enumerate(jobs):
            _emit(progress, stage="extract", done=n, total=len(jobs), source=name)
            try:
                doc, key = job()
                if len(jobs) > 1 and captured_by == "cli":
                    via = "folder"
                rep = add_document(kb, doc, key=key, captured_by=via, progress=progress,
                                   check_cancelled=check_cancelled)
                rep.name = name
                report.sources.append(rep)
            except Cancelled:
                raise
            except LocalKBError as err:
                kb.catalog.log_error("ingest", err.code, f"{name}: {err}", kb_id=kb.id, ref=name)
                report.sources.append(_failed(name, err))
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
