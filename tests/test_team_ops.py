"""Running the team server for a team: health a load balancer can trust, metrics, a bounded
pool wait, no write per request, an access log with request ids, schema versions checked.

Real PostgreSQL (embedded wheel), a real HTTP server on loopback, raw HTTP from the test.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
from types import SimpleNamespace
from urllib.parse import urlsplit

import psycopg
import pytest

from localkb.team.server import TeamAPI, TeamServer


def _raw(url: str, method: str, path: str, token: str | None = None, body: dict | None = None):
    """(status, headers, body bytes) of one request on a fresh connection."""
    conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=60)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw


def _serve(db, settings):
    api = TeamAPI(db, settings, name="ops")
    httpd = TeamServer(api, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    kb = api.system.create_kb("Handbook")
    api.directory.add_role("staff", "internal")
    api.directory.add_user("alice", roles=["staff"])
    api.directory.add_user("root", admin=True)
    api.directory.grant("staff", kb.id)
    tokens = {u: api.directory.create_token(u)["token"] for u in ("alice", "root")}
    return SimpleNamespace(api=api, httpd=httpd, url=httpd.url, kb=kb, tokens=tokens)


@pytest.fixture
def ops(team_db, settings):
    server = _serve(team_db, settings)
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def test_health_is_503_while_the_database_is_down_and_liveness_stays_200(ops, team_db_url, pg_cluster):
    assert _raw(ops.url, "GET", "/v1/health")[0] == 200
    assert _raw(ops.url, "GET", "/v1/health/ready")[0] == 200
    name = psycopg.conninfo.conninfo_to_dict(team_db_url)["dbname"]
    with psycopg.connect(pg_cluster.url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')  # every connection is cut
    for path in ("/v1/health", "/v1/health/ready"):
        status, _, raw = _raw(ops.url, "GET", path)
        reply = json.loads(raw)
        assert status == 503, (path, status, reply)
        assert reply["ok"] is False and reply["error"]["code"] == "team_unavailable", reply
    status, _, raw = _raw(ops.url, "GET", "/v1/health/live")
    assert status == 200 and json.loads(raw)["result"]["live"] is True


def test_metrics_are_scraped_in_prometheus_text(ops):
    assert _raw(ops.url, "POST", "/v1/search", ops.tokens["alice"],
                {"kbs": [ops.kb.id], "query": "holiday days"})[0] == 200
    assert _raw(ops.url, "GET", "/v1/kbs/nope/sources", ops.tokens["alice"])[0] == 404
    status, headers, raw = _raw(ops.url, "GET", "/metrics")
    text = raw.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4"), headers
    assert 'localkb_team_requests_total{method="POST",route="/v1/search",status="200"} 1' in text, text
    assert 'localkb_team_requests_total{method="GET",route="/v1/kbs/{kb}/sources",status="404"} 1' in text
    assert 'localkb_team_request_seconds_bucket{route="/v1/search",le="+Inf"} 1' in text
    assert "localkb_team_pool_wait_seconds_count" in text
    assert "localkb_team_stage_seconds_bucket{stage=" in text
    assert "# TYPE localkb_team_requests_total counter" in text


def test_a_request_past_the_pool_wait_is_team_busy_with_retry_after(team_db_url, settings):
    from localkb.team.db import Database

    db = Database(team_db_url, max_size=1, wait=0.3)
    server = _serve(db, settings)
    try:
        with db.conn():  # the pool's one connection is held: the next request cannot get one
            status, headers, raw = _raw(server.url, "GET", "/v1/me", server.tokens["alice"])
        reply = json.loads(raw)
        assert status == 503 and reply["error"]["code"] == "team_busy", (status, reply)
        assert headers.get("retry-after", "").isdigit(), headers
        assert _raw(server.url, "GET", "/v1/me", server.tokens["alice"])[0] == 200  # released
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
        db.close()


def test_requests_do_not_write_the_token_each_time(ops, team_db):
    def last_used() -> float | None:
        with team_db.conn() as conn:
            return conn.execute("SELECT t.last_used FROM tokens t JOIN users u ON u.id = t.user_id "
                                "WHERE u.name = 'alice'").fetchone()["last_used"]

    assert _raw(ops.url, "GET", "/v1/me", ops.tokens["alice"])[0] == 200
    first = last_used()
    assert first is not None  # a token's first use is recorded
    assert _raw(ops.url, "GET", "/v1/me", ops.tokens["alice"])[0] == 200
    assert last_used() == first, "the second request wrote last_used again"


def test_every_reply_has_a_request_id_and_one_json_access_log_line(ops, caplog):
    with caplog.at_level(logging.INFO, logger="localkb.team.access"):
        status, headers, _ = _raw(ops.url, "GET", "/v1/me", ops.tokens["alice"])
        assert status == 200
        rid = headers.get("x-request-id")
        assert rid, headers
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "localkb.team.access"]
    mine = [x for x in lines if x["request_id"] == rid]
    assert len(mine) == 1, lines
    assert mine[0]["route"] == "/v1/me" and mine[0]["status"] == 200 and mine[0]["user"] == "alice"
    assert mine[0]["ms"] >= 0 and mine[0]["instance"] == ops.api.instance


def test_query_log_rows_carry_the_instance_that_answered(ops, team_db):
    status, _, _ = _raw(ops.url, "POST", "/v1/chat", ops.tokens["alice"],
                        {"kbs": [ops.kb.id], "message": ""})  # refused, and logged
    assert status == 422
    with team_db.conn() as conn:
        rows = conn.execute("SELECT instance FROM query_log").fetchall()
    assert [r["instance"] for r in rows] == [ops.api.instance]


def test_a_schema_newer_than_the_code_is_refused(team_db_url):
    from localkb.errors import LocalKBError
    from localkb.team.db import Database

    Database(team_db_url).close()
    with psycopg.connect(team_db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO migrations VALUES (9999, 'from a newer release', 0)")
    with pytest.raises(LocalKBError) as err:
        Database(team_db_url)
    assert err.value.code == "schema_too_new", err.value
    assert "9999" in str(err.value)


def test_the_vector_query_is_planned_for_its_values(team_db):
    # A cached generic plan can drop the HNSW index for a sort: every execution is planned anew.
    with team_db.conn() as conn:
        assert conn.execute("SHOW plan_cache_mode").fetchone()["plan_cache_mode"] == "force_custom_plan"


def test_openapi_document_lists_every_route(ops):
    status, _, raw = _raw(ops.url, "GET", "/v1/openapi.json")
    doc = json.loads(raw)
    assert status == 200 and doc["openapi"].startswith("3."), doc
    assert "/v1/kbs/{kb}/sources" in doc["paths"] and "post" in doc["paths"]["/v1/search"]


def test_administrative_changes_are_audited_and_only_admins_read_them(ops):
    status, _, _ = _raw(ops.url, "PATCH", f"/v1/kbs/{ops.kb.id}", ops.tokens["root"],
                        {"default_access": "internal"})
    assert status == 200
    assert _raw(ops.url, "GET", "/v1/audit", ops.tokens["alice"])[0] == 403
    status, _, raw = _raw(ops.url, "GET", "/v1/audit", ops.tokens["root"])
    rows = json.loads(raw)["result"]["audit"]
    actions = [(r["action"], r["actor"]) for r in rows]
    assert ("kb.update", "root") in actions and ("grant", "server") in actions, actions
    assert ("role.add", "server") in actions and ("token.create", "server") in actions, actions
    token_rows = [r for r in rows if r["action"] == "token.create"]
    assert all("lkt_" not in json.dumps(r) for r in token_rows)  # no secret in the log
    assert {r["instance"] for r in rows} == {ops.api.instance}


def test_the_cli_lists_the_audit_log(team_db_url, tmp_path):
    from conftest import run_cli
    from localkb.team.access import Directory
    from localkb.team.db import Database

    db = Database(team_db_url)
    Directory(db, actor="cli:tester").add_role("staff", "internal")
    db.close()
    proc = run_cli(["team", "audit", "list", "--db", team_db_url], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "role.add staff" in proc.stdout and "cli:tester" in proc.stdout, proc.stdout


def test_fuzzing_the_openapi_document_finds_no_5xx_and_one_error_shape(ops):
    """A small bounded schemathesis run over every route, as an admin and with no token."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings

    raw = _raw(ops.url, "GET", "/v1/openapi.json")[2]
    schema = schemathesis.openapi.from_dict(json.loads(raw))
    seen: list[tuple[str, int]] = []

    def fuzz(op) -> None:
        @given(case=op.as_strategy())
        @hsettings(max_examples=4, deadline=None, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))
        def call(case):
            for token in (ops.tokens["root"], None):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                resp = case.call(base_url=ops.url, headers=headers, timeout=60)
                seen.append((op.label, resp.status_code))
                assert resp.status_code < 500, (op.label, case.path_parameters, case.body, resp.text)
                if resp.status_code >= 400:
                    body = resp.json()
                    assert body["ok"] is False and isinstance(body["error"]["code"], str), body
                    assert isinstance(body["error"]["message"], str), body

        call()

    for result in schema.get_all_operations():
        fuzz(result.ok())
    assert len({label for label, _ in seen}) >= 20, seen
