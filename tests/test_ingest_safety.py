"""Ingestion that a hostile page or a crash cannot mislead.

- Canonical URL spoofing: a page's ``<link rel="canonical">`` becomes its source key only when
  it has the page's own origin and an http(s) scheme; otherwise the page is keyed by its URL,
  so no page can overwrite another site's saved page or borrow its citations.
- Reports count the rows of their own write, even when another host writes the same source
  right after (two hosts saving one URL at once).
- A kill between the catalogue commit and the index save: ``doctor`` says the indexes are
  behind and will catch up (not a failure), the next write catches them up, re-running the same
  ``localkb add`` repairs them, and temporary files are swept.
"""

from __future__ import annotations

import json
import sys

from conftest import run_cli
from hostproc import HostProcess

HOST = [sys.executable, "-m", "localkb", "host"]
BANK = "<html><head><title>Bank login</title></head><body><article><p>Log in to Example Bank with " \
       "your card number and the code from your card reader.</p></article></body></html>"
EVIL = "<html><head><title>Bank login</title></head><body><article><p>Example Bank moved: send " \
       "your card number and PIN to evil.test to keep your account open.</p></article></body></html>"


def ok(host: HostProcess, rid, type_: str, data: dict) -> dict:
    reply = host.request({"id": rid, "type": type_, "data": data}, timeout=300)
    assert reply.get("ok"), reply
    return reply["result"]


def test_a_canonical_url_of_another_origin_never_becomes_the_source_key(tmp_path):
    home = tmp_path / "home"
    with HostProcess(HOST, home=home) as host:
        ok(host, 1, "kb.create", {"name": "Web"})
        bank = ok(host, 2, "source.add", {"kb": "Web", "url": "https://bank.test/login",
                                          "title": "Bank login", "html": BANK})
        evil = ok(host, 3, "source.add", {"kb": "Web", "url": "https://evil.test/page",
                                          "canonical_url": "https://bank.test/login",
                                          "title": "Bank login", "html": EVIL})
        assert evil["status"] == "added" and evil["source_id"] != bank["source_id"]
        for rid, canonical in enumerate(["http://bank.test/login", "https://bank.test:8443/login",
                                         "javascript:alert(1)", "file:///etc/passwd",
                                         "https://evil.test.bank.test/login"], start=10):
            ok(host, rid, "source.add", {"kb": "Web", "url": "https://evil.test/page",
                                         "canonical_url": canonical, "title": "Bank login",
                                         "html": EVIL})
        sources = ok(host, 4, "source.list", {"kb": "Web"})["sources"]
        assert sorted(s["url"] for s in sources) == ["https://bank.test/login", "https://evil.test/page"]
        found = ok(host, 5, "search", {"kbs": ["Web"], "query": "card reader code"})
        assert found["hits"][0]["url"] == "https://bank.test/login"
        assert "card reader" in found["hits"][0]["text"]  # the bank's own words, not the spoof


def test_a_canonical_url_of_the_same_origin_is_honoured(tmp_path):
    home = tmp_path / "home"
    with HostProcess(HOST, home=home) as host:
        ok(host, 1, "kb.create", {"name": "Web"})
        first = ok(host, 2, "source.add", {"kb": "Web", "url": "https://site.test/a?utm_source=x",
                                           "canonical_url": "https://site.test/a", "title": "A",
                                           "html": BANK})
        again = ok(host, 3, "source.add", {"kb": "Web", "url": "https://site.test/a?ref=y#top",
                                           "canonical_url": "https://site.test/a", "title": "A",
                                           "html": BANK})
        assert again["source_id"] == first["source_id"] and again["status"] == "unchanged"
        sources = ok(host, 4, "source.list", {"kb": "Web"})["sources"]
        assert [s["url"] for s in sources] == ["https://site.test/a"]


RACE_ROUNDS = 150  # per host: 300 reports in all


def _page(host: int, n: int) -> str:
    # Each save changes every passage, so each write replaces the other host's rows.
    return "\n\n".join(f"Host {host} revision {n}: paragraph {p} about valve V-{p} and its torque "
                       f"of {n + p} newton metres, checked every {p + 2} weeks." for p in range(6))


