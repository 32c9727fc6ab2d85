"""The team server's query log: one row per chat turn, in PostgreSQL.

Each row keeps who asked (user, client address), the access set the answer was computed
under (knowledge base -> level, as ``Access.public``), the knowledge bases searched, each
stage's latency, the cache tier that answered (``exact`` | ``semantic`` | null), the
rerank order (before/after positions and scores), the answer's citations and the outcome
(``answered`` or the error code that stopped it: ``rate_limited``, ``guardrail_blocked``, …).
An administrator lists and exports every row; any other user sees only their own.

A row is shown through the caller's access as it is now, not as it was when the row was
written: a citation (or a rerank entry) of a passage the caller can no longer see — its
knowledge base's grant revoked, its role's clearance lowered, the source raised or deleted —
is shown as ``[a source you can no longer see]``, its knowledge base, title, URL, position
and ids withheld. No row holds the answer or a passage's text (only the question, which is
the caller's own), so nothing else of a source is kept to withhold. An administrator sees
every knowledge base at every level, and so every row as it was written.
"""

from __future__ import annotations

import csv
import io
import json
import time
from typing import Any

from localkb.errors import InvalidInput
from localkb.team.access import Access
from localkb.team.db import Database

EXPORT_FORMATS = ("jsonl", "csv")
#: What a citation of a passage the caller can no longer see says in its title.
REDACTED = "[a source you can no longer see]"
#: The fields of a citation or rerank entry that name or locate its source.
_SOURCE_FIELDS = ("kb", "kb_name", "title", "url", "chunk_index", "chunk_id", "page", "text")
_COLUMNS = ("id", "at", "user", "address", "kind", "query", "access", "kbs", "outcome", "error_code",
            "cache", "stages", "rerank", "citations", "model", "total_ms", "instance")


class QueryLog:
    def __init__(self, db: Database, *, instance: str | None = None) -> None:
        self.db = db
        #: The server process writing these rows (``TeamAPI.instance``); None from the CLI.
        self.instance = instance
        #: Told of each row written: (kind, cache tier or None, stages in ms) (``team.metrics``).
        self.observe = None

    def record(self, access: Access, *, address: str | None, kind: str, query: str,
               kbs: list[str], outcome: str, error_code: str | None = None,
               cache: str | None = None, stages: dict | None = None, rerank: Any = None,
               citations: list[dict] | None = None, model: dict | None = None,
               total_ms: float = 0.0) -> int:
        cites = [{k: c.get(k) for k in ("n", "kb", "kb_name", "title", "url", "chunk_index",
                                         "chunk_id", "page")} for c in citations or []]
        with self.db.tx() as conn:
            row = conn.execute(
                "INSERT INTO query_log (at, user_id, user_name, address, kind, query, access, kbs, "
                "outcome, error_code, cache, stages, rerank, citations, model, total_ms, instance) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                # PostgreSQL text holds no NUL: a refused message with one is logged with U+FFFD.
                (time.time(), access.user_id, access.user, address, kind,
                 query[:8000].replace("\x00", "\ufffd"),
                 json.dumps(access.public()), json.dumps(kbs), outcome, error_code, cache,
                 json.dumps(stages or {}), json.dumps(rerank) if rerank else None,
                 json.dumps(cites), json.dumps(model) if model else None,
                 float(total_ms), self.instance)).fetchone()
        if self.observe is not None:
            self.observe(kind, cache, stages)
        return int(row["id"])

    def _where(self, access: Access, user: str | None) -> tuple[str, dict]:
        if not access.is_admin:
            if user is not None and user.lower() != access.user.lower():
                # The same refusal whether that user exists or not.
                raise InvalidInput("you can see only your own queries", detail={"field": "user"})
            return "user_id = %(uid)s", {"uid": access.user_id}
        if user is not None:
            return "lower(user_name) = lower(%(user)s)", {"user": user}
        return "TRUE", {}

    def list(self, access: Access, *, user: str | None = None, offset: int = 0,
             limit: int = 50) -> tuple[list[dict], int]:
        where, args = self._where(access, user)
        with self.db.conn() as conn:
            # ``where`` is one of _where's three fixed clauses; values travel as parameters.
            total = conn.execute(f"SELECT count(*) AS n FROM query_log WHERE {where}",  # noqa: S608
                                 args).fetchone()["n"]
            rows = conn.execute(f"SELECT * FROM query_log WHERE {where} ORDER BY id DESC "  # noqa: S608
                                "LIMIT %(l)s OFFSET %(o)s", {**args, "l": limit, "o": offset}
                                ).fetchall()
            visible = _visible_now(conn, access, rows)
        return [_public(r, visible) for r in rows], int(total)

    def export(self, access: Access, fmt: str, *, user: str | None = None) -> bytes:
        """Every row the caller may see, oldest first, as JSON lines or CSV."""
        if fmt not in EXPORT_FORMATS:
            raise InvalidInput(f"format must be one of {', '.join(EXPORT_FORMATS)}",
                               detail={"field": "format"})
        where, args = self._where(access, user)
        with self.db.conn() as conn:
            raw = conn.execute(f"SELECT * FROM query_log WHERE {where} ORDER BY id",  # noqa: S608
                               args).fetchall()
            visible = _visible_now(conn, access, raw)
        rows = [_public(r, visible) for r in raw]
        if fmt == "jsonl":
            return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
        out = io.StringIO()
        # Every field quoted (a quote inside doubled), so no separator or line break in a
        # message can end its cell; every field neutralised, so none becomes a formula.
        writer = csv.writer(out, quoting=csv.QUOTE_ALL)
        writer.writerow(_COLUMNS)
        for r in rows:
            writer.writerow([csv_cell(json.dumps(r[k], ensure_ascii=False)
                                      if isinstance(r[k], dict | list) else r[k]) for k in _COLUMNS])
        return out.getvalue().encode()


