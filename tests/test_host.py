"""The real host (`python -m localkb host`) spoken to with framed bytes, every message type."""

from __future__ import annotations

import collections
import json
import os
import random
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

from conftest import run_cli
from hostproc import HostProcess, frame, frame_json

HOST = [sys.executable, "-m", "localkb", "host"]
PAGE = ("<html><head><title>Support</title></head><body><article><h1>Support</h1>"
        "<p>Error ERR_7731 means the flux capacitor overheated; let it cool for ten minutes.</p>"
        "<p>Error ERR_7713 means the door is open.</p></article></body></html>")


def long_text(n: int) -> str:
    return "\n\n".join(f"Paragraph {i} describes maintenance step {i} of the turbine, including "
                       f"torque values, inspection intervals and the spare part number TP-{i:04d}. " * 3
                       for i in range(n))


def ok(host: HostProcess, rid: int, type_: str, data: dict | None = None) -> dict:
    reply = host.request({"id": rid, "type": type_, "data": data or {}})
    assert reply.get("ok"), reply
    return reply["result"]


def test_every_message_type_over_framed_bytes(tmp_path):
    with HostProcess(HOST, home=tmp_path / "home") as host:
        status = ok(host, 1, "status")
        assert status["ready"] and status["protocol_version"] == 1
        assert status["model"]["loaded"] is False  # status never waits for the model

        kb = ok(host, 2, "kb.create", {"name": "Docs"})["knowledge_base"]
        assert kb["privacy"] == "device" and kb["chunks"] == 0
        assert [k["name"] for k in ok(host, 3, "kb.list")["knowledge_bases"]] == ["Docs"]
        updated = ok(host, 4, "kb.update", {"kb": "Docs", "privacy": "cloud"})["knowledge_base"]
        assert updated["privacy"] == "cloud"

        host.send({"id": 5, "type": "source.add", "data": {
            "kb": "Docs", "url": "https://intranet.test/support", "title": "Support", "html": PAGE,
            "captured_by": "context-menu"}})
        msgs = host.until_reply(5)
        events, reply = msgs[:-1], msgs[-1]
        assert reply["ok"], reply
        assert events and all(m.get("event") == "progress" for m in events)
        assert {m["data"]["stage"] for m in events} >= {"chunk", "embed", "write"}
        job_fields = {"stage", "done", "total", "sources_done", "sources_total", "current", "passages",
                      "unit", "rate", "eta_s", "elapsed_s"}
        assert all(job_fields <= set(m["data"]) for m in events), events[0]
        assert all(m["data"]["unit"] == "tokens" and m["data"]["sources_total"] == 1 for m in events)
        assert events[-1]["data"]["sources_done"] == 1
        assert events[-1]["data"]["passages"] >= 1
        assert events[-1]["data"]["current"] == "https://intranet.test/support"
        report = reply["result"]
        assert report["status"] == "added" and report["added"] == report["total"] >= 1
        assert report["summary"] == f"{report['added']} added"

        sources = ok(host, 6, "source.list", {"kb": "Docs"})
        assert sources["total"] == 1 and sources["sources"][0]["captured_by"] == "context-menu"

        found = ok(host, 7, "search", {"kbs": ["Docs"], "query": "ERR_7731"})
        assert found["statuses"][0]["status"] == "passages"
        assert found["statuses"][0]["line"].startswith("Docs · ")
        assert "ERR_7731" in found["hits"][0]["text"] and found["hits"][0]["kb_name"] == "Docs"
        assert found["exact_terms"] == ["ERR_7731"] and found["statuses"][0]["missing_terms"] == []
        twin = ok(host, 70, "search", {"kbs": ["Docs"], "query": "ERR_7137"})
        st = twin["statuses"][0]
        assert st["exact_terms"] == ["ERR_7137"] and st["missing_terms"] == ["ERR_7137"]
        assert st["status"] != "passages" and twin["hits"] == []
        assert st["line"].startswith('Docs · no passage mentions "ERR_7137"')
        pages = ok(host, 71, "search", {"kbs": ["Docs"], "query": "ERR_7731", "per_source": 1})
        assert len({h["source_id"] for h in pages["hits"]}) == len(pages["hits"]) == 1
        bad_ps = host.request({"id": 72, "type": "search",
                               "data": {"kbs": ["Docs"], "query": "x", "per_source": "one"}})
        assert bad_ps["error"]["code"] == "invalid_input"

        cfg = ok(host, 8, "config.set", {"endpoints": [
            {"name": "local", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key": "secret"}],
            "default_endpoint": "local"})
        assert cfg["endpoints"][0]["location"] == "device"
        got = ok(host, 9, "config.get")
        assert got["default_endpoint"] == "local" and "secret" not in json.dumps(got)

        bad = host.request({"id": 10, "type": "source.add", "data": {"kb": "Docs", "text": "   "}})
        assert not bad["ok"] and bad["error"]["code"] == "invalid_input"
        errors = ok(host, 11, "errors.list", {"limit": 5})
        assert "total" in errors

        removed = ok(host, 12, "source.remove", {"kb": "Docs", "source": sources["sources"][0]["id"]})
        assert removed["removed_chunks"] == report["total"]
        assert ok(host, 13, "kb.delete", {"kb": "Docs"})["name"] == "Docs"
        status = ok(host, 14, "status")
        assert status["knowledge_bases"] == [] and status["model"]["loaded"] is True

        unknown = host.request({"id": 15, "type": "kb.explode", "data": {}})
        assert unknown["error"]["code"] == "unknown_type"
        missing = host.request({"id": 16, "type": "search", "data": {"kbs": ["Nope"], "query": "x"}})
        assert missing["error"]["code"] == "kb_not_found"


def test_cancel_stops_an_add_and_leaves_the_store_as_it_was(tmp_path):
    home = tmp_path / "home"
    with HostProcess(HOST, home=home) as host:
        ok(host, 1, "kb.create", {"name": "Docs"})
        first = ok(host, 2, "source.add", {"kb": "Docs", "url": "https://x.test/manual",
                                           "text": long_text(3), "title": "Manual"})
        host.send({"id": 3, "type": "source.add", "data": {
            "kb": "Docs", "url": "https://x.test/manual", "text": long_text(120), "title": "Manual"}})
        while True:  # wait until it is embedding, then cancel
            msg = host.next_message()
            if msg.get("id") == 3 and msg.get("event") == "progress" and msg["data"]["stage"] == "embed":
                break
        assert ok(host, 4, "cancel", {"target": 3})["cancelled"] is True
        reply = host.until_reply(3)[-1]
        assert not reply["ok"] and reply["error"]["code"] == "cancelled"
        sources = ok(host, 5, "source.list", {"kb": "Docs"})["sources"]
        assert len(sources) == 1 and sources[0]["chunks"] == first["total"]
    doctor = json.loads(run_cli(["doctor", "--json"], home).stdout)
    assert doctor["clean"], doctor


def _fuzz_payloads(rng: random.Random, n: int) -> list[bytes]:
    types = ["status", "kb.list", "kb.create", "kb.update", "kb.delete", "source.add", "source.list",
             "source.remove", "search", "errors.list", "config.get", "cancel", "no.such", ""]
    junk = [None, True, 0, -1, 2**70, 1.5, "", "x" * 5000, [], {}, [1, "a"], {"a": {"b": []}},
            "Doc", "../../etc/passwd", "\udcff".encode("utf-8", "surrogatepass").decode("latin-1")]
    keys = ["kb", "kbs", "name", "privacy", "query", "k", "mode", "text", "html", "pdf_base64", "file_base64",
            "file_name", "url", "source", "offset", "limit", "target", "endpoints", "cutoff", "captured_by"]
    out: list[bytes] = []
    for i in range(n):
        r = rng.random()
        if r < 0.25:
            out.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40))))
        elif r < 0.35:
            out.append(b'{"id": 1, "type": "status", "data": ' + b"[" * rng.randint(1, 3000))
        elif r < 0.45:
            out.append(json.dumps(rng.choice([[], 3, "s", None, {"type": "status"}, {"id": {}}])).encode())
        else:
            data = {rng.choice(keys): rng.choice(junk) for _ in range(rng.randint(0, 4))}
            if rng.random() < 0.1:
                data = rng.choice(junk)
            out.append(json.dumps({"id": f"f{i}", "type": rng.choice(types), "data": data}).encode())
    return out


