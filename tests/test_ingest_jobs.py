"""Ingest jobs as people run them: progress, the unchanged path, caps, two adds at once, Ctrl-C."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from localkb.ingest import pipeline
from localkb.ingest.pipeline import add_paths

WORDS = ("storage network quota error retry cable proxy backup archive restore invoice customer "
         "ledger payment refund shipment router switch firmware kernel module the a of and to").split()


def write_notes(folder: Path, n: int, prefix: str = "note", paragraphs: int = 3) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        body = "\n\n".join(f"Fact {j} of {prefix} {i}: the {prefix} collection keeps item {i * 10 + j} "
                           f"in drawer {j} next to the blue folder." for j in range(paragraphs))
        path = folder / f"{prefix}{i:03}.md"
        path.write_text(f"# {prefix.title()} {i}\n\n{body}\n", encoding="utf-8")
        out.append(path)
    return out


def rows(home: Path, sql: str) -> list:
    db = sqlite3.connect(home / "catalog.sqlite")
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


# -- 1. progress people can trust -----------------------------------------------------------
def test_progress_counts_the_whole_job_and_never_resets(kb, tmp_path):
    write_notes(tmp_path / "notes", 24, paragraphs=6)
    events: list[dict] = []
    report = add_paths(kb, [str(tmp_path / "notes")], progress=events.append, batch_tokens=1500)
    passages = report.totals()["added"]
    assert passages > 24  # several batches: the old bar reset at each one
    assert {e["sources_total"] for e in events} == {24}
    done = [e["sources_done"] for e in events]
    assert done == sorted(done) and done[-1] == 24
    embedded = [e["passages"] for e in events]
    assert embedded == sorted(embedded) and embedded[-1] == passages
    assert all(e["unit"] == "tokens" for e in events)
    assert {e["stage"] for e in events} >= {"extract", "chunk", "embed", "write"}
    assert all(isinstance(e["current"], str) and e["current"].startswith("note") for e in events
               if e["current"] is not None)
    elapsed = [e["elapsed_s"] for e in events]
    assert elapsed == sorted(elapsed)
    rates = [e["rate"] for e in events if e["rate"] is not None]
    assert all(r > 0 for r in rates)
    assert all(e["eta_s"] is None or e["eta_s"] >= 0 for e in events)


def test_the_model_starts_before_the_batch_is_read_and_the_batch_is_one_write(kb, tmp_path, monkeypatch):
    write_notes(tmp_path / "notes", 60, paragraphs=10)
    # A window and a queue smaller than these 40,000 tokens (the defaults are bigger than
    # the whole folder, which would be read before the model could start anyway).
    monkeypatch.setattr(pipeline, "EMBED_WINDOW", 4096)
    monkeypatch.setattr(pipeline, "EMBED_MIN", 2048)
    monkeypatch.setattr(pipeline, "QUEUE_TOKENS", 8192)
    order: list[str] = []
    real_open, real_embed = pipeline.open_file, kb.embedder.embed
    monkeypatch.setattr(pipeline, "open_file", lambda p, **kw: (order.append("read"), real_open(p, **kw))[1])

    def embed(texts, progress=None, **kw):
        order.append("embed")
        return real_embed(texts, progress, **kw)

    monkeypatch.setattr(kb.embedder, "embed", embed)
    gen = kb.record.generation
    report = add_paths(kb, [str(tmp_path / "notes")])
    assert report.totals()["by_status"]["added"] == 60
    assert order.count("read") == 60 and order.count("embed") >= 2
    # The model ran while sources of the same batch were still to be read (the old pipeline
    # read a whole batch, then embedded it, while the model waited)...
    assert order.index("embed") < len(order) - 1 - order[::-1].index("read")
    # ...and the batch was still written in one transaction.
    assert kb.store.resolve(kb.id).generation == gen + 1


def test_the_job_reports_the_cpu_of_its_reader_and_committer_threads(kb, tmp_path):
    """The throughput bench splits the job's CPU by thread: what extraction and chunking (the
    reader) and the writes (the committer) cost beside the model, each timed on its own thread."""
    import resource

    write_notes(tmp_path / "notes", 30, paragraphs=6)

    def cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    c0 = cpu()
    report = add_paths(kb, [str(tmp_path / "notes")])
    spent = cpu() - c0
    assert report.totals()["by_status"]["added"] == 30
    read, commit = report.timings["read_cpu_s"], report.timings["commit_cpu_s"]
    assert read > 0 and commit > 0
    assert read + commit < spent  # each thread's own CPU, not the process's


@pytest.mark.slow
def test_the_model_batches_passages_of_like_length_over_many_small_sources(kb, tmp_path):
    """Passages of mixed lengths, many small files: the model's padded work stays near the real
    tokens. Sorted by length only over 8,192 tokens at a time, each model batch spanned a third
    of the lengths and the model computed 7 % more tokens than there were."""
    rng = random.Random(17)
    folder = tmp_path / "mixed"
    folder.mkdir()
    for i in range(800):
        paras = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 70))) + "."
                 for _ in range(rng.randint(1, 4))]
        (folder / f"n{i:03}.md").write_text(f"# Note {i}\n\n" + "\n\n".join(paras) + "\n", encoding="utf-8")
    report = add_paths(kb, [str(folder)])
    assert report.totals()["by_status"]["added"] == 800
    work = report.timings["model"]
    assert work["texts"] == report.passages == report.totals()["added"]
    assert work["tokens"] > 3 * pipeline.EMBED_WINDOW  # several windows, not one sort of everything
    waste = work["padded_tokens"] / work["tokens"] - 1
    assert waste < 0.08, f"the model computed {waste:.1%} more tokens than the passages hold"


def test_rate_and_eta_are_over_the_whole_job_in_tokens():
    from localkb.ingest.progress import JobProgress

    now = [0.0]
    seen: list[dict] = []
    job = JobProgress(seen.append, clock=lambda: now[0])
    job.add_sources(2, nbytes=1000)
    assert job.rate() is None and job.eta() is None  # unknown until something was embedded
    job.chunked(500, tokens_to_embed=5000, tokens_all=5000)  # half the bytes read: 10 tokens/byte
    now[0] = 10.0
    job.embedded(50, 4000)
    assert job.rate() == pytest.approx(400.0)  # 4000 tokens over 10 s of job, not of one batch
    # 1000 tokens chunked but not embedded + 500 unread bytes at 10 tokens/byte = 6000 to go.
    assert job.tokens_left() == 6000
    assert job.eta() == pytest.approx(15.0)
    job.source_done(unread_bytes=500)  # the second source was unchanged: nothing left to read
    assert job.tokens_left() == 1000 and job.eta() == pytest.approx(2.5)
    job.emit("embed", 50, 60, current="b.md")
    ev = seen[-1]
    assert ev["sources_done"] == 1 and ev["sources_total"] == 2 and ev["current"] == "b.md"
    assert ev["rate"] == 400.0 and ev["eta_s"] == 2.5 and ev["unit"] == "tokens"


def test_the_rate_and_eta_count_from_when_the_model_was_ready_not_from_its_build():
    from localkb.ingest.progress import JobProgress

    now = [0.0]
    job = JobProgress(None, clock=lambda: now[0])
    job.add_sources(1, nbytes=1000)
    now[0] = 80.0  # the first add after an install: 80 s building the model
    job.model_ready()
    job.chunked(1000, tokens_to_embed=8000, tokens_all=8000)
    now[0] = 90.0
    job.embedded(40, 4000)
    # Before: 4000 tokens over 90 s (44/s), an ETA of 90 s for 10 s of work.
    assert job.rate() == pytest.approx(400.0)
    assert job.eta() == pytest.approx(10.0)
    assert job.elapsed() == pytest.approx(90.0)  # the job's own time still counts everything


def test_the_model_is_prepared_as_its_own_stage_before_the_first_passage(kb, tmp_path, monkeypatch):
    """A process that has not loaded the model yet (the first add after an install builds it)
    says so as a ``model`` stage before anything is chunked, not as "Reading 1 of 1"."""
    from localkb.embedding import embedder as embedder_mod

    monkeypatch.setattr(embedder_mod, "_SHARED", {})  # as in a fresh process
    kb._embedder = None
    write_notes(tmp_path / "notes", 2)
    events: list[dict] = []
    add_paths(kb, [str(tmp_path / "notes")], progress=events.append)
    stages = [e["stage"] for e in events]
    assert "model" in stages, stages
    first_model = stages.index("model")
    assert stages[first_model:first_model + 2] == ["model", "model"], stages
    assert [events[first_model]["done"], events[first_model + 1]["done"]] == [0, 1]
    assert "chunk" not in stages[:first_model] and "embed" not in stages[:first_model], stages
    # once the process holds the model, a later add has no model stage
    events.clear()
    (tmp_path / "notes" / "third.md").write_text("# Third\n\nA third note about tyres.")
    add_paths(kb, [str(tmp_path / "notes")], progress=events.append)
    assert "model" not in [e["stage"] for e in events]


def test_cli_add_ends_with_one_line_of_counts_and_time(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    write_notes(tmp_path / "notes", 3)
    (tmp_path / "notes" / "only.md").write_text("# One\n\nA single short note.")
    res = run_cli(["add", "Docs", str(tmp_path / "notes")], home)
    assert res.returncode == 0, res.stderr
    last = res.stdout.strip().splitlines()[-1]
    pattern = r"4 sources: 4 added — \d+ passages embedded in \d+:\d\d(, [\d,]+ tokens/s)?"
    assert re.fullmatch(pattern, last), last
    one = run_cli(["add", "Docs", str(tmp_path / "notes" / "only.md")], home)
    assert one.stdout.strip().splitlines()[-1].startswith("1 source: 1 unchanged — 0 passages embedded")


# -- 2. a size cap per source ---------------------------------------------------------------
def test_a_source_over_the_cap_is_refused_with_the_reason_and_the_flag_lifts_it(kb, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("A paragraph about storage quotas and cables. " * 200)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "big.txt").write_bytes(big.read_bytes())
    alone = add_paths(kb, [str(big)], max_bytes=2000).sources[0]
    assert alone.status == "failed" and alone.error["code"] == "source_too_large"
    assert "over the 2.0 KB cap" in alone.error["message"] and "--max-size" in alone.error["message"]
    walked = add_paths(kb, [str(folder)], max_bytes=2000).sources[0]
    assert walked.status == "skipped" and walked.reason.startswith("too large: 9.0 KB")
    assert kb.catalog.counts(kb.id)["chunks"] == 0
    lifted = add_paths(kb, [str(big)], max_bytes=0).sources[0]
    assert lifted.status == "added"
    logged = [e["code"] for e in kb.catalog.errors(source="ingest", limit=10)[0]]
    assert "source_too_large" in logged and "skipped" in logged


def test_cli_max_size_flag(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    note = tmp_path / "n.txt"
    note.write_text("Cables and quotas. " * 100)
    capped = run_cli(["add", "Docs", str(note), "--max-size", "1KB"], home)
    assert capped.returncode == 5 and "over the 1.0 KB cap (--max-size to lift it)" in capped.stdout
    lifted = run_cli(["add", "Docs", str(note), "--max-size", "0"], home)
    assert lifted.returncode == 0 and "1 added" in lifted.stdout
    bad = run_cli(["add", "Docs", str(note), "--max-size", "lots"], home)
    assert bad.returncode == 2 and "not a size" in bad.stderr


# -- 3. everything accounted for --------------------------------------------------------------
def test_a_missing_path_is_reported_and_logged(kb, tmp_path):
    report = add_paths(kb, [str(tmp_path / "nowhere.md")])
    assert report.sources[0].status == "failed"
    assert report.sources[0].error["message"] == "no such file or folder"
    errors, total = kb.catalog.errors(source="ingest")
    assert total == 1 and errors[0]["ref"] == str(tmp_path / "nowhere.md")


# -- 4. the unchanged path --------------------------------------------------------------------
def test_an_unchanged_file_is_not_read_again_and_a_touched_one_only_hashed(kb, tmp_path, monkeypatch):
    notes = write_notes(tmp_path / "notes", 5)
    first = add_paths(kb, [str(tmp_path / "notes")])
    assert first.totals()["by_status"]["added"] == 5
    opened: list[str] = []
    hashed: list[str] = []
    real_open, real_hash = pipeline.open_file, pipeline.hash_file
    monkeypatch.setattr(pipeline, "open_file", lambda p, **kw: (opened.append(p.name), real_open(p, **kw))[1])
    monkeypatch.setattr(pipeline, "hash_file", lambda p: (hashed.append(p.name), real_hash(p))[1])
    again = add_paths(kb, [str(tmp_path / "notes")])
    assert again.totals()["by_status"]["unchanged"] == 5
    assert opened == [] and hashed == []  # size and mtime matched: not even read
    os.utime(notes[0], ns=(time.time_ns(), time.time_ns() + 5_000_000_000))
    touched = add_paths(kb, [str(tmp_path / "notes")])
    assert touched.totals()["by_status"]["unchanged"] == 5
    assert opened == [] and hashed == [notes[0].name]  # hashed once, never extracted
    hashed.clear()
    add_paths(kb, [str(tmp_path / "notes")])
    assert hashed == []  # the new mtime was remembered
    notes[1].write_text(notes[1].read_text() + "\n\nA new closing paragraph about the red box.\n")
    edited = add_paths(kb, [str(tmp_path / "notes")])
    assert opened == [notes[1].name]
    assert edited.totals()["by_status"] == {"added": 0, "updated": 1, "unchanged": 4, "partial": 0,
                                            "skipped": 0, "failed": 0}


def test_an_unchanged_re_add_never_touches_the_model(store, tmp_path, monkeypatch):
    store.create_kb("Docs")
    write_notes(tmp_path / "notes", 4)
    add_paths(store.open_kb("Docs"), [str(tmp_path / "notes")])
    store.close()
    from localkb.store.kb import Store

    fresh = Store(store.settings)  # a new process, in effect: no embedder chosen yet

    def no_model(*_a, **_k):
        raise AssertionError("choosing the model checks its files' hashes: not needed here")

    monkeypatch.setattr(fresh.models, "get", no_model)
    report = add_paths(fresh.open_kb("Docs"), [str(tmp_path / "notes")])
    assert report.totals()["by_status"]["unchanged"] == 4
    fresh.close()


def test_a_second_add_of_the_same_folder_waits_and_embeds_nothing_twice(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    write_notes(tmp_path / "notes", 30, paragraphs=8)
    env = {**os.environ, "LOCALKB_HOME": str(home)}
    cmd = [sys.executable, "-m", "localkb", "add", "Docs", str(tmp_path / "notes"), "--json"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    reports = [json.loads(o[0]) for o in outs]
    stored = rows(home, "SELECT COUNT(*) FROM chunks")[0][0]
    assert sum(r["passages"] for r in reports) == stored  # every passage embedded exactly once
    for r in reports:
        by = r["totals"]["by_status"]
        assert by["added"] + by["unchanged"] == 30
    assert sum(r["totals"]["by_status"]["added"] for r in reports) == 30
    assert json.loads(run_cli(["doctor", "--json"], home).stdout)["clean"]


# -- 6. Ctrl-C --------------------------------------------------------------------------------
def test_ctrl_c_stops_at_a_safe_point_and_says_what_was_kept(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    write_notes(tmp_path / "notes", 40, paragraphs=10)
    env = {**os.environ, "LOCALKB_HOME": str(home), "LOCALKB_INGEST_BATCH_TOKENS": "1024"}
    proc = subprocess.Popen([sys.executable, "-m", "localkb", "add", "Docs", str(tmp_path / "notes")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if (home / "catalog.sqlite").exists() and rows(home, "SELECT COUNT(*) FROM sources")[0][0] >= 3:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the add finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (out, err)
    kept = rows(home, "SELECT COUNT(*) FROM sources")[0][0]
    assert 3 <= kept < 40
    assert f"interrupted: kept {kept} of 40 sources; run the same command to finish" in out
    assert "Traceback" not in err
    chunks = rows(home, "SELECT COUNT(*) FROM chunks")[0][0]
    assert chunks == rows(home, "SELECT SUM(chunk_count) FROM sources")[0][0]
    assert json.loads(run_cli(["doctor", "--json"], home).stdout)["clean"]
    again = json.loads(run_cli(["add", "Docs", str(tmp_path / "notes"), "--json"], home).stdout)
    by = again["totals"]["by_status"]
    assert by["unchanged"] == kept and by["added"] == 40 - kept


# -- the committer: the model never waits for a write ---------------------------------------
def test_the_model_embeds_the_next_batch_while_a_write_commits(kb, tmp_path, monkeypatch):
    """A batch's write runs on the committer thread: while the first write is held open, the
    writer goes on and embeds the next batch (a model call with none of the first batch's
    passages, after the last one with them). Ctrl-C then stops the job; what was handed to
    the committer lands whole and is reported, the rest is pending."""
    import threading

    from localkb.errors import Cancelled
    from localkb.store.kb import KnowledgeBase

    write_notes(tmp_path / "notes", 16, paragraphs=4)
    calls: list[set[str]] = []  # text hashes of each model call, in order
    cond = threading.Condition()
    overlapped = threading.Event()
    real_write, real_embed = KnowledgeBase.write_sources, type(kb.embedder).embed
    writes_seen = []

    def embed(self, texts, *a, **k):
        with cond:
            calls.append({pipeline._text_hash(t) for t in texts})
            cond.notify_all()
        return real_embed(self, texts, *a, **k)

    def next_batch_embedded(mine: set[str]) -> bool:
        last = max(i for i, hs in enumerate(calls) if hs & mine)
        return any(not hs & mine for hs in calls[last + 1:])

    def slow_write(self, writes):
        writes_seen.append(writes)
        if len(writes_seen) == 1:
            mine = {c.text_hash for w in writes for c in w.chunks}
            with cond:  # without a committer this waits in vain: the writer's thread is here
                if cond.wait_for(lambda: next_batch_embedded(mine), 20):
                    overlapped.set()
        return real_write(self, writes)

    def cancel():
        if overlapped.is_set():
            raise Cancelled("stop")

    monkeypatch.setattr(KnowledgeBase, "write_sources", slow_write)
    monkeypatch.setattr(type(kb.embedder), "embed", embed)
    monkeypatch.setattr(pipeline, "EMBED_WINDOW", 256)
    report = add_paths(kb, [str(tmp_path / "notes")], batch_tokens=300, check_cancelled=cancel)
    assert overlapped.is_set()  # the model worked on the next batch before the first write ended
    assert report.interrupted and report.pending
    kept = [s for s in report.sources if s.status == "added"]
    assert len(kept) == len(report.sources) and all(s.added == s.total for s in kept)  # whole
    assert kb.catalog.counts(kb.id)["chunks"] == sum(s.added for s in kept)
    assert {s.name for s in kept}.isdisjoint(report.pending)
    assert len(kept) + len(report.pending) == 16
