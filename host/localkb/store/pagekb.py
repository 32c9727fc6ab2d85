"""The open page as a knowledge base held in memory: chat with a page without saving it.

The side panel hands over the open tab (the same capture as "Add this tab": rendered HTML,
text, or a PDF's bytes); ``PageShelf.open`` extracts and chunks it exactly as a save would,
embeds the first part before it answers and the rest on a background thread, and keeps the
passages, their vectors and a keyword index in this process only. Nothing of it is written
to the data directory: "Save" in the panel is an ordinary ``source.add``.

A page is a knowledge base like any other to everything above the store seam: ``WithPages``
wraps the store a chat turn reads, so ``resolve``, ``open_kb``, ``record`` and
``passage_window`` answer for the page's id too, the ``Searcher`` runs its one status logic
over the page's in-memory ``Legs``, and the privacy gate decides for the page's record like
any other. That record is ``device`` unless the chat's request allows the page to reach a
cloud model, so its text goes to a cloud model only on that explicit, per-chat allowance.
A page the process no longer holds has no record: provenance naming it counts as device only.

    PageShelf        open pages of this process, LRU-bounded (pages and passages)
      OpenPage       one page: passages, vectors, keyword postings; embedding progress
        PageLegs     the page's two retrieval legs (brute-force cosine, in-memory BM25)
    WithPages        a store that also holds the shelf's pages (one turn's view)
"""

from __future__ import annotations

import hashlib
import io
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from localkb.errors import InvalidInput, LocalKBError, PageNotHeld
from localkb.ingest.chunk import Chunk, iter_chunks, passage_text
from localkb.ingest.extract import Document, _open_pdf, _pdf_pages, _tidy, extract_html, extract_text
from localkb.store.analysis import analyze
from localkb.store.base import KnowledgeStore, Legs, PassageRow
from localkb.store.catalog import KBRecord, vector_key
from localkb.store.keywords import KeywordHit
from localkb.store.vectors import VectorHits

#: What the page is called in status lines, citations and the panel.
PAGE_NAME = "This page"
#: Passages embedded before ``page.open`` answers; the rest follow in the background.
FIRST_PASSAGES = 48
#: Passages per background embedding batch (small: a question waits at most one for the model).
BATCH = 8
#: Pages a host process holds at once, and passages across them; the least recently used go.
MAX_PAGES = 8
MAX_PASSAGES = 40_000
BM25_K1, BM25_B = 1.2, 0.75
#: The extractive summary quotes at most this many passages.
SUMMARY_PASSAGES = 5
#: Two passages at least this similar say the same thing: the summary keeps the first.
SUMMARY_REDUNDANT = 0.92


@dataclass
class _Passage:
    id: str
    idx: int
    text: str
    page: int | None


