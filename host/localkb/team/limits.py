"""Daily caps on team chat, per user and per client address, counted in PostgreSQL.

A shared deployment answering through a cloud model pays per question; a cap that lives in
one process's memory would reset on every restart and count nothing across several server
processes. The counters are rows (``rate_counts``: scope, key, UTC day, count) raised by one
``INSERT … ON CONFLICT DO UPDATE … WHERE count < cap`` per scope, so two requests racing for
the last slot cannot both get it, and both caps are taken in one transaction: a request
refused by the address cap does not use up the user's.

Every chat request counts, cached or not (the checks run before anything else, and a cap
that skipped cache hits would invite a flood of them). Refusals are ``RateLimited`` (HTTP
429, ``Retry-After``) with the cap, the scope and the reset time: the next UTC midnight.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from localkb.errors import RateLimited
from localkb.team.db import Database


@dataclass(frozen=True)
class Caps:
    """Chat requests allowed per UTC day; 0 switches a cap off."""

    per_user: int = 500
    per_address: int = 2000


def _reset(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day + dt.timedelta(days=1), dt.time(0), tzinfo=dt.UTC)


class RateLimiter:
    def __init__(self, db: Database, caps: Caps = Caps()) -> None:
        self.db = db
        self.caps = caps

    def take(self, user_id: str | None, address: str | None, *,
             now: dt.datetime | None = None) -> dict:
        """Count one request, or raise ``RateLimited``; what is left of each cap today."""
        now = now or dt.datetime.now(dt.UTC)
        day = now.date()
        reset = _reset(day)
        wanted = [("user", user_id or "(server)", self.caps.per_user),
                  ("address", address or "(unknown)", self.caps.per_address)]
        left: dict[str, int | None] = {}
        with self.db.tx() as conn:
            for scope, key, cap in wanted:
                if cap <= 0:
                    left[scope] = None
                    continue
                row = conn.execute(
                    "INSERT INTO rate_counts (scope, key, day, count) VALUES (%s, %s, %s, 1) "
                    "ON CONFLICT (scope, key, day) DO UPDATE SET count = rate_counts.count + 1 "
                    "WHERE rate_counts.count < %s RETURNING count",
                    (scope, key, day, cap)).fetchone()
                if row is None:
                    # Raised inside the transaction: it rolls back, so the other scope's
                    # count taken just before is given back.
                    wait = max(1, int((reset - now).total_seconds()))
                    who = "you have" if scope == "user" else "this address has"
                    raise RateLimited(
                        f"{who} used today's {cap:,} chat requests; the cap resets at "
                        f"{reset:%Y-%m-%d %H:%M} UTC (in {_span(wait)})",
                        detail={"scope": scope, "cap": cap, "reset_at": reset.isoformat(),
                                "retry_after_s": wait})
                left[scope] = cap - int(row["count"])
        return {"remaining": left, "reset_at": reset.isoformat()}

    def usage(self, *, day: dt.date | None = None) -> list[dict]:
        """Today's counts (admin view)."""
        day = day or dt.datetime.now(dt.UTC).date()
        with self.db.conn() as conn:
            rows = conn.execute("SELECT scope, key, count FROM rate_counts WHERE day = %s "
                                "ORDER BY count DESC, scope, key", (day,)).fetchall()
        return [dict(r) for r in rows]


def _span(seconds: int) -> str:
    h, rem = divmod(seconds, 3600)
    return f"{h} h {rem // 60} min" if h else f"{max(1, rem // 60)} min"
