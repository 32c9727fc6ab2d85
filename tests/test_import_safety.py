"""Importing an .awkb file is safe against hostile files and kills.

- Memory is bounded by what is being built, not by what a file expands to: a parse bomb is
  refused while it is parsed (unknown keys, structure where a value belongs), so it costs no
  more than a small import (peak RSS measured in a real subprocess).
- A kill -9 at any point leaves either no trace at all or the whole knowledge base; the name is
  never blocked (the new knowledge base becomes visible in the transaction that writes its last
  chunk; an unfinished staging file is swept on the next open).
- Strings a store cannot hold (lone surrogates, NUL) are refused as ``invalid_archive``.
- Names are NFC and hold no control or format characters (RTL override, zero-width, BOM, DEL).
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import unicodedata

import pytest

from conftest import run_cli
from hostproc import HostProcess
from localkb.errors import InvalidArchive, InvalidInput
from localkb.portable.archive import import_kb
from test_portable import _doc, _export_bytes, _fill, _pack, _synthetic

HOST = [sys.executable, "-m", "localkb", "host"]


@pytest.fixture
def hashed(store):
    """A small knowledge base on the hashing model (test_portable's, with fewer passages)."""
    store.create_kb("Small", model="hashing-256")
    kb = store.open_kb("Small")
    _fill(kb, 3, repeat=10)
    return kb




# --------------------------------------------------------------------------- item 8: parse bombs

# VmHWM, not getrusage: ru_maxrss survives exec on Linux, so a child started by a big parent
# would report the parent's peak.
_PEAK = ("import sys\nfrom localkb.cli import main\nrc = main(sys.argv[1:])\n"
         "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
         "print('PEAK', hwm, file=sys.stderr)\nsys.exit(rc)\n")


def _peak_kib(args: list[str], home) -> tuple[int, str]:
    res = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True,
                         env={**os.environ, "LOCALKB_HOME": str(home)}, timeout=600, check=False)
    line = [x for x in res.stderr.splitlines() if x.startswith("PEAK ")]
    assert line, res.stderr
    return int(line[0].split()[1]), res.stderr


def _bombs(valid: dict) -> dict[str, bytes]:
    """Documents that expand to 64 MiB of tiny JSON values, each hidden somewhere else."""
    n = 64 * 1024 * 1024 // 3
    head = json.dumps({k: valid[k] for k in ("format", "version", "model", "kb")})[:-1].encode()
    return {
        "a top-level array": gzip.compress(b"[" + b"{}," * n + b"{}]", 6),
        "a chunks list of empty objects": gzip.compress(
            head + b', "sources": [], "chunks": [' + b"{}," * n + b"{}]}", 6),
        "an unknown key": gzip.compress(head + b', "padding": [' + b"[]," * n + b"[]]}", 6),
        "a nested value in a field": gzip.compress(
            head + b', "sources": [{"id": [' + b"0," * n + b"0]}]}", 6),
    }


def test_a_parse_bomb_is_refused_while_parsing_and_costs_no_more_than_a_small_import(tmp_path, store,
                                                                                    hashed):
    good = _export_bytes(hashed)
    small = tmp_path / "small.awkb"
    small.write_bytes(good)
    base, err = _peak_kib(["import", str(small), "--name", "Baseline"], store.root)
    assert "Traceback" not in err
    for label, data in _bombs(_doc(good)).items():
        path = tmp_path / "bomb.awkb"
        path.write_bytes(data)
        assert len(data) < 2 * 1024 * 1024, label  # a small file...
        peak, err = _peak_kib(["import", str(path)], store.root)
        assert "invalid_archive" in err and "Traceback" not in err, (label, err[-500:])
        # ...that must not cost more than its own 64 MiB of text over a normal import.
        assert peak < base + 64 * 1024, (label, peak, base)
    assert [r.name for r in store.kbs()] == ["Small", "Baseline"]