class PageLegs(Legs):
    """The searchable passages of an open page, as the Searcher reads any knowledge base."""

    def __init__(self, page: OpenPage) -> None:
        self.trace: dict = {}
        with page.lock:
            # One consistent view: the passages searchable now, whatever the background adds.
            self.n = page.searchable
            self.page = page
            self.vectors = page.vectors[: self.n]
            self.postings = page.postings
            self.lengths = page.lengths[: self.n]

    def _holding(self, term: str) -> dict[int, list[int]]:
        with self.page.lock:  # the background may be adding passages to this term's postings
            held = list(self.postings.get(term, {}).items())
        return {i: pos for i, pos in held if i < self.n}

    def is_empty(self) -> bool:
        return self.n == 0

    def vector(self, qvec: np.ndarray, count: int) -> VectorHits:
        sims = self.vectors @ np.asarray(qvec, dtype=np.float32) if self.n else np.zeros(0, np.float32)
        order = np.argsort(-sims, kind="stable")[:count]
        keys = np.array([self.page.keys[i] for i in order], dtype=np.uint64)
        return VectorHits(keys=keys, similarities=sims[order], exact=True)

    def keyword(self, terms: list[str], count: int) -> list[KeywordHit]:
        avg = (sum(self.lengths) / self.n) if self.n else 1.0
        scores: dict[int, float] = {}
        held: dict[int, set[str]] = {}
        for term in dict.fromkeys(terms):
            docs = self._holding(term)
            if not docs:
                continue
            idf = math.log(1 + (self.n - len(docs) + 0.5) / (len(docs) + 0.5))
            for i, pos in docs.items():
                tf = len(pos)
                norm = tf + BM25_K1 * (1 - BM25_B + BM25_B * self.lengths[i] / avg)
                scores[i] = scores.get(i, 0.0) + idf * tf * (BM25_K1 + 1) / norm
                held.setdefault(i, set()).add(term)
        best = sorted(scores, key=lambda i: (-scores[i], i))[:count]
        return [KeywordHit(self.page.passages[i].id, scores[i], frozenset(held[i])) for i in best]

    def doc_count(self) -> int:
        return self.n

    def doc_frequency(self, term: str) -> int:
        return len(self._holding(term))

    def phrase(self, terms: Sequence[str], limit: int = 1000) -> list[str]:
        if not terms:
            return []
        out = []
        for i, starts in sorted(self._holding(terms[0]).items()):
            later = [set(self.postings.get(t, {}).get(i, ())) for t in terms[1:]]
            if any(all(p + k in later[k - 1] for k in range(1, len(terms))) for p in starts):
                out.append(self.page.passages[i].id)
                if len(out) >= limit:
                    break
        return out

    def chunks_with(self, term: str, limit: int = 20_000) -> list[str]:
        return [self.page.passages[i].id for i in sorted(self._holding(term))[:limit]]

    def sources_of(self, chunk_ids: Sequence[str]) -> dict[str, str]:
        known = self.page.by_id
        return {c: self.page.source_id for c in chunk_ids if c in known and known[c] < self.n}

    def rows(self, keys: Sequence[int], qvec: np.ndarray | None) -> dict[int, PassageRow]:
        out = {}
        for key in keys:
            i = self.page.by_key.get(int(key))
            if i is None or i >= self.n:
                continue
            p = self.page.passages[i]
            cos = float(self.vectors[i] @ qvec) if qvec is not None else None
            out[int(key)] = PassageRow(vkey=int(key), id=p.id, source_id=self.page.source_id,
                                       idx=p.idx, text=p.text, page=p.page, title=self.page.title,
                                       url=self.page.url, file_name=None, type=self.page.type,
                                       chunk_count=self.page.total_known, cosine=cos)
        return out


