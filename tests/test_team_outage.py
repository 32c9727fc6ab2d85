"""The team server across a PostgreSQL outage: a real server on an embedded PostgreSQL of the
test's own, stopped and started again under it.

Lost mid-write is ``team_unavailable`` (503), as for reads; once PostgreSQL is back, no request
meets a connection the pool held from before the restart.
"""

from __future__ import annotations

import threading

import httpx
import psycopg
import pytest

from conftest import embedded_cluster
from localkb.team.db import Database
from localkb.team.server import TeamAPI
from test_team import _start, seed_acme

POOL = 4


@pytest.fixture
def own_pg():
    """A cluster only this test stops and starts (the session's ``pg_cluster`` serves the rest)."""
    with embedded_cluster("localkb-test-outage-") as pg:
        yield pg


def _call(url: str, token: str, method: str, route: str, body: dict | None = None) -> tuple[int, dict]:
    resp = httpx.request(method, url + route, json=body, timeout=120,
                         headers={"Authorization": f"Bearer {token}"})
    return resp.status_code, resp.json()


def test_postgres_lost_mid_write_is_unavailable_and_a_restart_leaves_no_stale_connection(own_pg, settings):
    db = Database(own_pg.url(), min_size=POOL, max_size=POOL, timeout=5)
    api = TeamAPI(db, settings, name="acme")
    httpd, _ = _start(api)
    try:
        kb, tokens, _holiday, _salary = seed_acme(api, httpd.url)
        bob = tokens["bob"]
        search = {"kbs": [kb.id], "query": "holiday days"}
        # Every pooled connection in use once, so each is held across the restart.
        barrier = threading.Barrier(POOL)

        def busy(_n: int) -> int:
            barrier.wait(timeout=60)
            return _call(httpd.url, bob, "POST", "/v1/search", search)[0]

        threads = [threading.Thread(target=busy, args=(n,)) for n in range(POOL)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert db.pool.get_stats()["pool_size"] == POOL

        # A write stopped in its transaction: the test holds the knowledge base's row lock, the
        # server's writer waits for it, and PostgreSQL goes away under both.
        holder = psycopg.connect(own_pg.url())
        holder.execute("SELECT 1 FROM kbs WHERE id = %s FOR UPDATE", (kb.id,))
        answer: list = []
        writer = threading.Thread(target=lambda: answer.append(_call(
            httpd.url, bob, "POST", f"/v1/kbs/{kb.id}/sources",
            {"title": "Travel policy", "text": "Book trains, not planes."})))
        writer.start()
        with psycopg.connect(own_pg.url(), autocommit=True) as watch:
            for _poll in range(2400):  # a hang guard only
                if watch.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                 "AND query LIKE '%%FOR UPDATE%%' AND pid <> %s",
                                 (holder.info.backend_pid,)).fetchone():
                    break
                assert writer.is_alive(), answer  # the write must be waiting, not done
                watch.execute("SELECT pg_sleep(0.05)")
            else:
                pytest.fail("the server's write never reached the knowledge base's row lock")
        own_pg.stop()
        writer.join(timeout=120)
        holder.close()
        status, reply = answer[0]
        assert (status, reply["error"]["code"]) == (503, "team_unavailable"), (status, reply)
        status, reply = _call(httpd.url, bob, "POST", "/v1/search", search)
        assert (status, reply["error"]["code"]) == (503, "team_unavailable"), (status, reply)

        own_pg.start()
        seen = []
        for n in range(3 * POOL):  # more than the pool holds: reads and writes, in turn
            if n % 3 == 0:
                status, reply = _call(httpd.url, bob, "POST", f"/v1/kbs/{kb.id}/sources",
                                      {"title": f"Note {n}", "text": f"Note number {n} about trains."})
            elif n % 3 == 1:
                status, reply = _call(httpd.url, bob, "POST", "/v1/search", search)
            else:
                status, reply = _call(httpd.url, bob, "GET", f"/v1/kbs/{kb.id}/sources")
            seen.append((n, status, reply.get("error", {}).get("code")))
        assert [s for s in seen if s[1] != 200] == [], seen
        status, reply = _call(httpd.url, bob, "GET", f"/v1/kbs/{kb.id}/sources")
        assert reply["result"]["total"] == 2 + POOL  # the two seeded pages and every note
    finally:
        httpd.shutdown()
        httpd.server_close()
        db.close()
