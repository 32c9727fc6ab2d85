"""The team server end to end: real PostgreSQL (embedded wheel), a real HTTP server on loopback, real clients.

Access is checked before retrieval: two users with different clearances get different
passages and answers, and the trace shows the restricted passage was never fetched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import REPO, run_cli
from localkb.answer.chat import run_turn
from localkb.errors import Forbidden, KnowledgeBaseNotFound, TeamUnavailable, Unauthorized
from localkb.retrieval.search import Searcher
from localkb.store.kb import Store
from localkb.team.attached import Library, attach
from localkb.team.client import TeamClient
from localkb.team.server import TeamAPI, TeamServer
from test_portable import _synthetic

HOLIDAY = ("Holiday policy", "Staff get 25 days of paid holiday a year. Ask your manager two weeks ahead; "
           "unused days carry over until March.")
SALARY = ("Salary bands 2027", "The senior engineer salary band is 95,000 to 120,000 EUR a year; "
          "the staff engineer band starts at 130,000 EUR. Internal code SB-2027.")


def _start(api: TeamAPI) -> tuple[TeamServer, threading.Thread]:
    httpd = TeamServer(api, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return httpd, thread


@pytest.fixture
def team(team_db, settings):
    """A team server on loopback: Handbook (new sources internal), staff (internal) and execs (secret)."""
    api = TeamAPI(team_db, settings, name="acme", max_json_bytes=2 * 1024 * 1024,
                  max_import_bytes=4 * 1024 * 1024)
    httpd, _ = _start(api)
    kb, tokens, holiday, salary = seed_acme(api, httpd.url)
    yield SimpleNamespace(url=httpd.url, api=api, kb=kb, tokens=tokens, holiday=holiday, salary=salary,
                          client=lambda user: TeamClient(httpd.url, tokens[user]))
    httpd.shutdown()
    httpd.server_close()


def seed_acme(api: TeamAPI, url: str, *, more_staff: tuple[str, ...] = ()):
    """Handbook (new sources internal); alice in staff (internal), bob in execs (secret, may
    write), root an admin; bob adds the holiday page (internal) and the salary bands (secret)."""
    d = api.directory
    kb = api.system.create_kb("Handbook", privacy="device", default_access=1)
    d.add_role("staff", "internal")
    d.add_role("execs", "secret")
    for user in ("alice", *more_staff):
        d.add_user(user, roles=["staff"])
    d.add_user("bob", roles=["execs"])
    d.add_user("root", admin=True)
    d.grant("staff", kb.id)
    d.grant("execs", kb.id, write=True)
    tokens = {u: d.create_token(u)["token"] for u in ("alice", "bob", "root", *more_staff)}
    with TeamClient(url, tokens["bob"]) as bob:
        holiday = bob.add(kb.id, title=HOLIDAY[0], text=HOLIDAY[1], url="https://intranet/holiday")
        salary = bob.add(kb.id, title=SALARY[0], text=SALARY[1], url="https://intranet/salaries",
                         access="secret")
    assert holiday["status"] == salary["status"] == "added"
    assert holiday["access"] == "internal" and salary["access"] == "secret"
    return kb, tokens, holiday, salary


def _chunk_ids(team_db, source_id: str) -> set[str]:
    with team_db.conn() as conn:
        return {r["id"] for r in conn.execute("SELECT id FROM chunks WHERE source_id = %s", (source_id,))}


def test_two_clearances_get_different_passages_and_the_restricted_one_is_never_fetched(team, team_db):
    query = "what is the senior engineer salary band?"
    secret_ids = _chunk_ids(team_db, team.salary["source_id"])
    with team.client("alice") as alice, team.client("bob") as bob:
        a = alice.search([team.kb.id], query, k=5, include_weaker=True)
        b = bob.search([team.kb.id], query, k=5)
    assert b["hits"][0]["title"] == SALARY[0] and b["statuses"][0]["status"] == "passages"
    assert all(h["title"] != SALARY[0] for h in a["hits"])
    trace = a["trace"]["kbs"][team.kb.id]
    fetched = set(trace["vector_fetched"]) | set(trace["keyword_fetched"])
    assert fetched and not fetched & secret_ids  # filtered inside both legs' SQL: never a candidate
    assert trace["access"] == {"level": "internal",
                               "filter": f"kb_id = {team.kb.id} AND access_level <= 1"}
    assert secret_ids <= set(b["trace"]["kbs"][team.kb.id]["vector_fetched"])
    # even the exact identifier finds nothing for alice, and the keyword leg says so: the name
    # is held only above her clearance, so for her no passage mentions it (issue 15's status)
    with team.client("alice") as alice, team.client("bob") as bob:
        code = alice.search([team.kb.id], "SB-2027", mode="keyword")
        seen = bob.search([team.kb.id], "SB-2027", mode="keyword")
    assert code["hits"] == [] and code["trace"]["kbs"][team.kb.id]["keyword_fetched"] == []
    st = code["statuses"][0]
    assert code["exact_terms"] == ["SB-2027"] and st["missing_terms"] == ["SB-2027"]
    assert st["status"] == "nothing" and st["line"].startswith('Handbook · no passage mentions "SB-2027"')
    assert seen["statuses"][0]["missing_terms"] == [] and seen["statuses"][0]["status"] == "passages"
    assert seen["trace"]["kbs"][team.kb.id]["exact"] == {"SB-2027": "whole"}


def test_two_clearances_get_different_answers_through_attached_clients(team, tmp_path, settings):
    answers = {}
    for user in ("alice", "bob"):
        home = tmp_path / user
        attach(home, team.url, team.tokens[user])
        lib = Library(Store(Settings_for(home, settings)))
        result = run_turn(lib, ["Handbook"], "What is the senior engineer salary band?", endpoint=None)
        answers[user] = result
        lib.local.close()
    assert "95,000" in answers["bob"].answer
    assert "95,000" not in answers["alice"].answer
    assert answers["bob"].citations[0]["title"] == SALARY[0]
    assert all(c["title"] != SALARY[0] for c in answers["alice"].citations)


def Settings_for(home: Path, settings):
    from dataclasses import replace

    return replace(settings, data_dir=home)


def test_revoking_a_grant_or_a_token_takes_effect_on_the_next_query(team):
    with team.client("alice") as alice:
        assert alice.search([team.kb.id], "holiday days")["statuses"][0]["status"] == "passages"
        team.api.directory.revoke("staff", team.kb.id)
        with pytest.raises(KnowledgeBaseNotFound):
            alice.search([team.kb.id], "holiday days")
        assert alice.kbs() == []
        team.api.directory.grant("staff", team.kb.id)
        assert alice.search([team.kb.id], "holiday days")["hits"]
        token_id = team.tokens["alice"].split("_")[1]
        team.api.directory.revoke_token(token_id)
        with pytest.raises(Unauthorized, match="revoked"):
            alice.search([team.kb.id], "holiday days")


def test_wrong_missing_and_malformed_tokens_are_refused(team):
    good = team.tokens["alice"]
    bad = [None, "", "lkt_0000000000000000_" + "A" * 43, good[:-1] + ("B" if good[-1] != "B" else "C"),
           "Bearer-less", good.replace("lkt_", "xyz_")]
    for token in bad:
        with TeamClient(team.url, token) as c, pytest.raises(Unauthorized):
            c.kbs()
    with TeamClient(team.url, None) as c:
        assert c.health()["database"]["ok"] is True  # health alone needs no token


INJECTIONS = ["x' OR '1'='1", "Handbook'; DROP TABLE chunks; --", "1; DELETE FROM sources",
              "' UNION SELECT id, text FROM chunks --", "%' OR 1=1 --", "\\'; TRUNCATE kbs; --",
              "tkb_x') OR ('a'='a"]


def _counts(team_db) -> dict:
    with team_db.conn() as conn:
        return {t: conn.execute(f"SELECT count(*) AS n FROM {t}").fetchone()["n"]
                for t in ("kbs", "sources", "chunks", "users", "roles", "grants", "tokens")}


def test_injection_and_oversized_inputs_are_refused_on_every_endpoint(team, team_db):
    before = _counts(team_db)
    root = team.client("root")
    bob = team.client("bob")
    kb = team.kb.id
    sid = team.holiday["source_id"]
    for bad in INJECTIONS:
        seen = []
        calls = [
            lambda b=bad: bob.search([b], "holiday"),
            lambda b=bad: bob.search([kb], "holiday", mode=b),
            lambda b=bad: bob.sources(b),
            lambda b=bad: bob.add(b, text="x", title="t"),
            lambda b=bad: bob.add(kb, text="holiday", title="t", access=b),
            lambda b=bad: bob.add(kb, text="holiday", title="t", captured_by=b),
            lambda b=bad: bob.remove(kb, b),
            lambda b=bad: bob.remove(b, sid),
            lambda b=bad: bob.set_access(kb, sid, b),
            lambda b=bad: bob.set_access(kb, b, "public"),
            lambda b=bad: bob.request("GET", f"/v1/kbs/{kb}/sources", params={"offset": b}),
            lambda b=bad: bob.request("GET", f"/v1/kbs/{b}/export", raw=True),
            lambda b=bad: root.request("PATCH", f"/v1/kbs/{b}", json={"name": "x"}),
            lambda b=bad: root.request("PATCH", f"/v1/kbs/{kb}", json={"privacy": b}),
            lambda b=bad: root.request("DELETE", f"/v1/kbs/{b}"),
            lambda b=bad: root.import_(b.encode()),
            lambda b=bad: root.request("GET", "/v1/errors", params={"kb": b}),
        ]
        for n, call in enumerate(calls):
            with pytest.raises(Exception) as caught:  # the code is checked below
                call()
            seen.append((n, getattr(caught.value, "code", type(caught.value).__name__)))
        assert {c for _, c in seen} <= {"kb_not_found", "invalid_input", "source_not_found",
                                        "invalid_archive", "not_found", "forbidden",
                                        "protocol_error"}, (bad, seen)
        assert bob.passages(kb, bad, 0, 1) == []  # an id is data: matched literally, found nowhere
        # a name is data: refused by its own rule (no / or \\), or stored exactly as given
        if "/" in bad or "\\" in bad:
            with pytest.raises(Exception, match=r"a knowledge base name (is|may not)"):
                root.create_kb(bad)
        else:
            made = root.create_kb(bad)
            assert made["name"] == bad
            assert root.request("DELETE", f"/v1/kbs/{made['id']}")["name"] == bad
        # a query is text to search for, not SQL: it runs and finds what it finds
        assert bob.search([kb], bad)["statuses"][0]["status"] in {"passages", "nothing", "weaker"}
    # type confusion and out-of-range values
    for body in ({"kbs": "Handbook", "query": "x"}, {"kbs": [kb], "query": 5},
                 {"kbs": [kb], "query": "x", "k": 10**6}, {"kbs": [kb], "query": "x", "k": True},
                 {"kbs": [kb], "query": "x" * 4001},
                 {"kbs": [kb] * 51, "query": "x"}, {"kbs": [kb], "query": "x", "cutoff": "0.3"}):
        with pytest.raises(Exception) as caught:
            bob.request("POST", "/v1/search", json=body)
        assert caught.value.code == "invalid_input", body
    # oversized: a JSON body over the cap, a field over its cap, an import over its cap
    with pytest.raises(Exception) as caught:
        bob.add(kb, text="word " * 600_000, title="huge")
    assert caught.value.code == "too_large"
    with pytest.raises(Exception) as caught:
        bob.add(kb, text="ok", title="t" * 2001)
    assert caught.value.code == "invalid_input"
    with pytest.raises(Exception) as caught:
        root.import_(b"\x1f\x8b" + os.urandom(5 * 1024 * 1024))
    assert caught.value.code == "too_large"
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        with pytest.raises(Exception) as caught:
            bob.request("POST", "/v1/search", content=raw)
        assert caught.value.code == "protocol_error"
    with pytest.raises(Exception) as caught:
        bob.request("GET", "/v1/nowhere")
    assert caught.value.code == "not_found"
    assert _counts(team_db) == before  # nothing was dropped, deleted or half-written
    assert bob.search([kb], "holiday days")["hits"][0]["title"] == HOLIDAY[0]
    root.close()
    bob.close()


def test_writers_stay_within_their_clearance_and_levels_can_change(team):
    d = team.api.directory
    d.add_role("editors", "internal")
    d.set_user_roles("alice", add=["editors"])
    d.grant("editors", team.kb.id, write=True)
    with team.client("alice") as alice, team.client("bob") as bob:
        with pytest.raises(Forbidden):
            alice.add(team.kb.id, text="Board minutes.", title="Board", access="secret")
        # she cannot see it, so her add at its URL makes a source of her own, leaving it untouched
        mine = alice.add(team.kb.id, text="Replaced!", title="Mine", url="https://intranet/salaries")
        assert mine["status"] == "added" and mine["source_id"] != team.salary["source_id"]
        assert all(h["title"] != SALARY[0] for h in alice.search([team.kb.id], "salary band")["hits"])
        changed = bob.set_access(team.kb.id, team.salary["source_id"], "internal")
        assert changed == {**changed, "was": "secret", "access": "internal"}
        assert alice.search([team.kb.id], "salary band")["hits"][0]["title"] == SALARY[0]
        rows = {s["title"]: s for s in alice.sources(team.kb.id)["sources"]}
        assert rows[SALARY[0]]["access"] == "internal" and rows[HOLIDAY[0]]["added_by"] == "bob"


def test_small_next_to_big_still_gets_k_hits(team_store, settings, monkeypatch):
    """60 passages a user may see among 3,060 in the same table: the filtered HNSW walk still fills k."""
    from dataclasses import replace

    from localkb.store.base import ChunkWrite, SourceWrite
    from localkb.store.catalog import chunk_id, source_id
    from localkb.team.access import Access, Grant
    from localkb.team.store import TeamLegs

    rng = np.random.default_rng(7)
    store = team_store
    # By default 60 visible passages are searched exactly (as the local store searches a tiny
    # index); below that threshold here, so the approximate walk must fill k on its own.
    store.settings = replace(settings, exact_search_below=50)
    rec = store.create_kb("Mixed")

    def write(level: int, n: int, prefix: str) -> None:
        kb = store.open_kb("Mixed", write_level=level)
        vecs = rng.normal(size=(n, 384)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        for start in range(0, n, 500):
            writes = []
            for i in range(start, min(n, start + 500)):
                sid = source_id(rec.id, f"{prefix}{i}")
                cid = chunk_id(rec.id, sid, 0)
                writes.append(SourceWrite(
                    id=sid, key=f"{prefix}{i}", type="text", title=f"{prefix} {i}", url=None,
                    file_name=None, content_hash=str(i), captured_by="api", chunk_count=1, pages=None,
                    lang=None, keep={cid}, chunks=[ChunkWrite(cid, 0, f"{prefix} passage {i}", str(i), None,
                                                              4, vecs[i], "api")]))
            kb.write_sources(writes)

    write(3, 3000, "secret")
    write(0, 60, "public")
    viewer = store.for_access(Access("u1", "viewer", kbs={rec.id: Grant(0, False)}))
    q = rng.normal(size=384).astype(np.float32)
    q /= np.linalg.norm(q)
    with store.db.conn() as conn:
        exact = [r["id"] for r in conn.execute(
            "SELECT id FROM chunks WHERE kb_id = %s AND access_level <= 0 ORDER BY embedding <=> %s "
            "LIMIT 10", (rec.id, q))]
    walk = "SELECT id FROM chunks WHERE dim = 384 AND kb_id = %s AND access_level <= 0 " \
           "ORDER BY (embedding::vector(384)) <=> %s::vector(384) LIMIT 10"
    # What the seeds describe: the HNSW walk, then the filter, without iterative scans, comes back short.
    with store.db.conn() as conn, conn.transaction():
        conn.execute("SET LOCAL enable_sort = off")  # make the planner walk the HNSW index
        conn.execute("SET LOCAL hnsw.iterative_scan = off")
        assert "chunks_hnsw_384" in str(conn.execute("EXPLAIN " + walk, (rec.id, q)).fetchall())
        assert len(conn.execute(walk, (rec.id, q)).fetchall()) < 10
    # The team store's walk (iterative scan, relaxed order) fills k with the visible passages.
    monkeypatch.setattr(TeamLegs, "session_settings", {"enable_sort": "off"})
    legs = viewer.open_kb("Mixed").legs()
    hits = legs.vector(q, 10)
    assert len(hits.keys) == 10 and legs.trace["vector_path"] == "hnsw"
    assert all(t.startswith("public") for t in _titles(store, legs.trace["vector_fetched"]))
    assert len(set(exact) & set(legs.trace["vector_fetched"])) >= 9  # and they are the nearest
    # A walk that still comes back short (here: iterative scans switched off) falls back to the
    # exact filtered scan.
    monkeypatch.setattr(TeamLegs, "session_settings", {"enable_sort": "off", "hnsw.iterative_scan": "off"})
    short = viewer.open_kb("Mixed").legs()
    assert len(short.vector(q, 10).keys) == 10 and short.trace["vector_path"].startswith("hnsw, then exact")
    assert short.trace["hnsw_returned"] < 10 and short.trace["vector_fetched"] == exact
    monkeypatch.setattr(TeamLegs, "session_settings", {})
    res = Searcher(viewer).search(["Mixed"], "public passage", k=10, floor=False)
    assert len(res.hits) == 10 and all(h.title.startswith("public") for h in res.hits)
    viewer.settings = settings  # the default: the few visible passages are searched exactly
    exact_legs = viewer.open_kb("Mixed").legs()
    assert len(exact_legs.vector(q, 10).keys) == 10 and exact_legs.trace["vector_path"] == "exact"


def _titles(store, chunk_ids) -> list[str]:
    with store.db.conn() as conn:
        return [r["title"] for r in conn.execute(
            "SELECT s.title FROM chunks c JOIN sources s ON s.id = c.source_id WHERE c.id = ANY(%s)",
            (list(chunk_ids),))]


def test_twenty_concurrent_clients_ingesting_and_searching_get_exact_counts(team, team_db):
    errors: list[str] = []
    reports: list[dict] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        with team.client("bob") as c:
            for j in range(3):
                try:
                    rep = c.add(team.kb.id, title=f"Note {n}-{j}", url=f"https://intranet/notes/{n}/{j}",
                                text=f"Meeting note {n}-{j}: the project codename is P{n}X{j}. "
                                     f"Budget review on day {j} of week {n}.")
                    res = c.search([team.kb.id], f"P{n}X{j}", k=3)
                    with lock:
                        reports.append(rep)
                        if res["hits"][0]["title"] != f"Note {n}-{j}":
                            errors.append(f"search {n}-{j} found {res['hits'][0]['title']}")
                except Exception as err:  # every failure is reported, none is swallowed
                    with lock:
                        errors.append(f"{n}-{j}: {err!r}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert errors == []
    assert len(reports) == 60 and {r["status"] for r in reports} == {"added"}
    with team.client("bob") as c:
        listed = c.sources(team.kb.id, limit=1000)
    assert listed["total"] == 62  # the 60 notes and the fixture's two pages
    with team_db.conn() as conn:
        chunks = conn.execute("SELECT count(*) AS n FROM chunks WHERE kb_id = %s", (team.kb.id,)).fetchone()
        gen = conn.execute("SELECT generation FROM kbs WHERE id = %s", (team.kb.id,)).fetchone()
    assert chunks["n"] == sum(r["total"] for r in reports) + 2
    assert gen["generation"] == 62  # one bump per write, none lost to a race


def test_an_unreachable_team_is_unavailable_never_empty(team, tmp_path, settings):
    home = tmp_path / "alice"
    attach(home, team.url, team.tokens["alice"])
    lib = Library(Store(Settings_for(home, settings)))
    assert Searcher(lib).search(["Handbook"], "holiday days").statuses[0].status == "passages"
    dead = TeamClient("http://127.0.0.1:9", None)  # nothing listens on the discard port
    with pytest.raises(TeamUnavailable):
        dead.health()
    lib.teams[0].url = "http://127.0.0.1:9"
    res = Searcher(lib).search(["Handbook"], "holiday days")
    st = res.statuses[0]
    assert st.status == "unavailable" and "cannot be reached" in st.message and res.hits == []
    assert "says nothing about what is stored" in st.message
    assert [r.name for r in lib.kbs()] == ["Handbook"]  # still listed, from the last listing
    turn = run_turn(lib, ["Handbook"], "how many holiday days?", endpoint=None)
    assert turn.statuses[0]["status"] == "unavailable"
    assert any("did not run" in n for n in turn.notes)
    assert "nothing relevant" not in turn.answer and "says nothing about what they hold" in turn.answer
    lib.local.close()


def test_a_team_database_that_goes_away_makes_searches_unavailable(team, team_db_url, pg_cluster):
    import psycopg

    with team.client("alice") as alice:
        assert alice.search([team.kb.id], "holiday days")["hits"]
        name = psycopg.conninfo.conninfo_to_dict(team_db_url)["dbname"]
        with psycopg.connect(pg_cluster.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')  # every connection is cut
        with pytest.raises(TeamUnavailable):
            alice.search([team.kb.id], "holiday days")
        with pytest.raises(TeamUnavailable) as err:  # readiness: 503 while the database is gone
            alice.health()
        assert err.value.detail["database"]["ok"] is False, err.value.detail


def test_an_awkb_file_goes_to_a_team_and_back(team, tmp_path, settings):
    from localkb.ingest.extract import extract_text
    from localkb.ingest.pipeline import add_document

    home = tmp_path / "root"
    store = Store(Settings_for(home, settings))
    store.create_kb("Mine")
    add_document(store.open_kb("Mine"), extract_text("The boiler is serviced every October.",
                                                     title="Boiler"), key="boiler")
    store.close()
    attach(home, team.url, team.tokens["root"], name="acme")
    assert run_cli(["export", "Mine", "-o", str(tmp_path / "mine.awkb")], home).returncode == 0
    done = run_cli(["import", str(tmp_path / "mine.awkb"), "--team", "acme", "--name", "Boilers",
                    "--access", "confidential", "--json"], home)
    assert done.returncode == 0, done.stderr
    res = json.loads(done.stdout)
    assert res["chunks"] == 1 and res["access"] == "confidential"
    with team.client("root") as root:
        rows = root.sources(res["knowledge_base"]["id"])["sources"]
        assert [(r["title"], r["access"]) for r in rows] == [("Boiler", "confidential")]
    out = run_cli(["export", "acme/Boilers", "-o", str(tmp_path / "back.awkb"), "--json"], home)
    assert out.returncode == 0 and json.loads(out.stdout)["chunks"] == 1
    back = run_cli(["import", str(tmp_path / "back.awkb"), "--name", "Back"], home)
    assert back.returncode == 0 and "1 source, 1 chunk" in back.stdout


def test_the_privacy_gate_applies_to_team_knowledge_bases(team, tmp_path, settings):
    from localkb.answer.llm import Endpoint

    home = tmp_path / "bob"
    attach(home, team.url, team.tokens["bob"])
    lib = Library(Store(Settings_for(home, settings)))
    cloud = Endpoint("cloud", "https://api.example.invalid/v1", "some-model")
    turn = run_turn(lib, ["Handbook"], "What is the senior engineer salary band?", endpoint=cloud)
    assert [s["status"] for s in turn.statuses] == ["skipped"] and not turn.generated
    assert "device only" in turn.statuses[0]["message"]
    lib.local.close()


def test_a_team_knowledge_base_made_device_only_is_never_sent_to_a_cloud_model_from_a_stale_listing(
        team, tmp_path, settings):
    """Its privacy is the team admin's, as it is now: the attached listing (teams.json) may be
    older. Before: the listing said "cloud", the admin had since set "device", and the salary
    passage went to the cloud model."""
    from fakellm import FakeLLM
    from localkb.answer.llm import Endpoint

    team.api.system.update_kb("Handbook", privacy="cloud")
    home = tmp_path / "bob"
    attach(home, team.url, team.tokens["bob"])  # lists Handbook as cloud
    team.api.system.update_kb("Handbook", privacy="device")
    lib = Library(Store(Settings_for(home, settings)))
    assert next(r for r in lib.kbs() if r.name == "Handbook").privacy == "cloud"  # stale
    with FakeLLM(reply="The band is 95,000 [1].") as llm:
        cloud = Endpoint("cloudy", llm.base_url, "fake-model", mark_cloud=True)
        turn = run_turn(lib, ["Handbook"], "What is the senior engineer salary band?", endpoint=cloud)
        sent = json.dumps(llm.requests)
    assert "95,000" not in sent and "SB-2027" not in sent
    assert [s["status"] for s in turn.statuses] == ["skipped"], turn.statuses
    # ... and a history turn drawn from it is gated the same way (issue 14's provenance)
    team.api.system.update_kb("Handbook", privacy="cloud")
    attach(tmp_path / "bob2", team.url, team.tokens["bob"])
    lib2 = Library(Store(Settings_for(tmp_path / "bob2", settings)))
    first = run_turn(lib2, ["Handbook"], "What is the senior engineer salary band?", endpoint=None)
    assert team.kb.id in first.kbs and "95,000" in first.answer
    team.api.system.update_kb("Handbook", privacy="device")
    from localkb.answer.chat import Turn

    history = [Turn("user", "What is the senior engineer salary band?"),
               Turn("assistant", first.answer, tuple(first.kbs))]
    with FakeLLM(reply="Ask HR.") as llm:
        cloud = Endpoint("cloudy", llm.base_url, "fake-model", mark_cloud=True)
        run_turn(lib2, ["Handbook"], "and who decides it?", history=history, endpoint=cloud)
        sent = json.dumps(llm.requests)
    assert "95,000" not in sent
    lib.local.close()
    lib2.local.close()


# -- the server as a process ------------------------------------------------------------------
class ServerProcess:
    """``localkb team serve`` in a subprocess; its URL read from its first line."""

    def __init__(self, args: list[str], home: Path) -> None:
        env = {**os.environ, "LOCALKB_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "localkb", "team", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        line = self.proc.stdout.readline()
        assert "listening on http://" in line, line + (self.proc.stdout.read() if self.proc.poll() else "")
        self.url = line.split("listening on ")[1].split()[0]

    def stop(self, sig: int = signal.SIGTERM) -> str:
        self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=120)
        return out


def test_server_killed_mid_ingest_loses_no_acknowledged_source_and_leaves_no_half_one(team_db_url, tmp_path):
    from localkb.config import Settings
    from localkb.team.access import Access, Directory
    from localkb.team.db import Database
    from localkb.team.store import TeamStore

    db = Database(team_db_url)
    d = Directory(db)
    kb = TeamStore(db, Settings.from_env(), Access.system()).create_kb("Notes")
    d.add_role("w", "secret")
    d.add_user("writer", roles=["w"])
    d.grant("w", kb.id, write=True)
    token = d.create_token("writer")["token"]
    server = ServerProcess(["--db", team_db_url], tmp_path / "srv")
    acked: dict[str, dict] = {}
    page = "\n\n".join(f"Section {s}: the cooling loop {s} is flushed every {s + 2} weeks; valve V{s} "
                       f"is closed first and the pressure checked against the table on page {s}."
                       for s in range(14))
    stop = threading.Event()

    def writer() -> None:
        with TeamClient(server.url, token) as c:
            for i in range(200):
                if stop.is_set():
                    return
                try:
                    url = f"https://intranet/loop/{i}"
                    acked[url] = c.add(kb.id, url=url, title=f"Loop {i}", text=f"Manual {i}.\n\n{page}")
                except TeamUnavailable:
                    return

    t = threading.Thread(target=writer)
    t.start()
    deadline = time.monotonic() + 300
    while len(acked) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # well inside the next source's extract/embed/write
    server.proc.kill()  # SIGKILL: no clean-up of any kind
    server.proc.wait(60)
    stop.set()
    t.join(120)
    assert len(acked) >= 3
    with db.conn() as conn:
        rows = conn.execute("SELECT s.url, s.chunk_count, (SELECT count(*) FROM chunks c WHERE "
                            "c.source_id = s.id) AS stored FROM sources s WHERE s.kb_id = %s",
                            (kb.id,)).fetchall()
        orphans = conn.execute("SELECT count(*) AS n FROM chunks c LEFT JOIN sources s ON s.id = c.source_id "
                               "WHERE s.id IS NULL").fetchone()["n"]
    stored = {r["url"]: r for r in rows}
    for url, rep in acked.items():  # every acknowledged source is there, whole
        assert url in stored and stored[url]["stored"] == rep["total"] == stored[url]["chunk_count"]
    assert all(r["stored"] == r["chunk_count"] for r in rows) and orphans == 0  # no half source
    assert len(stored) - len(acked) in (0, 1)  # at most the one being written when it died, whole
    again = ServerProcess(["--db", team_db_url], tmp_path / "srv")
    with TeamClient(again.url, token) as c:
        assert c.sources(kb.id)["total"] == len(stored)
        first = next(iter(acked))
        assert c.add(kb.id, url=first, title=f"Loop {first.rsplit('/', 1)[1]}",
                     text=f"Manual {first.rsplit('/', 1)[1]}.\n\n{page}")["status"] == "unchanged"
    again.stop()
    db.close()


def test_team_serve_runs_embedded_postgres_and_the_admin_cli_works_beside_it(tmp_path):
    """The README's flow: serve (embedded), add a role, a user, a grant and a token, attach, search."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="localkb-test-serve-"))  # see conftest.pg_cluster
    try:
        team_dir = base / "team"
        admin = ["--dir", str(team_dir)]
        assert run_cli(["team", "kb", "create", "Docs", "--default-access", "internal", *admin],
                       tmp_path / "admin").returncode == 0  # the cluster starts for the command, then stops
        server = ServerProcess(["--dir", str(team_dir), "--name", "acme"], tmp_path / "srv")
        for args in (["team", "role", "add", "staff", "--clearance", "internal"],
                     ["team", "user", "add", "carol", "--role", "staff"],
                     ["team", "grant", "staff", "Docs", "--write"]):
            done = run_cli([*args, *admin], tmp_path / "admin")
            assert done.returncode == 0, done.stderr
        token = json.loads(run_cli(["team", "token", "create", "carol", "--json", *admin],
                                   tmp_path / "admin").stdout)["token"]
        home = tmp_path / "carol"
        env = {**os.environ, "LOCALKB_HOME": str(home)}
        done = subprocess.run([sys.executable, "-m", "localkb", "team", "attach", server.url,
                               "--token-stdin"], input=token + "\n", capture_output=True, text=True,
                              env=env, timeout=120, check=False)
        assert done.returncode == 0 and "attached team acme" in done.stdout, done.stderr
        (tmp_path / "tea.md").write_text("Green tea\n\nBrew green tea at 80 °C for two minutes.\n")
        assert "1 added" in run_cli(["add", "Docs", str(tmp_path / "tea.md")], home).stdout
        listing = json.loads(run_cli(["kb", "list", "--json"], home).stdout)["knowledge_bases"]
        assert [(k["name"], k["origin"], k["team"]) for k in listing] == [("Docs", "team", "acme")]
        out = run_cli(["search", "Docs", "how hot should green tea be brewed?"], home).stdout
        assert out.startswith("Docs · 1 passage") and "80 °C" in out
        assert "stopped" in server.stop()
        assert not (team_dir / "pg" / "postmaster.pid").exists()  # PostgreSQL was stopped cleanly
        down = run_cli(["search", "Docs", "green tea"], home)
        assert down.returncode == 4 and "Docs · unavailable" in down.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_host_lists_and_searches_team_knowledge_bases(team, tmp_path):
    from hostproc import HostProcess

    home = tmp_path / "alice"
    attach(home, team.url, team.tokens["alice"])
    with HostProcess([sys.executable, "-m", "localkb", "host"], home=home) as host:
        host.send({"id": 1, "type": "kb.list", "data": {}})
        kbs = host.until_reply(1)[-1]["result"]["knowledge_bases"]
        assert [(k["name"], k["origin"], k["team"]) for k in kbs] == [("Handbook", "team", "acme")]
        host.send({"id": 2, "type": "search", "data": {"kbs": ["Handbook"], "query": "holiday days"}})
        res = host.until_reply(2)[-1]["result"]
        assert res["statuses"][0]["status"] == "passages" and res["hits"][0]["title"] == HOLIDAY[0]
        host.send({"id": 3, "type": "status", "data": {}})
        status = host.until_reply(3)[-1]["result"]
        assert [k["origin"] for k in status["knowledge_bases"]] == ["team"]


