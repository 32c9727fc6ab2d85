"""Ingestion over the store seam (``store.base``): the team server's write path.

The local product ingests through ``ingest.pipeline`` (streaming readers, staged big
sources, folder sync), which still writes SQLite itself; until that pipeline is moved
behind the seam, the team store ingests with this: the same steps and reports, on any
``KnowledgeBaseHandle``. Each batch of sources is one store transaction (a source lands
whole or not at all), re-adding upserts the same deterministic chunk ids and reuses the
vectors of unchanged passages, and every report is counted from the rows after the write.
The report type, content hash and source keys are the pipeline's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from localkb.errors import (
    Cancelled,
    EmbeddingUnavailable,
    InvalidDocument,
    InvalidInput,
    LocalKBError,
    NothingWritten,
)
from localkb.ingest.chunk import Chunk, chunk_document, passage_text
from localkb.ingest.extract import Document
from localkb.ingest.pipeline import (
    CAPTURED_BY,
    SourceReport,
    _text_hash,
    capture_document,
    content_hash,
    settle_status,
)
from localkb.store.base import ChunkWrite, KnowledgeBaseHandle, SourceWrite
from localkb.store.catalog import chunk_id, source_id

KnowledgeBase = KnowledgeBaseHandle
Progress = Callable[[dict], None]
CancelCheck = Callable[[], None]


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
    existing = kb.existing_chunks(sid)
    src = kb.source_state(sid)
    valid_now = sum(1 for _h, ok in existing.values() if ok)
    if src and src[0] == digest and src[1] == len(chunks) == valid_now:
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
    total = sum(len(p.chunks) for p in batch)
    _emit(progress, stage="write", done=0, total=total, source=batch[0].name)
    writes = []
    for p in batch:
        keep = {p.cids[i] for i in range(len(p.chunks)) if i not in p.failures}
        chunks = [ChunkWrite(id=p.cids[i], idx=c.index, text=c.text, text_hash=p.hashes[i], page=c.page,
                             tokens=c.tokens, vector=p.vectors[i], indexed_by=p.captured_by)
                  for i, c in enumerate(p.chunks) if i not in p.failures and i in p.vectors]
        writes.append(SourceWrite(
            id=p.sid, key=p.key, type=p.doc.type, title=p.doc.title, url=p.doc.url,
            file_name=p.doc.file_name, content_hash=p.digest, captured_by=p.captured_by,
            chunk_count=len(p.chunks), pages=p.doc.pages, lang=p.doc.lang, chunks=chunks, keep=keep))
    befores = kb.write_sources(writes)
    for p in batch:
        p.before = befores[p.sid]
    _emit(progress, stage="write", done=total, total=total, source=batch[-1].name)


def _report(kb: KnowledgeBase, p: _Prepared) -> SourceReport:
    """Count what is really in the catalogue now, passage by passage."""
    after = kb.existing_chunks(p.sid)
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
    settle_status(rep, new=not p.before)
    if rep.failed:
        kb.log_error("ingest", "nothing_written" if rep.status == "failed" else "partial_write",
                     f"{p.name}: {rep.summary}", ref=p.sid, detail={"failures": rep.failures[:50]})
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
            kb.log_error("ingest", err.code, f"{name}: {err}", ref=name)
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
            kb.log_error("ingest", err.code, f"{p.name}: {err}", ref=p.sid)
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


# -- inputs --------------------------------------------------------------------------------


def add_capture(kb: KnowledgeBase, *, url: str | None, title: str | None = None,
                html: str | None = None, text: str | None = None, pdf: bytes | None = None,
                captured_by: str = "api", canonical_url: str | None = None, lang: str | None = None,
                progress: Progress | None = None, check_cancelled: CancelCheck | None = None,
                ) -> SourceReport:
    """A page handed over as rendered HTML, plain text or PDF bytes (the pipeline's extraction)."""
    doc, key = capture_document(kb, url=url, title=title, html=html, text=text, pdf=pdf,
                                canonical_url=canonical_url, lang=lang)
    return add_document(kb, doc, key=key, captured_by=captured_by, progress=progress,
                        check_cancelled=check_cancelled)


def _failed(name: str, err: LocalKBError) -> SourceReport:
    return SourceReport(name=name, status="failed", error={"code": err.code, "message": str(err)})
