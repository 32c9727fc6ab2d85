"""What the team server reveals of what a caller may not see (issue 37): a real server on embedded
PostgreSQL, its replies compared byte for byte (or field for field, ids and times aside).

- A knowledge base the caller is not granted answers exactly as one that does not exist, on
  every route that takes one, by name and by id.
- A writer's add at the URL of a source above their clearance makes a source of their own:
  their replies are those of a knowledge base without the hidden source, which is untouched.
- The query log shows past citations through the caller's current access: a source they can
  no longer see is a redacted citation, not its title and URL.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import httpx
import pytest

from fakellm import FakeLLM
from localkb.answer.llm import Endpoint
from localkb.team.chat import ChatConfig
from localkb.team.client import TeamClient
from localkb.team.server import TeamAPI
from test_team import HOLIDAY, SALARY, _start, seed_acme
from test_team_chat import _answer as chat_answer


@pytest.fixture
def team(team_db, settings):
    """The acme team of ``test_team`` (alice internal reader, bob secret writer, root admin),
    with a fake model so chat turns generate and cite."""
    with FakeLLM(reply_fn=_answer) as llm:
        api = TeamAPI(team_db, settings, name="acme",
                      chat=ChatConfig(endpoint=Endpoint("team", llm.base_url, "fake-model")))
        httpd, _ = _start(api)
        kb, tokens, holiday, salary = seed_acme(api, httpd.url)
        yield SimpleNamespace(url=httpd.url, api=api, kb=kb, tokens=tokens, holiday=holiday,
                              salary=salary, client=lambda user: TeamClient(httpd.url, tokens[user]))
        httpd.shutdown()
        httpd.server_close()


def _answer(request: dict) -> str:
    """``test_team_chat``'s model, which also answers from the reorg plan (citing it)."""
    if "Berlin" in request["messages"][-1]["content"]:
        return "The platform team moves to Berlin [1]."
    return chat_answer(request)


def _raw(team, user: str, method: str, path: str, **kw) -> tuple[int, bytes]:
    with httpx.Client(base_url=team.url, trust_env=False) as http:
        resp = http.request(method, path, headers={"Authorization": f"Bearer {team.tokens[user]}"}, **kw)
    return resp.status_code, resp.content


# -- item 2: "not granted" reads exactly as "does not exist" ------------------------------------------
def _kb_probes(ref: str, sid: str, handbook: str) -> list[tuple[str, str, dict]]:
    """Every route that takes a knowledge base (in its path, body or query), with ``ref`` as it."""
    from urllib.parse import quote

    seg = quote(ref, safe="")
    page = {"url": "https://intranet/vault/new", "title": "New", "text": "A new page about holidays."}
    return [
        ("GET", f"/v1/kbs/{seg}/sources", {}),
        ("POST", f"/v1/kbs/{seg}/sources", {"json": page}),
        ("POST", f"/v1/kbs/{seg}/sources", {"json": {**page, "access": "public"}}),
        ("PATCH", f"/v1/kbs/{seg}/sources/{sid}", {"json": {"access": "public"}}),
        ("DELETE", f"/v1/kbs/{seg}/sources/{sid}", {}),
        ("GET", f"/v1/kbs/{seg}/passages", {"params": {"source": sid, "index": 0, "radius": 1}}),
        ("GET", f"/v1/kbs/{seg}/export", {}),
        ("PATCH", f"/v1/kbs/{seg}", {"json": {"name": "Renamed"}}),
        ("DELETE", f"/v1/kbs/{seg}", {}),
        ("POST", "/v1/search", {"json": {"kbs": [ref], "query": "vault combination"}}),
        ("POST", "/v1/search", {"json": {"kbs": [handbook, ref], "query": "vault combination"}}),
        ("POST", "/v1/chat", {"json": {"kbs": [ref], "message": "What is the vault combination?"}}),
        ("POST", "/v1/chat", {"json": {"kbs": [ref], "message": "What is the vault combination?",
                                       "stream": True}}),
        ("GET", "/v1/errors", {"params": {"kb": ref}}),
        ("POST", "/v1/import", {"params": {"name": ref}, "content": b"\x1f\x8b not an archive"}),
    ]


#: Routes whose knowledge base travels in the body or the query rather than the path.
_KB_IN_BODY = {("POST", ("v1", "search")), ("POST", ("v1", "chat")), ("GET", ("v1", "errors")),
               ("POST", ("v1", "import"))}


def _matches(pattern: tuple[str, ...], path: str) -> bool:
    parts = path.strip("/").split("/")
    return len(parts) == len(pattern) and all(p in ("*", q) for p, q in zip(pattern, parts, strict=True))


