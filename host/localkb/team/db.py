"""The connection pool to the team's PostgreSQL, and the mapping of its errors onto ours.

Any PostgreSQL >= 15 with pgvector >= 0.8 works, given by URL; the embedded one
(``team.embedded``) is one such URL. Connections come from a ``psycopg_pool`` pool with
pgvector's binary adapter registered, and each ``tx()`` is one transaction: all of it
lands, or none of it. A database that cannot be reached is ``TeamUnavailable``, never
an empty answer.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from localkb.errors import StoreError, TeamBusy, TeamUnavailable


def _configure(conn: psycopg.Connection) -> None:
    from pgvector.psycopg.vector import register_vector_info
    from psycopg.types import TypeInfo

    info = TypeInfo.fetch(conn, "vector")
    if info is None:
        raise TeamUnavailable("the pgvector extension is missing from the team database")
    register_vector_info(conn, info)
    # Every execution is planned for its values: psycopg prepares a statement after five runs,
    # and PostgreSQL's generic plan for the vector query can drop the HNSW index for a sort
    # (130 ms instead of 10 ms, for the life of the connection).
    conn.execute("SET plan_cache_mode = force_custom_plan")
    conn.commit()


def mapped(err: psycopg.Error) -> Exception:
    """Our error for a PostgreSQL one: unreachable -> TeamUnavailable, anything else -> StoreError.

    Unreachable: not connected, the connection lost or closed (mid-read or mid-write alike),
    the server shutting down, no connection to be had (``PoolTimeout`` while PostgreSQL takes
    no new connection; while it does, every pooled one is busy: ``TeamBusy``, in ``conn``).
    """
    if isinstance(err, psycopg.OperationalError | psycopg.InterfaceError):
        return TeamUnavailable(f"the team database cannot be reached: {str(err).strip()[:500]}")
    return StoreError(f"the team database refused the statement: {str(err).strip()[:500]}")


class Database:
    """A pool of connections to one team database, plus small caches keyed by generation."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 16,
                 timeout: float = 30.0, wait: float | None = None) -> None:
        from psycopg_pool import ConnectionPool

        from localkb.team.schema import check_server, migrate
        from localkb.team.store import reanalyze

        self.url = url
        try:
            with psycopg.connect(url, connect_timeout=15) as conn:
                self.server = check_server(conn)
                self.applied = migrate(conn)
                self.reanalyzed = reanalyze(conn)
        except psycopg.Error as err:
            raise mapped(err) from err
        # check: each connection is tried as it is handed out, so one PostgreSQL closed while
        # idle in the pool (a restart, a failover) is replaced, never served to a request.
        self.pool = ConnectionPool(url, min_size=min_size, max_size=max_size, timeout=timeout,
                                   configure=_configure, kwargs={"row_factory": dict_row},
                                   check=ConnectionPool.check_connection, open=False,
                                   name="localkb-team")
        try:
            self.pool.open(wait=True, timeout=timeout)
        except Exception as err:
            raise TeamUnavailable(f"the team database pool did not open: {err}") from err
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        self._cache_lock = threading.Lock()
        #: How long a request waits for a pooled connection before it is refused (``team_busy``).
        self.wait = timeout if wait is None else wait
        self._probe_lock = threading.Lock()
        self._probed: tuple[float, bool] = (-1e9, True)
        #: Called with the seconds each checkout waited (``team.metrics``); None: not measured.
        self.on_wait: Callable[[float], None] | None = None

    @contextmanager
    def conn(self) -> Iterator[psycopg.Connection]:
        """A connection from the pool, for reads (autocommit off: one implicit transaction)."""
        from psycopg_pool import PoolTimeout

        started = time.perf_counter()
        try:
            with self.pool.connection(timeout=self.wait) as conn:
                if self.on_wait is not None:
                    self.on_wait(time.perf_counter() - started)
                yield conn
        except PoolTimeout as err:
            if self.on_wait is not None:
                self.on_wait(time.perf_counter() - started)
            if not self._reachable():
                raise mapped(err) from err
            raise TeamBusy(f"every one of the {self.pool.max_size} database connections stayed busy "
                           f"for {self.wait:g} s", detail={"retry_after_s": max(1, round(self.wait))}
                           ) from err
        except psycopg.Error as err:
            raise mapped(err) from err

    def _reachable(self) -> bool:
        """Whether PostgreSQL takes a new connection (asked at most once a second, on a pool timeout)."""
        now = time.monotonic()
        with self._probe_lock:
            if now - self._probed[0] >= 1.0:
                try:
                    with psycopg.connect(self.url, connect_timeout=3):
                        ok = True
                except psycopg.Error:
                    ok = False
                self._probed = (now, ok)
            return self._probed[1]

    @contextmanager
    def tx(self) -> Iterator[psycopg.Connection]:
        """One write transaction."""
        with self.conn() as conn, conn.transaction():
            yield conn

    # -- a small cache of per-generation figures (passage counts, document frequencies) ----
    def cached(self, key: tuple, compute) -> Any:
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        value = compute()
        self.put(key, value)
        return value

    def peek(self, key: tuple) -> Any:
        with self._cache_lock:
            return self._cache.get(key)

    def put(self, key: tuple, value: Any) -> None:
        with self._cache_lock:
            self._cache[key] = value
            while len(self._cache) > 20_000:
                self._cache.popitem(last=False)

    def close(self) -> None:
        self.pool.close()