def test_unknown_keys_and_misplaced_structure_are_named(store, hashed):
    doc = _doc(_export_bytes(hashed))
    cases = {
        "'padding' is not a field of an .awkb document": {**doc, "padding": [[1]]},
        "source 0: 'extra' is not a field of a source": {
            **doc, "sources": [{**doc["sources"][0], "extra": 1}, *doc["sources"][1:]]},
        "chunk 0: 'text' must be a string": {
            **doc, "chunks": [{**doc["chunks"][0], "text": ["a"]}, *doc["chunks"][1:]]},
        "model: 'id' must be a string": {**doc, "model": {**doc["model"], "id": {"x": 1}}},
    }
    before = [r.id for r in store.kbs()]
    for message, bad in cases.items():
        with pytest.raises(InvalidArchive) as err:
            import_kb(store, io.BytesIO(_pack(bad)))
        assert message in str(err.value), (message, str(err.value))
    assert [r.id for r in store.kbs()] == before


# --------------------------------------------------------------------------- item 9: kill -9

KILL_TRIALS = 24


def _catalog_state(home) -> tuple[list[tuple], list[tuple]]:
    db = sqlite3.connect(home / "catalog.sqlite")
    try:
        kbs = db.execute("SELECT id, name FROM kbs ORDER BY created").fetchall()
        counts = db.execute("SELECT k.name, (SELECT COUNT(*) FROM sources s WHERE s.kb_id = k.id), "
                            "(SELECT COUNT(*) FROM chunks c WHERE c.kb_id = k.id) FROM kbs k").fetchall()
    finally:
        db.close()
    return kbs, counts


