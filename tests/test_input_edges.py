"""Both edges that take JSON from outside — the team server's HTTP API and the host's frames —
refuse what cannot be text (a lone surrogate, a NUL) and nesting no request needs with
``invalid_input`` naming the field, through the one parser in ``localkb.inputs``.

Real components: a team server on the embedded PostgreSQL, the host as a subprocess.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import httpx
import pytest

from conftest import run_cli
from hostproc import HostProcess
from localkb.team.client import TeamClient
from localkb.team.server import TeamAPI
from test_team import _counts, _start, seed_acme

#: Raw JSON put where a string belongs: a lone surrogate, a NUL, and 100,000-deep nesting
#: (arrays, then objects) — each a valid JSON text that no real request holds.
BAD = {
    "lone surrogate": '"ab\\ud800cd"',
    "NUL": '"a\\u0000b"',
    "deep arrays": "[" * 100_000 + "]" * 100_000,
    "deep objects": '{"a":' * 100_000 + "1" + "}" * 100_000,
}


@pytest.fixture
def team(team_db, settings):
    """The team server of test_team (Handbook with two pages; alice, bob and root)."""
    api = TeamAPI(team_db, settings, name="acme")
    httpd, _ = _start(api)
    kb, tokens, holiday, _salary = seed_acme(api, httpd.url)
    yield SimpleNamespace(url=httpd.url, kb=kb, tokens=tokens, holiday=holiday)
    httpd.shutdown()
    httpd.server_close()


def _body(base: dict, path: list, raw: str) -> bytes:
    """``base`` as JSON with the value at ``path`` replaced by the raw JSON text ``raw``."""
    data = json.loads(json.dumps(base))
    target = data
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = "@@HERE@@"
    return json.dumps(data).replace('"@@HERE@@"', raw).encode()


def _field(path: list) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def _send(url: str, token: str, method: str, route: str, body: bytes) -> tuple[int, dict]:
    try:
        resp = httpx.request(method, url + route, content=body, timeout=120,
                             headers={"Authorization": f"Bearer {token}",
                                      "Content-Type": "application/json"})
    except httpx.HTTPError as err:
        return 0, {"no reply": f"{type(err).__name__}: {err}"}
    try:
        return resp.status_code, resp.json()
    except ValueError:
        return resp.status_code, {"not json": resp.text[:200]}


def test_team_server_refuses_surrogates_nuls_and_deep_nesting_naming_the_field(team, team_db):
    kb, sid = team.kb.id, team.holiday["source_id"]
    routes = [  # (user, method, route, a valid body, the string fields to spoil)
        ("bob", "POST", "/v1/search", {"kbs": [kb], "query": "holiday", "mode": "hybrid"},
         [["query"], ["mode"], ["kbs", 0]]),
        ("alice", "POST", "/v1/chat", {"kbs": [kb], "message": "How many holiday days?",
                                       "history": [{"role": "user", "content": "hello"}]},
         [["message"], ["history", 0, "content"], ["kbs", 0]]),
        ("root", "POST", "/v1/kbs", {"name": "Fresh", "privacy": "device"}, [["name"], ["privacy"]]),
        ("root", "PATCH", f"/v1/kbs/{kb}", {"name": "Renamed"}, [["name"]]),
        ("bob", "POST", f"/v1/kbs/{kb}/sources",
         {"title": "Travel policy", "url": "https://intranet/travel", "text": "Book trains."},
         [["title"], ["url"], ["text"]]),
        ("bob", "PATCH", f"/v1/kbs/{kb}/sources/{sid}", {"access": "internal"}, [["access"]]),
    ]
    before = _counts(team_db)
    outcomes: dict[str, object] = {}
    for user, method, route, base, paths in routes:
        for path in paths:
            for label, raw in BAD.items():
                status, reply = _send(team.url, team.tokens[user], method, route, _body(base, path, raw))
                error = reply.get("error") or {}
                field = (error.get("detail") or {}).get("field", "")
                want = _field(path)
                ok = (status == 400 and error.get("code") == "invalid_input"
                      and (field == want if label in ("lone surrogate", "NUL") else field.startswith(want)))
                outcomes[f"{method} {route.replace(kb, '{kb}').replace(sid, '{source}')} "
                         f"{want}={label}"] = "ok" if ok else (status, reply)
    # a key is a string too
    for label, key in (("lone surrogate", "\\udc00"), ("NUL", "q\\u0000")):
        body = b'{"kbs": ["%s"], "query": "holiday", "%s": 1}' % (kb.encode(), key.encode())
        status, reply = _send(team.url, team.tokens["bob"], "POST", "/v1/search", body)
        outcomes[f"POST /v1/search key={label}"] = (
            "ok" if status == 400 and reply["error"]["code"] == "invalid_input"
            and reply["error"]["detail"]["field"] else (status, reply))
    wrong = {k: v for k, v in outcomes.items() if v != "ok"}
    assert wrong == {}, f"{len(wrong)} of {len(outcomes)} not 400 invalid_input naming the field: {wrong}"
    assert _counts(team_db) == before  # nothing was written
    with TeamClient(team.url, team.tokens["bob"]) as bob:  # and the server still serves
        assert bob.search([kb], "holiday days")["hits"][0]["title"] == "Holiday policy"


def test_host_refuses_the_same_through_the_same_parser(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    requests = [("search", {"kbs": ["Docs"], "query": "keep"}, [["query"], ["kbs", 0]]),
                ("kb.create", {"name": "Fresh"}, [["name"]]),
                ("chat", {"kbs": ["Docs"], "message": "keep?", "extractive": True,
                          "history": [{"role": "user", "content": "hi"}]}, [["history", 0, "content"]])]
    outcomes: dict[str, object] = {}
    with HostProcess([sys.executable, "-m", "localkb", "host"], home=home) as host:
        n = 0
        for kind, data, paths in requests:
            for path in paths:
                for label, raw in BAD.items():
                    n += 1
                    frame = {"id": n, "type": kind, "data": data}
                    host.send_body(_body(frame, ["data", *path], raw))
                    reply = host.next_message(timeout=120)
                    error = reply.get("error") or {}
                    field = (error.get("detail") or {}).get("field", "")
                    want = _field(["data", *path])
                    ok = (reply.get("ok") is False and error.get("code") == "invalid_input"
                          and (field == want if label in ("lone surrogate", "NUL")
                               else field.startswith(want)))
                    outcomes[f"{kind} {want}={label}"] = "ok" if ok else reply
        assert host.request({"id": "after", "type": "kb.list", "data": {}})["ok"]
    wrong = {k: v for k, v in outcomes.items() if v != "ok"}
    assert wrong == {}, f"{len(wrong)} of {len(outcomes)} were not invalid_input naming the field: {wrong}"