def test_a_knowledge_base_not_granted_reads_byte_for_byte_as_one_that_does_not_exist(team):
    """Before: ``GET /v1/errors?kb=`` resolved the name before the admin check, so a reader got
    403 for a knowledge base that exists and 404 for one that does not."""
    from localkb.ingest.extract import extract_text
    from localkb.ingest.pipeline import add_document

    vault = team.api.system.create_kb("Vault", default_access=0)
    rep = add_document(team.api.system.open_kb("Vault"), extract_text(
        "The vault combination is 31-7-42.", title="Vault"), key="url:https://intranet/vault")
    probes = {ref: _kb_probes(ref, rep.source_id, team.kb.id) for ref in ("Vault", vault.id)}
    # every route that takes a knowledge base is probed (a new one must join the list)
    missing = [(m, p) for m, p, _fn, _auth in team.api.routes
               if (p[:3] == ("v1", "kbs", "*") or (m, p) in _KB_IN_BODY)
               and not any(pm == m and _matches(p, path) for pm, path, _ in probes["Vault"])]
    assert missing == []

    users = ("alice", "bob")  # a reader and a writer, neither granted Vault
    before = {(u, ref, n): _raw(team, u, m, p, **kw)
              for u in users for ref, ps in probes.items() for n, (m, p, kw) in enumerate(ps)}
    team.api.system.delete_kb(vault.id)  # the same names and ids, now of nothing
    after = {(u, ref, n): _raw(team, u, m, p, **kw)
             for u in users for ref, ps in probes.items() for n, (m, p, kw) in enumerate(ps)}
    differ = [(key, probes[key[1]][key[2]][:2], before[key], after[key])
              for key in before if before[key] != after[key]]
    assert differ == [], "\n".join(f"{k} {m} {p}: {b[0]} {b[1][:160]!r} != {a[0]} {a[1][:160]!r}"
                                   for k, (m, p), b, a in differ)
    statuses = {b[0] for b in before.values()}
    assert statuses <= {200, 403, 404}, statuses  # 200: a stream whose error event says so
    assert 404 in statuses and len(before) == 2 * 2 * len(probes["Vault"])


# -- item 8: the query log seen through the caller's access as it is now ------------------------------
REORG = ("Reorg plan 2027", "The platform team moves to Berlin in May 2027 and the Lisbon office "
         "closes. Code name ORCA.", "https://intranet/reorg")


def test_a_lowered_clearance_hides_the_titles_and_urls_past_answers_cited_in_the_query_log(team, tmp_path):
    """Before: carol's log still named the confidential source and its URL after her role was
    lowered to internal."""
    from localkb.retrieval.search import Reranker
    from test_team_chat import build_cross_encoder

    d = team.api.directory
    d.add_role("leads", "confidential")
    d.add_user("carol", roles=["leads"])
    d.grant("leads", team.kb.id)
    team.tokens["carol"] = d.create_token("carol")["token"]
    with team.client("bob") as bob:
        bob.add(team.kb.id, title=REORG[0], text=REORG[1], url=REORG[2], access="confidential")
    team.api.reranker = Reranker(build_cross_encoder(tmp_path / "ce", ["reorg", "berlin"]))
    with team.client("carol") as carol:
        reorg = carol.chat([team.kb.id], "Where does the platform team move in the reorg?")
        holiday = carol.chat([team.kb.id], "How many days of paid holiday do staff get?")
    assert reorg["citations"][0]["title"] == REORG[0] and "Berlin" in reorg["answer"]
    assert holiday["citations"][0]["title"] == HOLIDAY[0]

    def logged() -> dict[str, str]:
        with team.client("carol") as carol:
            return {"list": json.dumps(carol.querylog(), ensure_ascii=False),
                    "jsonl": carol.querylog_export("jsonl").decode(),
                    "csv": carol.querylog_export("csv").decode()}

    assert all(REORG[0] in text and REORG[2] in text for text in logged().values())
    d.set_clearance("leads", "internal")
    now = logged()
    for form, text in now.items():
        for secret in (REORG[0], REORG[2], "Berlin", "ORCA"):
            assert secret not in text, (form, secret)
        assert HOLIDAY[0] in text and "https://intranet/holiday" in text, form  # still visible to her
        assert "[a source you can no longer see]" in text, form
    rows = {r["query"]: r for r in json.loads(now["list"])["queries"]}
    hidden = rows["Where does the platform team move in the reorg?"]
    assert hidden["citations"][0] == {"n": 1, "kb": None, "kb_name": None,
                                      "title": "[a source you can no longer see]", "url": None,
                                      "chunk_index": None, "chunk_id": None, "page": None,
                                      "redacted": True}
    assert all(e["title"] != REORG[0] for e in hidden["rerank"][team.kb.id]["order"])
    # the administrator's log is the record as written
    with team.client("root") as root:
        assert REORG[0] in json.dumps(root.querylog(user="carol"), ensure_ascii=False)
    # and what she may see again shows again
    d.set_clearance("leads", "confidential")
    assert all(REORG[0] in text for text in logged().values())