def _home_with_one_passage(tmp_path: Path) -> Path:
    """A data dir with a knowledge base "Docs" holding one passage that fuzzing must not touch."""
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    note = tmp_path / "keep.md"
    note.write_text("# Keep\n\nThis passage must survive the fuzzing untouched.")
    run_cli(["add", "Docs", str(note)], home, check=True)
    return home


def test_fuzzed_frames_never_kill_the_real_host(tmp_path):
    home = _home_with_one_passage(tmp_path)
    payloads = _fuzz_payloads(random.Random(4521), 2200)
    with HostProcess(HOST, home=home) as host:
        for body in payloads:
            host.send_body(body)
        last = "last-0"
        host.send({"id": last, "type": "status", "data": {}})
        replies = 0
        while True:
            msg = host.next_message(timeout=120)
            if "ok" in msg:
                replies += 1
                if msg.get("ok") is False:
                    assert msg["error"]["code"] != "internal_error", msg
            if msg.get("id") == last:
                # With the fuzz still in flight the host may say it is busy (its in-flight
                # limit, a clear refusal): ask again once the backlog drains.
                if msg.get("ok") is False and msg["error"]["code"] == "host_busy":
                    last = f"last-{int(last.split('-')[1]) + 1}"
                    host.send({"id": last, "type": "status", "data": {}})
                    continue
                break
        assert msg["ok"] and msg["result"]["ready"], msg
        assert replies >= 2000
    report = json.loads(run_cli(["doctor", "--json"], home).stdout)
    assert report["clean"], report
    docs = next(k for k in report["knowledge_bases"] if k["name"] == "Docs")
    assert docs["chunks"] == 1  # what was stored before is still there, whole


