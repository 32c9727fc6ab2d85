"""Every path that builds a prompt goes through the one privacy gate, proven from what the model got.

The paths, each tested below against a real loopback model server:

    chat        the passages of the answer prompt
    rewrite     earlier turns sent to make a follow-up standalone
    history     earlier turns sent along with the answer prompt
    extractive  no model, or a model that failed: quoted passages, nothing sent
    tool calls  the knowledge bases offered to (and accepted from) ``add_to_knowledge_base``
    strict      the request fails before anything is sent

A "cloud" model here is a loopback server marked cloud, an endpoint named "auto" (undecided,
treated as cloud), or a name this process's resolver is told points off the machine: no test
traffic ever leaves the machine. Each leak check
has a positive control with an on-device endpoint, so a check that could never fail would show.
"""

from __future__ import annotations

import json
import socket

import pytest

from fakellm import FakeLLM
from localkb.answer import chat as chat_module
from localkb.answer.chat import ChatOptions, Turn, run_turn
from localkb.answer.llm import Endpoint, Timeouts
from localkb.errors import PrivacyBlocked
from localkb.ingest.pipeline import add_capture
from test_chat import ToolLLM

SECRET = "ZEBRA-7731"
DIARY_TEXT = (f"Dear diary: the spare key code is {SECRET}; the key hides under the green tea tin "
              "in the kitchen.")
RECIPE_TEXT = "Green tea cake: whisk two spoons of matcha green tea into the batter and bake."
QUESTION = "Where is the green tea tin kept?"


@pytest.fixture
def kbs(store):
    store.create_kb("Diary", privacy="device")
    store.create_kb("Recipes", privacy="cloud")
    add_capture(store.open_kb("Diary"), url=None, title="Diary", text=DIARY_TEXT)
    add_capture(store.open_kb("Recipes"), url="https://example.org/cake", title="Tea cake",
                text=RECIPE_TEXT)
    return store.resolve("Diary"), store.resolve("Recipes")


def cloud(llm: FakeLLM, name: str = "cloudy") -> Endpoint:
    return Endpoint(name=name, base_url=llm.base_url, model="m", mark_cloud=True)


def device(llm: FakeLLM) -> Endpoint:
    return Endpoint(name="local", base_url=llm.base_url, model="m")


def received(llm: FakeLLM) -> str:
    """Everything the model server was sent, as one string."""
    return "\n".join(json.dumps(r, ensure_ascii=False) for r in llm.requests)


def _rewrite_reply(body: dict) -> str:
    last = body["messages"][-1]["content"]
    return "green tea tin location" if "Standalone search query:" in last else "In the kitchen [1]."


# --------------------------------------------------------------------------- chat


def test_chat_a_cloud_model_never_receives_device_only_passages(store, kbs):
    with FakeLLM(reply="It is baked into a cake [1].") as llm:
        res = run_turn(store, ["Diary", "Recipes"], QUESTION, endpoint=cloud(llm))
        sent = received(llm)
    assert llm.requests, "the cloud model was asked (with the cloud knowledge base)"
    assert SECRET not in sent and "Dear diary" not in sent
    assert "matcha" in sent
    status = {s["kb_name"]: s for s in res.statuses}
    assert status["Diary"]["status"] == "skipped"
    assert status["Diary"]["line"] == "Diary · skipped · device only, cloudy is a cloud model"
    assert status["Recipes"]["status"] == "passages"
    assert any(n.startswith("Diary was not searched: device only, cloudy") for n in res.notes)
    assert all(c["kb_name"] == "Recipes" for c in res.citations)


def test_chat_positive_control_an_on_device_model_does_receive_them(store, kbs):
    with FakeLLM(reply="Under the tin [1].") as llm:
        run_turn(store, ["Diary", "Recipes"], QUESTION, endpoint=device(llm))
        assert SECRET in received(llm)


# --------------------------------------------------------------------------- rewrite and history


def _history(diary_id: str, recipes_id: str) -> list[Turn]:
    return [
        Turn("user", "What is the spare key code?"),
        Turn("assistant", f"The code is {SECRET} [1].", (diary_id,)),
        Turn("user", "Which cake uses matcha?"),
        Turn("assistant", "The green tea cake [1].", (recipes_id,)),
    ]