def test_readme_documents_the_team_server():
    readme = (REPO / "README.md").read_text()
    assert "## Team server" in readme
    for words in ("localkb team serve", "--db postgresql://", "localkb team user add",
                  "localkb team role add", "localkb team grant", "localkb team token create",
                  "localkb team attach"):
        assert words in readme, words


def test_teams_file_survives_concurrent_listings(tmp_path):
    """The host answers kb.list on several threads; each may rewrite teams.json (it once raced)."""
    from localkb.team.attached import Attachment, load_attachments, save_attachments

    errors = []

    def writer(n: int) -> None:
        try:
            for j in range(30):
                listing = [{"n": n, "j": j}]
                save_attachments(tmp_path, [Attachment("acme", "http://127.0.0.1:1", "lkt_x", listing)])
        except Exception as err:
            errors.append(repr(err))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and load_attachments(tmp_path)[0].name == "acme"
    assert (tmp_path / "teams.json").stat().st_mode & 0o777 == 0o600


def test_a_database_written_with_another_keyword_analysis_is_reanalysed_on_open(team_store, team_db_url,
                                                                                settings):
    """The team twin of the local index rebuilt on open: tsvectors of an older analysis (before
    issue 15's positions, suffixes and versions) are rewritten when a server connects."""
    from localkb.ingest.extract import extract_text
    from localkb.ingest.pipeline import add_document
    from localkb.team.access import Access
    from localkb.team.db import Database
    from localkb.team.store import TeamStore

    team_store.create_kb("Docs")
    kb = team_store.open_kb("Docs")
    add_document(kb, extract_text("class asyncio.Task(coro)\nTask.done() returns True when the Task "
                                  "is done.", title="Coroutines and Tasks"), key="page:task")
    with team_store.db.tx() as conn:  # what a database of the previous analysis holds
        conn.execute("UPDATE chunks SET tsv = to_tsvector('simple', text)")
        conn.execute("DELETE FROM meta")
    stale = Searcher(team_store).search(["Docs"], "asyncio.Task.done", mode="keyword")
    assert stale.statuses[0].missing_terms == ["asyncio.Task.done"]  # the old lexemes lack it
    db = Database(team_db_url)
    try:
        assert db.reanalyzed == 1
        fresh = Searcher(TeamStore(db, settings, Access.system())).search(
            ["Docs"], "asyncio.Task.done", mode="keyword")
        st = fresh.statuses[0]
        assert st.status == "passages" and st.missing_terms == [], st
        again = Database(team_db_url)
        again.close()
        assert again.reanalyzed == 0  # once only
    finally:
        db.close()


