"""Hybrid search that says, per knowledge base, what it found and why.

Each knowledge base is searched on its own (its own vector and keyword index),
the two lists are fused with reciprocal-rank fusion, and a relevance floor on
cosine similarity separates passages from weaker matches. Every knowledge
base gets exactly one status: passages, weaker, nothing, empty, skipped or
unavailable, with the numbers behind it.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from localkb.errors import EmbeddingUnavailable, InvalidInput, LocalKBError
from localkb.ingest.chunk import defining_spans_ranked, passage_text
from localkb.retrieval.hybrid import rrf, tied_ranks
from localkb.store.analysis import ExactTerm, QueryPlan, analyze, named_terms, plan_query
from localkb.store.base import KnowledgeBaseHandle, KnowledgeStore, Legs
from localkb.store.catalog import vector_key
from localkb.store.keywords import KeywordHit

MODES = ("hybrid", "vector", "keyword")
#: Below the cut-off by at most this much, a hit is a "weaker match"; further down it is noise.
WEAK_BAND = 0.05
MAX_K = 100
#: A keyword list whose best hit shares this many query terms counts in full (keyword_weight).
FULL_WEIGHT_TERMS = 2
#: Per-source searches fetch deeper until k pages are in, at most this many candidates per list.
MAX_FETCH = 640
#: At most this many passages are taken from one back-off form of an exact term.
MAX_BACKOFF = 2000


def fetch_k(k: int) -> int:
    """How many candidates each list fetches: min(200, max(k, 4k, 20))."""
    return min(200, max(k, 4 * k, 20))


def keyword_weight(hits: Sequence[KeywordHit], n_terms: int,
                   common: frozenset[str] = frozenset()) -> float:
    """The keyword list's weight in the fusion: 1 when its best hit shares two query terms or half of them.

    With one shared word (of three or more), the list is evidence of that word, not of
    the question: its order is mostly BM25's length normalisation among pages holding
    the word. It then counts in proportion: twice the best hit's share of the terms.
    Two shared words already rank by co-occurrence, which is evidence; requiring half
    of a long question's terms (SciFact claims have up to 12) muted the keyword list
    exactly where 96-token passages hold only part of them.

    ``common`` are the query terms found in at least half of the knowledge base's
    passages: their Robertson-Spärck Jones weight, ``log((N - df + 0.5) / (df + 0.5))``,
    is zero or below, so sharing them is no evidence and they are not counted at all.
    Under RRF any vote from a list can reorder two neighbours of another (their scores
    differ by about ``1/(60 + r)²``), so the only way two weak words cannot swing the
    result is for them not to vote.
    """
    if not hits or n_terms <= 0:
        return 1.0
    n_terms -= len(common)
    if n_terms <= 0:
        return 1.0  # every word is common: nothing tells one list from the other
    best = max(len(h.terms - common) for h in hits)
    if best >= FULL_WEIGHT_TERMS:
        return 1.0
    return min(1.0, 2 * best / n_terms)


def best_per_source(hits: Sequence[Hit], n: int) -> list[Hit]:
    """The first ``n`` hits of each source, in the order given (best first)."""
    seen: Counter[str] = Counter()
    out = []
    for h in hits:
        seen[h.source_id] += 1
        if seen[h.source_id] <= n:
            out.append(h)
    return out


@dataclass
class Hit:
    kb: str
    kb_name: str
    chunk_id: str
    source_id: str
    title: str
    url: str | None
    file_name: str | None
    chunk_index: int
    chunk_count: int
    page: int | None
    text: str
    score: float  # fused, 0..1
    cosine: float | None
    bm25: float | None
    matched_terms: int
    lists: list[str]
    relevant: bool = True
    degraded: bool = False
    rerank_score: float | None = None
    #: The query's exact terms this passage does not mention.
    missing_terms: list[str] = field(default_factory=list)
    #: Would be relevant but for a missing exact term (offered as a weaker match then).
    would_count: bool = False

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("would_count")
        out["weaker"] = not self.relevant
        return out


@dataclass
class KBStatus:
    kb: str
    kb_name: str
    status: str  # passages | weaker | nothing | empty | skipped | unavailable
    count: int = 0
    weaker: int = 0
    best: float | None = None
    cutoff: float = 0.35
    message: str = ""
    degraded: bool = False
    error: dict | None = None
    #: The query's exact terms as typed, and those no passage of this knowledge base holds.
    exact_terms: list[str] = field(default_factory=list)
    missing_terms: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {**asdict(self), "line": status_line(self)}


@dataclass
class TermMatch:
    """How one exact term of the query was found in one knowledge base."""

    term: ExactTerm
    how: str  # whole | backoff | missing | unchecked
    via: str | None = None  # the back-off form that matched, as it reads
    chunks: frozenset[str] = frozenset()  # passages holding it through the back-off
    extra_terms: tuple[str, ...] = ()  # single-term back-off forms the OR query also asks for

    def describe(self) -> str:
        if self.how == "backoff":
            return f"as {self.via}"
        return {"unchecked": "not checked"}.get(self.how, self.how)

    def held_by(self, chunk_id: str, terms: frozenset[str] | None) -> bool:
        """Whether one passage holds the term (whole, or through the back-off that found it).

        ``terms``: the passage's indexed terms, or those of them the keyword search matched.
        """
        if chunk_id in self.chunks:
            return True
        if self.how != "whole":
            return self.how == "unchecked"
        return terms is not None and self.term.term in terms


def defined_terms(present: Sequence[TermMatch], title: str | None, text: str) -> tuple[int, int]:
    """How many of the exact terms a passage defines (``ingest.chunk.defining_spans``), and
    how strongly: ``OWN_ENTRY`` when one has its own entry there, else ``LISTING_ROW``.

    A term found whole counts where a span writes it as a name (``named_terms``: a longer name
    that contains it, ``macaddr8_set7bit`` for ``macaddr8``, is another name); one found
    through its back-off, in any of its back-off forms (``Task.done()`` under ``class
    asyncio.Task`` defines ``asyncio.Task.done``).
    """
    spans = defining_spans_ranked(title, text)
    names = [named_terms(span) for span, _ in spans]
    pairs = [analyze(span) for span, _ in spans] if any(m.how == "backoff" for m in present) else []
    n, best = 0, 0
    for m in present:
        if m.how == "backoff":
            forms = [(m.term.term,)] + [a.phrase for a in m.term.backoff]
            held = [strength for (_, strength), p in zip(spans, pairs, strict=True)
                    if any(_holds_phrase(p, f) for f in forms)]
        else:
            held = [strength for (_, strength), ns in zip(spans, names, strict=True) if m.term.term in ns]
        if held:
            n += 1
            best = max(best, *held)
    return n, best


def _holds_phrase(pairs: list[tuple[str, int]], phrase: tuple[str, ...]) -> bool:
    at: dict[str, set[int]] = {}
    for term, pos in pairs:
        at.setdefault(term, set()).add(pos)
    return any(all(p + i in at.get(t, ()) for i, t in enumerate(phrase[1:], start=1))
               for p in at.get(phrase[0], ()))


def find_exact_terms(legs: Legs, plan: QueryPlan) -> list[TermMatch]:
    """Each exact term: whole if any passage holds it, else through its back-off, else missing.

    ``legs`` are one knowledge base's (``store.base.Legs``): on the team store every lookup
    sees only the passages the user may see, so a name held only by a restricted passage
    is missing for that user.
    """
    out = []
    for e in plan.exact:
        if legs.doc_frequency(e.term) > 0:
            out.append(TermMatch(e, "whole"))
            continue
        chunks: set[str] = set()
        via = None
        extra: list[str] = []
        for alt in e.backoff:
            ids = legs.phrase(alt.phrase, limit=MAX_BACKOFF)
            if ids and len(alt.phrase) > 1:
                ids = _written_in_order(legs, ids, alt.label)
            if ids and alt.context:
                ids = _on_pages_holding(legs, ids, alt.context)
            if ids:
                chunks.update(ids)
                via = via or alt.label
                if len(alt.phrase) == 1:
                    extra.append(alt.phrase[0])
        out.append(TermMatch(e, "backoff", via, frozenset(chunks), tuple(extra)) if chunks
                   else TermMatch(e, "missing"))
    return out


def _written_in_order(legs: Legs, ids: list[str], label: str) -> list[str]:
    """The passages of ``ids`` where the parts are written in a row as typed, not only their stems.

    The index holds stems, and a code-like token's parts each take a position, so the
    phrase ``warn deprec`` of ``warnings.deprecated`` also sits in
    ``warnings.warn("deprecated")`` — the last part of one name and the next word. The
    parts, in any case, joined by at most three spaces or punctuation marks and not inside
    a longer word, are what the back-off means ("Task done", "ERR 4521", "ERR-4521").
    """
    words = [re.escape(w) for w in label.split() if w]
    pattern = re.compile(r"(?<![A-Za-z0-9])" + r"[\W_]{0,3}".join(words) + r"(?![A-Za-z0-9])",
                         re.IGNORECASE)
    rows = legs.rows([vector_key(c) for c in ids], None)
    keep = {row.id for row in rows.values() if pattern.search(passage_text(row.title, row.text))}
    return [c for c in ids if c in keep]


def _on_pages_holding(legs: Legs, ids: list[str], context: tuple[str, ...]) -> list[str]:
    """The passages of ``ids`` whose page (source) also holds every term of ``context``."""
    source = legs.sources_of(ids)
    pages = set(source.values())
    for term in context:
        pages &= set(legs.sources_of(legs.chunks_with(term)).values())
        if not pages:
            return []
    return [c for c in ids if source.get(c) in pages]


@dataclass
class Candidates:
    """The ranked lists of one knowledge base and what is known about their members."""

    lists: dict[str, list[int]] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    #: Ranks of a list whose members are partly tied (``hybrid.rrf``'s ``ranks``).
    ranks: dict[str, list[int]] = field(default_factory=dict)
    sims: dict[int, float] = field(default_factory=dict)
    bm25: dict[int, tuple[float, int]] = field(default_factory=dict)
    qvec: np.ndarray | None = None
    embed_error: LocalKBError | None = None
    saturated: bool = False  # some list returned all it was asked for: there may be more
    terms: dict[int, frozenset[str]] = field(default_factory=dict)  # query terms each keyword hit holds
    keyword_complete: bool = False  # the keyword list holds every passage with a query term


@dataclass
class SearchResult:
    query: str
    mode: str
    cutoff: float
    terms: list[str]
    exact_terms: list[str] = field(default_factory=list)
    hits: list[Hit] = field(default_factory=list)
    weaker: list[Hit] = field(default_factory=list)
    statuses: list[KBStatus] = field(default_factory=list)
    trace: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"query": self.query, "mode": self.mode, "cutoff": self.cutoff, "terms": self.terms,
                "exact_terms": self.exact_terms,
                "hits": [h.to_dict() for h in self.hits],
                "weaker": [h.to_dict() for h in self.weaker],
                "statuses": [s.to_dict() for s in self.statuses],
                "summary": summary_line(self.statuses), "trace": self.trace}


def status_line(s: KBStatus) -> str:
    """The one-line step shown per knowledge base (CLI and side panel use the same words)."""
    name = s.kb_name
    if s.missing_terms and s.status in ("weaker", "nothing"):
        names = " or ".join(f'"{t}"' for t in s.missing_terms)
        if s.status == "weaker":
            return (f"{name} · no passage mentions {names} · {s.weaker} weaker "
                    f"match{'es' if s.weaker != 1 else ''}")
        best = f"best {s.best:.2f}, " if s.best is not None else ""
        return f"{name} · no passage mentions {names} · nothing else relevant ({best}cut-off {s.cutoff:.2f})"
    if s.status == "passages":
        text = f"{name} · {s.count} passage{'s' if s.count != 1 else ''}"
        return text + (" · keyword only, the embedder is unavailable" if s.degraded else "")
    if s.status == "weaker":
        return f"{name} · {s.weaker} weaker match{'es' if s.weaker != 1 else ''}"
    if s.status == "nothing":
        best = f"best {s.best:.2f}, " if s.best is not None else ""
        return f"{name} · nothing relevant ({best}cut-off {s.cutoff:.2f})"
    if s.status == "empty":
        return f"{name} · empty"
    if s.status == "skipped":
        return f"{name} · skipped · {s.message}"
    return f"{name} · unavailable · the search could not run"


def names_phrase(names: Sequence[str]) -> str:
    """"Docs", "Docs and Notes", "Docs, Notes and Mail", "5 knowledge bases"."""
    if len(names) > 3:
        return f"{len(names)} knowledge bases"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def summary_line(statuses: Sequence[KBStatus | dict]) -> str:
    """One line over every knowledge base's status: "Found in Docs · 6 others had nothing".

    Skipped and unavailable knowledge bases are always named (the side panel shows this line
    above the folded per-knowledge-base lines, so nothing it sets aside is hidden).
    """
    def get(s: KBStatus | dict, key: str):
        return s.get(key) if isinstance(s, dict) else getattr(s, key)

    by: dict[str, list[str]] = {}
    for s in statuses:
        by.setdefault(get(s, "status"), []).append(get(s, "kb_name") or get(s, "kb"))
    found, weaker = by.get("passages", []), by.get("weaker", [])
    none = by.get("nothing", []) + by.get("empty", [])
    parts = []
    if found:
        parts.append(f"Found in {names_phrase(found)}")
    if weaker:
        parts.append(f"{'only weaker' if found else 'Only weaker'} matches in {names_phrase(weaker)}")
    if none:
        if found or weaker:
            parts.append(f"{len(none)} other{'s' if len(none) != 1 else ''} had nothing")
        else:
            parts.append(f"Nothing relevant in {names_phrase(none)}")
    if by.get("skipped"):
        parts.append(f"{names_phrase(by['skipped'])} skipped")
    if by.get("unavailable"):
        parts.append(f"{names_phrase(by['unavailable'])} could not be searched")
    return " · ".join(parts) if parts else "No knowledge base was searched"


class Reranker:
    """Optional cross-encoder (ONNX file given by path, tokenizer.json beside it) for the top 50."""

    top = 50

    def __init__(self, model_path: Path) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tok_path = Path(model_path).with_name("tokenizer.json")
        try:
            self.session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
            self.tokenizer = Tokenizer.from_file(str(tok_path))
        except Exception as err:
            raise InvalidInput(f"the reranker {model_path} could not be loaded: {err}") from err
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(512)
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.name = Path(model_path).name

    def scores(self, query: str, passages: Sequence[str]) -> np.ndarray:
        if not passages:
            return np.zeros(0, dtype=np.float32)
        enc = self.tokenizer.encode_batch([(query, p) for p in passages])
        width = max(len(e.ids) for e in enc)
        ids = np.zeros((len(enc), width), np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for r, e in enumerate(enc):
            ids[r, : len(e.ids)] = e.ids
            mask[r, : len(e.ids)] = 1
            types[r, : len(e.ids)] = e.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        out = self.session.run(None, {k: v for k, v in feeds.items() if k in self.inputs})[0]
        return np.asarray(out, dtype=np.float32).reshape(len(enc), -1)[:, 0]


class Searcher:
    """Runs searches against a store (local or team, ``store.base``); one query-embedding cache per call.

    The status logic below — exact terms and their back-off, fusion, floor, weaker band,
    per-source fill, the six statuses — is the only copy: the team server runs this same
    class over its PostgreSQL store, and a knowledge base attached from a team server
    (``remote``) hands back the statuses that the server computed with it.
    """

    def __init__(self, store: KnowledgeStore, *, reranker: Reranker | None = None) -> None:
        self.store = store
        self.reranker = reranker

    def search(self, kb_refs: Sequence[str], query: str, *, k: int = 8, mode: str = "hybrid",
               cutoff: float | None = None, rerank: bool = False, floor: bool = True,
               per_source: int | None = None,
               skipped: Sequence[tuple[str, str, str]] = (),
               query_vectors: dict[str, np.ndarray | EmbeddingUnavailable] | None = None,
               ) -> SearchResult:
        """Search each knowledge base separately and merge, keeping where each hit came from.

        ``skipped`` carries (kb id, name, reason) for knowledge bases the privacy
        gate kept out; they get the status ``skipped`` and are not searched.
        ``floor=False`` returns the plain fused ranking (the evals score that).
        ``per_source=N`` keeps at most N passages of any one source (its best ones), so
        k hits name up to k different pages: "which pages say this" rather than "which
        passages". The lists behind it are fetched and fused exactly as without it.
        ``query_vectors`` (model id -> the query's embedding) is shared with the caller: a
        vector already there is used as it is, and each one computed here is left in it, so
        a chat turn embeds its query once for its semantic cache and every knowledge base.
        """
        if mode not in MODES:
            raise InvalidInput(f"mode must be one of {', '.join(MODES)}")
        if not isinstance(query, str) or not query.strip():
            raise InvalidInput("the query is empty")
        if not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise InvalidInput(f"k must be an integer from 1 to {MAX_K}")
        if per_source is not None and (not isinstance(per_source, int) or per_source < 1):
            raise InvalidInput("per_source must be a positive integer")
        if rerank and self.reranker is None:
            raise InvalidInput("rerank needs a cross-encoder model (--rerank-model PATH)")
        cutoff = self.store.settings.cutoff if cutoff is None else float(cutoff)
        kb_refs = [self.store.resolve(ref).id for ref in kb_refs]  # an unknown name is the caller's error
        plan = plan_query(query)
        result = SearchResult(query=query, mode=mode, cutoff=cutoff, terms=list(plan.terms),
                              exact_terms=[e.text for e in plan.exact])
        qcache = {} if query_vectors is None else query_vectors
        started = time.perf_counter()
        def one(ref: str):
            return lambda: self._search_one(ref, query, plan=plan, k=k, mode=mode, cutoff=cutoff,
                                            rerank=rerank, floor=floor, per_source=per_source,
                                            qcache=qcache, trace=result.trace)

        if len(kb_refs) > 1 and getattr(self.store, "concurrent", False):
            # A store whose knowledge bases each take their own connections (the team store):
            # searched side by side, reported in the order asked.
            runs = [_Background(one(ref)) for ref in kb_refs]
            outcomes = [r.result() for r in runs]
        else:
            outcomes = [one(ref)() for ref in kb_refs]
        for status, hits in outcomes:
            result.statuses.append(status)
            result.hits += [h for h in hits if h.relevant]
            result.weaker += [h for h in hits if not h.relevant]
        for kb_id, name, reason in skipped:
            result.statuses.append(KBStatus(kb_id, name, "skipped", cutoff=cutoff, message=reason,
                                            exact_terms=result.exact_terms))
        def order(h: Hit) -> tuple:
            return (h.rerank_score if h.rerank_score is not None else -1e9, h.score, h.cosine or 0.0)

        result.hits = sorted(result.hits, key=order, reverse=True)[:k]
        result.weaker = sorted(result.weaker, key=order, reverse=True)[:k]
        result.trace["total_ms"] = round((time.perf_counter() - started) * 1000, 2)
        return result

    def _search_one(self, ref: str, query: str, *, plan: QueryPlan, k: int, mode: str,
                    cutoff: float, rerank: bool, floor: bool, per_source: int | None,
                    qcache: dict, trace: dict) -> tuple[KBStatus, list[Hit]]:
        t: dict = {}
        name = ref
        exact_terms = [e.text for e in plan.exact]
        try:
            kb = self.store.open_kb(ref)
            name = kb.record.name
            if getattr(kb, "remote", False):  # a team knowledge base: its server ran this search
                status, hits, t = kb.search(query, k=k, mode=mode, cutoff=cutoff, floor=floor,
                                            per_source=per_source)
                trace.setdefault("kbs", {})[kb.id] = t
                return status, hits
            t0 = time.perf_counter()
            legs = kb.legs()
            t["open_ms"] = _ms(t0)
            empty = legs.is_empty()
        except LocalKBError as err:
            return self._unavailable(ref, name, cutoff, err, exact_terms), []
        trace.setdefault("kbs", {})[kb.id] = t
        if empty:
            return KBStatus(kb.id, name, "empty", cutoff=cutoff, exact_terms=exact_terms,
                            missing_terms=exact_terms,
                            message="the knowledge base has no passages"), []
        t0 = time.perf_counter()
        try:
            found = find_exact_terms(legs, plan)
        except LocalKBError as err:
            # Without the keyword index nobody can say which names are present: the search
            # still runs, and the trace says that the exact terms were not checked.
            kb.log_error("rag-retrieval", err.code, str(err))
            found = [TermMatch(e, "unchecked") for e in plan.exact]
        t["exact_ms"] = _ms(t0)
        t["exact"] = {m.term.text: m.describe() for m in found}
        missing = [m.term.text for m in found if m.how == "missing"]
        want = fetch_k(k)
        while True:
            got = self._candidates(kb, legs, query, plan, found, want=want, mode=mode,
                                   cutoff=cutoff, qcache=qcache, t=t)
            if isinstance(got, KBStatus):
                return got, []
            try:
                hits = self._hits(kb, legs, got, plan, found, cutoff=cutoff, floor=floor,
                                  missing=missing)
            except LocalKBError as err:
                return self._unavailable(kb.id, name, cutoff, err, exact_terms), []
            if per_source is None:
                break
            kept = {h.source_id for h in hits if h.relevant or not floor}
            # Per-source results fill k: several passages of one page can fill the lists, so
            # fetch deeper (4x at a time, at most MAX_FETCH per list) until k pages are in or
            # the lists hold no more.
            if len(kept) >= k or want >= MAX_FETCH or not got.saturated:
                break
            want = min(MAX_FETCH, want * 4)
        t["fetched"] = want
        degraded = got.embed_error is not None
        if degraded:
            kb.log_error("rag-retrieval", got.embed_error.code,
                         f"vector search could not run, keyword results only: {got.embed_error}")
        t.update(legs.trace)
        t["candidates"] = {n: len(v) for n, v in got.lists.items()}
        t["weights"] = {n: round(got.weights.get(n, 1.0), 3) for n in got.lists}
        if rerank and self.reranker is not None:
            t0 = time.perf_counter()
            top = hits[: self.reranker.top]
            for h, s in zip(top, self.reranker.scores(query, [h.text for h in top]), strict=True):
                h.rerank_score = float(s)
            before = {h.chunk_id: n for n, h in enumerate(top, start=1)}
            hits = sorted(top, key=lambda h: h.rerank_score, reverse=True) + hits[self.reranker.top :]
            t["rerank_ms"] = _ms(t0)
            # What the cross-encoder did, for the query log and the pipeline view: each passage
            # it scored with its place before (fused order) and after (its score's order).
            t["rerank"] = {"scored": len(top), "model": self.reranker.name, "order": [
                {"chunk_id": h.chunk_id, "title": h.title, "before": before[h.chunk_id],
                 "after": n, "score": round(h.rerank_score, 4)}
                for n, h in enumerate(hits[: len(top)], start=1)]}
        if per_source is not None:
            # A source's relevant passages come before its weaker ones (sorted is stable).
            hits = best_per_source(sorted(hits, key=lambda h: not h.relevant), per_source)
        relevant = [h for h in hits if h.relevant][:k]
        below = [h for h in hits if not h.relevant]
        best = max((h.cosine for h in hits if h.cosine is not None), default=None)
        common = {"best": best, "cutoff": cutoff, "degraded": degraded,
                  "exact_terms": exact_terms, "missing_terms": missing}
        if relevant:
            status = KBStatus(kb.id, name, "passages", count=len(relevant), weaker=len(below),
                              **common)
        else:
            # With a name missing, the passages that would have counted are the closest
            # ones: offered as weaker matches, never as passages.
            band = [h for h in below if h.would_count
                    or (h.cosine is not None and h.cosine >= cutoff - WEAK_BAND)
                    or (h.cosine is None and h.matched_terms > 0)]
            if band:
                below = band[:k]
                status = KBStatus(kb.id, name, "weaker", weaker=len(below), **common)
            else:
                status = KBStatus(kb.id, name, "nothing", **common)
                below = below[:k]
        if degraded:
            status.message = ("keyword results only: the embedder is unavailable "
                              f"({got.embed_error}); vector search did not run")
        status.message = status.message or status_line(status)
        return status, relevant + below[:k]

    def _candidates(self, kb: KnowledgeBaseHandle, legs: Legs, query: str, plan: QueryPlan,
                    found: list[TermMatch], *, want: int, mode: str, cutoff: float,
                    qcache: dict, t: dict) -> Candidates | KBStatus:
        """The ranked lists of one knowledge base, ``want`` deep each (or its unavailable status)."""
        got = Candidates()
        terms = list(plan.terms)
        name = kb.record.name
        early = None
        if mode == "hybrid" and getattr(legs, "concurrent", False):
            # Legs that each take their own database connection: the keyword leg runs beside
            # the query's embedding and the vector leg (its outcome is read below, as before).
            early = _Background(lambda: self._keyword_fetch(legs, plan, found, terms, want=want, t=t))
        if mode in ("hybrid", "vector"):
            try:
                t0 = time.perf_counter()
                got.qvec = self._embed_query(kb, query, qcache)
                t["embed_ms"] = _ms(t0)
                t0 = time.perf_counter()
                vh = legs.vector(got.qvec, want)
                t["vector_ms"] = _ms(t0)
                t["vector_exact"] = vh.exact
                got.lists["vector"] = [int(x) for x in vh.keys]
                got.sims.update(zip(got.lists["vector"], (float(s) for s in vh.similarities),
                                    strict=True))
                got.saturated |= len(vh.keys) >= want
            except LocalKBError as err:
                got.embed_error = err
                if mode == "vector":
                    return self._unavailable(kb.id, name, cutoff, err,
                                             [e.text for e in plan.exact])
        if mode in ("hybrid", "keyword") or got.embed_error is not None:
            try:
                khits, extra = (early.result() if early is not None
                                else self._keyword_fetch(legs, plan, found, terms, want=want, t=t))
            except LocalKBError as err:
                if got.embed_error is not None or mode == "keyword":
                    return self._unavailable(kb.id, name, cutoff, got.embed_error or err,
                                             [e.text for e in plan.exact])
                khits = []
                kb.log_error("rag-retrieval", err.code, str(err))
                t["keyword_error"] = str(err)
            got.saturated |= len(khits) >= want
            got.keyword_complete = len(khits) < want and "keyword_error" not in t
            for h in khits:
                # A passage found through an exact term's back-off holds that term (and its
                # back-off forms count as that one term, not as more).
                held = {m.term.term for m in found if h.chunk_id in m.chunks}
                if held or extra & h.terms:
                    h.terms = (h.terms - extra) | held
            got.lists["keyword"] = [vector_key(h.chunk_id) for h in khits]
            n = legs.doc_count()
            common = frozenset(t for t in terms if 2 * legs.doc_frequency(t) >= n) if khits else frozenset()
            got.weights["keyword"] = keyword_weight(khits, len(terms), common)
            if got.weights["keyword"] < 1.0:
                # Evidence of one word, not of the question: the pages holding the same
                # words are one vote, not an order by BM25's length normalisation.
                got.ranks["keyword"] = tied_ranks([frozenset(h.terms - common) for h in khits])
            got.bm25.update((vector_key(h.chunk_id), (h.bm25, h.matched)) for h in khits)
            got.terms.update((vector_key(h.chunk_id), h.terms) for h in khits)
            present = [m for m in found if m.how in ("whole", "backoff")]
            if present:
                self._exact_lists(legs, got, khits, present, want=want, n_terms=len(terms))
        if mode == "keyword":
            # The floor is on cosine for every hit, so keyword mode still embeds the query
            # (best effort): without it, only real keyword matches count as relevant.
            try:
                got.qvec = self._embed_query(kb, query, qcache)
            except LocalKBError:
                got.qvec = None
        return got

    @staticmethod
    def _keyword_fetch(legs: Legs, plan: QueryPlan, found: list[TermMatch], terms: list[str], *,
                       want: int, t: dict) -> tuple[list[KeywordHit], set[str]]:
        """The keyword leg's hits, and the extra terms it was asked for beside the query's."""
        t0 = time.perf_counter()
        # Single-term back-off forms, and the parts of a code-like term no passage
        # holds whole: asked for, scored, never counted as terms a passage matched.
        extra = {a for m in found for a in m.extra_terms}
        how = {m.term.term: m.how for m in found}
        asked = [p for term, ps in plan.parts
                 if (how[term] if term in how else
                     "whole" if legs.doc_frequency(term) else "missing") != "whole"
                 for p in ps]
        if asked:
            t["parts"] = sorted(set(asked))
        extra |= set(asked) - set(terms)
        khits = legs.keyword(terms + sorted(extra), want)
        t["keyword_ms"] = _ms(t0)
        return khits, extra

    def _exact_lists(self, legs: Legs, got: Candidates, khits: Sequence[KeywordHit],
                     present: list[TermMatch], *, want: int, n_terms: int) -> None:
        """The lists of the query's exact terms: passages holding them, and those defining them.

        ``exact``: passages holding the terms (whole or through their back-off), most of them
        first, then by BM25. A sentence model sees ERR_4521 and
        ERR_4512 as near-twins; this list does not. ``defines``: the passages among them that
        introduce a term — in the page title, a heading, a definition term, a table row's
        first cell or a signature (``ingest.chunk.defining_spans``) — rather than only
        mention it: on a page that defines a name and ten that use it, the one that defines
        it is what a question naming it asks for. A term held by at most ``MAX_FETCH``
        passages has all of them considered, not only those the keyword list fetched.
        """
        codes = {m.term.term for m in present}
        bm25 = {vector_key(h.chunk_id): h.bm25 for h in khits}
        holds: dict[int, set[str]] = {vector_key(h.chunk_id): set(h.terms & codes) for h in khits
                                      if h.terms & codes}
        for m in present:
            for cid in m.chunks:
                holds.setdefault(vector_key(cid), set()).add(m.term.term)

        def rank(key: int) -> tuple:
            return (len(holds[key]), bm25.get(key, 0.0))

        got.lists["exact"] = sorted(holds, key=rank, reverse=True)[:want]
        # Where a name is defined is looked for among every passage holding it (a definition
        # is short and says the name once: BM25 can rank it below the pages that repeat it).
        for m in present:
            if m.how == "whole" and legs.doc_frequency(m.term.term) <= MAX_FETCH:
                for cid in legs.chunks_with(m.term.term, limit=MAX_FETCH):
                    holds.setdefault(vector_key(cid), set()).add(m.term.term)
        rows = legs.rows(list(holds), None)
        defined = {key: d for key, row in rows.items()
                   if (d := defined_terms(present, row.title, row.text))[0]}
        # Where some page gives a name its own entry (a title, heading, definition term or
        # signature), a table that lists it among others is a summary, not its definition.
        strongest = max((strength for _, strength in defined.values()), default=0)
        defined = {key: n for key, (n, strength) in defined.items() if strength == strongest}
        if defined:
            got.lists["defines"] = sorted(defined, key=lambda key: (defined[key], *rank(key)),
                                          reverse=True)[:want]
            # The list speaks for the names only: it counts in proportion to their share of
            # the query's terms (1 for a query that is a name, 1/4 for a question naming one).
            got.weights["defines"] = min(1.0, len(present) / max(1, n_terms))

    def _hits(self, kb: KnowledgeBaseHandle, legs: Legs, got: Candidates, plan: QueryPlan,
              found: list[TermMatch], *, cutoff: float, floor: bool, missing: list[str]) -> list[Hit]:
        """The fused candidates as hits, each marked relevant (above the floor) or not."""
        name = kb.record.name
        fused = rrf(got.lists, self.store.settings.rrf_k, got.weights, got.ranks)
        rows = legs.rows(list(fused), got.qvec)
        hits: list[Hit] = []
        need_terms = len(plan.terms) / 2
        wanted = [m for m in found if m.how in ("whole", "backoff")]
        degraded = got.embed_error is not None
        for key, score in sorted(fused.items(), key=lambda kv: kv[1], reverse=True):
            row = rows.get(key)
            if row is None:  # an index entry without a catalogue row is never served
                continue
            cos = got.sims.get(key)
            if cos is None:
                cos = row.cosine
            b, matched = got.bm25.get(key, (None, 0))
            keyword_match = b is not None and b > 0 and matched > need_terms
            counts = keyword_match or (cos is not None and cos >= cutoff)
            lacks = list(missing)
            if wanted:
                # A question naming something: a passage above the floor counts only if it
                # names some of it; one that names none of it is a weaker match at best.
                terms = got.terms.get(key)
                if terms is None and not got.keyword_complete:
                    # Not among the keyword hits that were fetched: read the passage itself.
                    terms = frozenset(t for t, _ in analyze(passage_text(row.title, row.text)))
                lacks += [m.term.text for m in wanted if not m.held_by(row.id, terms)]
                held = len(wanted) - (len(lacks) - len(missing))
                counts = counts and held > 0
            hits.append(Hit(
                kb=kb.id, kb_name=name, chunk_id=row.id, source_id=row.source_id,
                title=row.title, url=row.url, file_name=row.file_name,
                chunk_index=row.idx, chunk_count=row.chunk_count, page=row.page,
                text=row.text, score=round(score, 6), cosine=None if cos is None else round(cos, 6),
                bm25=None if b is None else round(b, 4), matched_terms=matched,
                lists=[n for n, items in got.lists.items() if key in items],
                relevant=(counts and not missing) or not floor, degraded=degraded,
                missing_terms=lacks, would_count=counts))
        return hits

    def _embed_query(self, kb: KnowledgeBaseHandle, query: str, qcache: dict) -> np.ndarray:
        model = kb.record.model
        cached = qcache.get(model)
        if isinstance(cached, LocalKBError):
            raise cached
        if cached is None:
            try:
                cached = kb.embedder.embed([query])[0]
            except EmbeddingUnavailable as err:
                qcache[model] = err
                raise
            qcache[model] = cached
        return cached

    def _unavailable(self, kb_id: str, name: str, cutoff: float, err: LocalKBError,
                     exact_terms: list[str]) -> KBStatus:
        self.store.log_error("rag-retrieval", err.code, f"search could not run: {err}",
                             kb_id=kb_id if kb_id.startswith(("kb_", "tkb_")) else None)
        return KBStatus(kb_id, name, "unavailable", cutoff=cutoff, error=err.to_dict(),
                        exact_terms=exact_terms,
                        message=("the search could not run, so this says nothing about what is "
                                 f"stored: {err}"))


class _Background:
    """A call run on a thread of its own; ``result()`` waits for it and returns or raises what it did."""

    def __init__(self, fn) -> None:
        self._fn = fn
        self._out: tuple = ()
        self._thread = threading.Thread(target=self._run, name="localkb-leg", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._out = (True, self._fn())
        except BaseException as err:  # handed to the caller of result(), who decides
            self._out = (False, err)

    def result(self):
        self._thread.join()
        ok, value = self._out
        if not ok:
            raise value
        return value


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
