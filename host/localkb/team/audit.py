"""The audit log: who changed what, for every administrative action on the team.

Users, roles, clearances, grants and tokens (``Directory``, written in the change's own
transaction, so a change and its row land together), knowledge bases and source access
levels (the API routes), and imports. A row names the actor (a user over the API, the
operating-system user at the CLI), the action, its target, what changed, and the server
instance. Read with ``GET /v1/audit`` (admin) or ``localkb team audit list``.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localkb.team.db import Database


def write(conn, actor: str, action: str, target: str, detail: dict | None = None, *,
          instance: str | None = None) -> None:
    """One row, in the caller's transaction (secrets never belong in ``detail``)."""
    conn.execute("INSERT INTO audit_log (at, actor, action, target, detail, instance) "
                 "VALUES (%s, %s, %s, %s, %s, %s)",
                 (time.time(), actor[:200], action, target[:400],
                  json.dumps(detail or {}, default=str), instance))


class AuditLog:
    def __init__(self, db: Database, *, instance: str | None = None) -> None:
        self.db = db
        self.instance = instance

    def record(self, actor: str, action: str, target: str, detail: dict | None = None) -> None:
        with self.db.tx() as conn:
            write(conn, actor, action, target, detail, instance=self.instance)

    def list(self, *, offset: int = 0, limit: int = 50) -> tuple[list[dict[str, Any]], int]:
        with self.db.conn() as conn:
            total = conn.execute("SELECT count(*) AS n FROM audit_log").fetchone()["n"]
            rows = conn.execute("SELECT id, at, actor, action, target, detail, instance FROM audit_log "
                                "ORDER BY id DESC LIMIT %s OFFSET %s", (limit, offset)).fetchall()
        return [dict(r) for r in rows], int(total)
