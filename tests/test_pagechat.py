"""Chat with the open page, unsaved: the real host over framed bytes (``page.open``, ``chat`` with ``page``).

The page lives in the host process only: these tests check it is searchable part by part, cited
as "This page", kept from a cloud model unless the chat allows it, and never written to the store.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from conftest import make_pdf
from fakellm import FakeLLM
from hostproc import HostProcess

PAGES = [f"Page {n} of the parts catalogue. Part PX-{n:03d} is a {('brass', 'steel', 'copper')[n % 3]} "
         f"bracket that holds valve number {n} in the {('upper', 'middle', 'lower')[n % 3]} manifold."
         for n in range(1, 81)]
LATE = "The emergency shut-off lever sits behind the blue panel on the left wall of the boiler room."
PAGES[71] = f"Page 72 of the parts catalogue. {LATE}"
SECRET_HTML = """<!doctype html><html><head><title>Team offsite plans</title></head><body><main>
<h1>Team offsite plans</h1><p>The offsite moves to the lighthouse hotel on the harbour. The
door code for the meeting room is HARBOUR-8812, and lunch is served at noon on the terrace.</p>
<p>Bring warm clothes: the terrace is windy in the evening.</p></main></body></html>"""


def _host(home: Path) -> HostProcess:
    return HostProcess([sys.executable, "-m", "localkb", "host"], home=home)


def _ok(host: HostProcess, n: int, type_: str, data: dict) -> dict:
    reply = host.request({"id": n, "type": type_, "data": data}, timeout=300)
    assert reply["ok"], reply
    return reply["result"]


def _sources(home: Path) -> int:
    db = home / "catalog.sqlite"
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT count(*) FROM sources").fetchone()[0]
    finally:
        con.close()


def _catalogue_mentions(home: Path, needle: str) -> list[str]:
    """Tables of the catalogue with a row holding ``needle`` anywhere (the query log included)."""
    db = home / "catalog.sqlite"
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return [t for t in tables if any(needle in json.dumps(list(row), default=str)
                                         for row in con.execute(f'SELECT * FROM "{t}"'))]
    finally:
        con.close()


def _until_done(host: HostProcess, page_id: str, first: int) -> list[dict]:
    """``page.status`` until the page is all searchable (a hang guard, never a timing check)."""
    seen, n, deadline = [], first, time.monotonic() + 300
    while time.monotonic() < deadline:
        status = _ok(host, n, "page.status", {"page": page_id})
        seen.append(status)
        if status["done"]:
            return seen
        n += 1
        time.sleep(0.05)
    pytest.fail(f"the page never became searchable: {seen[-1]}")


def test_a_long_pdf_is_searchable_part_first_then_whole_and_never_stored(tmp_path):
    pdf = make_pdf(tmp_path / "catalogue.pdf", PAGES).read_bytes()
    home = tmp_path / "home"
    with _host(home) as host:
        opened = _ok(host, 1, "page.open", {"url": "http://127.0.0.1:9/catalogue.pdf",
                                              "title": "Parts catalogue",
                                              "pdf_base64": base64.b64encode(pdf).decode()})
        assert opened["pages"] == 80 and opened["page_id"].startswith("page_")
        # The first part answers at once; the page says how much of it that is.
        assert 0 < opened["pages_searchable"] < 80 and not opened["done"], opened
        assert opened["line"] == f"This page: {opened['pages_searchable']} of 80 pages searchable so far"
        seen = _until_done(host, opened["page_id"], 2)
        assert seen[-1]["line"] == "This page: all 80 pages searchable", seen[-1]
        assert seen[-1]["searchable"] == seen[-1]["total"] >= 80
        answer = _ok(host, 100, "chat", {"page": opened["page_id"], "extractive": True,
                                         "message": "Where is the emergency shut-off lever?"})
        assert [s["status"] for s in answer["statuses"]] == ["passages"], answer["statuses"]
        assert answer["statuses"][0]["line"].startswith("This page · ")
        first = answer["citations"][0]
        assert first["kb_name"] == "This page" and first["page"] == 72 and LATE[:40] in first["text"]
        assert first["url"] == "http://127.0.0.1:9/catalogue.pdf"
        assert answer["kbs"] == [opened["page_id"]]
    assert _sources(home) == 0
    assert _catalogue_mentions(home, "shut-off lever") == []


def test_a_page_the_host_no_longer_holds_is_an_error_with_its_code(tmp_path):
    with _host(tmp_path) as host:
        host.send({"id": 1, "type": "chat", "data": {"page": "page_000000000000000000000000",
                                                        "message": "hello?", "extractive": True}})
        reply = host.until_reply(1)[-1]
        assert not reply["ok"] and reply["error"]["code"] == "page_not_held", reply


def test_summarize_without_a_model_is_a_labelled_extractive_summary(tmp_path):
    with _host(tmp_path) as host:
        opened = _ok(host, 1, "page.open", {"url": "http://127.0.0.1:9/offsite.html", "html": SECRET_HTML})
        out = _ok(host, 2, "chat", {"page": opened["page_id"], "message": "Summarize this page",
                                    "summarize": True})
        assert out["answer_line"] == "Extractive summary (no model)"
        assert out["answer"].startswith("Extractive summary (no model)")
        assert out["citations"] and all(c["kb_name"] == "This page" for c in out["citations"])
        assert "[1]" in out["answer"] and "HARBOUR-8812" in out["answer"]
        # Explain quotes the selection in its question: that question is not logged either.
        explained = _ok(host, 3, "chat", {"page": opened["page_id"], "extractive": True,
                                          "message": "Explain this passage from the page: “door code "
                                                     "for the meeting room is HARBOUR-8812”"})
        assert explained["citations"][0]["kb_name"] == "This page"
    assert _sources(tmp_path) == 0
    assert _catalogue_mentions(tmp_path, "HARBOUR-8812") == []


def _fake_reply(request: dict) -> str:
    prompt = json.dumps(request.get("messages", []))
    if "HARBOUR-8812" in prompt:
        return "The door code is HARBOUR-8812 [1]."
    return "I don't know from these documents."


def test_a_cloud_model_gets_the_page_only_when_the_chat_allows_it(tmp_path):
    with FakeLLM(reply_fn=_fake_reply) as llm, _host(tmp_path) as host:
        _ok(host, 1, "config.set", {"endpoints": [{"name": "cloudy", "base_url": llm.base_url,
                                                   "model": "m", "mark_cloud": True}],
                                    "default_endpoint": "cloudy"})
        page = _ok(host, 2, "page.open", {"url": "http://127.0.0.1:9/offsite.html",
                                          "html": SECRET_HTML})["page_id"]
        question = {"page": page, "message": "What is the door code of the meeting room?"}
        kept = _ok(host, 3, "chat", question)
        assert [s["line"] for s in kept["statuses"]] == [
            "This page · skipped · device only, cloudy is a cloud model"], kept["statuses"]
        assert "HARBOUR-8812" not in json.dumps(llm.requests)
        allowed = _ok(host, 4, "chat", {**question, "page_to_cloud": True})
        assert "HARBOUR-8812" in json.dumps(llm.requests[-1]) and "HARBOUR-8812" in allowed["answer"]
        assert allowed["citations"][0]["kb_name"] == "This page" and allowed["kbs"] == [page]
        # The answer restates the page: a later turn without the allowance does not send it back.
        before = len(llm.requests)
        history = [{"role": "user", "content": question["message"]},
                   {"role": "assistant", "content": allowed["answer"], "kbs": allowed["kbs"]}]
        _ok(host, 5, "chat", {**question, "message": "And what about lunch?", "history": history})
        assert "HARBOUR-8812" not in json.dumps(llm.requests[before:])
    # A host that no longer holds the page knows nothing of it: its provenance is device only.
    with FakeLLM(reply_fn=_fake_reply) as llm, _host(tmp_path) as host:
        _ok(host, 1, "config.set", {"endpoints": [{"name": "cloudy", "base_url": llm.base_url,
                                                   "model": "m", "mark_cloud": True}],
                                    "default_endpoint": "cloudy"})
        other = _ok(host, 2, "page.open", {"url": "http://127.0.0.1:9/o.html", "text": "Lunch is at noon."})
        _ok(host, 3, "chat", {"page": other["page_id"], "page_to_cloud": True,
                              "message": "And what about lunch?", "history": history})
        assert llm.requests and "HARBOUR-8812" not in json.dumps(llm.requests)
    assert _sources(tmp_path) == 0


def test_summarize_with_a_model_is_generated_only_where_the_gate_lets_the_page_go(tmp_path):
    def reply(request: dict) -> str:
        prompt = json.dumps(request.get("messages", []))
        return "The offsite is at the lighthouse hotel [1]." if "lighthouse hotel" in prompt else "?"

    with FakeLLM(reply_fn=reply) as llm, _host(tmp_path) as host:
        _ok(host, 1, "config.set", {"endpoints": [
            {"name": "local", "base_url": llm.base_url, "model": "m"},
            {"name": "cloudy", "base_url": llm.base_url, "model": "m", "mark_cloud": True}],
            "default_endpoint": "local"})
        page = _ok(host, 2, "page.open", {"url": "http://127.0.0.1:9/offsite.html",
                                          "html": SECRET_HTML})["page_id"]
        ask = {"page": page, "message": "Summarize this page", "summarize": True}
        local = _ok(host, 3, "chat", {**ask, "endpoint": "local"})
        assert local["generated"] and local["answer"] == "The offsite is at the lighthouse hotel [1]."
        assert local["answer_line"] == "Summarized by local · m · on this device"
        assert local["citations"][0]["kb_name"] == "This page" and local["kbs"] == [page]
        sent = len(llm.requests)
        cloud = _ok(host, 4, "chat", {**ask, "endpoint": "cloudy"})
        assert len(llm.requests) == sent  # the page is device only here: nothing went
        assert cloud["answer_line"] == "Extractive summary (no model)" and not cloud["generated"]
        assert "This page was not sent to cloudy: device only, cloudy is a cloud model." in cloud["notes"]
        allowed = _ok(host, 5, "chat", {**ask, "endpoint": "cloudy", "page_to_cloud": True})
        assert allowed["generated"] and "lighthouse hotel" in json.dumps(llm.requests[sent:])
