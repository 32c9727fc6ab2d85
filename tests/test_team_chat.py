"""Team chat end to end: real PostgreSQL (embedded wheel), a real team server and model server on loopback.

Each bullet of issue 20 has its test here: the SSE chat endpoint (CRLF too), the two-tier
cache across access sets, revocations and writes, embedding once, the daily caps, the
input and output guardrails, the query log (API and CLI) and the rerank stage with a real
ONNX cross-encoder built by the test.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from conftest import run_cli
from fakellm import FakeLLM
from localkb.answer.chat import run_turn
from localkb.answer.llm import Endpoint
from localkb.embedding.embedder import MiniLMEmbedder
from localkb.errors import GuardrailBlocked, KnowledgeBaseNotFound, LocalKBError, RateLimited
from localkb.retrieval.search import Reranker
from localkb.team.chat import ChatConfig
from localkb.team.client import TeamClient
from localkb.team.guard import Policy, check_output
from localkb.team.limits import Caps, RateLimiter
from localkb.team.server import TeamAPI
from test_team import HOLIDAY, SALARY, _start, seed_acme

QUESTION = "How many days of paid holiday do staff get?"


def _answer(request: dict) -> str:
    """The model's reply: cites passage 1, naming what it was given (so answers differ by passage)."""
    text = request["messages"][-1]["content"]
    if "25 days" in text:
        return "Staff get 25 days of paid holiday a year [1]."
    if "95,000" in text:
        return "The senior band is 95,000 to 120,000 EUR [1]."
    return "I don't know from these documents."


def _make(team_db, settings, tmp_path, **chat) -> SimpleNamespace:
    llm = FakeLLM(reply_fn=_answer).__enter__()
    config = ChatConfig(endpoint=chat.pop("endpoint", Endpoint("team", llm.base_url, "fake-model")),
                        **chat)
    api = TeamAPI(team_db, settings, name="acme", chat=config)
    httpd, _ = _start(api)
    kb, tokens, holiday, salary = seed_acme(api, httpd.url, more_staff=("carol",))
    return SimpleNamespace(url=httpd.url, api=api, kb=kb, tokens=tokens, llm=llm, httpd=httpd,
                           holiday=holiday, salary=salary,
                           client=lambda user: TeamClient(httpd.url, tokens[user]))


def _serve_again(team, settings, **chat) -> SimpleNamespace:
    """A second team server over the same database and users, with another chat configuration."""
    config = ChatConfig(endpoint=chat.pop("endpoint", Endpoint("team", team.llm.base_url, "fake-model")),
                        **chat)
    api = TeamAPI(team.api.db, settings, name="acme", chat=config)
    httpd, _ = _start(api)
    return SimpleNamespace(**{**vars(team), "api": api, "httpd": httpd, "url": httpd.url,
                              "client": lambda user: TeamClient(httpd.url, team.tokens[user])})


@pytest.fixture
def team(team_db, settings, tmp_path):
    ns = _make(team_db, settings, tmp_path)
    yield ns
    ns.httpd.shutdown()
    ns.httpd.server_close()
    ns.llm.close()


@pytest.fixture
def make_team(team_db, settings, tmp_path):
    made = []

    def make(**chat):
        ns = _make(team_db, settings, tmp_path, **chat)
        made.append(ns)
        return ns

    yield make
    for ns in made:
        ns.httpd.shutdown()
        ns.httpd.server_close()
        ns.llm.close()