def test_untrusted_length_ends_the_connection_cleanly(tmp_path):
    with HostProcess(HOST, home=tmp_path / "home") as host:
        host.send_raw(struct.pack("=I", 0xFFFFFFF0) + b"{}")
        msg = host.next_message()
        assert msg["ok"] is False and msg["error"]["detail"]["reason"] == "frame_too_large"
        host.close_stdin()
        assert host.wait() == 3


def test_three_hosts_and_a_cli_add_to_one_store_at_once(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    folder = tmp_path / "cli"
    folder.mkdir()
    for i in range(4):
        (folder / f"c{i}.md").write_text(f"# CLI note {i}\n\nThe CLI wrote note {i} about the turbine.")
    hosts = [HostProcess(HOST, home=home) for _ in range(3)]
    cli = subprocess.Popen([sys.executable, "-m", "localkb", "add", "Docs", str(folder)],
                           env={**os.environ, "LOCALKB_HOME": str(home)},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for h, host in enumerate(hosts):
            for i in range(4):
                host.send({"id": i, "type": "source.add", "data": {
                    "kb": "Docs", "url": f"https://host{h}.test/{i}", "title": f"Host {h} page {i}",
                    "text": f"Host {h} saved page {i}: the valve V-{h}{i} opens at {i + 2} bar."}})
        for host in hosts:
            for i in range(4):
                reply = host.until_reply(i, timeout=300)[-1]
                assert reply["ok"] and reply["result"]["status"] == "added", reply
    finally:
        for host in hosts:
            host.close_stdin()
            host.wait()
    assert cli.wait(timeout=300) == 0, cli.stderr.read()
    db = sqlite3.connect(home / "catalog.sqlite")
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT key) FROM sources").fetchone() == (16, 16)
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM chunks").fetchone() == (16, 16)
    report = json.loads(run_cli(["doctor", "--json"], home).stdout)
    assert report["clean"], report


def test_installed_launcher_answers_status(tmp_path):
    home = tmp_path / "user"
    (home / ".config" / "chromium").mkdir(parents=True)
    (home / ".mozilla").mkdir()
    data = tmp_path / "data"
    env = {"HOME": str(home)}
    res = run_cli(["install", "--json"], data, env=env)
    assert res.returncode == 0, res.stderr
    installed = json.loads(res.stdout)
    assert {r["browser"] for r in installed["installed"]} == {"chromium", "firefox"}
    chromium = json.loads((home / ".config/chromium/NativeMessagingHosts/com.localkb.host.json").read_text())
    assert chromium["allowed_origins"] == [f"chrome-extension://{installed['extension_id']}/"]
    firefox = json.loads((home / ".mozilla/native-messaging-hosts/com.localkb.host.json").read_text())
    assert firefox["allowed_extensions"] == [installed["firefox_id"]]
    launcher = Path(chromium["path"])
    assert launcher == Path(firefox["path"]) and os.access(launcher, os.X_OK)
    out = subprocess.run([str(launcher), "chrome-extension://x/"], input=frame_json(
        {"id": 1, "type": "status", "data": {}}), capture_output=True, timeout=60, check=True).stdout
    n = struct.unpack("=I", out[:4])[0]
    reply = json.loads(out[4 : 4 + n])
    assert reply["ok"] and reply["result"]["data_dir"] == str(data)
    check = json.loads(run_cli(["install", "--check", "--json"], data, env=env).stdout)
    registered = [b for b in check["browsers"] if b["registered"]]
    assert len(registered) == 2 and all(b["answered"] and b["problem"] is None for b in registered)
    assert frame(b"") == struct.pack("=I", 0)


# Every string field of every message type, as the browser could send it: each bad text in
# each field, one at a time, plus each number field as NaN, Infinity and 1e999 (raw JSON, which
# Python's own encoder would never write). Paths name nested fields: "history.1.kbs.0".
_STRING_FIELDS: dict[str, tuple[dict, list[str]]] = {
    "status": ({}, ["extra"]),
    "kb.list": ({}, ["extra"]),
    "kb.create": ({"name": "New", "privacy": "device", "model": "hashing-256"},
                  ["name", "privacy", "model"]),
    "kb.update": ({"kb": "Docs", "name": "Docs", "privacy": "device"}, ["kb", "name", "privacy"]),
    "kb.delete": ({"kb": "Nope"}, ["kb"]),
    "source.add": ({"kb": "Docs", "url": "https://f.test/p", "title": "T", "text": "Fuzz text.",
                    "captured_by": "api", "canonical_url": "https://f.test/p", "lang": "en"},
                   ["kb", "url", "title", "text", "captured_by", "canonical_url", "lang"]),
    "source.list": ({"kb": "Docs"}, ["kb"]),
    "source.remove": ({"kb": "Docs", "source": "nope"}, ["kb", "source"]),
    "search": ({"kbs": ["Docs"], "query": "keep", "mode": "hybrid"}, ["kbs.0", "query", "mode"]),
    "errors.list": ({"source": "ingest", "kb": "Docs"}, ["source", "kb"]),
    "config.get": ({}, ["extra"]),
    "config.set": ({"endpoints": [{"name": "e", "base_url": "http://127.0.0.1:9/v1", "model": "m",
                                   "api_key": "k", "api_key_env": "E_API_KEY"}],
                    "default_endpoint": "e"},
                   ["endpoints.0.name", "endpoints.0.base_url", "endpoints.0.model",
                    "endpoints.0.api_key", "endpoints.0.api_key_env", "default_endpoint"]),
    "chat": ({"kbs": ["Docs"], "message": "keep?", "endpoint": "e", "extractive": True,
              "history": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "hello", "kbs": ["kb_x"]}]},
             ["kbs.0", "message", "endpoint", "history.0.content", "history.0.role",
              "history.1.kbs.0"]),
    "chat.confirm": ({"target": "nope", "call_id": "c", "approve": False}, ["target", "call_id"]),
    "kb.export": ({"kb": "Nope", "passphrase": "p"}, ["kb", "passphrase"]),
    "kb.import": ({"action": "commit", "upload": "up_x", "name": "N", "passphrase": "p"},
                  ["action", "upload", "name", "passphrase"]),
    "kb.reembed": ({"kb": "Nope", "model": "hashing-256"}, ["kb", "model"]),
}
_NUMBER_FIELDS = {"search": ["k", "cutoff", "per_source"], "source.list": ["offset", "limit"],
                  "errors.list": ["offset", "limit"], "chat": ["k"], "kb.reembed": ["batch_size"],
                  "kb.import": ["index"]}