class OpenPage:
    """One page held in memory: its passages as they are read, their vectors as they are embedded.

    ``searchable`` passages (a prefix, in document order) are embedded and keyword-indexed;
    a search sees exactly those. A background thread embeds the rest unless ``stop`` is set.
    """

    def __init__(self, page_id: str, doc: Document, chunks: Iterator[list[Chunk]], embedder,
                 model: str) -> None:
        self.id = page_id
        self.source_id = "s" + page_id
        self.title = doc.title
        self.url = doc.url
        self.type = doc.type
        self.pages_total = doc.pages if doc.type == "pdf" else None
        self.model = model
        self.embedder = embedder
        self.opened = time.time()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.done = threading.Event()
        self.passages: list[_Passage] = []
        self.keys: list[int] = []
        self.by_key: dict[int, int] = {}
        self.by_id: dict[str, int] = {}
        self.vectors = np.zeros((0, embedder.dim), dtype=np.float32)
        self.postings: dict[str, dict[int, list[int]]] = {}
        self.lengths: list[int] = []
        self.searchable = 0
        self.error: str | None = None
        #: Turns searching the page now: the background starts no batch while there are any.
        self._readers = 0
        self._idle = threading.Condition()
        self._chunks = chunks
        self._read_all = False

    # -- reading and embedding ------------------------------------------------------
    def _read(self, until: int) -> None:
        """Read chunks until ``until`` passages are known (or the document ends)."""
        while len(self.passages) < until and not self._read_all:
            try:
                block = next(self._chunks)
            except StopIteration:
                self._read_all = True
                return
            with self.lock:
                for c in block:
                    cid = hashlib.sha256(f"{self.id}\x1f{c.index}".encode()).hexdigest()[:32]
                    key = vector_key(cid)
                    self.by_key[key] = len(self.passages)
                    self.by_id[cid] = len(self.passages)
                    self.keys.append(key)
                    self.passages.append(_Passage(cid, c.index, c.text, c.page))

    def _embed_next(self, n: int) -> int:
        """Embed and index the next ``n`` read passages; how many were added."""
        start = self.searchable
        batch = self.passages[start: start + n]
        if not batch:
            return 0
        vecs = self.embedder.embed([passage_text(self.title, p.text) for p in batch])
        analysed = [analyze(passage_text(self.title, p.text)) for p in batch]
        with self.lock:
            self.vectors = np.vstack([self.vectors, vecs.astype(np.float32)])
            for offset, pairs in enumerate(analysed):
                i = start + offset
                for term, pos in pairs:
                    self.postings.setdefault(term, {}).setdefault(i, []).append(pos)
                self.lengths.append(len(pairs))
            self.searchable = start + len(batch)
        return len(batch)

    def first_part(self) -> None:
        """What ``page.open`` waits for: the first ``FIRST_PASSAGES`` passages searchable."""
        self._read(FIRST_PASSAGES)
        while self.searchable < min(FIRST_PASSAGES, len(self.passages)):
            self._embed_next(FIRST_PASSAGES - self.searchable)
        if self._read_all and self.searchable == len(self.passages):
            self.done.set()

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """While a turn searches the page, the background embedding waits (the model and the
        CPU are the question's): at most one small batch is under way when it starts."""
        with self._idle:
            self._readers += 1
        try:
            yield
        finally:
            with self._idle:
                self._readers -= 1
                self._idle.notify_all()

    def rest(self) -> None:
        """The background part: read and embed the rest, a small batch at a time."""
        try:
            while not self.stop.is_set():
                with self._idle:
                    self._idle.wait_for(lambda: self._readers == 0 or self.stop.is_set())
                self._read(self.searchable + BATCH)
                if not self._embed_next(BATCH):
                    break
        except LocalKBError as err:
            self.error = str(err)
        except Exception as err:  # a background failure is reported by page.status, never lost
            self.error = f"{type(err).__name__}: {err}"
        finally:
            self.done.set()

    # -- what is known ----------------------------------------------------------------
    @property
    def total_known(self) -> int:
        return len(self.passages)

    def pages_searchable(self) -> int | None:
        if self.pages_total is None:
            return None
        if self.done.is_set() and self.error is None:
            return self.pages_total
        with self.lock:
            last = self.passages[self.searchable - 1].page if self.searchable else None
            nxt = self.passages[self.searchable].page if self.searchable < len(self.passages) else None
        if last is None:
            return 0
        # A page counts once all its passages are searchable.
        return last if nxt != last else last - 1

    def status(self) -> dict:
        """``{page_id, title, url, passages, searchable, total, pages, pages_searchable, done, line}``."""
        with self.lock:
            searchable, known = self.searchable, len(self.passages)
        done = self.done.is_set()
        pages = self.pages_total
        pages_done = self.pages_searchable()
        if pages is not None:
            line = (f"{PAGE_NAME}: all {pages} page{'s' if pages != 1 else ''} searchable"
                    if done and pages_done == pages
                    else f"{PAGE_NAME}: {pages_done} of {pages} pages searchable so far")
        else:
            line = (f"{PAGE_NAME}: {searchable} passage{'s' if searchable != 1 else ''}, all searchable"
                    if done else f"{PAGE_NAME}: {searchable} of {known}+ passages searchable so far")
        if self.error:
            line += f" · the rest could not be read: {self.error}"
        return {"page_id": self.id, "title": self.title, "url": self.url, "type": self.type,
                "passages": known, "searchable": searchable, "total": known if done else None,
                "pages": pages, "pages_searchable": pages_done, "done": done,
                "error": self.error, "line": line}

    @property
    def partial(self) -> bool:
        return not self.done.is_set() or self.error is not None

    def record(self, privacy: str) -> KBRecord:
        return KBRecord(id=self.id, name=PAGE_NAME, privacy=privacy, model=self.model,
                        dim=int(self.vectors.shape[1]), created=self.opened,
                        generation=self.searchable)

    def window(self, idx: int, radius: int) -> list[dict]:
        with self.lock:
            n = self.searchable
            return [{"idx": p.idx, "text": p.text, "page": p.page}
                    for p in self.passages[max(0, idx - radius): min(n, idx + radius + 1)]]

    # -- the extractive summary ---------------------------------------------------------
    def summary_passages(self, n: int = SUMMARY_PASSAGES) -> list[int]:
        """Indexes of the passages that best stand for the page, in document order.

        Centroid selection (Radev et al.'s MEAD): the mean of the passages' unit vectors is
        what the page is mostly about; the passages nearest to it are picked, best first,
        skipping any nearly identical to one already picked, then put back in page order.
        """
        with self.lock:
            vecs = self.vectors[: self.searchable]
        if not len(vecs):
            return []
        centroid = vecs.mean(axis=0)
        norm = float(np.linalg.norm(centroid))
        if norm == 0.0:
            return list(range(min(n, len(vecs))))
        score = vecs @ (centroid / norm)
        picked: list[int] = []
        for i in np.argsort(-score, kind="stable"):
            if all(float(vecs[i] @ vecs[j]) < SUMMARY_REDUNDANT for j in picked):
                picked.append(int(i))
            if len(picked) == n:
                break
        return sorted(picked)