class EmbedCounter:
    """Counts the real embedder's calls per text (the real model still runs)."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[list[str]] = []
        real = MiniLMEmbedder.embed

        def counted(embedder, texts, *args, **kwargs):
            self.calls.append(list(texts))
            return real(embedder, texts, *args, **kwargs)

        monkeypatch.setattr(MiniLMEmbedder, "embed", counted)

    def of(self, text: str) -> int:
        return sum(1 for c in self.calls if c == [text])


# -- 1 and 9: the chat endpoint, grounded, streamed over SSE (CRLF too) ------------------------------
def test_team_chat_answers_with_citations_as_json_and_as_an_sse_stream_with_crlf(make_team):
    team = make_team(sse_newline="\r\n")
    with team.client("alice") as alice:
        steps, tokens = [], []
        by_event = {"step": steps, "token": tokens}
        result = alice.chat_stream([team.kb.id], QUESTION,
                                   on_event=lambda n, d: by_event.get(n, []).append(d))
        plain = alice.chat([team.kb.id], QUESTION, regenerate=True)
    assert result["answer"] == "Staff get 25 days of paid holiday a year [1]." == plain["answer"]
    assert result["generated"] and result["citations"][0]["title"] == HOLIDAY[0]
    assert [s["status"] for s in steps] == ["passages"] and steps[0]["kb"] == team.kb.id
    assert "".join(t["text"] for t in tokens) == result["answer"]
    assert result["pipeline"]["access"]["user"] == "alice"
    # The bytes on the wire really end their lines in CRLF, events split by \r\n\r\n.
    with httpx.Client(base_url=team.url, trust_env=False) as http:
        raw = http.post("/v1/chat", json={"kbs": [team.kb.id], "message": QUESTION, "stream": True},
                        headers={"Authorization": f"Bearer {team.tokens['alice']}"}).content
    assert b"\r\n\r\n" in raw and b"event: result\r\ndata: " in raw and b"\n\n" not in raw.replace(
        b"\r\n", b"")
    # alice (internal) never gets the secret passage, bob (secret) does
    with team.client("alice") as alice, team.client("bob") as bob:
        a = alice.chat([team.kb.id], "What is the senior engineer salary band?")
        b = bob.chat([team.kb.id], "What is the senior engineer salary band?")
    assert "95,000" in b["answer"] and b["citations"][0]["title"] == SALARY[0]
    assert "95,000" not in a["answer"] and all(c["title"] != SALARY[0] for c in a["citations"])


def test_a_stream_that_fails_mid_turn_ends_in_an_error_event_not_silence(make_team, team_db):
    team = make_team()
    with team.client("alice") as alice:
        with pytest.raises(KnowledgeBaseNotFound):  # not granted: refused before the stream starts
            alice.chat_stream(["tkb_000000000000"], QUESTION)
        team.api.system.delete_kb(team.kb.id)
        with pytest.raises(KnowledgeBaseNotFound):
            alice.chat_stream([team.kb.id], QUESTION)


# -- 2: the two-tier cache, namespaced by permission -------------------------------------------------
def test_exact_tier_never_crosses_access_sets_and_dies_with_a_revocation_or_a_write(team):
    sent = lambda: len(team.llm.requests)  # noqa: E731
    with team.client("alice") as alice, team.client("bob") as bob, team.client("carol") as carol:
        first = alice.chat([team.kb.id], QUESTION)
        assert first["cached"] is False and sent() == 1
        again = alice.chat([team.kb.id], "  how many DAYS of paid holiday do staff get ")
        assert again["cached"] == "exact" and again["answer"] == first["answer"] and sent() == 1
        assert again["pipeline"]["cache"]["tier"] == "exact"
        # carol holds the same roles: the same access set, so the same answer is hers too
        assert carol.chat([team.kb.id], QUESTION)["cached"] == "exact"
        # bob's access set differs (secret clearance, write): never served alice's answer
        assert bob.chat([team.kb.id], QUESTION)["cached"] is False and sent() == 2
        # a revoked grant: refused before the cache is looked at; granted again, answered afresh
        # only if anything changed (the same access set and generations: the same answer)
        team.api.directory.revoke("staff", team.kb.id)
        with pytest.raises(KnowledgeBaseNotFound):
            alice.chat([team.kb.id], QUESTION)
        team.api.directory.grant("staff", team.kb.id)
        # a revocation: staff's clearance goes down to public, the holiday page is internal
        team.api.directory.set_clearance("staff", "public")
        revoked = alice.chat([team.kb.id], QUESTION)
        assert revoked["cached"] is False and "25 days" not in revoked["answer"]
        assert all(c["title"] != HOLIDAY[0] for c in revoked["citations"])
        team.api.directory.set_clearance("staff", "internal")
        # a write to the knowledge base drawn on: its generation moves, the cached answer goes
        before = sent()
        bob.add(team.kb.id, title="Parking", text="Parking spaces are given out by lottery each May.")
        after_write = alice.chat([team.kb.id], QUESTION)
        assert after_write["cached"] is False and sent() == before + 1


def test_semantic_tier_serves_a_paraphrase_only_within_one_access_set(make_team, settings):
    team = make_team(semantic_threshold=0.80)
    paraphrase = "How many paid holiday days do staff get each year?"
    with team.client("alice") as alice, team.client("bob") as bob:
        alice.chat([team.kb.id], QUESTION)
        hit = alice.chat([team.kb.id], paraphrase)
        cos = hit["pipeline"]["cache"]["cosine"]
        assert hit["cached"] == "semantic" and cos >= 0.80, cos
        assert hit["pipeline"]["cache"]["semantic_threshold"] == 0.80
        assert bob.chat([team.kb.id], paraphrase)["cached"] is False
        # after a write, the paraphrase is answered afresh
        bob.add(team.kb.id, title="Parking", text="Parking spaces are given out by lottery each May.")
        assert alice.chat([team.kb.id], paraphrase)["cached"] is False
    # default: off, and the measurement says why (bench/team.py --threshold)
    off = _serve_again(team, settings)
    with off.client("alice") as alice:
        alice.chat([off.kb.id], QUESTION)
        miss = alice.chat([off.kb.id], paraphrase)
    assert miss["cached"] is False and miss["pipeline"]["cache"]["semantic_threshold"] is None
    off.httpd.shutdown()
    off.httpd.server_close()


# -- 3: embed once -----------------------------------------------------------------------------------
def test_the_query_is_embedded_once_for_the_semantic_cache_and_every_vector_leg(make_team, monkeypatch,
                                                                                 store):
    team = make_team(semantic_threshold=0.95)
    second = team.api.system.create_kb("Wiki", privacy="device", default_access=1)
    team.api.directory.grant("staff", second.id)
    team.api.directory.grant("execs", second.id, write=True)
    with team.client("bob") as bob:
        bob.add(second.id, title="Leave", text="Parental leave is 16 weeks at full pay.")
    counter = EmbedCounter(monkeypatch)
    question = "How long is parental leave and paid holiday?"
    with team.client("alice") as alice:
        out = alice.chat([team.kb.id, second.id], question)
    assert {s["kb"] for s in out["statuses"]} == {team.kb.id, second.id}
    assert counter.of(question) == 1, counter.calls  # was 3: the cache's, then one per knowledge base
    # the local product shares the fix (the same run_turn)
    for name, text in (("A", HOLIDAY[1]), ("B", "Parental leave is 16 weeks at full pay.")):
        store.create_kb(name)
        from localkb.ingest.pipeline import add_capture

        add_capture(store.open_kb(name), url=None, title=name, text=text, captured_by="api")
    counter.calls.clear()
    from localkb.answer.chat import AnswerCache

    run_turn(store, ["A", "B"], question, cache=AnswerCache())
    assert counter.of(question) == 1, counter.calls


# -- 4: rate limits ------------------------------------------------------------------------------------
def test_daily_caps_per_user_and_per_address_refuse_with_the_reset_time(make_team):
    team = make_team(caps=Caps(per_user=2, per_address=4))
    with team.client("alice") as alice:
        alice.chat([team.kb.id], QUESTION)
        alice.chat([team.kb.id], QUESTION)
        with pytest.raises(RateLimited) as err:
            alice.chat([team.kb.id], QUESTION)
    detail = err.value.detail
    tomorrow = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)
    assert detail["scope"] == "user" and detail["cap"] == 2
    assert dt.datetime.fromisoformat(detail["reset_at"]) == dt.datetime.combine(tomorrow, dt.time(0),
                                                                                tzinfo=dt.UTC)
    assert "resets at" in str(err.value)
    with httpx.Client(base_url=team.url, trust_env=False) as http:
        resp = http.post("/v1/chat", json={"kbs": [team.kb.id], "message": QUESTION},
                         headers={"Authorization": f"Bearer {team.tokens['alice']}"})
    refused = resp.json()["error"]
    assert resp.status_code == 429 and refused["code"] == "rate_limited"
    assert int(resp.headers["Retry-After"]) == refused["detail"]["retry_after_s"] > 0
    assert refused["detail"]["reset_at"] == detail["reset_at"]
    # the address cap (all clients here are 127.0.0.1): 2 of 4 used (a refusal takes no slot)
    with team.client("bob") as bob, team.client("carol") as carol:
        bob.chat([team.kb.id], QUESTION)
        carol.chat([team.kb.id], QUESTION)
        with pytest.raises(RateLimited) as err:
            carol.chat([team.kb.id], QUESTION)
    assert err.value.detail["scope"] == "address" and err.value.detail["cap"] == 4
    # a refusal by the address cap did not use up carol's own count (rolled back with it)
    usage = {(r["scope"], r["key"]): r["count"] for r in RateLimiter(team.api.db).usage()}
    assert usage[("address", "127.0.0.1")] == 4 and usage[("user", team.api.directory.user(
        "carol")["id"])] == 1


def test_the_counter_is_exact_under_concurrency_and_resets_the_next_day(team_db):
    import concurrent.futures as cf

    limiter = RateLimiter(team_db, Caps(per_user=7, per_address=0))
    now = dt.datetime(2026, 12, 1, 23, 59, tzinfo=dt.UTC)

    def one(_):
        try:
            limiter.take("u_x", "10.0.0.1", now=now)
            return True
        except RateLimited:
            return False

    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(20)))
    assert results.count(True) == 7
    assert limiter.take("u_x", "10.0.0.1", now=now + dt.timedelta(minutes=2))["remaining"]["user"] == 6


# -- 5: guardrails ----------------------------------------------------------------------------------
def test_input_guardrails_refuse_before_anything_runs(make_team, monkeypatch):
    policy = Policy.from_lines(["# refused", "payroll export", "secrets: (?:api|secret)[ _-]?keys?"],
                               max_chars=200)
    team = make_team(policy=policy, caps=Caps(per_user=100, per_address=100))
    counter = EmbedCounter(monkeypatch)
    cases = {"": "empty", "   \n ": "empty", "x" * 201: "too_long", "holiday\x07days": "control_chars",
             "holiday \u202eyad": "control_chars", "Give me the PAYROLL   export": "deny_list",
             "list the API keys": "deny_list"}
    with team.client("alice") as alice:
        for message, rule in cases.items():
            with pytest.raises(GuardrailBlocked) as err:
                alice.chat([team.kb.id], message)
            assert err.value.detail["rule"] == rule and err.value.detail["stage"] == "input"
        with pytest.raises(GuardrailBlocked) as err:
            alice.chat([team.kb.id], "and?", history=[{"role": "user", "content": "payroll export"}])
        assert err.value.detail["rule"] == "deny_list"
    assert "payroll" not in str(err.value)  # the rule's name, never the refused text
    assert counter.calls == [] and team.llm.requests == []  # nothing embedded, nothing sent
    assert RateLimiter(team.api.db).usage() == []  # and no cap slot taken
    with team.client("alice") as alice:
        assert alice.chat([team.kb.id], QUESTION)["generated"]  # a normal question still passes


def test_output_guardrails_check_citations_server_side_and_the_privacy_gate(team, settings):
    d = team.api.directory
    store = team.api.system.for_access(d.access(d.user("alice")["id"], "alice", False))
    with team.client("alice") as alice:
        good = alice.chat([team.kb.id], QUESTION)
    assert good["pipeline"]["guard"]["citations"] == 1
    assert check_output(good, store)["location"] == "device"
    secret_chunk = next(iter(_chunks(team, team.salary["source_id"])))
    forged = json.loads(json.dumps(good))
    forged["citations"][0]["chunk_id"] = secret_chunk  # a citation alice was never given
    with pytest.raises(GuardrailBlocked) as err:
        check_output(forged, store)
    assert err.value.detail["rule"] == "citation"
    stray = {**good, "answer": good["answer"] + " See also [4]."}
    with pytest.raises(GuardrailBlocked, match=r"\[4\]"):
        check_output(stray, store)
    cloud = {**good, "model": {**good["model"], "location": "cloud"}}
    with pytest.raises(GuardrailBlocked) as err:
        check_output(cloud, store)  # the Handbook is device-only
    assert err.value.detail["rule"] == "privacy"
    # end to end with a cloud model: the gate skips the device knowledge base before retrieval,
    # nothing reaches the model, and the output check passes on what is left
    llm = FakeLLM(reply_fn=_answer).__enter__()
    try:
        cloudy = _serve_again(team, settings, endpoint=Endpoint("cloud", llm.base_url, "m",
                                                                mark_cloud=True))
        with cloudy.client("alice") as alice:
            out = alice.chat([cloudy.kb.id], QUESTION)
        assert out["statuses"][0]["status"] == "skipped" and out["citations"] == []
        assert llm.requests == [] and out["pipeline"]["location"] == "cloud"
        cloudy.httpd.shutdown()
        cloudy.httpd.server_close()
    finally:
        llm.close()


def _chunks(team, source_id):
    with team.api.db.conn() as conn:
        return {r["id"] for r in conn.execute("SELECT id FROM chunks WHERE source_id = %s",
                                              (source_id,))}


# -- 6: the query log ------------------------------------------------------------------------------
def test_every_query_is_logged_admins_list_and_export_users_see_their_own(team, team_db_url, tmp_path):
    with team.client("alice") as alice, team.client("bob") as bob:
        alice.chat([team.kb.id], QUESTION)
        alice.chat([team.kb.id], QUESTION)
        bob.chat([team.kb.id], "What is the senior engineer salary band?")
        with pytest.raises(GuardrailBlocked):
            alice.chat([team.kb.id], "bad\x07bell")
        own = alice.querylog()
        with pytest.raises(Exception, match="only your own"):
            alice.querylog(user="bob")
    assert own["total"] == 3 and {r["user"] for r in own["queries"]} == {"alice"}
    refused, cached, first = own["queries"]
    assert refused["outcome"] == "refused" and refused["error_code"] == "guardrail_blocked"
    assert cached["cache"] == "exact" and first["cache"] is None
    assert first["access"]["knowledge_bases"][team.kb.id]["level"] == "internal"
    assert first["kbs"] == [team.kb.id] and first["citations"][0]["title"] == HOLIDAY[0]
    assert first["citations"][0]["chunk_id"]
    assert {"guard_in", "limits", "embed", "vector", "keyword", "fuse", "generate",
            "guard_out"} <= set(first["stages"]) and first["total_ms"] > 0
    with team.client("root") as root:
        everyone = root.querylog()
        jsonl = root.querylog_export("jsonl").decode().splitlines()
        csv_text = root.querylog_export("csv").decode()
    assert everyone["total"] == 4 and {r["user"] for r in everyone["queries"]} == {"alice", "bob"}
    assert len(jsonl) == 4 and json.loads(jsonl[-1])["outcome"] == "refused"
    assert csv_text.splitlines()[0].startswith('"id","at","user","address"')
    assert len(csv_text.splitlines()) == 5
    # the admin CLI, against the same database
    res = run_cli(["team", "log", "list", "--db", team_db_url, "--user", "alice"], tmp_path / "cli")
    assert res.returncode == 0, res.stderr
    assert "3 queries logged by alice" in res.stdout and "cache:exact" in res.stdout
    out = tmp_path / "log.csv"
    res = run_cli(["team", "log", "export", "--db", team_db_url, "--format", "csv", "-o", str(out)],
                  tmp_path / "cli")
    assert res.returncode == 0, res.stderr
    assert len(out.read_text().splitlines()) == 5


# -- 7: the rerank stage ---------------------------------------------------------------------------
def build_cross_encoder(folder: Path, favoured: list[str]) -> Path:
    """A real (tiny) ONNX cross-encoder: score = sum over the pair's tokens of a learned weight,
    high for the tokens of ``favoured`` words. Same inputs and output as a BERT cross-encoder."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tokenizers import Tokenizer

    from localkb.embedding.files import tokenizer_path

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer_path(), folder / "tokenizer.json")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    weights = np.zeros((vocab, 1), np.float32)
    for word in favoured:
        for i in tok.encode(word, add_special_tokens=False).ids:
            weights[i, 0] = 5.0
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "input_ids"], ["g"], axis=0),
         helper.make_node("Squeeze", ["g", "axis2"], ["s"]),
         helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["s", "m"], ["p"]),
         helper.make_node("ReduceSum", ["p", "axis1"], ["logits"], keepdims=1)],
        "tiny-cross-encoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "t"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "t"]),
         helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["b", "t"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 1])],
        [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(np.array([2], np.int64), "axis2"),
         numpy_helper.from_array(np.array([1], np.int64), "axis1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = folder / "cross-encoder.onnx"
    onnx.save(model, str(path))
    return path


def test_the_rerank_stage_reorders_the_top_50_and_shows_its_cost(team, tmp_path):
    with team.client("bob") as bob:
        for n in range(6):
            bob.add(team.kb.id, title=f"Holiday note {n}",
                    text=f"Holiday note {n}: paid holiday requests go through the portal. "
                    + ("Approved by the lottery committee." if n == 4 else ""))
    question = "how do I request paid holiday?"
    with team.client("bob") as bob:
        plain = bob.chat([team.kb.id], question)
    assert plain["pipeline"]["rerank"] == {"configured": False, "model": None, "scored": 0,
                                           "top": None, "order": []}
    team.api.reranker = Reranker(build_cross_encoder(tmp_path / "ce", ["lottery"]))
    with team.client("bob") as bob:
        out = bob.chat([team.kb.id], question, regenerate=True)
    view = out["pipeline"]["rerank"]
    assert view["configured"] and view["model"] == "cross-encoder.onnx"
    assert view["scored"] == len(view["order"]) >= 7  # every fused candidate, up to 50
    assert [r["after"] for r in view["order"]] == list(range(1, len(view["order"]) + 1))
    top = view["order"][0]
    assert top["title"] == "Holiday note 4" and top["before"] > 1  # moved up by the cross-encoder
    scores = [r["score"] for r in view["order"]]
    assert scores == sorted(scores, reverse=True)
    stage = {s["stage"]: s["ms"] for s in out["pipeline"]["stages"]}
    assert stage["rerank"] > 0
    with team.client("root") as root:
        logged = root.querylog(limit=1)["queries"][0]
    assert logged["rerank"][team.kb.id]["order"][0]["title"] == "Holiday note 4"


# -- 9: the side panel's stream through the host ---------------------------------------------------
def test_the_host_relays_the_team_stream_to_the_side_panel(team, tmp_path):
    import sys

    from hostproc import HostProcess
    from localkb.team.attached import attach

    home = tmp_path / "home"
    attach(home, team.url, team.tokens["alice"])
    with HostProcess([sys.executable, "-m", "localkb", "host"], home=home) as host:
        host.send({"id": 1, "type": "chat", "data": {"kbs": ["Handbook"], "message": QUESTION}})
        got = host.until_reply(1, timeout=120)
    reply, events = got[-1], got[:-1]
    assert reply["ok"], reply
    result = reply["result"]
    assert result["team"] == "acme" and result["answer"].startswith("Staff get 25 days")
    assert result["pipeline"]["access"]["user"] == "alice"
    kinds = [e["event"] for e in events]
    assert "step" in kinds and "token" in kinds
    assert "".join(e["data"]["text"] for e in events if e["event"] == "token") == result["answer"]
    with team.client("alice") as alice:
        assert alice.querylog()["queries"][0]["query"] == QUESTION  # answered (and logged) by the team
    # a team that cannot be reached: answered by the host, the team's knowledge base unavailable
    from localkb.team.attached import load_attachments, save_attachments

    teams = load_attachments(home)
    teams[0].url = "http://127.0.0.1:9"
    save_attachments(home, teams)
    with HostProcess([sys.executable, "-m", "localkb", "host"], home=home) as host:
        host.send({"id": 2, "type": "chat", "data": {"kbs": ["Handbook"], "message": QUESTION}})
        got = host.until_reply(2, timeout=120)
    assert got[-1]["ok"], got[-1]
    assert got[-1]["result"]["statuses"][0]["status"] == "unavailable"
    assert "did not run" in got[-1]["result"]["answer"]


# -- issue 37.1: the relay gates what it hands a team ------------------------------------------------
def _record_chat_bodies(api) -> list[bytes]:
    """Every request body the team server reads, as it arrived (what left the device)."""
    bodies: list[bytes] = []
    dispatch = api.dispatch

    def recording(req):
        reader = req._read_body

        def read(limit):
            raw = reader(limit)
            bodies.append(raw)
            return raw

        req._read_body = read
        return dispatch(req)

    api.dispatch = recording
    return bodies


def _everything_the_team_saw(team, bodies: list[bytes]) -> str:
    return "\n".join([b.decode("utf-8", "replace") for b in bodies]
                     + [json.dumps(r) for r in team.llm.requests])


def test_the_relay_sends_a_team_only_turns_drawn_wholly_from_that_team(team, settings, tmp_path):
    """The panel's request exactly (no endpoint, ``kbs`` on assistant turns) through a real host:
    an earlier answer quoting a device-only local knowledge base never leaves this device."""
    import sys

    from hostproc import HostProcess
    from localkb.config import Settings
    from localkb.store.kb import Store
    from localkb.team.attached import attach

    home = tmp_path / "home"
    local = Store(Settings.from_env({"LOCALKB_HOME": str(home),
                                     "LOCALKB_MODEL_DIR": str(settings.model_dir)}))
    private = local.create_kb("Private")  # device only, on this machine
    local.close()
    attach(home, team.url, team.tokens["alice"])
    bodies = _record_chat_bodies(team.api)
    history = [
        {"role": "user", "content": "What is the door code?"},
        {"role": "assistant", "content": "The code is CANARY-DEV-7731 [1].", "kbs": [private.id]},
        {"role": "user", "content": "And the alarm?"},
        {"role": "assistant", "content": "It is CANARY-UNKNOWN-5512."},  # no kbs: unknown
        {"role": "user", "content": "Both then?"},
        {"role": "assistant", "content": "Both: CANARY-MIX-4242 [1][2].",
         "kbs": [team.kb.id, private.id]},
        {"role": "user", "content": "How long is the holiday?"},
        {"role": "assistant", "content": "CANARY-TEAM-1234: 25 days [1].", "kbs": [team.kb.id]},
    ]
    with HostProcess([sys.executable, "-m", "localkb", "host"], home=home) as host:
        host.send({"id": 1, "type": "chat", "data": {"kbs": ["Handbook"], "message": QUESTION,
                                                      "history": history}})
        got = host.until_reply(1, timeout=120)
        reply = got[-1]
        assert reply["ok"], reply
        # the panel learns the relayed answer's provenance before its first token, as it does locally
        provenance = [e["data"]["kbs"] for e in got[:-1] if e.get("event") == "provenance"]
        assert provenance == [[team.kb.id]], [e.get("event") for e in got[:-1]]
        assert reply["result"]["team"] == "acme"  # the team answered: the relay ran
        seen = _everything_the_team_saw(team, bodies)
        for canary in ("CANARY-DEV-7731", "CANARY-UNKNOWN-5512", "CANARY-MIX-4242"):
            assert canary not in seen, f"{canary} reached the team"
        # what the team's own knowledge base wrote goes back to it, and reaches its model
        assert "CANARY-TEAM-1234" in json.dumps(team.llm.requests)

        # a stopped answer drawn from the device-only knowledge base is never sent to be continued
        sent_before = len(bodies)
        host.send({"id": 2, "type": "chat", "data": {
            "kbs": ["Handbook"], "message": QUESTION, "continue_from": "CANARY-CONT-9090 and",
            "continue_kbs": [private.id]}})
        reply = host.until_reply(2, timeout=120)[-1]
        assert not reply["ok"] and reply["error"]["code"] == "privacy_blocked", reply
        assert "CANARY-CONT-9090" not in _everything_the_team_saw(team, bodies[sent_before:])
        # one drawn from the team's knowledge base is continued by the team
        host.send({"id": 3, "type": "chat", "data": {
            "kbs": ["Handbook"], "message": QUESTION, "continue_from": "CANARY-CONT-TEAM-77 Staff",
            "continue_kbs": [team.kb.id]}})
        reply = host.until_reply(3, timeout=120)[-1]
        assert reply["ok"], reply
        assert reply["result"]["answer"].startswith("CANARY-CONT-TEAM-77 Staff")
        assert "CANARY-CONT-TEAM-77" in json.dumps(team.llm.requests[-1])


def test_a_team_server_sends_its_model_no_history_it_cannot_trace_to_its_own_knowledge_bases(team):
    """A turn naming knowledge bases the team does not hold, or none, came from another machine:
    unknown provenance, which reaches no model of the team's (not even one on its loopback)."""
    history = [
        {"role": "user", "content": "What is the door code?"},
        {"role": "assistant", "content": "The code is CANARY-FOREIGN-1 [1].", "kbs": ["a-local-id"]},
        {"role": "user", "content": "And the alarm?"},
        {"role": "assistant", "content": "It is CANARY-FOREIGN-2."},
        {"role": "user", "content": "And the holiday?"},
        {"role": "assistant", "content": "CANARY-OWN-3: 25 days [1].", "kbs": [team.kb.id]},
    ]
    with team.client("alice") as alice:
        out = alice.chat([team.kb.id], "and what about it?", history=history)
        assert out["answer"]
        sent = json.dumps(team.llm.requests)
        assert "CANARY-FOREIGN-1" not in sent and "CANARY-FOREIGN-2" not in sent
        assert "CANARY-OWN-3" in sent
        # continuing text the team cannot trace is refused, before its model sees it
        with pytest.raises(LocalKBError) as refused:
            alice.chat([team.kb.id], QUESTION, continue_from="CANARY-FOREIGN-4 and",
                       continue_kbs=["a-local-id"])
        assert refused.value.code == "privacy_blocked", refused.value
    assert "CANARY-FOREIGN-4" not in json.dumps(team.llm.requests)