_BAD_TEXT = ["\ud800", "x\udfffy", "a\x00b", "\x00"]
_BAD_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]


def _put(data: dict, path: str, value) -> dict:
    data = json.loads(json.dumps(data))
    *parents, last = path.split(".")
    target = data
    for p in parents:
        target = target[int(p)] if isinstance(target, list) else target[p]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return data


def test_every_string_and_number_field_of_every_message_type_refuses_what_cannot_be_text(tmp_path):
    home = _home_with_one_passage(tmp_path)
    bodies: list[tuple[str, bytes]] = []
    for kind, (data, fields) in _STRING_FIELDS.items():
        for field in fields:
            for bad in _BAD_TEXT:
                body = json.dumps({"id": f"{kind}/{field}/{bad!r}", "type": kind,
                                   "data": _put(data, field, bad)})
                bodies.append((f"{kind} {field}={bad!r}", body.encode()))
    for kind, fields in _NUMBER_FIELDS.items():
        data = _STRING_FIELDS[kind][0]
        for field in fields:
            for bad in _BAD_NUMBERS:
                body = json.dumps({"id": f"{kind}/{field}/{bad}", "type": kind,
                                   "data": _put(data, field, "@@")}).replace('"@@"', bad)
                bodies.append((f"{kind} {field}={bad}", body.encode()))
    assert len(bodies) >= 230
    with HostProcess(HOST, home=home) as host:
        codes: dict[str, str] = {}
        for label, body in bodies:
            host.send_body(body)
            reply = host.until_reply(json.loads(body)["id"], timeout=120)[-1]
            codes[label] = "accepted" if reply["ok"] else reply["error"]["code"]
        assert host.request({"id": "last", "type": "status", "data": {}})["result"]["ready"]
    wrong = {k: v for k, v in codes.items() if v != "invalid_input"}
    assert wrong == {}, (collections.Counter(wrong.values()), wrong)
    report = json.loads(run_cli(["doctor", "--json"], home).stdout)
    assert report["clean"] and [k["chunks"] for k in report["knowledge_bases"]] == [1]
    print(f"{len(bodies)} frames, every one refused as invalid_input")