class PageHandle:
    """``open_kb`` of a page: what the Searcher and the chat turn read of a knowledge base."""

    def __init__(self, store: WithPages, page: OpenPage, record: KBRecord) -> None:
        self.store = store
        self.page = page
        self.record = record
        self.embedder = page.embedder

    @property
    def id(self) -> str:
        return self.record.id

    def legs(self) -> PageLegs:
        return PageLegs(self.page)

    def log_error(self, source: str, code: str, message: str, *, ref: str | None = None,
                  detail: dict | None = None) -> None:
        self.store.log_error(source, code, message, ref=ref, detail=detail)


def _document(url: str | None, title: str | None, html: str | None, text: str | None,
              pdf: bytes | None) -> Document:
    """The page as a document; a PDF's pages are read as they are asked for."""
    given = [x for x in (html, text, pdf) if x is not None]
    if len(given) != 1:
        raise InvalidInput("give exactly one of html, text or pdf_base64")
    if pdf is not None:
        if not pdf.startswith(b"%PDF"):
            raise InvalidInput("pdf_base64 is not a PDF (no %PDF header)", detail={"field": "pdf_base64"})
        reader, count, meta_title = _open_pdf(io.BytesIO(pdf))
        fallback = (url.rsplit("/", 1)[-1] if url else None) or "Untitled PDF"
        return Document(title=_tidy(title or meta_title or fallback)[:300], type="pdf", url=url,
                        stream=_pdf_pages(reader, count), page_count=count)
    if html is not None:
        return extract_html(html, url=url, title=title)
    return extract_text(text or "", title=title, url=url)


class PageShelf:
    """The pages one host process holds, least recently used first out."""

    def __init__(self, max_pages: int = MAX_PAGES, max_passages: int = MAX_PASSAGES) -> None:
        self.max_pages = max_pages
        self.max_passages = max_passages
        self._pages: OrderedDict[str, OpenPage] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, store: KnowledgeStore, *, url: str | None, title: str | None, html: str | None = None,
             text: str | None = None, pdf: bytes | None = None) -> OpenPage:
        """Hold the page (the same URL and content: the page already held); its first part searchable."""
        raw = pdf if pdf is not None else (html if html is not None else text or "").encode()
        page_id = "page_" + hashlib.sha256((url or "").encode() + b"\x1f" + raw).hexdigest()[:24]
        with self._lock:
            held = self._pages.get(page_id)
            if held is not None and not held.error:
                self._pages.move_to_end(page_id)
                return held
        cap = store.settings.max_source_bytes
        if cap and len(raw) > cap:
            from localkb.errors import SourceTooLarge
            from localkb.ingest.pipeline import too_large_reason

            raise SourceTooLarge(too_large_reason(len(raw), cap), detail={"bytes": len(raw), "cap": cap})
        doc = _document(url, title, html, text, pdf)
        settings = store.settings
        model = store.models.spec(settings.default_model).id
        embedder = store.models.get(model)
        chunks = iter_chunks(doc, embedder.count_tokens, max_tokens=settings.max_chunk_tokens,
                             overlap=settings.chunk_overlap_tokens)
        page = OpenPage(page_id, doc, chunks, embedder, model)
        page.first_part()
        if not page.passages:
            raise InvalidInput("the page has no text to search", detail={"field": "html"})
        with self._lock:
            old = self._pages.pop(page_id, None)
            if old is not None:
                old.stop.set()
            self._pages[page_id] = page
            self._evict()
        if not page.done.is_set():
            threading.Thread(target=page.rest, name=f"localkb-page-{page_id[5:13]}", daemon=True).start()
        return page

    def _evict(self) -> None:
        while len(self._pages) > 1 and (len(self._pages) > self.max_pages or sum(
                p.total_known for p in self._pages.values()) > self.max_passages):
            _, gone = self._pages.popitem(last=False)
            gone.stop.set()

    def get(self, page_id: str) -> OpenPage | None:
        with self._lock:
            page = self._pages.get(page_id)
            if page is not None:
                self._pages.move_to_end(page_id)
            return page

    def require(self, page_id: str) -> OpenPage:
        page = self.get(page_id)
        if page is None:
            raise PageNotHeld("this page is no longer held by the host: open it again",
                              detail={"page": page_id})
        return page

    def close(self, page_id: str) -> bool:
        with self._lock:
            page = self._pages.pop(page_id, None)
        if page is not None:
            page.stop.set()
        return page is not None


