"""Re-embedding between MiniLM (384-d) and the hashing model (256-d): writes meanwhile, failures, kills."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from conftest import run_cli
from hostproc import HostProcess
from localkb.doctor import doctor
from localkb.errors import Cancelled, InvalidInput, ModelMismatch
from localkb.ingest.extract import extract_text
from localkb.ingest.pipeline import add_document
from localkb.ingest.reembed import reembed, staged_count
from localkb.retrieval.search import Searcher
from localkb.store.catalog import valid_vector

MINILM, HASHING = "all-MiniLM-L6-v2", "hashing-256"
FACTS = ["Copper conducts electricity better than iron does.",
         "The heron stood motionless in the shallow reeds at dawn.",
         "A sourdough starter needs feeding with flour and water each day.",
         "Glaciers carve U-shaped valleys as they slowly move downhill.",
         "The violin's soundpost transmits vibration from the top to the back."]


def _add(kb, i: int, text: str | None = None) -> None:
    body = text or " ".join(f"{FACTS[i % len(FACTS)]} Item {i} line {j}." for j in range(12))
    add_document(kb, extract_text(body, title=f"Item {i}"), key=f"item:{i}")


def _usable(store, kb_id: str, query: str) -> None:
    """Search answers with passages and every chunk's vector fits the knowledge base's model."""
    rec = store.resolve(kb_id)
    res = Searcher(store).search([kb_id], query, k=5, floor=False)
    assert res.statuses[0].status not in ("unavailable", "empty"), res.statuses[0]
    assert res.hits or res.weaker
    rows = store.catalog.db.execute("SELECT vector FROM chunks WHERE kb_id = ?", (kb_id,)).fetchall()
    assert rows and all(valid_vector(r[0], rec.dim) for r in rows)
    report = doctor(store)
    assert report["clean"], report["knowledge_bases"]


def test_reembed_moves_to_the_other_model_while_writes_arrive(store, kb, tmp_path):
    for i in range(6):
        _add(kb, i)
    initial = store.catalog.counts(kb.id)["chunks"]
    seen: list[dict] = []
    written = threading.Event()
    outsider = tmp_path / "outsider.txt"
    outsider.write_text("Lighthouse lenses were ground by hand in Paris workshops. " * 8)

    def progress(ev: dict) -> None:
        seen.append(ev)
        if ev["stage"] == "embed" and ev["done"] > 0 and not written.is_set():
            written.set()
            # Searches still read the old model's index while staging runs.
            assert store.resolve("Docs").model == MINILM
            assert Searcher(store).search(["Docs"], "heron in the reeds", k=3).hits
            # A writer thread adds a source and changes another, on the old model ...
            t = threading.Thread(target=lambda: (_add(store.open_kb("Docs"), 50),
                                                 _add(store.open_kb("Docs"), 1, "Item one was rewritten "
                                                      "about tidal mills grinding grain. " * 6)))
            t.start()
            t.join()
            # ... and another process adds a file (the store lock works across processes).
            res = run_cli(["add", "Docs", str(outsider)], store.root)
            assert res.returncode == 0, res.stderr

    report = reembed(store, "Docs", HASHING, batch_size=4, lock_below=0, progress=progress)
    assert written.is_set() and report.switched
    # The chunks written meanwhile were embedded for the new model too (by a later pass).
    assert report.chunks == store.catalog.counts(kb.id)["chunks"] > initial
    assert report.embedded >= initial + (report.chunks - initial) + 1
    rec = store.resolve("Docs")
    assert (rec.model, rec.dim) == (HASHING, 256)
    assert [e["stage"] for e in seen][-4:] == ["switch", "switch", "index", "index"]
    assert staged_count(store, rec.id) == 0
    assert not (store.kb_dir(rec.id) / f"vectors-{MINILM}.usearch").exists()
    hits = Searcher(store).search(["Docs"], "tidal mills grinding grain", k=3, floor=False)
    assert hits.hits and "tidal mills" in hits.hits[0].text
    assert "Lighthouse lenses" in Searcher(store).search(["Docs"], "lighthouse lenses Paris",
                                                         k=3, floor=False).hits[0].text
    _usable(store, rec.id, "Item 50 copper electricity")

    back = reembed(store, "Docs", MINILM)
    assert back.switched and store.resolve("Docs").dim == 384
    _usable(store, rec.id, "glaciers carve valleys")


def test_a_writer_holding_the_old_model_is_refused_after_the_switch(store, kb):
    _add(kb, 0)
    stale = store.open_kb("Docs")
    reembed(store, "Docs", HASHING)
    with pytest.raises(ModelMismatch, match="switched from all-MiniLM-L6-v2 to hashing-256"):
        _add(stale, 9)
    _add(store.open_kb("Docs"), 9)  # opened again, it writes on the new model
    _usable(store, kb.id, "copper")


def test_a_failure_keeps_the_old_model_and_a_rerun_reuses_the_staged_vectors(store, kb):
    for i in range(5):
        _add(kb, i)
    total = store.catalog.counts(kb.id)["chunks"]
    calls = {"n": 0}

    def cancel_later() -> None:
        calls["n"] += 1
        if calls["n"] > 2:
            raise Cancelled("stop")

    with pytest.raises(Cancelled):
        reembed(store, "Docs", HASHING, batch_size=2, lock_below=0, check_cancelled=cancel_later)
    assert store.resolve("Docs").model == MINILM
    staged = staged_count(store, kb.id)
    assert 0 < staged < total
    _usable(store, kb.id, "sourdough starter")
    again = reembed(store, "Docs", HASHING, batch_size=2, lock_below=0)
    assert again.switched and again.reused == staged and again.embedded == total - staged
    _usable(store, kb.id, "sourdough starter")


def test_unknown_target_model_is_refused(store, kb):
    with pytest.raises(InvalidInput, match="unknown model"):
        reembed(store, "Docs", "no-such-model")
    res = run_cli(["kb", "reembed", "Docs", "--model", HASHING, "--json"], store.root)
    assert res.returncode == 0 and json.loads(res.stdout)["to_model"] == HASHING
    res = run_cli(["kb", "reembed", "Docs", "--model", HASHING, "--json"], store.root)
    assert res.returncode == 0 and json.loads(res.stdout)["switched"] is False  # already there


def test_sigkill_at_random_points_always_leaves_a_usable_kb_and_a_rerun_completes(store):
    store.create_kb("Kill", model=HASHING)
    kb = store.open_kb("Kill")
    for i in range(10):
        _add(kb, i)
    rng = random.Random(20)
    outcomes = []
    for trial in range(20):
        rec = store.resolve("Kill")
        target = MINILM if rec.model == HASHING else HASHING
        kill_after = rng.randrange(0, 14)  # progress events before the kill
        with HostProcess([sys.executable, "-m", "localkb", "host"], home=store.root) as host:
            host.send({"id": trial, "type": "kb.reembed",
                       "data": {"kb": "Kill", "model": target, "batch_size": 4}})
            events = 0
            finished = False
            while events < kill_after:
                msg = host.next_message()
                if "ok" in msg:
                    finished = True
                    break
                events += 1
            os.kill(host.proc.pid, signal.SIGKILL)
            host.proc.wait()
        after = store.resolve("Kill")
        outcomes.append((trial, kill_after, finished, after.model == target,
                         staged_count(store, after.id)))
        _usable(store, after.id, "glaciers valleys")
    switched = sum(1 for o in outcomes if o[3])
    assert 0 < switched < len(outcomes), outcomes  # kills landed both before and after the switch
    assert any(o[4] for o in outcomes), outcomes  # and some in the middle of staging
    final = MINILM if store.resolve("Kill").model == HASHING else HASHING
    res = run_cli(["kb", "reembed", "Kill", "--model", final, "--json"], store.root)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["switched"] is True
    assert store.resolve("Kill").model == final
    assert staged_count(store, store.resolve("Kill").id) == 0
    _usable(store, store.resolve("Kill").id, "violin soundpost")



def _kill_when(proc: subprocess.Popen, reached) -> str:
    """SIGKILL ``proc`` as soon as ``reached()`` holds; says whether the kill or the exit came first."""
    while proc.poll() is None:
        if reached():
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return "killed"
        time.sleep(0.002)  # the poll interval: the wait is on the condition
    return "finished"


def test_a_cli_reembed_killed_at_each_stage_leaves_doctor_clean_and_nothing_behind(settings, tmp_path):
    """``localkb kb reembed`` killed mid-staging, as the switch commits, while the new vector index
    is written, once it is listed, and once the old one goes: each time ``doctor`` is clean at
    once, search answers on one model's vectors, and no file of the other model is left."""
    from localkb.config import Settings
    from localkb.store.kb import Store

    origin = Store(settings)
    origin.create_kb("Big", model=HASHING)
    big = origin.open_kb("Big")
    for i in range(20):  # 400 passages: the MiniLM run takes seconds
        _add(big, i, " ".join(f"{FACTS[(i + j) % len(FACTS)]} Document {i} part {j}." * 6
                              for j in range(20)))
    kb_id = big.id
    origin.close()

    def catalogue(home):
        db = sqlite3.connect(f"file:{home / 'catalog.sqlite'}?mode=ro", uri=True, timeout=0.05)

        def one(sql: str):
            try:
                return db.execute(sql).fetchone()[0]
            except sqlite3.OperationalError:  # a writer holds it this instant: not yet
                return None
        return db, one

    def files(home) -> list[str]:
        return sorted(p.name for p in (home / "kbs" / kb_id).iterdir())

    stages = {
        "staging": lambda one, home: (one("SELECT COUNT(*) FROM reembed_staging") or 0) > 0,
        "switched": lambda one, home: one("SELECT model FROM kbs") == MINILM,
        "vectors written": lambda one, home: one("SELECT model FROM kbs") == MINILM and any(
            n.startswith(f".vectors-{MINILM}") and n.endswith(".tmp") for n in files(home)),
        "vectors listed": lambda one, home: (home / "kbs" / kb_id / f"vectors-{MINILM}.json").exists(),
        "old model gone": lambda one, home: one("SELECT model FROM kbs") == MINILM and not (
            home / "kbs" / kb_id / f"vectors-{HASHING}.json").exists(),
    }
    outcomes, unclean = [], []
    for stage, reached in stages.items():
        home = tmp_path / stage.replace(" ", "-")
        shutil.copytree(settings.data_dir, home)
        env = {**os.environ, "LOCALKB_HOME": str(home), "LOCALKB_COMPACT": "off"}
        proc = subprocess.Popen([sys.executable, "-m", "localkb", "kb", "reembed", "Big", "--model", MINILM,
                                 "--json"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        db, one = catalogue(home)
        try:
            landed = _kill_when(proc, lambda reached=reached, one=one, home=home: reached(one, home))
        finally:
            db.close()
        checked = run_cli(["doctor", "--json"], home)
        report = json.loads(checked.stdout)
        unclean.extend((stage, landed, k["problems"]) for k in report["knowledge_bases"] if k["problems"])
        if checked.returncode != 0:
            unclean.append((stage, landed, f"doctor exited {checked.returncode}"))
        store = Store(Settings.from_env({"LOCALKB_HOME": str(home),
                                         "LOCALKB_MODEL_DIR": os.environ["LOCALKB_MODEL_DIR"]}))
        try:
            model = store.resolve("Big").model
            _usable(store, kb_id, "glaciers carve valleys")  # the first open builds what is missing
            other = HASHING if model == MINILM else MINILM
            left = [n for n in files(home) if f"vectors-{other}" in n or n.endswith(".tmp")]
            if left:
                unclean.append((stage, landed, f"left of {other}: {left}"))
        finally:
            store.close()
        outcomes.append((stage, landed, model))
    assert not unclean, unclean
    assert [m for _, _, m in outcomes] == [HASHING] + [MINILM] * 4, outcomes
    assert sum(landed == "killed" for _, landed, _ in outcomes) >= 4, outcomes