def _docs_with_folds(tmp_path):
    """A knowledge base "Docs" of 1,100 notes added by the CLI with compaction off: its vector
    log folded, a compaction due. Returns the data dir and the knowledge base's id."""
    home = tmp_path / "home"
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(1100):
        (folder / f"n{i:04}.md").write_text(f"# Note {i}\n\nAbout widget {i} and cable {i % 7}.")
    made = run_cli(["kb", "create", "Docs", "--model", "hashing-256", "--json"], home, check=True)
    run_cli(["add", "Docs", str(folder)], home, check=True, env={"LOCALKB_COMPACT": "off"})
    return home, json.loads(made.stdout)["id"]


def test_the_host_compacts_the_vector_index_in_the_background_after_a_write(tmp_path):
    """A store whose vector index has a rewrite due (1,100 passages folded by a CLI add with
    compaction off); one small write through the host starts the compaction on its own
    thread: the reply comes back, status keeps answering, and the listing ends compacted."""
    import time

    home, kb_id = _docs_with_folds(tmp_path)
    [meta] = (home / "kbs" / kb_id).glob("vectors-*.json")
    assert json.loads(meta.read_text())["segments"]
    with HostProcess(HOST, home=home) as host:
        ok(host, 1, "source.add", {"kb": "Docs", "url": "https://x.test/one", "text": "One more note.",
                                   "title": "One"})
        assert ok(host, 2, "status")["host_version"]  # status answers while it compacts
        deadline, rid = time.monotonic() + 180, 3
        while json.loads(meta.read_text())["segments"] and time.monotonic() < deadline:
            time.sleep(0.2)
        listing = json.loads(meta.read_text())
        # The folded 1,100 are the new base; the host's one note is in the log beside it.
        assert listing["segments"] == [] and listing["count"] == 1100
        hits = ok(host, rid, "search", {"query": "widget 17 cable 3", "kbs": ["Docs"]})
        assert hits
    report = json.loads(run_cli(["doctor", "--json"], home).stdout)
    assert report["clean"], report
    [kb] = report["knowledge_bases"]
    assert (kb["chunks"], kb["vector_index"]["count"]) == (1101, 1101)


def test_a_host_that_opened_the_index_before_a_cli_compaction_writes_without_listing_deleted_files(tmp_path):
    """The host's copy of the vector index predates a ``localkb kb compact`` in another process:
    its next search and write see the new layout (a stat of the listing), so the listing it
    leaves names only files that exist, and counts agree with the catalogue."""
    home, kb_id = _docs_with_folds(tmp_path)
    off = {"LOCALKB_COMPACT": "off"}
    folder_of = home / "kbs" / kb_id
    [meta] = folder_of.glob("vectors-*.json")
    with HostProcess(HOST, home=home, env=off) as host:
        assert ok(host, 1, "search", {"query": "widget 17", "kbs": ["Docs"]})  # the host opens it
        before = json.loads(meta.read_text())
        done = json.loads(run_cli(["kb", "compact", "Docs", "--json"], home, check=True).stdout)
        assert done["state"] == "compacted"
        assert ok(host, 2, "search", {"query": "widget 17", "kbs": ["Docs"]})
        ok(host, 3, "source.add", {"kb": "Docs", "url": "https://x.test/one", "text": "One more note.",
                                   "title": "One"})
        after = json.loads(meta.read_text())
        assert after["layout"] == before["layout"] + 1 and after["segments"] == []
        assert (folder_of / after["base"]).exists()
    report = json.loads(run_cli(["doctor", "--json"], home).stdout)
    assert report["clean"], report
    [kb] = report["knowledge_bases"]
    assert (kb["chunks"], kb["vector_index"]["count"]) == (1101, 1101)
