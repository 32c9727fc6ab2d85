"""The team server's HTTP API: JSON over HTTP/1.1, a bearer token on every request but ``/v1/health``.

Thin by design (the host handlers' twin): each route checks its input, builds the
asking user's view of the store (``TeamStore.for_access``: their grants and
clearances, read from the database for this request), and calls the same core as the
local product — the ingest pipeline, the Searcher, the ``.awkb`` export and import.

Replies have the host protocol's shape: ``{"ok": true, "result": …}`` or
``{"ok": false, "error": {"code", "message", "detail"?}}`` with an HTTP status that
matches the code (400 invalid_input, 401 unauthorized, 403 forbidden, 404 *_not_found,
409 conflict, 411/413 for a missing or oversized body, 421 host_not_allowed, 503
team_unavailable and embedding_unavailable). Bodies are read only up to their cap; nothing
past it is read. The Host header is checked first (``hosts.py``: DNS rebinding).

    GET    /v1/health[/ready]                      no token: name, version, database; 503 while it is down
    GET    /v1/health/live                         no token: 200 while the process serves
    GET    /metrics                                no token: Prometheus text (``team/metrics.py``)
    GET    /v1/openapi.json                        no token: this API as OpenAPI 3.1 (``team/openapi.py``)
    GET    /v1/me                                  the caller and their access
    GET    /v1/kbs                                 knowledge bases the caller is granted
    POST   /v1/kbs                                 admin: {name, privacy?, model?, default_access?}
    PATCH  /v1/kbs/{kb}                            admin: {name?, privacy?, default_access?}
    DELETE /v1/kbs/{kb}                            admin
    POST   /v1/search                              {kbs, query, k?, mode?, cutoff?, per_source?, ...}
    GET    /v1/kbs/{kb}/sources?offset=&limit=     the sources the caller may see
    POST   /v1/kbs/{kb}/sources                    {url?, title?, html|text|pdf_base64, access?}: report
                                                   (or file_base64 with file_name: any type add reads)
    PATCH  /v1/kbs/{kb}/sources/{source}           {access}
    DELETE /v1/kbs/{kb}/sources/{source}
    GET    /v1/kbs/{kb}/passages?source=&index=&radius=   a passage with its neighbours
    GET    /v1/kbs/{kb}/export                     the .awkb file of what the caller may see
    POST   /v1/import?name=&access=                admin: an .awkb file as the body, a new knowledge base
    GET    /v1/errors?source=&kb=&offset=&limit=   admin: the server's error log
    POST   /v1/chat, GET /v1/querylog[/export], GET /pipeline   team chat (``team/chat.py``)
    GET    /v1/audit?offset=&limit=                admin: the audit log (``team/audit.py``)

Every reply carries ``X-Request-Id``; each request is one JSON line of the access log
(``team/accesslog.py``) and is counted in ``/metrics``.

Hooks for issue 20 (team chat): every request passes through ``TeamAPI.dispatch`` with
the caller's ``Access`` (whose ``key()`` is the cache key part of an access set), so
rate limits, guardrails, a query log and caches sit in one place.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import psycopg

from localkb import __version__
from localkb.answer.privacy import endpoint_location
from localkb.config import Settings
from localkb.errors import (
    InvalidInput,
    LocalKBError,
    ProtocolError,
    TeamUnavailable,
    TooLarge,
)
from localkb.inputs import b64_bytes, parse_object, req_bool, req_int, req_kbs, req_str
from localkb.team import accesslog, proxies
from localkb.team.access import Access, Directory, level_of, require_admin
from localkb.team.admin import TeamAdmin
from localkb.team.db import Database, mapped
from localkb.team.hosts import HostNames
from localkb.team.metrics import Metrics
from localkb.team.openapi import template
from localkb.team.schema import LEVELS
from localkb.team.store import TeamStore

log = logging.getLogger("localkb.team")

API_VERSION = 1
MAX_JSON_BYTES = 64 * 1024 * 1024 + 1024 * 1024  # a 64 MiB page plus its envelope
MAX_TEXT = 64 * 1024 * 1024
MAX_IMPORT_BYTES = 512 * 1024 * 1024
SOCKET_TIMEOUT_S = 120
#: On SIGTERM, how long requests already being answered get to finish before the pool closes.
DRAIN_SECONDS = 60

STATUS = {
    "invalid_input": 400, "invalid_document": 400, "invalid_archive": 400, "protocol_error": 400,
    "too_large": 413, "unauthorized": 401, "forbidden": 403, "not_found": 404, "kb_not_found": 404,
    "source_not_found": 404, "conflict": 409, "nothing_written": 422, "model_mismatch": 409,
    "team_unavailable": 503, "embedding_unavailable": 503, "index_unavailable": 503,
    "team_busy": 503, "schema_too_new": 503,
    "store_error": 500, "cancelled": 499, "rate_limited": 429, "guardrail_blocked": 422,
    "host_not_allowed": 421, "origin_not_allowed": 403,
}


class Request:
    """One parsed request: method, path parts, query, body, the caller."""

    def __init__(self, method: str, path: str, query: dict[str, list[str]], headers, body_reader,
                 *, json_cap: int = MAX_JSON_BYTES) -> None:
        self.method = method
        self.json_cap = json_cap
        self.parts = [unquote(p) for p in path.strip("/").split("/") if p]
        self.query = query
        self.headers = headers
        self._read_body = body_reader
        self.access: Access | None = None
        #: The matched route's template (``/v1/kbs/{kb}``), for metrics and the access log.
        self.route = "unmatched"
        #: The client's IP address (the socket's peer; a proxy in front is that address).
        self.address: str | None = None

    def arg(self, name: str, *, max_len: int = 8192) -> str | None:
        values = self.query.get(name)
        if not values:
            return None
        if len(values) > 1 or len(values[0]) > max_len:
            raise InvalidInput(f"query parameter {name!r} must be given once, at most {max_len} "
                               "characters", detail={"field": name})
        return values[0]

    def int_arg(self, name: str, default: int, *, lo: int, hi: int) -> int:
        raw = self.arg(name, max_len=20)
        if raw is None:
            return default
        if not re.fullmatch(r"-?\d{1,19}", raw) or not lo <= int(raw) <= hi:
            raise InvalidInput(f"{name!r} must be an integer from {lo} to {hi}", detail={"field": name})
        return int(raw)

    def json(self) -> dict:
        return parse_object(self._read_body(self.json_cap))

    def raw(self, limit: int) -> bytes:
        return self._read_body(limit)


def _ident(value: str, what: str) -> str:
    """A path segment naming a knowledge base or a source: ids only, or a name for a knowledge base."""
    if not value or len(value) > 200 or any(ord(c) < 32 for c in value):
        raise InvalidInput(f"{what} must be 1-200 characters without control characters",
                           detail={"field": what})
    return value


class TeamAPI:
    """The routes, over one database; each call sees the store as its caller does."""

    def __init__(self, db: Database, settings: Settings, *, name: str = "team",
                 max_import_bytes: int = MAX_IMPORT_BYTES, max_json_bytes: int = MAX_JSON_BYTES,
                 chat=None, allowed_hosts: tuple[str, ...] = (),
                 trusted_proxies: tuple[str, ...] = ()) -> None:
        self.db = db
        #: This server process, named on query-log and audit rows (several may share a database).
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.metrics = Metrics()
        db.on_wait = lambda s: self.metrics.observe("localkb_team_pool_wait_seconds", s)
        self.metrics.gauges["localkb_team_pool_connections"] = self._pool_gauges
        #: The Host names answered beside loopback ones (``hosts.py``: DNS rebinding).
        self.hosts = HostNames.of(allowed_hosts)
        #: Proxies whose X-Forwarded-For is believed (``team/proxies.py``).
        self.trusted_proxies = proxies.networks(trusted_proxies)
        self.settings = settings
        self.name = name
        self.directory = Directory(db, actor="server", instance=self.instance)
        self.system = TeamStore(db, settings, Access.system())
        self.max_import_bytes = max_import_bytes
        self.max_json_bytes = max_json_bytes
        #: The cross-encoder for the top 50 (``retrieval.search.Reranker``); None: no rerank stage.
        self.reranker = None
        self.routes: list[tuple[str, tuple[str, ...], Callable[..., Any], bool]] = [
            ("GET", ("v1", "health"), self.health, False),
            ("GET", ("v1", "health", "ready"), self.health, False),
            ("GET", ("v1", "health", "live"), self.live, False),
            ("GET", ("metrics",), self.metrics_text, False),
            ("GET", ("v1", "openapi.json"), self.openapi, False),
            ("GET", ("v1", "me"), self.me, True),
            ("GET", ("v1", "kbs"), self.kb_list, True),
            ("POST", ("v1", "kbs"), self.kb_create, True),
            ("PATCH", ("v1", "kbs", "*"), self.kb_update, True),
            ("DELETE", ("v1", "kbs", "*"), self.kb_delete, True),
            ("POST", ("v1", "search"), self.search, True),
            ("GET", ("v1", "kbs", "*", "sources"), self.source_list, True),
            ("POST", ("v1", "kbs", "*", "sources"), self.source_add, True),
            ("PATCH", ("v1", "kbs", "*", "sources", "*"), self.source_update, True),
            ("DELETE", ("v1", "kbs", "*", "sources", "*"), self.source_remove, True),
            ("GET", ("v1", "kbs", "*", "passages"), self.passages, True),
            ("GET", ("v1", "kbs", "*", "export"), self.export, True),
            ("POST", ("v1", "import"), self.import_, True),
            ("GET", ("v1", "errors"), self.errors, True),
        ]
        from localkb.team.chat import ChatConfig, TeamChat

        #: Team chat (``team/chat.py``): its routes join these; ``chat`` is its ``ChatConfig``.
        self.chat = TeamChat(self, chat or ChatConfig())
        self.chat.log.observe = self.metrics.query
        self.routes += self.chat.routes()
        #: The administrators' page and its API (``team/admin.py``).
        self.admin = TeamAdmin(self)
        self.routes += self.admin.routes()
        from localkb.team.audit import AuditLog

        #: Administrative changes (``team/audit.py``): written by the routes and the CLI.
        self.audit = AuditLog(db, instance=self.instance)
        self.routes.append(("GET", ("v1", "audit"), self.audit_list, True))

    # -- dispatch -------------------------------------------------------------------------
    def dispatch(self, req: Request) -> tuple[int, Any]:
        """(HTTP status, result): a dict for JSON, or (bytes, headers) for a file."""
        self.hosts.check(req.method, req.headers)  # before any route or token is looked at
        known_path = False
        for method, pattern, fn, auth in self.routes:
            if len(pattern) != len(req.parts) or not all(
                    p in ("*", q) for p, q in zip(pattern, req.parts, strict=True)):
                continue
            known_path = True
            if method != req.method:
                continue
            req.route = template(pattern)
            if auth:
                req.access = self.directory.authenticate(_bearer(req.headers.get("Authorization")))
            args = [req.parts[i] for i, p in enumerate(pattern) if p == "*"]
            try:
                return 200, fn(req, *args)
            except psycopg.Error as err:  # one that a store path let through: mapped all the same
                raise mapped(err) from err
        if known_path:
            raise InvalidInput(f"{req.method} is not allowed here", detail={"reason": "method"})
        raise _NoRoute(f"no such endpoint: {req.method} /{'/'.join(req.parts)}")

    def store(self, req: Request, *, write_level: int | None = None) -> TeamStore:
        view = self.system.for_access(req.access)
        view.write_level = write_level
        return view

    # -- routes ---------------------------------------------------------------------------
    def live(self, req: Request) -> dict:
        """Liveness: the process serves requests (the database is not asked)."""
        return {"live": True, "name": self.name, "version": __version__, "instance": self.instance}

    def health(self, req: Request) -> dict:
        """Readiness: 503 ``team_unavailable`` while the database cannot be reached."""
        out = {"name": self.name, "version": __version__, "api": API_VERSION, "server": "localkb-team"}
        endpoint = self.chat.config.endpoint
        out["chat"] = {"model": None if endpoint is None else endpoint.model,
                       "location": endpoint_location(endpoint) if endpoint else None,
                       "rerank": self.reranker is not None,
                       "semantic_cache": self.chat.config.semantic_threshold}
        try:
            with self.db.conn() as conn:
                conn.execute("SELECT 1")
        except LocalKBError as err:
            raise TeamUnavailable(f"not ready: {err}", detail={**out, "database": {
                "ok": False, "error": err.to_dict()}}) from err
        out["database"] = {"ok": True, **self.db.server}
        return out

    def metrics_text(self, req: Request) -> tuple[bytes, dict]:
        """The server's figures in Prometheus text format."""
        return self.metrics.render().encode(), {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

    def openapi(self, req: Request) -> tuple[bytes, dict]:
        """This API as an OpenAPI document (built from the route table)."""
        from localkb.team.openapi import document

        doc = document(self.routes, title=f"LocalKB team server {self.name!r}", version=__version__)
        return json.dumps(doc).encode(), {"Content-Type": "application/json"}

    def _pool_gauges(self) -> dict:
        stats = self.db.pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        return {(("state", "busy"),): size - idle, (("state", "idle"),): idle,
                (("state", "waiting"),): stats.get("requests_waiting", 0)}

    def audit_list(self, req: Request) -> dict:
        """Admin: the audit log, newest first."""
        require_admin(req.access)
        rows, total = self.audit.list(offset=req.int_arg("offset", 0, lo=0, hi=10**9),
                                      limit=req.int_arg("limit", 50, lo=1, hi=1000))
        return {"audit": rows, "total": total}

    def me(self, req: Request) -> dict:
        return {"team": self.name, **req.access.public()}

    def kb_list(self, req: Request) -> dict:
        store = self.store(req)
        return {"team": self.name,
                "knowledge_bases": [{**store.describe(r), "team": self.name} for r in store.kbs()]}

    def kb_create(self, req: Request) -> dict:
        require_admin(req.access)
        data = req.json()
        default = data.get("default_access")
        rec = self.store(req).create_kb(
            req_str(data, "name", max_len=80), privacy=req_str(data, "privacy", required=False) or "device",
            model=req_str(data, "model", required=False, max_len=100),
            default_access=level_of(default) if default is not None else 0)
        self.audit.record(req.access.user, "kb.create", rec.id, {"name": rec.name, "privacy": rec.privacy})
        return {"knowledge_base": self.system.describe(rec)}

    def kb_update(self, req: Request, kb: str) -> dict:
        data = req.json()
        default = data.get("default_access")
        rec = self.store(req).update_kb(
            _ident(kb, "kb"), name=req_str(data, "name", required=False, max_len=80),
            privacy=req_str(data, "privacy", required=False),
            default_access=level_of(default) if default is not None else None)
        self.audit.record(req.access.user, "kb.update", rec.id, {
            k: data[k] for k in ("name", "privacy", "default_access") if k in data})
        return {"knowledge_base": self.system.describe(rec)}

    def kb_delete(self, req: Request, kb: str) -> dict:
        rec = self.store(req).delete_kb(_ident(kb, "kb"))
        self.audit.record(req.access.user, "kb.delete", rec.id, {"name": rec.name})
        return {"deleted": rec.id, "name": rec.name}

    def search(self, req: Request) -> dict:
        from localkb.retrieval.search import Searcher

        data = req.json()
        cutoff = data.get("cutoff")
        if cutoff is not None and (isinstance(cutoff, bool) or not isinstance(cutoff, int | float)
                                   or not -1.0 <= cutoff <= 1.0):
            raise InvalidInput("'cutoff' must be a number from -1 to 1", detail={"field": "cutoff"})
        floor = req_bool(data, "floor", True)
        started = time.perf_counter()
        # Counted like a chat (the per-minute caps) before anything runs, and logged after it.
        self.chat.limiter.take(req.access.user_id, req.address, kind="search")
        res = Searcher(self.store(req), reranker=self.reranker).search(
            req_kbs(data), req_str(data, "query", max_len=4000), k=req_int(data, "k", 8, lo=1, hi=100),
            mode=req_str(data, "mode", required=False, max_len=20) or "hybrid", cutoff=cutoff,
            floor=floor, per_source=req_int(data, "per_source", 0, lo=0, hi=100) or None,
            rerank=self.reranker is not None)
        for trace in res.trace.get("kbs", {}).values():
            self.metrics.stages_ms({k: v for k, v in trace.items() if k.endswith("_ms")}, "search_")
        out = res.to_dict()
        self.chat.log.record(
            req.access, address=req.address, kind="team-search", query=res.query,
            kbs=[st["kb"] for st in out["statuses"] if st["status"] != "skipped"], outcome="answered",
            citations=[{"n": i, **h} for i, h in enumerate(out["hits"], 1)],
            total_ms=(time.perf_counter() - started) * 1000)
        if req_bool(data, "include_weaker"):
            out["hits"] = out["hits"] + out["weaker"]
        out["team"] = self.name
        return out

    def source_list(self, req: Request, kb: str) -> dict:
        handle = self.store(req).open_kb(_ident(kb, "kb"))
        rows, total = handle.list_sources(offset=req.int_arg("offset", 0, lo=0, hi=10**9),
                                          limit=req.int_arg("limit", 100, lo=1, hi=10_000))
        return {"sources": rows, "total": total}

    def source_add(self, req: Request, kb: str) -> dict:
        from localkb.ingest.pipeline import CAPTURED_BY, add_capture

        data = req.json()
        access = data.get("access")
        level = level_of(access) if access is not None else None
        handle = self.store(req).open_kb(_ident(kb, "kb"), write_level=level)
        handle.check_writable()
        captured_by = req_str(data, "captured_by", required=False, max_len=40) or "api"
        if captured_by not in CAPTURED_BY:
            raise InvalidInput(f"captured_by must be one of {', '.join(CAPTURED_BY)}",
                               detail={"field": "captured_by"})
        report = add_capture(
            handle, url=req_str(data, "url", required=False, max_len=8192),
            title=req_str(data, "title", required=False, max_len=2000, allow_empty=True),
            html=req_str(data, "html", required=False, max_len=MAX_TEXT),
            text=req_str(data, "text", required=False, max_len=MAX_TEXT),
            pdf=b64_bytes(data, "pdf_base64"), file=b64_bytes(data, "file_base64"),
            file_name=req_str(data, "file_name", required=False, max_len=1000), captured_by=captured_by,
            canonical_url=req_str(data, "canonical_url", required=False, max_len=8192),
            lang=req_str(data, "lang", required=False, max_len=35))
        out = {**report.to_dict(), "kb": handle.id, "kb_name": handle.record.name}
        if level is not None and report.status == "unchanged" and report.source_id:
            # The text did not change, the level may have: it is set all the same.
            handle.set_access(report.source_id, level)
        out["access"] = handle.source_access(report.source_id) if report.source_id else None
        return out

    def source_update(self, req: Request, kb: str, source: str) -> dict:
        data = req.json()
        if "access" not in data:
            raise InvalidInput("'access' is required", detail={"field": "access"})
        handle = self.store(req).open_kb(_ident(kb, "kb"))
        out = handle.set_access(_ident(source, "source"), level_of(data["access"]))
        self.audit.record(req.access.user, "source.access", f"{handle.id}/{source}",
                          {"access": data["access"]})
        return out

    def source_remove(self, req: Request, kb: str, source: str) -> dict:
        handle = self.store(req).open_kb(_ident(kb, "kb"))
        return handle.remove_source(_ident(source, "source"))

    def passages(self, req: Request, kb: str) -> dict:
        store = self.store(req)
        rec = store.resolve(_ident(kb, "kb"))
        source = req.arg("source", max_len=200)
        if not source:
            raise InvalidInput("'source' is required", detail={"field": "source"})
        rows = store.passage_window(rec.id, source, req.int_arg("index", 0, lo=0, hi=10**7),
                                    req.int_arg("radius", 1, lo=0, hi=5))
        return {"passages": rows}

    def export(self, req: Request, kb: str) -> tuple[bytes, dict]:
        from localkb.portable.archive import SUFFIX, export_kb

        handle = self.store(req).open_kb(_ident(kb, "kb"))
        with tempfile.TemporaryFile() as fh:
            report = export_kb(handle, fh)
            fh.seek(0)
            body = fh.read()
        name = (re.sub(r"[^\w.-]+", "-", handle.record.name).strip("-.") or "knowledge-base") + SUFFIX
        return body, {"Content-Type": "application/gzip",
                      "Content-Disposition": f'attachment; filename="{name}"',
                      "X-LocalKB-Sources": str(report.sources), "X-LocalKB-Chunks": str(report.chunks),
                      "X-LocalKB-SHA256": report.sha256, "X-LocalKB-Model": report.model}

    def import_(self, req: Request) -> dict:
        from localkb.portable.archive import Limits, import_kb

        require_admin(req.access)
        access = req.arg("access", max_len=20)
        level = level_of(access) if access is not None else 0
        name = req.arg("name", max_len=80)
        raw = req.raw(self.max_import_bytes)
        if not raw:
            raise InvalidInput("the body must be an .awkb file", detail={"field": "body"})
        store = self.store(req, write_level=level)
        with tempfile.TemporaryFile() as fh:
            fh.write(raw)
            fh.seek(0)
            report = import_kb(store, fh, name=name,
                               limits=Limits(max_compressed=self.max_import_bytes))
        self.audit.record(req.access.user, "kb.import", str(report.to_dict().get("kb")),
                          {"name": name, "access": LEVELS[level]})
        return {**report.to_dict(), "access": LEVELS[level]}

    def errors(self, req: Request) -> dict:
        rows, total = self.store(req).errors(
            source=req.arg("source", max_len=40), kb=req.arg("kb", max_len=200) or None,
            offset=req.int_arg("offset", 0, lo=0, hi=10**9), limit=req.int_arg("limit", 20, lo=1, hi=200))
        return {"errors": rows, "total": total}


class _NoRoute(LocalKBError):
    code = "not_found"


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _handler_class(api: TeamAPI):
    class Handler(BaseHTTPRequestHandler):
        server_version = f"localkb-team/{__version__}"
        protocol_version = "HTTP/1.1"
        timeout = SOCKET_TIMEOUT_S

        def log_message(self, format: str, *args) -> None:
            log.info("%s %s", self.address_string(), format % args)

        def _read_body(self, limit: int) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                raise _LengthRequired("send the body with a Content-Length, not chunked")
            raw = self.headers.get("Content-Length")
            if raw is None:
                return b""
            if not raw.isdigit():
                raise ProtocolError("Content-Length is not a number", detail={"reason": "length"})
            length = int(raw)
            if length > limit:
                self.close_connection = True  # the body is left unread: this connection is done
                raise TooLarge(f"the body is {length:,} bytes, over the {limit:,}-byte cap",
                               detail={"limit": limit})
            data = self.rfile.read(length)
            if len(data) != length:
                raise ProtocolError("the body ended early", detail={"reason": "short_body"})
            self._body_read = True
            return data

        def _handle(self) -> None:
            with self.server.inflight_lock:
                self.server.inflight += 1
            try:
                self._handle_one()
            finally:
                with self.server.inflight_lock:
                    self.server.inflight -= 1

        def _handle_one(self) -> None:
            self._body_read = False
            self._started = time.perf_counter()
            self._rid = accesslog.request_id(self.headers.get("X-Request-Id"))
            self._req = None
            split = urlsplit(self.path)
            try:
                query = parse_qs(split.query, keep_blank_values=True, max_num_fields=50,
                                 strict_parsing=False)
                req = self._req = Request(self.command, split.path, query, self.headers, self._read_body,
                                          json_cap=api.max_json_bytes)
                req.address = proxies.client_address(self.client_address[0],
                                                     self.headers.get_all("X-Forwarded-For"),
                                                     api.trusted_proxies)
                status, result = api.dispatch(req)
            except LocalKBError as err:
                status = 411 if isinstance(err, _LengthRequired) else STATUS.get(err.code, 500)
                if isinstance(err, _NoRoute):
                    status = 404
                result = {"ok": False, "error": err.to_dict()}
                retry = (err.detail or {}).get("retry_after_s")  # rate_limited, team_busy
                if retry:
                    result = (json.dumps(result).encode(), {
                        "Content-Type": "application/json; charset=utf-8", "Retry-After": str(retry)})
            except ValueError as err:  # parse_qs with too many fields
                status, result = 400, {"ok": False, "error": InvalidInput(str(err)).to_dict()}
            except Exception as err:  # a bug must not kill the server or leak a trace to the client
                log.exception("unexpected error on %s %s", self.command, split.path)
                status = 500
                result = {"ok": False, "error": {"code": "internal_error",
                                                 "message": f"{type(err).__name__}: the server failed"}}
            else:
                if isinstance(result, dict):
                    result = {"ok": True, "result": result}
                elif not isinstance(result, tuple):  # a stream: its body is read, its reply follows
                    self._reply(status, result)
                    return
            if not self._body_read and self.headers.get("Content-Length", "0") not in ("0", ""):
                self.close_connection = True  # an unread body would be taken for the next request
            self._reply(status, result)

        def _done(self, status: int, result: Any) -> None:
            """Count the request in the metrics and write its access-log line."""
            seconds = time.perf_counter() - self._started
            req = self._req
            route = req.route if req is not None else "unmatched"
            code = None
            if isinstance(result, dict) and not result.get("ok", True):
                code = result["error"].get("code")
            elif status >= 400 and isinstance(result, tuple):
                try:
                    code = json.loads(result[0])["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = None
            api.metrics.request(self.command, route, status, seconds, code)
            accesslog.record(request_id=self._rid, instance=api.instance, method=self.command,
                             route=route, path=urlsplit(self.path).path[:300], status=status,
                             ms=round(seconds * 1000, 2), code=code,
                             user=req.access.user if req is not None and req.access else None,
                             address=self.client_address[0])

        def _stream(self, stream) -> None:
            """Server-Sent Events: headers now, each event as it happens, the connection closed after."""
            self.close_connection = True
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Accel-Buffering", "no")  # a proxy in front must not buffer it
                self.send_header("Connection", "close")
                self.send_header("X-Request-Id", self._rid)
                self.end_headers()
                self.wfile.flush()

                def emit(event: str, data: Any) -> None:
                    self.wfile.write(stream.frame(event, data))
                    self.wfile.flush()

                stream.run(emit)
            except (BrokenPipeError, ConnectionResetError):
                log.info("a chat stream's client went away")
            finally:
                self._done(200, None)

        def _reply(self, status: int, result: Any) -> None:
            from localkb.team.chat import EventStream

            if isinstance(result, EventStream):
                self._stream(result)
                return
            if isinstance(result, tuple):
                body, headers = result
            else:
                body = _json_bytes(result)
                headers = {"Content-Type": "application/json; charset=utf-8"}
            try:
                self._done(status, result)
                headers = {**headers, "X-Request-Id": self._rid}
                known = status in HTTPStatus._value2member_map_
                self.send_response(status, HTTPStatus(status).phrase if known else None)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _handle

    return Handler


def _json_bytes(result: Any) -> bytes:
    try:
        return json.dumps(result, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate from somewhere (a row stored before input was checked): ASCII
        # escapes keep the reply valid UTF-8, and a reply always goes out.
        return json.dumps(result, ensure_ascii=True, default=str).encode("ascii")


class _LengthRequired(ProtocolError):
    pass


class TeamServer(ThreadingHTTPServer):
    """The HTTP server: one thread per connection, daemonic, so a stuck client never blocks exit."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, api: TeamAPI, host: str = "127.0.0.1", port: int = 8765) -> None:
        self.api = api
        self.inflight = 0
        self.inflight_lock = threading.Lock()
        super().__init__((host, port), _handler_class(api))

    def drain(self, timeout: float = DRAIN_SECONDS) -> int:
        """After ``shutdown``: wait for requests already being answered; how many were still running."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.inflight_lock:
                if self.inflight == 0:
                    return 0
            time.sleep(0.05)
        return self.inflight

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def serve(db_url: str | None, *, team_dir, host: str, port: int, name: str, settings: Settings,
          ready: Callable[[str], None] | None = None, stop: threading.Event | None = None,
          chat=None, rerank_model: str | None = None, allowed_hosts: tuple[str, ...] = (),
          trusted_proxies: tuple[str, ...] = (), pool_size: int = 16, pool_wait: float = 10.0) -> None:
    """Run the team server until ``stop`` is set (the CLI sets it on SIGINT/SIGTERM).

    With no ``db_url`` the embedded PostgreSQL in ``team_dir`` is started first and stopped
    after the last request has been answered.
    """
    from localkb.staging import import_staging
    from localkb.team.embedded import EmbeddedPostgres

    import_staging(settings.data_dir).sweep()  # what imports killed with an earlier server left
    pg = None
    if db_url is None:
        pg = EmbeddedPostgres(team_dir)
        if pg.standalone():  # `localkb team db start` runs it for several servers: use, never stop
            db_url, pg = pg.url(), None
        else:
            pg.acquire(wait=True)
            db_url = pg.start()
    try:
        db = Database(db_url, max_size=pool_size, wait=pool_wait)
        try:
            api = TeamAPI(db, settings, name=name, chat=chat, allowed_hosts=allowed_hosts,
                          trusted_proxies=trusted_proxies)
            if rerank_model:
                from pathlib import Path

                from localkb.retrieval.search import Reranker

                api.reranker = Reranker(Path(rerank_model))
            httpd = TeamServer(api, host, port)
            thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                      name="localkb-team-http", daemon=True)
            thread.start()
            if ready is not None:
                ready(httpd.url)
            (stop or threading.Event()).wait()
            httpd.shutdown()  # no new requests; those being answered finish (their writes commit)
            left = httpd.drain()
            if left:
                log.warning("%d requests were still running after %d s; their transactions roll back",
                            left, DRAIN_SECONDS)
            httpd.server_close()
        finally:
            db.close()
    except OSError as err:
        raise TeamUnavailable(f"the team server cannot listen on {host}:{port}: {err}") from err
    finally:
        if pg is not None:
            pg.stop()
            pg.release()

