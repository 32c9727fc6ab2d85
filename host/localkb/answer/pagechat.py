"""Chat with the open page: its turn's view of the store, its progress in the status line, its summary.

The page itself is an in-memory knowledge base (``store.pagekb``); a chat turn over it is an
ordinary ``run_turn`` over ``WithPages``, so the gate, the statuses and the citations are the
ones every knowledge base gets. What is particular to a page lives here:

- ``page_view``: the turn's store, with the page allowed to reach a cloud model only when the
  request says so for this chat (``page_to_cloud``);
- ``mark_progress``: a page still being embedded says how much of it was searched
  ("This page: 40 of 300 pages searchable so far") in its status line and the turn's notes;
- ``summarize``: "Summarize this page": its central passages (``OpenPage.summary_passages``)
  summarized by the chosen model where the privacy gate lets the page reach it, and otherwise
  (no model, a model the page may not reach, a model that fails) quoted in page order as an
  extractive summary, labelled so; cited like any passage either way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from localkb.answer.chat import (
    ChatResult,
    TokenFn,
    _citation,
    _quote,
    build_messages,
    check_citations,
)
from localkb.answer.llm import DEFAULT_TIMEOUTS, Endpoint, Timeouts, stream_chat
from localkb.answer.privacy import allowed_knowledge_bases, locate
from localkb.errors import LLMUnavailable
from localkb.retrieval.search import Hit, KBStatus, summary_line
from localkb.store.base import KnowledgeStore
from localkb.store.pagekb import PAGE_NAME, OpenPage, PageShelf, WithPages

SUMMARY_LABEL = "Extractive summary (no model)"
#: What the model is asked, with the central passages fenced as in any chat prompt.
SUMMARY_QUESTION = ("Summarize this page in a short paragraph from the passages given, citing "
                    "them by number.")


def page_view(store: KnowledgeStore, shelf: PageShelf, page_id: str, *, to_cloud: bool) -> WithPages:
    """``store`` with the shelf's pages; ``page_id`` is ``cloud`` only on the chat's explicit allowance."""
    shelf.require(page_id)
    return WithPages(store, shelf, frozenset({page_id}) if to_cloud else frozenset())


def mark_progress(status: dict, page: OpenPage) -> dict:
    """The page's status line, with how much of it was searchable when it was searched."""
    if status.get("kb") == page.id and page.partial:
        status["line"] = f"{status['line']} · {page.status()['line'].removeprefix(PAGE_NAME + ': ')}"
    return status


def mark_result(result: ChatResult, page: OpenPage) -> ChatResult:
    """``mark_progress`` for a finished turn, and a note that the rest was not searched yet."""
    result.statuses = [mark_progress(s, page) for s in result.statuses]
    if page.partial and any(s.get("kb") == page.id for s in result.statuses):
        result.notes.append(f"{page.status()['line']}: the rest of it was not searched.")
    return result


def _hit(page: OpenPage, i: int) -> Hit:
    p = page.passages[i]
    return Hit(kb=page.id, kb_name=PAGE_NAME, chunk_id=p.id, source_id=page.source_id,
               title=page.title, url=page.url, file_name=None, chunk_index=p.idx,
               chunk_count=page.total_known, page=p.page, text=p.text, score=1.0, cosine=None,
               bm25=None, matched_terms=0, lists=["summary"])


def summarize(view: WithPages, page: OpenPage, endpoint: Endpoint | None = None, *,
              on_token: TokenFn | None = None, cancel: threading.Event | None = None,
              timeouts: Timeouts = DEFAULT_TIMEOUTS) -> ChatResult:
    """The page's summary: its most central passages, cited, summarized by ``endpoint`` where
    the privacy gate lets the page reach it, else quoted in page order (no model)."""
    chosen = [_hit(page, i) for i in page.summary_passages()]
    status = KBStatus(page.id, PAGE_NAME, "passages", count=len(chosen),
                      message=f"{len(chosen)} passages chosen for the summary")
    statuses = [mark_progress(status.to_dict(), page)]
    notes = [f"{page.status()['line']}: the summary covers only that part."] if page.partial else []
    common = {"removed_citations": [], "ungrounded": False, "rewritten_query": None,
              "statuses": statuses, "kbs": [page.id], "summary": summary_line(statuses)}
    placement = locate(endpoint)
    if endpoint is not None and chosen:
        gate = allowed_knowledge_bases(endpoint, [view.resolve(page.id)], placement=placement)
        if gate.skipped:
            notes.append(f"{PAGE_NAME} was not sent to {endpoint.name}: {gate.skipped[0].reason}.")
        else:
            try:
                text = "".join(_streamed(stream_chat(
                    endpoint, build_messages(SUMMARY_QUESTION, chosen), timeout=timeouts,
                    cancel=cancel, placement=placement), on_token))
                answer, cited, removed = check_citations(text, len(chosen))
                where = {"device": "on this device", "cloud": "cloud"}.get(placement.location,
                                                                           "unknown (treated as cloud)")
                named = f"{endpoint.name}{f' · {endpoint.model}' if endpoint.model else ''}"
                line = f"Summarized by {named} · {where}"
                return ChatResult(answer=answer, generated=True,
                                  citations=[_citation(n, chosen[n - 1]) for n in cited],
                                  model={"name": endpoint.name, "model": endpoint.model,
                                         "location": placement.location},
                                  trace={"kind": "summary", "passages": len(chosen)}, notes=notes,
                                  answer_line=line, **{**common, "removed_citations": removed})
            except LLMUnavailable as err:
                notes.append(f"The model {endpoint.name} failed, so the summary is not generated: {err}")
    lines = [f"{SUMMARY_LABEL}: the passages that best stand for the page, in page order.", ""]
    for n, hit in enumerate(chosen, start=1):
        where = f" (page {hit.page})" if hit.page else ""
        lines.append(f"[{n}] “{_quote(hit.text)}”{where}")
    answer = "\n".join(lines).rstrip()
    if on_token is not None:
        on_token(answer)
    return ChatResult(
        answer=answer, generated=False,
        citations=[_citation(n, h) for n, h in enumerate(chosen, start=1)], model=None,
        trace={"kind": "summary", "passages": len(chosen)}, notes=notes,
        answer_line=SUMMARY_LABEL, **common)


def _streamed(pieces: Iterator[str], on_token: TokenFn | None) -> Iterator[str]:
    for piece in pieces:
        if on_token is not None:
            on_token(piece)
        yield piece