#: What makes a spreadsheet read a cell as a formula (OWASP "CSV Injection"): these first,
#: or after leading spaces or quotes, which some spreadsheets strip before they look; their
#: full-width forms too, in case one normalises them (such a cell only gains a ').
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def csv_cell(value: Any) -> str:
    """One CSV field as text a spreadsheet shows as text: a leading ``'`` before a formula start."""
    text = "" if value is None else str(value)
    if text.startswith(_FORMULA_START) or text.lstrip(" \"'").startswith(_FORMULA_START):
        return "'" + text
    return text


def _entries(r: dict) -> list[dict]:
    """The row's citations and rerank entries: every place it names a passage."""
    rerank = r["rerank"] if isinstance(r["rerank"], dict) else {}
    return list(r["citations"] or []) + [e for kb in rerank.values() if isinstance(kb, dict)
                                         for e in kb.get("order", [])]


def _visible_now(conn, access: Access, rows: list[dict]) -> set[str] | None:
    """The passages named in ``rows`` that ``access`` may see now (None: every one, an admin)."""
    if access.everything:
        return None
    ids = list({e.get("chunk_id") for r in rows for e in _entries(r)} - {None})
    if not ids or not access.kbs:
        return set()
    kbs = list(access.kbs)
    return {row["id"] for row in conn.execute(
        "SELECT c.id FROM chunks c JOIN unnest(%s::text[], %s::int[]) AS g(kb, lvl) "
        "ON c.kb_id = g.kb AND c.access_level <= g.lvl WHERE c.id = ANY(%s)",
        (kbs, [access.kbs[k].level for k in kbs], ids))}


def _seen(entry: dict, visible: set[str] | None) -> dict:
    if visible is None or entry.get("chunk_id") in visible:
        return entry
    return {**entry, **{k: None for k in _SOURCE_FIELDS if k in entry}, "title": REDACTED,
            "redacted": True}


def _public(r: dict, visible: set[str] | None) -> dict:
    rerank = r["rerank"]
    if visible is not None and isinstance(rerank, dict):
        rerank = {kb: {**v, "order": [_seen(e, visible) for e in v.get("order", [])]}
                  if isinstance(v, dict) else v for kb, v in rerank.items()}
    return {"id": r["id"], "at": r["at"], "user": r["user_name"], "address": r["address"],
            "kind": r["kind"], "query": r["query"], "access": r["access"], "kbs": r["kbs"],
            "outcome": r["outcome"], "error_code": r["error_code"], "cache": r["cache"],
            "stages": r["stages"], "rerank": rerank,
            "citations": [_seen(c, visible) for c in r["citations"] or []],
            "model": r["model"], "total_ms": r["total_ms"], "instance": r.get("instance")}