# -- item 3: a writer's add never reveals (or touches) a source above their clearance -------------------
SECRET_URL = "https://intranet/salaries"
_IDS = re.compile(r"\b(tkb_[0-9a-f]{12}|s[0-9a-f]{23}|[0-9a-f]{32})\b")
#: Times and the knowledge base's write counter (see the report: it counts every write).
_VARYING = re.compile(r"(^|_)(ms|s|at|created|elapsed|timings|generation)$")


def _normal(value, ids: dict[str, str], name: str):
    """A reply with its times dropped, its ids numbered by first appearance, its KB's name fixed."""
    if isinstance(value, dict):
        return {_normal(k, ids, name): _normal(v, ids, name) for k, v in value.items()
                if not _VARYING.search(k)}
    if isinstance(value, list):
        return [_normal(v, ids, name) for v in value]
    if isinstance(value, str):
        value = value.replace(name, "<kb>")
        return _IDS.sub(lambda m: ids.setdefault(m.group(0), f"<id{len(ids)}>"), value)
    return value


def _paths(a, b, at: str = "") -> list[str]:
    """Where two replies differ: each differing leaf as ``path: a != b``."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b), key=str)
                for p in _paths(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{at}.{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [p for n, (x, y) in enumerate(zip(a, b, strict=True)) for p in _paths(x, y, f"{at}[{n}]")]
    return [] if a == b else [f"{at}: {a!r:.120} != {b!r:.120}"]


def _writer_probes(team, user: str, kb) -> list[tuple[int, object]]:
    """One writer's sequence at ``SECRET_URL``: add, re-add, list, search, read, export, relevel,
    delete; each reply as (status, normalised JSON)."""
    from urllib.parse import quote

    ids: dict[str, str] = {}
    out: list[tuple[int, object]] = []

    def call(method: str, path: str, **kw) -> dict:
        status, body = _raw(team, user, method, path, **kw)
        data = json.loads(body) if not path.endswith("/export") or status != 200 else {}
        out.append((status, _normal(data, ids, kb.name)))
        return data

    page = {"url": SECRET_URL, "title": "Salary questions",
            "text": "Ask HR about the salary bands; they answer within a week."}
    src = f"/v1/kbs/{kb.id}/sources"
    first = call("POST", src, json=page)
    call("POST", src, json=page)
    call("POST", src, json={**page, "text": page["text"] + " Bands are reviewed every March."})
    call("POST", src, json={**page, "text": page["text"] + " Bands are reviewed every March.",
                            "access": "public"})
    call("GET", src)
    call("POST", "/v1/search", json={"kbs": [kb.id], "query": "senior engineer salary band",
                                     "include_weaker": True})
    call("POST", "/v1/search", json={"kbs": [kb.id], "query": "SB-2027", "mode": "keyword"})
    call("GET", f"/v1/kbs/{kb.id}/passages",
         params={"source": (first.get("result") or {}).get("source_id", "-"), "index": 0, "radius": 1})
    with httpx.Client(base_url=team.url, trust_env=False) as http:
        resp = http.get(f"/v1/kbs/{kb.id}/export", headers={
            "Authorization": f"Bearer {team.tokens[user]}"})
    out.append((resp.status_code, (resp.headers.get("x-localkb-sources"),
                                   resp.headers.get("x-localkb-chunks"))))
    listing = call("GET", "/v1/kbs")
    out[-1] = (out[-1][0], [k for k in out[-1][1]["result"]["knowledge_bases"] if k["id"] == "<kb>"
                            or k["name"] == "<kb>"])
    assert listing["ok"]
    call("PATCH", f"{src}/{quote(SECRET_URL, safe='')}", json={"access": "internal"})
    call("POST", src, json={**page, "access": "secret"})  # above her clearance: refused either way
    call("DELETE", f"{src}/{quote(SECRET_URL, safe='')}")
    call("DELETE", f"{src}/{quote(SECRET_URL, safe='')}")
    call("GET", src)
    call("POST", src, json=page)
    return out


def test_a_writers_add_at_a_hidden_sources_url_reveals_nothing_and_changes_nothing(team, team_db):
    """Before: dana's add at the URL of a secret source was refused with 403 "above your
    clearance", where the same add in a knowledge base without it was stored (200)."""
    d = team.api.directory
    one = team.api.system.create_kb("WikiOne", default_access=1)
    two = team.api.system.create_kb("WikiTwo", default_access=1)
    d.add_role("editors", "internal")
    d.add_user("dana", roles=["editors"])
    team.tokens["dana"] = d.create_token("dana")["token"]
    for kb in (one, two):
        d.grant("editors", kb.id, write=True)
        d.grant("execs", kb.id, write=True)
    with team.client("bob") as bob:
        for kb in (one, two):
            bob.add(kb.id, title=HOLIDAY[0], text=HOLIDAY[1], url="https://intranet/holiday")
        secret = bob.add(one.id, title=SALARY[0], text=SALARY[1], url=SECRET_URL, access="secret")

    def stored(sid: str) -> tuple:
        with team_db.conn() as conn:
            src = conn.execute("SELECT * FROM sources WHERE id = %s", (sid,)).fetchone()
            chunks = conn.execute("SELECT id, text, text_hash, access_level, embedding::text AS e "
                                  "FROM chunks WHERE source_id = %s ORDER BY idx", (sid,)).fetchall()
        return src, chunks

    was = stored(secret["source_id"])
    with_hidden = _writer_probes(team, "dana", one)
    without = _writer_probes(team, "dana", two)
    assert len(with_hidden) == len(without) == 16  # the probes compared
    differ = [(n, a, b) for n, (a, b) in enumerate(zip(with_hidden, without, strict=True)) if a != b]
    assert differ == [], "\n".join(f"probe {n}: {'; '.join(_paths(a, b))[:600]}" for n, a, b in differ)
    assert [s for s, _ in with_hidden].count(200) == 14  # all but the secret add and the second delete
    # the hidden source is exactly as it was: row, passages, vectors
    assert stored(secret["source_id"]) == was
    # someone who sees both sees two sources at that URL, each with its level and author ...
    with team.client("bob") as bob:
        rows = [(r["title"], r["access"], r["added_by"]) for r in bob.sources(one.id)["sources"]
                if r["url"] == SECRET_URL]
        assert sorted(rows) == [(SALARY[0], "secret", "bob"), ("Salary questions", "internal", "dana")]
        # ... and their own add at it still reaches their own source
        again = bob.add(one.id, title=SALARY[0], text=SALARY[1], url=SECRET_URL)
        assert again["status"] == "unchanged" and again["source_id"] == secret["source_id"]
        hits = bob.search([one.id], "senior engineer salary band", k=3)["hits"]
        assert hits[0]["title"] == SALARY[0]
    # an export holds both (the later one's key made unique), so the file imports whole
    with team.client("root") as root:
        body, head = root.export(one.id)
        copy = root.import_(body, name="WikiCopy", access="secret")
        urls = [r["url"] for r in root.sources(copy["knowledge_base"]["id"])["sources"]]
    assert head["x-localkb-sources"] == "3" and copy["chunks"] == 3
    assert sorted(urls) == ["https://intranet/holiday", SECRET_URL, SECRET_URL]


