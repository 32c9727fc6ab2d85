"""The sentences the side panel shows come from the host: summary, answer line, no-passage answer.

The panel renders these as sent (issue 16 "one source of truth"); these tests pin what the host
says against its own statuses, with the real model and stores and a loopback model server.
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace

import pytest

from fakellm import FakeLLM
from hostproc import HostProcess
from localkb.answer.chat import ChatOptions, run_turn
from localkb.answer.llm import Endpoint
from localkb.errors import IndexUnavailable
from localkb.ingest.pipeline import add_capture
from localkb.retrieval.search import KBStatus, Searcher, summary_line
from localkb.store.kb import KnowledgeBase, Store

TEA = ("Green tea is brewed at 80 degrees Celsius for two minutes; boiling water scorches the "
       "leaves and makes the cup bitter.")
BIKE = "To fix a flat bicycle tyre, remove the wheel, find the puncture and patch the inner tube."
QUESTION = "At what temperature is green tea brewed?"


def _seed(store: Store, name: str, *texts: tuple[str, str]) -> KnowledgeBase:
    store.create_kb(name)
    kb = store.open_kb(name)
    for title, text in texts:
        add_capture(kb, url=f"https://example.org/{title.lower().replace(' ', '-')}", title=title, text=text)
    return kb


def test_summary_line_names_what_was_found_counts_the_rest_and_never_hides_skips():
    def st(name, status):
        return KBStatus(kb=name.lower(), kb_name=name, status=status)

    assert summary_line([st("Docs", "passages")] + [st(f"K{i}", "nothing") for i in range(6)]) == (
        "Found in Docs · 6 others had nothing")
    assert summary_line([st("Docs", "passages"), st("Mail", "empty")]) == (
        "Found in Docs · 1 other had nothing")
    assert summary_line([st("Docs", "weaker"), st("Mail", "nothing")]) == (
        "Only weaker matches in Docs · 1 other had nothing")
    assert summary_line([st("Docs", "nothing"), st("Mail", "nothing")]) == "Nothing relevant in Docs and Mail"
    assert summary_line([st("Docs", "passages"), st("Private", "skipped"), st("Notes", "unavailable")]) == (
        "Found in Docs · Private skipped · Notes could not be searched")
    assert summary_line([st(n, "passages") for n in "ABCD"]) == "Found in 4 knowledge bases"
    assert summary_line([]) == "No knowledge base was searched"


def test_the_no_passage_answer_counts_weaker_matches_as_the_step_lines_do(settings):
    # Before: the answer counted every below-cut-off hit of every knowledge base ("There are 8
    # weaker matches") while the only "weaker" line said "1 weaker match".
    store = Store(settings)
    try:
        _seed(store, "Tea", ("Green tea", TEA))
        _seed(store, "Bikes", ("Bicycle repair", BIKE), ("Tyres", BIKE.replace("flat", "worn")))
        probe = Searcher(store).search(["Tea"], "ideal heat for steeping sencha", floor=False)
        best = max(h.cosine for h in probe.hits)
        strict = Store(replace(settings, cutoff=round(best + 0.02, 4)))
        try:
            res = run_turn(strict, ["Tea", "Bikes"], "ideal heat for steeping sencha")
        finally:
            strict.close()
    finally:
        store.close()
    by = {s["kb_name"]: s for s in res.statuses}
    assert by["Tea"]["status"] == "weaker" and by["Bikes"]["status"] == "nothing", by
    n = by["Tea"]["weaker"]
    said = re.search(r"There (?:is|are) (\d+) weaker match", res.answer)
    assert said and int(said.group(1)) == n, (res.answer, n)
    assert res.summary == "Only weaker matches in Tea · 1 other had nothing"


def test_an_unavailable_knowledge_base_is_named_in_the_no_passage_answer(store, monkeypatch):
    # Before: "nothing in them matches" although one of them could not be searched at all.
    _seed(store, "Bikes", ("Bicycle repair", BIKE))
    _seed(store, "Broken", ("Oolong", "Oolong tea is brewed at 90 degrees."))
    real = KnowledgeBase.indexes

    def indexes(self):
        if self.record.name == "Broken":
            raise IndexUnavailable("the vector index of Broken cannot be read")
        return real(self)

    monkeypatch.setattr(KnowledgeBase, "indexes", indexes)
    res = run_turn(store, ["Bikes", "Broken"], "what is the capital of Peru")
    assert "nothing in Bikes matches" in res.answer, res.answer
    assert "The search of Broken did not run, so this says nothing about what it holds." in res.answer
    assert res.summary.endswith("Broken could not be searched"), res.summary


def test_weaker_matches_of_one_knowledge_base_only(settings):
    store = Store(settings)
    try:
        _seed(store, "Tea", ("Green tea", TEA))
        _seed(store, "Tea two", ("Sencha", TEA.replace("Green tea", "Sencha")))
        probe = Searcher(store).search(["Tea", "Tea two"], "ideal heat for steeping sencha", floor=False)
        best = max(h.cosine for h in probe.hits)
        strict = Store(replace(settings, cutoff=round(best + 0.02, 4)))
        try:
            res = run_turn(strict, ["Tea", "Tea two"], "ideal heat for steeping sencha",
                           options=ChatOptions(weaker_kbs=("Tea two",)))
        finally:
            strict.close()
    finally:
        store.close()
    assert res.citations and {c["kb_name"] for c in res.citations} == {"Tea two"}
    two = next(s["kb"] for s in res.statuses if s["kb_name"] == "Tea two")
    assert res.trace["options"]["weaker_kbs"] == [two]


@pytest.mark.parametrize("case", ["generated", "no model", "failed", "nothing"])
def test_the_answer_line_says_how_the_answer_came_about(store, case):
    _seed(store, "Docs", ("Green tea", TEA))
    if case == "no model":
        res = run_turn(store, ["Docs"], QUESTION, options=ChatOptions(no_model_reason="you chose no model"))
        assert res.answer_line == "Quoted from your passages: you chose no model"
        assert res.answer.startswith("Not generated (you chose no model)")
        return
    if case == "failed":
        dead = Endpoint(name="local", base_url="http://127.0.0.1:9/v1", model="m")
        res = run_turn(store, ["Docs"], QUESTION, endpoint=dead)
        assert res.answer_line == "Not generated: local failed, so the best passages are quoted"
        return
    with FakeLLM(reply="80 °C [1].") as llm:
        ep = Endpoint(name="local", base_url=llm.base_url, model="fake-model")
        question = QUESTION if case == "generated" else "what is the capital of Peru"
        res = run_turn(store, ["Docs"], question, endpoint=ep)
    if case == "generated":
        assert res.answer_line == "Answered by local · fake-model · on this device"
    else:
        assert res.answer_line == "local was not asked: no passage to answer from"


@pytest.mark.parametrize(("url", "location"), [
    ("http://127.1:11434/v1", None),
    ("http://0x7f000001/v1", None),
    ("http://2130706433/v1", None),
    ("http://[::ffff:127.0.0.1]/v1", None),
    ("http://127\uff0e0\uff0e0\uff0e1/v1", None),
    ("http://127.0.0.1:11434/v1", "device"),
    # Decided by address (issue 14): a public address is cloud; a name that does not resolve
    # cannot be placed, so it is null ("unknown (treated as cloud)"), whatever it is called.
    ("https://203.0.113.7/v1", "cloud"),
    ("https://api.example.invalid/v1", None),
])
def test_config_check_returns_the_gates_own_verdict(settings, url, location):
    """The options page labels an unsaved row with this; it must be the gate's answer exactly."""
    from localkb.answer.llm import Endpoint as Ep
    from localkb.answer.privacy import endpoint_location

    expected = endpoint_location(Ep(name="x", base_url=url, model="", mark_cloud=False))
    with HostProcess([sys.executable, "-m", "localkb", "host"], home=settings.data_dir) as host:
        reply = host.request({"id": 1, "type": "config.check",
                              "data": {"endpoint": {"base_url": url, "mark_cloud": False}}})
    assert reply["ok"], reply
    assert reply["result"]["endpoint"]["location"] == expected
    assert "api_key" not in reply["result"]["endpoint"]
    if location is not None:
        assert expected == location


def test_continue_sends_the_stopped_answer_and_returns_the_whole_text(store):
    _seed(store, "Docs", ("Green tea", TEA))
    with FakeLLM(reply=" for two minutes [1].") as llm:
        ep = Endpoint(name="local", base_url=llm.base_url, model="fake-model")
        tokens: list[str] = []
        res = run_turn(store, ["Docs"], QUESTION, endpoint=ep, on_token=tokens.append,
                       options=ChatOptions(continue_from="Green tea is brewed at 80 °C [1]"))
        sent = llm.requests[-1]["messages"]
    assert sent[-2] == {"role": "assistant", "content": "Green tea is brewed at 80 °C [1]"}
    assert sent[-1]["role"] == "user" and "Continue your answer" in sent[-1]["content"]
    assert "".join(tokens) == " for two minutes [1]."
    assert res.answer == "Green tea is brewed at 80 °C [1] for two minutes [1]."
    assert [c["n"] for c in res.citations] == [1]