def test_rewrite_and_history_never_carry_device_answers_to_a_cloud_model(store, kbs):
    diary, recipes = kbs
    with FakeLLM(reply_fn=_rewrite_reply) as llm:
        res = run_turn(store, ["Diary", "Recipes"], "and where is that?",
                       history=_history(diary.id, recipes.id), endpoint=cloud(llm))
        rewrite_req, chat_req = llm.requests
    assert res.trace["rewrite"]["method"] == "model"
    rewrite_sent = json.dumps(rewrite_req)
    assert SECRET not in rewrite_sent
    assert "What is the spare key code?" in rewrite_sent  # user turns are the user's own words
    assert "The green tea cake [1]." in rewrite_sent  # an answer from a cloud KB may go
    chat_sent = json.dumps(chat_req)
    assert SECRET not in chat_sent and "The green tea cake [1]." in chat_sent


def test_an_answer_that_does_not_say_where_it_came_from_counts_as_device_only(store, kbs):
    history = [Turn("user", "What is the spare key code?"), Turn("assistant", f"It is {SECRET}.")]
    with FakeLLM(reply_fn=_rewrite_reply) as llm:
        run_turn(store, ["Recipes"], "and where is that?", history=history, endpoint=cloud(llm))
        assert len(llm.requests) == 2 and SECRET not in received(llm)
    with FakeLLM(reply_fn=_rewrite_reply) as llm:
        run_turn(store, ["Recipes"], "and where is that?", history=history, endpoint=device(llm))
        assert SECRET in json.dumps(llm.requests[0])  # positive control: on-device, it is sent


def test_a_deleted_knowledge_base_in_history_counts_as_device_only(store, kbs):
    diary, _ = kbs
    history = [Turn("user", "What is the code?"), Turn("assistant", f"It is {SECRET}.", (diary.id,))]
    store.delete_kb("Diary")
    with FakeLLM(reply_fn=_rewrite_reply) as llm:
        run_turn(store, ["Recipes"], "and where is that?", history=history, endpoint=cloud(llm))
        assert SECRET not in received(llm)


# --------------------------------------------------------------------------- extractive


def test_extractive_without_a_model_sends_nothing_and_may_quote_device_passages(store, kbs):
    with FakeLLM() as llm:  # running, but not configured for this turn
        res = run_turn(store, ["Diary", "Recipes"], "spare key code under the tin")
        assert llm.requests == []
    assert res.generated is False and res.model is None
    assert SECRET in res.answer  # on-device: nothing left the machine
    assert "skipped" not in {s["status"] for s in res.statuses}  # no model: nothing to keep from


def test_extractive_fallback_after_a_cloud_model_fails_keeps_the_gate(store, kbs):
    with FakeLLM(mode="http_error") as llm:
        res = run_turn(store, ["Diary", "Recipes"], QUESTION, endpoint=cloud(llm))
        assert llm.requests and SECRET not in received(llm)
    assert res.generated is False
    assert SECRET not in res.answer and "matcha" in res.answer
    assert {s["kb_name"]: s["status"] for s in res.statuses}["Diary"] == "skipped"


# --------------------------------------------------------------------------- tool calls


def test_tool_calls_a_cloud_model_is_offered_and_may_write_only_cloud_knowledge_bases(store, kbs):
    diary, _ = kbs
    before = store.catalog.counts(diary.id)
    asked: list[dict] = []
    call = [{"name": "add_to_knowledge_base",
             "arguments": {"knowledge_base": "Diary", "title": "x", "text": "note"}}]
    with ToolLLM(tool_fn=lambda b: call if "tools" in b else None, reply="") as llm:
        res = run_turn(store, ["Diary", "Recipes"], "Please save to my notes: buy more matcha",
                       endpoint=cloud(llm), confirm=lambda r: asked.append(r) or True)
        offered = llm.requests[-1]["tools"][0]["function"]["parameters"]["properties"]
        sent = received(llm)
    assert offered["knowledge_base"]["enum"] == ["Recipes"]
    assert "Diary" not in sent and SECRET not in sent
    assert res.tool_calls[0]["status"] == "refused" and asked == []
    assert store.catalog.counts(diary.id) == before


def test_tool_calls_positive_control_an_on_device_model_is_offered_every_knowledge_base(store, kbs):
    with ToolLLM(tool_fn=lambda b: None, reply="Noted.") as llm:
        run_turn(store, ["Recipes"], "Please save to my notes: buy more matcha",
                 endpoint=device(llm))
        offered = llm.requests[-1]["tools"][0]["function"]["parameters"]["properties"]
    assert offered["knowledge_base"]["enum"] == ["Diary", "Recipes"]