class WithPages(KnowledgeStore):
    """``store`` plus the pages of ``shelf``: one chat turn's view of its knowledge bases.

    A page's record is ``device`` unless its id is in ``to_cloud`` (the turn's explicit
    allowance), so the privacy gate keeps it from a cloud model like any device knowledge base.
    Pages are never listed by ``kbs()``: nothing can be written to them.
    """

    def __init__(self, store: KnowledgeStore, shelf: PageShelf,
                 to_cloud: frozenset[str] = frozenset()) -> None:
        self.inner = store
        self.shelf = shelf
        self.to_cloud = to_cloud
        self.settings = store.settings
        self.models = store.models
        self.history_is_local = store.history_is_local

    def __getattr__(self, name: str) -> Any:  # the wrapped store's own extras (``local``, ``teams``)
        return getattr(self.inner, name)

    def _page_record(self, page_id: str) -> KBRecord | None:
        page = self.shelf.get(page_id) if page_id.startswith("page_") else None
        if page is None:
            return None
        return page.record("cloud" if page_id in self.to_cloud else "device")

    def kbs(self) -> list[KBRecord]:
        return self.inner.kbs()

    def resolve(self, ref: str) -> KBRecord:
        rec = self._page_record(ref)
        if rec is not None:
            return rec
        if ref.startswith("page_"):
            self.shelf.require(ref)
        return self.inner.resolve(ref)

    def record(self, kb_id: str) -> KBRecord | None:
        return self._page_record(kb_id) or self.inner.record(kb_id)

    def create_kb(self, name: str, *, privacy: str = "device", model: str | None = None) -> KBRecord:
        return self.inner.create_kb(name, privacy=privacy, model=model)

    def delete_kb(self, ref: str) -> KBRecord:
        return self.inner.delete_kb(ref)

    def open_kb(self, ref: str):
        rec = self._page_record(ref)
        if rec is None:
            return self.inner.open_kb(ref)
        return PageHandle(self, self.shelf.require(ref), rec)

    def generation(self, kb_id: str) -> int | None:
        rec = self._page_record(kb_id)
        return rec.generation if rec is not None else self.inner.generation(kb_id)

    def counts(self, kb_id: str) -> dict:
        page = self.shelf.get(kb_id) if kb_id.startswith("page_") else None
        if page is not None:
            return {"sources": 1, "chunks": page.searchable}
        return self.inner.counts(kb_id)

    def passage_window(self, kb_id: str, source_id: str, idx: int, radius: int) -> list[dict]:
        page = self.shelf.get(kb_id) if kb_id.startswith("page_") else None
        if page is not None:
            return page.window(idx, radius)
        return self.inner.passage_window(kb_id, source_id, idx, radius)

    def log_error(self, source: str, code: str, message: str, *, kb_id: str | None = None,
                  ref: str | None = None, detail: dict | None = None) -> None:
        if kb_id is not None and kb_id.startswith("page_"):
            kb_id = None  # no catalogue row to attach it to
        self.inner.log_error(source, code, message, kb_id=kb_id, ref=ref, detail=detail)

    def log_query(self, kind: str, query: str, kb_ids: list[str], trace: dict[str, Any]) -> None:
        """Not logged when the turn searched a page: its question may quote the page ("Explain
        this passage …") and its trace names what was found there, and the page is never
        written to disk."""
        if any(k.startswith("page_") for k in kb_ids):
            return
        self.inner.log_query(kind, query, kb_ids, trace)

    def confirm_privacy(self) -> None:
        self.inner.confirm_privacy()