def test_a_writers_own_source_raised_above_them_is_not_reached_by_their_next_add(team):
    d = team.api.directory
    d.add_role("editors", "internal")
    d.set_user_roles("alice", add=["editors"])
    d.grant("editors", team.kb.id, write=True)
    page = {"url": "https://intranet/plans", "title": "Plans", "text": "The plan is to grow."}
    with team.client("alice") as alice, team.client("bob") as bob:
        first = alice.add(team.kb.id, **page)
        bob.set_access(team.kb.id, first["source_id"], "secret")
        second = alice.add(team.kb.id, **{**page, "text": "The plan is to shrink."})
        again = alice.add(team.kb.id, **{**page, "text": "The plan is to shrink."})
        rows = {r["id"]: (r["access"], r["title"]) for r in bob.sources(team.kb.id)["sources"]
                if r["url"] == page["url"]}
        raised = bob.passages(team.kb.id, first["source_id"], 0, 0)
    assert second["status"] == "added" and second["source_id"] != first["source_id"]
    assert again["status"] == "unchanged" and again["source_id"] == second["source_id"]
    assert rows == {first["source_id"]: ("secret", "Plans"), second["source_id"]: ("internal", "Plans")}
    assert [p["text"] for p in raised] == ["The plan is to grow."]  # the raised one is untouched
