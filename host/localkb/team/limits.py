"""Caps on team requests, counted in PostgreSQL: per day and per minute, per user, per client
address and for the whole service.

A shared deployment answering through a cloud model pays per question; a cap that lives in
one process's memory would reset on every restart and count nothing across several server
processes. So the caps themselves are rows (``caps``: read on every request, changed with
``localkb team caps set``; the first server's flags only fill in what is missing), and so are
the counters: ``rate_counts`` per UTC day, ``rate_windows`` per minute, each raised by one
``INSERT … ON CONFLICT DO UPDATE … WHERE count < cap`` per scope, so two requests racing for
the last slot cannot both get it, and every scope is taken in one transaction: a request
refused by one cap uses up none of the others.

Daily caps count chat requests (what a cloud model is paid for): per user, per address, and
``service`` for everyone together. Per-minute caps count chat and search alike (load). Every
request counts, cached or not (a cap that skipped cache hits would invite a flood of them).
Refusals are ``RateLimited`` (HTTP 429, ``Retry-After``) with the cap, the scope and the
reset time: the next UTC midnight, or the next minute.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass, fields

from localkb.errors import InvalidInput, RateLimited
from localkb.team.db import Database

#: Per-minute counters older than this are swept (a minute's row is never read after it).
WINDOW_KEEP = dt.timedelta(hours=1)


@dataclass(frozen=True)
class Caps:
    """Requests allowed; 0 switches a cap off. Daily caps count chats, per-minute ones chats and searches."""

    per_user: int = 500
    per_address: int = 2000
    service: int = 0
    per_user_minute: int = 0
    per_address_minute: int = 0


#: The caps' names in the database and on the command line (``user-day`` …).
CAP_NAMES = {"per_user": "user_day", "per_address": "address_day", "service": "service_day",
             "per_user_minute": "user_minute", "per_address_minute": "address_minute"}


def _reset(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day + dt.timedelta(days=1), dt.time(0), tzinfo=dt.UTC)


class RateLimiter:
    """The caps in the database (``defaults`` fill in what is not set there yet) and their counters."""

    def __init__(self, db: Database, defaults: Caps | None = None) -> None:
        self.db = db
        self.defaults = defaults or Caps()

    # -- the caps ------------------------------------------------------------------------
    def seed(self) -> None:
        """Write ``defaults`` for every cap the database does not hold yet (a first start)."""
        with self.db.tx() as conn:
            for field in fields(Caps):
                conn.execute("INSERT INTO caps (name, value, updated_at) VALUES (%s, %s, %s) "
                             "ON CONFLICT (name) DO NOTHING",
                             (CAP_NAMES[field.name], getattr(self.defaults, field.name), time.time()))

    def current(self, conn=None) -> Caps:
        """The caps in force: the database's, ``defaults`` for any it does not hold."""
        if conn is None:
            with self.db.conn() as own:
                return self.current(own)
        held = {r["name"]: int(r["value"]) for r in conn.execute("SELECT name, value FROM caps")}
        return Caps(**{f.name: held.get(CAP_NAMES[f.name], getattr(self.defaults, f.name))
                       for f in fields(Caps)})

    def set(self, name: str, value: int) -> Caps:
        """Change one cap for every server (from their next request)."""
        key = name.replace("-", "_")
        if key not in CAP_NAMES.values():
            known = ", ".join(sorted(n.replace("_", "-") for n in CAP_NAMES.values()))
            raise InvalidInput(f"unknown cap {name!r} (one of {known})", detail={"field": "name"})
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**9:
            raise InvalidInput("a cap is a whole number from 0 (off) to 1,000,000,000",
                               detail={"field": "value"})
        with self.db.tx() as conn:
            conn.execute("INSERT INTO caps (name, value, updated_at) VALUES (%s, %s, %s) "
                         "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, "
                         "updated_at = EXCLUDED.updated_at", (key, value, time.time()))
            return self.current(conn)

    @staticmethod
    def public(caps: Caps) -> dict:
        return {CAP_NAMES[k]: v for k, v in asdict(caps).items()}

    # -- counting ------------------------------------------------------------------------
    def take(self, user_id: str | None, address: str | None, *, kind: str = "chat",
             now: dt.datetime | None = None) -> dict:
        """Count one request (``chat`` or ``search``), or raise ``RateLimited``; what is left."""
        now = now or dt.datetime.now(dt.UTC)
        day = now.date()
        minute = now.replace(second=0, microsecond=0)
        user, addr = user_id or "(server)", address or "(unknown)"
        left: dict[str, int | None] = {}
        with self.db.tx() as conn:
            caps = self.current(conn)
            daily = ([("user", user, caps.per_user), ("address", addr, caps.per_address),
                      ("service", "*", caps.service)] if kind == "chat" else [])
            for scope, key, cap in daily:
                if cap <= 0:
                    left[scope] = None
                    continue
                row = conn.execute(
                    "INSERT INTO rate_counts (scope, key, day, count) VALUES (%s, %s, %s, 1) "
                    "ON CONFLICT (scope, key, day) DO UPDATE SET count = rate_counts.count + 1 "
                    "WHERE rate_counts.count < %s RETURNING count",
                    (scope, key, day, cap)).fetchone()
                if row is None:
                    # Raised inside the transaction: it rolls back, so every count taken just
                    # before is given back.
                    self._refuse(scope, cap, _reset(day), now, which="today's", what="chat requests")
                left[scope] = cap - int(row["count"])
            for scope, key, cap in (("user_minute", user, caps.per_user_minute),
                                    ("address_minute", addr, caps.per_address_minute)):
                if cap <= 0:
                    left[scope] = None
                    continue
                row = conn.execute(
                    "INSERT INTO rate_windows (scope, key, window_start, count) "
                    "VALUES (%s, %s, %s, 1) ON CONFLICT (scope, key, window_start) DO UPDATE "
                    "SET count = rate_windows.count + 1 WHERE rate_windows.count < %s "
                    "RETURNING count", (scope, key, minute, cap)).fetchone()
                if row is None:
                    self._refuse(scope, cap, minute + dt.timedelta(minutes=1), now,
                                 which="this minute's", what="requests")
                if int(row["count"]) == 1:  # a new window: sweep the old ones
                    conn.execute("DELETE FROM rate_windows WHERE window_start < %s",
                                 (minute - WINDOW_KEEP,))
                left[scope] = cap - int(row["count"])
        return {"remaining": left, "reset_at": _reset(day).isoformat()}

    @staticmethod
    def _refuse(scope: str, cap: int, reset: dt.datetime, now: dt.datetime, *, which: str,
                what: str) -> None:
        wait = max(1, int((reset - now).total_seconds() + 0.999))
        who = {"user": "you have", "user_minute": "you have", "service": "this team server has"
               }.get(scope, "this address has")
        raise RateLimited(
            f"{who} used {which} {cap:,} {what}; the cap resets at {reset:%Y-%m-%d %H:%M} UTC "
            f"(in {_span(wait)})",
            detail={"scope": scope, "cap": cap, "reset_at": reset.isoformat(), "retry_after_s": wait})

    def usage(self, *, day: dt.date | None = None, minute: bool = False) -> list[dict]:
        """Today's counts (admin view); with ``minute`` the per-minute windows of the last hour."""
        with self.db.conn() as conn:
            if minute:
                rows = conn.execute("SELECT scope, key, window_start, count FROM rate_windows "
                                    "ORDER BY window_start DESC, count DESC").fetchall()
            else:
                day = day or dt.datetime.now(dt.UTC).date()
                rows = conn.execute("SELECT scope, key, count FROM rate_counts WHERE day = %s "
                                    "ORDER BY count DESC, scope, key", (day,)).fetchall()
        return [dict(r) for r in rows]


def _span(seconds: int) -> str:
    h, rem = divmod(seconds, 3600)
    if h:
        return f"{h} h {rem // 60} min"
    return f"{rem // 60} min" if rem >= 60 else f"{rem} s"