def test_two_hosts_saving_one_url_at_once_each_report_their_own_rows(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Race", "--model", "hashing-256"], home, check=True)
    hosts = [HostProcess(HOST, home=home) for _ in range(2)]
    try:
        for n in range(RACE_ROUNDS):
            for h, host in enumerate(hosts):
                host.send({"id": n, "type": "source.add", "data": {
                    "kb": "Race", "url": "https://race.test/page", "title": "Race",
                    "text": _page(h, n)}})
        reports = []
        for host in hosts:
            for n in range(RACE_ROUNDS):
                reports.append(host.until_reply(n, timeout=600)[-1])
    finally:
        for host in hosts:
            host.close_stdin()
            host.wait()
    refused = [r["error"] for r in reports if not r["ok"]]
    assert refused == [], (len(refused), refused[:3])
    wrong = [r["result"] for r in reports
             if r["result"]["failed"] or r["result"]["added"] + r["result"]["updated"]
             + r["result"]["unchanged"] != r["result"]["total"]]
    assert wrong == [], (len(wrong), wrong[:2])
    doctor = json.loads(run_cli(["doctor", "--json"], home).stdout)
    assert doctor["clean"], doctor


# --------------------------------------------------------------------------- index lag


def _doctor(home) -> dict:
    return json.loads(run_cli(["doctor", "--json"], home).stdout)


def test_a_crash_between_commit_and_index_save_is_behind_not_broken_and_the_same_add_repairs(
        tmp_path, monkeypatch):
    from localkb.config import Settings
    from localkb.errors import IndexUnavailable
    from localkb.ingest.pipeline import add_paths
    from localkb.store.kb import Store
    from localkb.store.vectors import VectorIndex

    home = tmp_path / "home"
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(5):
        (folder / f"n{i}.md").write_text(f"# Note {i}\n\nValve V-{i} is checked every {i + 2} weeks.")
    run_cli(["kb", "create", "Notes", "--model", "hashing-256"], home, check=True)
    store = Store(Settings.from_env({"LOCALKB_HOME": str(home)}))
    kb = store.open_kb("Notes")
    kb.indexes()

    def dies(self, generation):  # as if the process died after the commit, before the save
        raise IndexUnavailable("killed before the index was saved")

    monkeypatch.setattr(VectorIndex, "save", dies)
    assert add_paths(kb, [str(folder)]).totals()["added"] == 5  # the catalogue has it all
    monkeypatch.undo()
    store.close()
    # A save that a kill cut short leaves its temporary file behind.
    dead_pid = 2**22 + 12345
    stray = home / "kbs" / kb.id / f".vectors-hashing-256.usearch.{dead_pid}.tmp"
    stray.write_bytes(b"half a file")
    report = _doctor(home)
    assert report["clean"], report  # complete catalogue, indexes behind: not a failure
    notes = report["knowledge_bases"][0].get("notes", [])
    assert any("behind" in n and "catch" in n for n in notes), report
    assert not stray.exists()  # the open swept it
    res = run_cli(["add", "Notes", str(folder), "--json"], home)  # the same add, all unchanged
    assert res.returncode == 0, res.stderr
    after = _doctor(home)["knowledge_bases"][0]
    assert after["vector_index"]["generation"] == after["generation"], after  # caught up
    assert after["vector_index"]["count"] == after["chunks"] == 5
    assert not after.get("notes"), after


ADD_KILL_TRIALS = 20


def test_sigkill_during_add_at_random_points_never_leaves_doctor_failing(tmp_path):
    import os
    import random
    import signal
    import subprocess
    import time

    home = tmp_path / "home"
    folder = tmp_path / "notes"
    folder.mkdir()

    def write_notes(rev: int) -> None:
        for i in range(40):
            (folder / f"n{i}.md").write_text(
                f"# Note {i}\n\n" + " ".join(f"Revision {rev}: valve V-{i}-{j} opens at {j} bar."
                                             for j in range(30)))

    run_cli(["kb", "create", "Notes", "--model", "hashing-256"], home, check=True)
    write_notes(0)
    t0 = time.monotonic()
    run_cli(["add", "Notes", str(folder)], home, check=True)
    duration = time.monotonic() - t0
    rng = random.Random(1414)
    behind = 0
    for trial in range(1, ADD_KILL_TRIALS + 1):
        write_notes(trial)
        proc = subprocess.Popen([sys.executable, "-m", "localkb", "add", "Notes", str(folder)],
                                env={**os.environ, "LOCALKB_HOME": str(home)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, duration))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        report = _doctor(home)
        kb = report["knowledge_bases"][0]
        assert report["clean"] and kb["problems"] == [], (trial, kb)
        behind += bool(kb.get("notes"))
        assert list(home.glob("kbs/*/.*.tmp")) == [], trial  # the doctor's open swept them
    res = run_cli(["add", "Notes", str(folder), "--json"], home)
    assert res.returncode == 0, res.stderr
    kb = _doctor(home)["knowledge_bases"][0]
    assert kb["problems"] == [] and not kb.get("notes"), kb
    assert kb["vector_index"]["generation"] == kb["keyword_index"]["generation"] == kb["generation"]
    print(f"{ADD_KILL_TRIALS} kill -9 trials during localkb add: doctor clean after every one, "
          f"{behind} left the indexes behind (caught up later)")
