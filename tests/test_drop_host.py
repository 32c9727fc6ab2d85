"""The host side of the side panel's dropped files and endpoint set-up, over framed bytes.

Dropped files travel as ``upload`` parts and are added by ``source.add`` with ``upload`` and
``file_name`` (the host reads the type from the name, then the bytes); ``endpoint.test`` asks
an endpoint for its models on the page's behalf.
"""

from __future__ import annotations

import base64
import sys

from conftest import make_pdf
from fakellm import FakeLLM
from hostproc import HostProcess

HOST = [sys.executable, "-m", "localkb", "host"]
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00" * 4


def _request(host: HostProcess, rid: int, type_: str, data: dict) -> dict:
    return host.request({"id": rid, "type": type_, "data": data})


def _send_file(host: HostProcess, rid: int, kb: str, name: str, data: bytes, part: int) -> dict:
    """Upload ``data`` in parts of ``part`` bytes, then add it; the final reply."""
    begin = _request(host, rid, "upload", {"action": "begin"})
    assert begin.get("ok"), begin
    upload = begin["result"]["upload"]
    for index, at in enumerate(range(0, len(data), part)):
        reply = _request(host, rid + 1 + index, "upload", {
            "action": "part", "upload": upload, "index": index,
            "data_base64": base64.b64encode(data[at:at + part]).decode()})
        assert reply.get("ok"), reply
    assert reply["result"]["bytes"] == len(data)
    return _request(host, rid + 500, "source.add", {"kb": kb, "upload": upload, "file_name": name,
                                                     "captured_by": "side-panel"})


def test_dropped_files_sent_in_parts_are_added_by_type_and_a_binary_one_refused(tmp_path):
    pdf = make_pdf(tmp_path / "boiler.pdf", ["The boiler pressure must stay below 2.5 bar.",
                                             "Bleed the radiators every autumn."]).read_bytes()
    html = (b"<html><head><title>Kettle care</title></head>"
            b"<body><p>Descale the kettle monthly.</p></body></html>")
    md = b"# Bike notes\n\nPump the tyres to 4 bar before a long ride.\n"
    with HostProcess(HOST, home=tmp_path / "home") as host:
        created = _request(host, 1, "kb.create", {"name": "Drops", "privacy": "device"})
        kb = created["result"]["knowledge_base"]["id"]
        results = {}
        for n, (name, data) in enumerate((("boiler.pdf", pdf), ("kettle.html", html), ("bike.md", md))):
            reply = _send_file(host, 1000 * (n + 1), kb, name, data, part=max(1, len(data) // 3))
            assert reply.get("ok"), (name, reply)
            results[name] = reply["result"]
        assert {k: (r["status"], r["added"] > 0) for k, r in results.items()} == {
            "boiler.pdf": ("added", True), "kettle.html": ("added", True), "bike.md": ("added", True)}
        assert results["kettle.html"]["title"] == "Kettle care"
        hits = _request(host, 9, "search", {"kbs": [kb], "query": "tyre pressure before a long ride"})
        assert hits["result"]["hits"][0]["file_name"] == "bike.md", hits["result"]["hits"][:1]

        refused = _send_file(host, 5000, kb, "diagram.png", PNG, part=len(PNG))
        assert refused.get("ok") is False and refused["error"]["code"] == "invalid_document", refused
        assert "diagram.png" in refused["error"]["message"], refused
        # The upload was taken by the add: it is gone, refused or not.
        gone = _request(host, 6000, "upload", {"action": "abort", "upload": "up_missing"})
        assert gone["result"] == {"aborted": False}


def test_endpoint_test_lists_the_models_and_says_where_it_runs(tmp_path):
    with FakeLLM() as llm, HostProcess(HOST, home=tmp_path / "home") as host:
        reply = _request(host, 1, "endpoint.test", {"base_url": llm.base_url})
    assert reply.get("ok"), reply
    assert reply["result"] == {"ok": True, "models": ["fake-model"], "location": "device",
                               "base_url": llm.base_url, "error": None}


def test_endpoint_test_of_a_dead_port_says_connection_refused_and_saves_nothing(tmp_path):
    with HostProcess(HOST, home=tmp_path / "home") as host:
        reply = _request(host, 1, "endpoint.test", {"base_url": "http://127.0.0.1:9/v1"})
        config = _request(host, 2, "config.get", {})
    assert reply.get("ok"), reply
    result = reply["result"]
    assert result["ok"] is False and result["models"] == [] and result["location"] == "device", result
    assert result["error"]["reason"] == "unreachable", result
    assert "connection refused" in result["error"]["message"].lower(), result
    assert config["result"]["endpoints"] == []