def _time_to_complete(path, home) -> float:
    """Seconds from starting ``localkb import`` until the catalogue holds all of it."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "localkb", "import", str(path), "--name", "Probe"],
                            env={**os.environ, "LOCALKB_HOME": str(home)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = None
    while proc.poll() is None:
        try:
            db = sqlite3.connect(f"file:{home / 'catalog.sqlite'}?mode=ro", uri=True, timeout=5)
            n = db.execute("SELECT COUNT(*) FROM chunks c JOIN kbs k ON k.id = c.kb_id "
                           "WHERE k.name = 'Probe'").fetchone()[0]
            db.close()
        except sqlite3.Error:
            n = 0
        if n and seen is None:
            seen = time.monotonic() - t0
        time.sleep(0.02)
    assert proc.returncode == 0 and seen is not None
    return seen


def test_sigkill_at_random_points_of_an_import_leaves_no_trace_or_the_whole_kb(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Keep", "--model", "hashing-256"], home, check=True)
    n_sources, n_chunks = 60, 3000
    path = tmp_path / "big.awkb"
    path.write_bytes(_synthetic(n_chunks, per_source=50, words_per_chunk=40, seed=9))
    # Kills land anywhere from the start to a little past the moment the catalogue holds the
    # whole knowledge base (building its derived indexes afterwards is not the risky part).
    window = _time_to_complete(path, home) * 1.3
    run_cli(["kb", "delete", "Probe", "-y"], home, check=True)
    rng = random.Random(14)
    outcomes = {"no trace": 0, "whole": 0}
    for trial in range(KILL_TRIALS):
        proc = subprocess.Popen([sys.executable, "-m", "localkb", "import", str(path), "--name", "Moved"],
                                env={**os.environ, "LOCALKB_HOME": str(home)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, window))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kbs, counts = _catalog_state(home)
        names = [n for _, n in kbs]
        assert names[0] == "Keep" and len(names) <= 2, (trial, names)
        if "Moved" in names:
            assert ("Moved", n_sources, n_chunks) in counts, (trial, counts)  # all of it, or...
            outcomes["whole"] += 1
            run_cli(["kb", "delete", "Moved", "-y"], home, check=True)
        else:
            outcomes["no trace"] += 1  # ...nothing: no half-made knowledge base, the name free
        res = run_cli(["kb", "list", "--json"], home)  # an open sweeps what a kill left
        assert [k["name"] for k in json.loads(res.stdout)["knowledge_bases"]] == ["Keep"], trial
        leftovers = sorted(p.name for p in home.glob("imports/*"))
        assert leftovers == [], (trial, leftovers)
    assert sum(outcomes.values()) == KILL_TRIALS
    assert outcomes["no trace"] > 0, outcomes  # some kills landed before the knowledge base was whole
    res = run_cli(["import", str(path), "--name", "Moved", "--json"], home)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["knowledge_base"]["name"] == "Moved"
    assert run_cli(["search", "Moved", "w1 w2 w3"], home).returncode == 0
    doctor = json.loads(run_cli(["doctor", "--json"], home).stdout)
    assert doctor["clean"], doctor
    print(f"{KILL_TRIALS} kill -9 trials:", outcomes)


# --------------------------------------------------------------------------- item 12: strings


@pytest.mark.parametrize("field", ["text", "title", "name", "key", "url"])
@pytest.mark.parametrize("bad", ["\\ud800", "\\udfff", "\\u0000"])
def test_strings_a_store_cannot_hold_are_refused_through_the_host(store, hashed, field, bad):
    doc = _doc(_export_bytes(hashed))
    text = json.dumps(doc)
    marker = {"text": doc["chunks"][0]["text"], "title": doc["sources"][0]["title"],
              "name": doc["kb"]["name"], "key": doc["sources"][0]["key"],
              "url": doc["sources"][0]["url"]}[field]
    spoiled = text.replace(json.dumps(marker)[:-1], json.dumps(marker)[:-1] + bad, 1)
    assert spoiled != text
    data = gzip.compress(spoiled.encode())
    with HostProcess(HOST, home=store.root) as host:
        up = host.request({"id": 1, "type": "kb.import", "data": {"action": "begin"}})["result"]["upload"]
        host.request({"id": 2, "type": "kb.import", "data": {
            "action": "part", "upload": up, "index": 0,
            "data_base64": base64.b64encode(data).decode()}})
        reply = host.request({"id": 3, "type": "kb.import",
                              "data": {"action": "commit", "upload": up}}, timeout=120)
    assert not reply["ok"] and reply["error"]["code"] == "invalid_archive", reply
    assert [r.name for r in store.kbs()] == ["Small"]


# --------------------------------------------------------------------------- item 15: names

DECEPTIVE = {
    "rtl override": "Invoices\u202egpj.exe",
    "zero width space": "Dia\u200bry",
    "zero width joiner": "Diary\u200d",
    "byte order mark": "\ufeffDiary",
    "delete": "Diary\x7f",
    "line separator": "Diary\u2028x",
    "lone surrogate": "Diary\udc80",
}


@pytest.mark.parametrize("label", sorted(DECEPTIVE))
def test_deceptive_names_are_refused_on_create_rename_and_import(store, hashed, label):
    name = DECEPTIVE[label]
    with pytest.raises(InvalidInput):
        store.create_kb(name)
    with pytest.raises(InvalidInput):
        store.update_kb("Small", name=name)
    doc = _doc(_export_bytes(hashed))
    doc["kb"]["name"] = name
    with pytest.raises(InvalidArchive, match=r"kb: 'name'|lone UTF-16 surrogate"):
        import_kb(store, io.BytesIO(gzip.compress(json.dumps(doc).encode())))
    with pytest.raises(InvalidInput):
        import_kb(store, io.BytesIO(_export_bytes(hashed)), name=name)
    assert [r.name for r in store.kbs()] == ["Small"]


def test_names_are_nfc_so_a_decomposed_twin_is_the_same_name(store, hashed):
    nfc, nfd = "Caf\u00e9", unicodedata.normalize("NFD", "Caf\u00e9")
    assert nfc != nfd
    made = store.create_kb(nfd)
    assert made.name == nfc  # stored composed
    with pytest.raises(Exception) as err:
        store.create_kb(nfc)
    assert err.value.code == "conflict"
    assert store.resolve(nfd).id == made.id
    doc = _doc(_export_bytes(hashed))
    doc["kb"]["name"] = nfd
    imported = import_kb(store, io.BytesIO(gzip.compress(json.dumps(doc).encode())))
    assert imported.knowledge_base["name"] == f"{nfc} (2)"  # not a look-alike twin


def test_deceptive_names_through_the_host_and_the_cli(tmp_path):
    home = tmp_path / "home"
    with HostProcess(HOST, home=home) as host:
        for i, name in enumerate(DECEPTIVE.values()):
            reply = host.request({"id": i, "type": "kb.create", "data": {"name": name}})
            assert reply["error"]["code"] == "invalid_input", (name, reply)
    res = run_cli(["kb", "create", "Invoices\u202egpj.exe"], home)
    assert res.returncode == 2 and "invalid_input" in res.stderr