# --------------------------------------------------------------------------- strict, auto, unknown host


def test_strict_fails_before_anything_is_sent(store, kbs):
    with FakeLLM() as llm:
        with pytest.raises(PrivacyBlocked) as info:
            run_turn(store, ["Diary", "Recipes"], "and where is that?",
                     history=[Turn("user", "What is the spare key code?")], endpoint=cloud(llm),
                     options=ChatOptions(strict=True))
        assert llm.requests == []  # not even the rewrite
    assert info.value.detail["knowledge_bases"][0]["name"] == "Diary"
    assert store.catalog.queries()[1] == 0


def test_an_auto_endpoint_is_unknown_and_treated_as_cloud(store, kbs):
    auto = Endpoint(name="auto", base_url="auto", model="auto")
    res = run_turn(store, ["Diary", "Recipes"], QUESTION, endpoint=auto,
                   options=ChatOptions(timeouts=Timeouts(connect=1, read=1)))
    assert {s["kb_name"]: s["status"] for s in res.statuses}["Diary"] == "skipped"
    assert res.model["location"] is None  # shown as "unknown (treated as cloud)"
    assert SECRET not in res.answer and res.generated is False  # "auto" cannot be reached


def _loopback_name() -> str | None:
    """This machine's host name if /etc/hosts points it at loopback only (no DNS is asked)."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
    except OSError:
        return None
    loopback = all(i[4][0].startswith("127.") or i[4][0] == "::1" for i in infos)
    return name if name != "localhost" and infos and loopback else None


def test_a_host_name_that_resolves_only_to_loopback_is_on_device(store, kbs):
    # The verdict is by address: this machine's own name, resolving to 127.x only, is here.
    name = _loopback_name()
    if name is None:
        pytest.skip("this machine's host name does not resolve to loopback only")
    with FakeLLM(reply="Under the tin [1].") as llm:
        by_name = Endpoint(name="by-name", base_url=f"http://{name}:{llm.port}/v1", model="m")
        res = run_turn(store, ["Diary", "Recipes"], QUESTION, endpoint=by_name)
        assert SECRET in received(llm)  # positive: device passages do go to a device model
        assert llm.request_headers[0]["host"] == f"{name}:{llm.port}"
    assert res.model["location"] == "device" and res.generated


def test_a_cloud_verdict_by_address_skips_device_knowledge_bases(store, kbs, monkeypatch):
    # "localhost" pointed elsewhere (a tampered /etc/hosts, a resolver on the network): cloud.
    real = socket.getaddrinfo

    def resolver(host, port, *args, **kwargs):
        if host == "localhost":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.255.255.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    with FakeLLM(reply="Bake it [1].") as llm:
        res = run_turn(store, ["Diary", "Recipes"], QUESTION, options=ChatOptions(
            timeouts=Timeouts(connect=0.5, read=1)),
            endpoint=Endpoint(name="lh", base_url=f"http://localhost:{llm.port}/v1", model="m"))
        assert SECRET not in received(llm)
    assert res.model["location"] == "cloud"
    assert {s["kb_name"]: s["status"] for s in res.statuses}["Diary"] == "skipped"


# --------------------------------------------------------------------------- one function


def test_every_path_asks_the_one_gate_function(store, kbs, monkeypatch):
    diary, recipes = kbs
    calls: list[list[str]] = []
    real = chat_module.allowed_knowledge_bases

    def recording(endpoint, refs, **kw):
        calls.append(sorted(getattr(r, "name", "?") for r in refs))
        return real(endpoint, refs, **kw)

    monkeypatch.setattr(chat_module, "allowed_knowledge_bases", recording)
    with ToolLLM(tool_fn=lambda b: None, reply_fn=_rewrite_reply) as llm:
        run_turn(store, ["Diary", "Recipes"], "and save that to my notes",
                 history=_history(diary.id, recipes.id), endpoint=cloud(llm))
    # The selection (chat and extractive passages) first, then the write targets (every
    # knowledge base), and each assistant turn of the history for the rewrite and the answer.
    assert calls[0] == ["Diary", "Recipes"]
    assert calls.count(["Diary", "Recipes"]) == 2
    assert calls.count(["Diary"]) == 2 and calls.count(["Recipes"]) == 2
    assert len(calls) == 6