N_ARCHIVE = 3_000  # passages: their import to PostgreSQL takes seconds


def test_a_team_server_killed_mid_import_leaves_no_staging_file_and_no_half_knowledge_base(
        team_db_url, tmp_path):
    """kill -9 of the server while an import is staged, and again while its passages are written
    to PostgreSQL: after a restart no staging file is left under ``imports/``, no knowledge base
    of the half import is listed, and the same import then goes through whole."""
    from localkb.team.access import Directory
    from localkb.team.db import Database

    db = Database(team_db_url)
    Directory(db).add_user("root", admin=True)
    token = Directory(db).create_token("root")["token"]
    data = _synthetic(N_ARCHIVE, dense=True)  # random vectors: 3.4 MB that does not compress away
    home = tmp_path / "srv"
    imports = home / "imports"

    def kb_rows() -> int:
        with db.conn() as conn:
            return conn.execute("SELECT count(*) AS n FROM kbs").fetchone()["n"]

    def writing_passages() -> bool:
        with db.conn() as conn:
            return conn.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE datname = "
                                "current_database() AND state <> 'idle' AND query LIKE "
                                "'INSERT INTO chunks%%'").fetchone()["n"] > 0

    points = {"staging": lambda: any(imports.glob("kb_*.sqlite")),
              "passages written": lambda: any(imports.glob("kb_*.sqlite")) and writing_passages()}
    left = []
    for point, reached in points.items():
        server = ServerProcess(["--db", team_db_url], home)
        outcome: dict = {}

        def send(url=server.url, outcome=outcome) -> None:
            try:
                with TeamClient(url, token) as c:
                    outcome["reply"] = c.import_(data)
            except Exception as err:  # the server dies under the request
                outcome["error"] = err

        sender = threading.Thread(target=send)
        sender.start()
        try:
            while sender.is_alive() and not reached():
                time.sleep(0.005)  # the poll interval: the wait is on the condition
        finally:
            server.proc.kill()
            server.proc.wait(60)
            sender.join(180)
        assert "error" in outcome, (point, outcome)  # it was killed mid-import
        staged_then = sorted(p.name for p in imports.iterdir())
        again = ServerProcess(["--db", team_db_url], home)  # its first line says it is listening
        try:
            found = sorted(p.name for p in imports.glob("*")) if imports.exists() else []
            with TeamClient(again.url, token) as c:
                listed = [k["name"] for k in c.kbs()]
            if found or listed or kb_rows():
                left.append((point, staged_then, found, listed))
        finally:
            again.stop()
    assert not left, left
    server = ServerProcess(["--db", team_db_url], home)
    try:
        with TeamClient(server.url, token) as c:
            done = c.import_(data)
            assert done["chunks"] == N_ARCHIVE and done["knowledge_base"]["name"] == "Random", done
    finally:
        server.stop()
    assert not imports.exists() or not any(imports.iterdir())
    db.close()
