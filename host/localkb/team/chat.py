"""Team chat: ask and chat over team knowledge bases, with the stages a shared deployment needs.

    POST /v1/chat      {kbs, message, history?, k?, regenerate?, stream?}
                       JSON reply, or Server-Sent Events with ``stream: true`` (or
                       ``Accept: text/event-stream``)
    GET  /v1/querylog?user=&offset=&limit=     the caller's queries (an admin: everyone's)
    GET  /v1/querylog/export?format=jsonl|csv  the same, as a file
    GET  /pipeline                             the pipeline view (``pipeline_page/``)

One turn, in order — each stage timed, and the times returned, logged and drawn:

    guard_in   input checks (``guard.py``): empty, length, control characters, deny list
    limits     the daily caps per user and per client address (``limits.py``)
    access     the caller's access set, read from PostgreSQL for this request
    cache      exact tier: (access set, KBs with generations, model, options, normalised query),
               before any embedding; semantic tier: the query embedding against earlier
               ones under the same key parts, at the configured cosine (off by default: see
               RESULTS.md "Semantic threshold, measured", the measurement behind it)
    embed      the query embedded once, for the semantic tier and every vector leg
    retrieve   vector and keyword legs filtered by access inside their SQL; fused
    rerank     the cross-encoder over the top 50, when a model file is configured
    generate   the team's model (``--llm-url``), streamed; or the extractive answer
    guard_out  every citation a passage this user may see; no device-only KB at a cloud model
    log        the query log row (``querylog.py``)

The turn itself is ``answer.chat.run_turn``, the local product's code, over the caller's
``TeamStore`` view: the privacy gate, rewrite, citation check and statuses are the same.

The SSE stream carries the host protocol's event frames as each event's data — ``{"event":
"step", "data": status}``, ``{"event": "token", "data": {"text"}}``, then ``{"event":
"result", "data": reply}`` or ``{"event": "error", "data": {"code", "message", "detail"}}``
— so the host relays it to the side panel unchanged (``relay.py``).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from localkb.answer.chat import AnswerCache, ChatOptions, parse_continuation, parse_history, run_turn
from localkb.answer.llm import Endpoint
from localkb.answer.privacy import endpoint_location
from localkb.errors import GuardrailBlocked, InvalidInput, LocalKBError, NotFound, RateLimited
from localkb.inputs import req_bool, req_int, req_kbs
from localkb.team.guard import Policy, check_input, check_output
from localkb.team.limits import Caps, RateLimiter
from localkb.team.querylog import QueryLog

#: Off: the semantic tier never serves. The measurement (bench/team.py, RESULTS.md "Semantic
#: threshold, measured") found claims that contradict each other at a higher cosine than
#: same-verdict pairs at every threshold from 0.80 to 0.95, so no cosine alone is a safe
#: default for this model.
DEFAULT_SEMANTIC_THRESHOLD: float | None = None
STAGE_ORDER = ("guard_in", "limits", "access", "cache", "rewrite", "embed", "vector", "keyword",
               "fuse", "rerank", "generate", "guard_out", "log")
PAGE_FILES = {"": ("index.html", "text/html; charset=utf-8"),
              "app.js": ("app.js", "text/javascript; charset=utf-8"),
              "sse.js": ("sse.js", "text/javascript; charset=utf-8"),
              "dom.js": ("dom.js", "text/javascript; charset=utf-8"),
              "app.css": ("app.css", "text/css; charset=utf-8")}


@dataclass(frozen=True)
class ChatConfig:
    """How the team server answers; ``endpoint`` None: extractive answers only."""

    endpoint: Endpoint | None = None
    caps: Caps = field(default_factory=Caps)
    policy: Policy = field(default_factory=Policy)
    semantic_threshold: float | None = DEFAULT_SEMANTIC_THRESHOLD
    k: int = 10
    #: Line ending of the SSE stream ("\n" or "\r\n"; both are valid SSE).
    sse_newline: str = "\n"


_ICON = (b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" '
         b'rx="3" fill="#1a5fb4"/><path d="M4 4h2v6h6v2H4z" fill="#fff"/></svg>')


class EventStream:
    """A streamed reply: the handler sends the headers, then ``run(emit)`` writes the events."""

    def __init__(self, run, newline: str = "\n") -> None:
        self.run = run
        self.newline = newline

    def frame(self, event: str, data: Any) -> bytes:
        nl = self.newline
        payload = json.dumps({"event": event, "data": data}, ensure_ascii=False, default=str)
        # One data line per JSON text (json.dumps never emits a raw newline).
        return f"event: {event}{nl}data: {payload}{nl}{nl}".encode()


class TeamChat:
    def __init__(self, api, config: ChatConfig = ChatConfig()) -> None:
        self.api = api
        self.config = config
        threshold = config.semantic_threshold
        self.cache = AnswerCache(threshold=threshold if threshold is not None else 1.0)
        self.semantic = threshold is not None
        self.limiter = RateLimiter(api.db, config.caps)
        self.limiter.seed()  # the first server's caps; after that the database's
        self.log = QueryLog(api.db, instance=api.instance)
        self._lock = threading.Lock()

    def routes(self) -> list[tuple[str, tuple[str, ...], Any, bool]]:
        return [("POST", ("v1", "chat"), self.chat, True),
                ("GET", ("v1", "querylog"), self.querylog, True),
                ("GET", ("v1", "querylog", "export"), self.querylog_export, True),
                ("GET", ("pipeline",), self.page, False),
                ("GET", ("pipeline", "*"), self.page, False),
                ("GET", ("favicon.ico",), self.favicon, False)]

    # -- the pipeline page -----------------------------------------------------------------
    def page(self, req, name: str = "") -> tuple[bytes, dict]:
        if name not in PAGE_FILES:
            raise NotFound(f"no such file: /pipeline/{name}")
        file, ctype = PAGE_FILES[name]
        body = resources.files("localkb.team").joinpath("pipeline_page", file).read_bytes()
        return body, {"Content-Type": ctype, "Cache-Control": "no-store",
                      "Content-Security-Policy": "default-src 'self'; style-src 'self'; "
                      "script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
                      "X-Content-Type-Options": "nosniff"}

    def favicon(self, req) -> tuple[bytes, dict]:
        return _ICON, {"Content-Type": "image/svg+xml", "Cache-Control": "max-age=86400"}

    # -- the query log -----------------------------------------------------------------------
    def querylog(self, req) -> dict:
        rows, total = self.log.list(req.access, user=req.arg("user", max_len=64),
                                    offset=req.int_arg("offset", 0, lo=0, hi=10**9),
                                    limit=req.int_arg("limit", 50, lo=1, hi=1000))
        return {"queries": rows, "total": total}

    def querylog_export(self, req) -> tuple[bytes, dict]:
        fmt = req.arg("format", max_len=10) or "jsonl"
        body = self.log.export(req.access, fmt, user=req.arg("user", max_len=64))
        ctype = "application/x-ndjson" if fmt == "jsonl" else "text/csv; charset=utf-8"
        return body, {"Content-Type": ctype,
                      "Content-Disposition": f'attachment; filename="localkb-querylog.{fmt}"'}

    # -- a turn ------------------------------------------------------------------------------
    def chat(self, req) -> dict | EventStream:
        started = time.perf_counter()
        stages: dict[str, float] = {}
        data = req.json()
        message = data.get("message")
        access = req.access
        address = req.address
        kbs: list[str] = []

        def fail(err: LocalKBError) -> LocalKBError:
            stages["total"] = _ms(started)
            self.log.record(access, address=address, kind="team-chat",
                            query=message if isinstance(message, str) else "", kbs=kbs,
                            outcome="refused", error_code=err.code, stages=stages,
                            total_ms=stages["total"])
            return err

        t0 = time.perf_counter()
        try:
            raw_history = data.get("history")
            if not isinstance(message, str):
                raise GuardrailBlocked("the message must be text",
                                       detail={"rule": "empty", "stage": "input"})
            check_input(message, raw_history if isinstance(raw_history, list) else None,
                        self.config.policy, continue_from=data.get("continue_from"))
            history = parse_history(raw_history)
            # Continued only when its provenance is this team's (``gate_continuation`` in run_turn).
            continued = parse_continuation(data)
            kbs = req_kbs(data)
            k = req_int(data, "k", self.config.k, lo=1, hi=50)
        except (GuardrailBlocked, InvalidInput) as err:
            raise fail(err) from None
        stages["guard_in"] = _ms(t0)
        t0 = time.perf_counter()
        try:
            limits = self.limiter.take(access.user_id, address)
        except RateLimited as err:
            raise fail(err) from None
        stages["limits"] = _ms(t0)
        t0 = time.perf_counter()
        store = self.api.store(req)
        stages["access"] = _ms(t0)
        regenerate = req_bool(data, "regenerate")
        options = ChatOptions(k=k, kind="team-chat", tools=False,
                              no_model_reason="this team server has no model configured",
                              continue_from=continued.content if continued is not None else "",
                              continue_kbs=continued.kbs if continued is not None else None)
        stream = req_bool(data, "stream") or "text/event-stream" in (req.headers.get("Accept") or "")

        def turn(emit=None) -> dict:
            # The live page's stages: those before the turn go out with its first own stage, so a
            # turn refused before it searched (an unknown or ungranted knowledge base) streams only
            # its error, the same whether the knowledge base exists or not.
            earlier = ["guard_in", "limits", "access"]

            def on_stage(stage: str, ms: float) -> None:
                while earlier:
                    first = earlier.pop(0)
                    emit("stage", {"stage": first, "ms": stages[first]})
                emit("stage", {"stage": stage, "ms": ms})

            try:
                result = run_turn(
                    store, kbs, message, history=history, endpoint=self.config.endpoint,
                    options=options, cache=None if regenerate else self.cache,
                    reranker=self.api.reranker, scope=("access", access.key()),
                    on_step=(lambda s: emit("step", s)) if emit else None,
                    on_token=(lambda t: emit("token", {"text": t})) if emit else None,
                    on_provenance=(lambda ids: emit("provenance", {"kbs": ids})) if emit else None,
                    on_stage=on_stage if emit else None)
                out = result.to_dict()
                t1 = time.perf_counter()
                checked = check_output(out, store)
                stages["guard_out"] = _ms(t1)
            except LocalKBError as err:
                raise fail(err) from None
            trace = out["trace"]
            stages.update({s: trace.get("stages_ms", {}).get(s, 0.0)
                           for s in ("rewrite", "embed", "vector", "keyword", "fuse", "rerank",
                                     "generate")})
            stages["cache"] = round(max(0.0, trace.get("total_ms", 0.0) - sum(
                trace.get("stages_ms", {}).values())), 3) if result.cached else 0.0
            t1 = time.perf_counter()
            searched = [s["kb"] for s in out["statuses"] if s["status"] not in ("skipped",)]
            log_id = self.log.record(
                access, address=address, kind="team-chat", query=message, kbs=searched,
                outcome="answered", cache=result.cached or None, stages=stages,
                rerank=trace.get("rerank") or None, citations=out["citations"],
                model=out["model"], total_ms=_ms(started))
            stages["log"] = _ms(t1)
            out["pipeline"] = {
                "access": access.public(), "log_id": log_id, "limits": limits,
                "stages": [{"stage": s, "ms": stages.get(s, 0.0)} for s in STAGE_ORDER],
                "total_ms": _ms(started),
                "cache": {"tier": result.cached or None, "cosine": trace["cache"].get("cosine"),
                          "semantic_threshold": self.config.semantic_threshold},
                "rerank": _rerank_view(trace.get("rerank") or {}, self.api.reranker),
                "guard": checked, "location": endpoint_location(self.config.endpoint)}
            return out

        if not stream:
            return turn()

        def run(emit) -> None:
            try:
                emit("result", turn(emit))
            except LocalKBError as err:
                emit("error", err.to_dict())

        return EventStream(run, self.config.sse_newline)


def _rerank_view(per_kb: dict, reranker) -> dict:
    rows = []
    cost = 0
    for kb_id, info in per_kb.items():
        cost += int(info.get("scored", 0))
        rows += [{"kb": kb_id, **r} for r in info.get("order", [])]
    return {"configured": reranker is not None, "model": getattr(reranker, "name", None),
            "scored": cost, "top": getattr(reranker, "top", None), "order": rows}


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
