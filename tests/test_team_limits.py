"""Team limits a company can run with (issue 40, "Limits"): a daily cap on the whole service,
per-minute caps beside the daily ones, searches counted and logged like chats, the client
behind a trusted TLS proxy counted as itself, and caps kept in PostgreSQL so every server
enforces the same ones. Real team servers on embedded PostgreSQL, a loopback model."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest

import test_team_chat
from conftest import run_cli
from localkb.errors import RateLimited
from localkb.team.client import TeamClient
from localkb.team.limits import Caps, RateLimiter
from test_team_chat import QUESTION

make_team = test_team_chat.make_team  # the team chat tests' servers, one per test


def test_a_service_cap_counts_every_user_and_refuses_past_it(make_team):
    team = make_team(caps=Caps(per_user=100, per_address=100, service=3))
    with team.client("alice") as alice, team.client("bob") as bob, team.client("carol") as carol:
        alice.chat([team.kb.id], QUESTION)
        bob.chat([team.kb.id], QUESTION)
        carol.chat([team.kb.id], QUESTION)
        # Before: no such cap; three users each under their own cap could spend without end.
        with pytest.raises(RateLimited) as refused:
            alice.chat([team.kb.id], "Anything else?")
    assert refused.value.detail["scope"] == "service", refused.value.detail


def test_per_minute_caps_sit_beside_the_daily_ones_and_reset_with_the_minute(team_db):
    RateLimiter(team_db, Caps(per_user=100, per_address=100, per_user_minute=2)).seed()
    limiter = RateLimiter(team_db)
    at = dt.datetime(2026, 12, 6, 10, 15, 5, tzinfo=dt.UTC)
    limiter.take("u1", "10.0.0.1", now=at)
    limiter.take("u1", "10.0.0.1", kind="search", now=at + dt.timedelta(seconds=20))
    with pytest.raises(RateLimited) as refused:
        limiter.take("u1", "10.0.0.1", now=at + dt.timedelta(seconds=40))
    assert refused.value.detail["scope"] == "user_minute"
    assert refused.value.detail["retry_after_s"] == 15  # the next minute starts at 10:16:00
    limiter.take("u1", "10.0.0.1", now=at + dt.timedelta(seconds=56))  # a new minute
    limiter.take("u2", "10.0.0.1", now=at + dt.timedelta(seconds=40))  # another user


def test_search_is_counted_and_logged_like_chat(make_team):
    team = make_team(caps=Caps(per_user=100, per_address=100, per_user_minute=1000))
    with team.client("alice") as alice:
        hits = alice.search([team.kb.id], "paid holiday days")
        assert hits["hits"]
        log = alice.querylog()["queries"]
    # Before: searches left no trace in the log and no count against any cap.
    assert log[0]["kind"] == "team-search" and log[0]["query"] == "paid holiday days", log[0]
    assert log[0]["citations"] and log[0]["outcome"] == "answered", log[0]
    usage = {(r["scope"], r["key"]) for r in RateLimiter(team.api.db).usage(minute=True)}
    assert any(scope == "user_minute" for scope, _ in usage), usage


def test_behind_a_trusted_proxy_each_client_counts_as_itself(make_team):
    team = make_team(caps=Caps(per_user=100, per_address=1), trusted_proxies=("127.0.0.1/32",))
    headers = {"Authorization": f"Bearer {team.tokens['alice']}"}
    body = {"kbs": [team.kb.id], "message": QUESTION}
    with httpx.Client(base_url=team.url, trust_env=False) as http:
        for client in ("203.0.113.5", "203.0.113.6"):
            ok = http.post("/v1/chat", json=body, headers={**headers, "X-Forwarded-For": client})
            assert ok.status_code == 200, ok.text
        again = http.post("/v1/chat", json=body, headers={**headers, "X-Forwarded-For": "203.0.113.5"})
        assert again.status_code == 429 and again.json()["error"]["detail"]["scope"] == "address"
        # what a client writes itself is left of what the trusted proxy appended: not believed
        chain = {**headers, "X-Forwarded-For": "198.51.100.9, 203.0.113.7"}
        spoofed = http.post("/v1/chat", json=body, headers=chain)
        assert spoofed.status_code == 200  # counted as 203.0.113.7, the address the proxy saw
    queries = [q["address"] for q in TeamClient(team.url, team.tokens["alice"]).querylog()["queries"]]
    assert set(queries) >= {"203.0.113.5", "203.0.113.6", "203.0.113.7"}, queries


def test_caps_live_in_the_database_and_every_server_enforces_a_change(make_team, tmp_path, team_db_url):
    one = make_team(caps=Caps(per_user=100, per_address=100))
    from test_team_chat import _serve_again

    two = _serve_again(one, one.api.settings, caps=Caps(per_user=50, per_address=50))
    shown = run_cli(["team", "caps", "show", "--db", team_db_url, "--json"], tmp_path / "home")
    assert shown.returncode == 0, shown.stderr
    assert '"user_day": 100' in shown.stdout.replace(" ", "").replace(":", ": "), shown.stdout
    done = run_cli(["team", "caps", "set", "user-day", "1", "--db", team_db_url], tmp_path / "home")
    assert done.returncode == 0, done.stderr
    with one.client("alice") as a, TeamClient(two.url, one.tokens["alice"]) as b:
        a.chat([one.kb.id], QUESTION)
        with pytest.raises(RateLimited):
            b.chat([one.kb.id], QUESTION)
    two.httpd.shutdown()
    two.httpd.server_close()
