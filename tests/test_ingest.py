"""Honest, idempotent ingestion on the real model and the real store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import count_embedded, make_pdf, run_cli
from localkb.doctor import doctor
from localkb.errors import EmbeddingUnavailable, NothingWritten
from localkb.ingest.extract import extract_text
from localkb.ingest.pipeline import add_capture, add_document, add_paths, list_sources, remove_source
from localkb.store.catalog import valid_vector


def real_rows(kb) -> int:
    rows = kb.catalog.db.execute("SELECT vector FROM chunks WHERE kb_id = ?", (kb.id,)).fetchall()
    return sum(1 for r in rows if valid_vector(r[0], kb.record.dim))


def long_text(paragraphs: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    words = ("storage network quota error retry cable proxy backup archive restore invoice "
             "customer ledger payment refund shipment").split()
    return "\n\n".join(
        " ".join(rng.choice(words, size=60)) + f". Paragraph {i} ends here." for i in range(paragraphs))


def test_report_counts_real_rows(kb):
    doc = extract_text(long_text(12), title="Ledger guide", url="https://example.test/ledger")
    rep = add_document(kb, doc, key="https://example.test/ledger")
    assert rep.status == "added"
    assert rep.added == rep.total == real_rows(kb) > 1
    assert rep.failed == rep.updated == rep.removed == 0
    assert kb.indexes()[0].__len__() == real_rows(kb)


def test_readding_same_page_adds_and_duplicates_nothing(kb):
    doc = extract_text(long_text(8), title="Same page", url="https://example.test/same")
    first = add_document(kb, doc, key="https://example.test/same")
    again = add_document(kb, extract_text(long_text(8), title="Same page",
                                          url="https://example.test/same"),
                         key="https://example.test/same")
    assert again.status == "unchanged"
    assert again.added == again.updated == 0
    assert again.unchanged == first.total
    assert real_rows(kb) == first.total
    vi, ki = kb.indexes()
    assert len(vi) == ki.doc_count() == first.total


def test_readding_shorter_page_deletes_extra_chunks(kb):
    key = "https://example.test/shrinks"
    big = add_document(kb, extract_text(long_text(20), title="T", url=key), key=key)
    small = add_document(kb, extract_text(long_text(4), title="T", url=key), key=key)
    assert big.total > small.total
    assert small.removed == big.total - small.total
    assert real_rows(kb) == small.total
    idx = [r[0] for r in kb.catalog.db.execute("SELECT idx FROM chunks ORDER BY idx")]
    assert idx == list(range(small.total))
    vi, ki = kb.indexes()
    assert len(vi) == ki.doc_count() == small.total


def test_unchanged_hash_skips_without_embedding(kb, monkeypatch):
    key = "https://example.test/skip"
    add_document(kb, extract_text(long_text(5), title="T", url=key), key=key)

    def boom(*_a, **_k):
        raise AssertionError("the embedder must not run for an unchanged source")

    monkeypatch.setattr(kb.embedder, "embed", boom)
    rep = add_document(kb, extract_text(long_text(5), title="T", url=key), key=key)
    assert rep.status == "unchanged"


def test_changed_paragraph_reembeds_only_that_passage(kb, monkeypatch):
    key = "https://example.test/edit"
    text = long_text(10)
    first = add_document(kb, extract_text(text, title="T", url=key), key=key)
    calls = count_embedded(kb, monkeypatch)
    edited = text.replace("Paragraph 9 ends here.", "Paragraph 9 now says something new.")
    rep = add_document(kb, extract_text(edited, title="T", url=key), key=key)
    assert rep.status == "updated"
    assert rep.updated >= 1
    assert rep.unchanged >= first.total - 2
    assert sum(calls) == rep.updated + rep.added


def test_provenance_round_trips_with_pdf_pages(kb, tmp_path):
    pdf = make_pdf(tmp_path / "manual.pdf", [
        "Page one explains installation of the Acme router model AX-200.",
        "Page two lists error ERR_4521: the disk is full.",
        "Page three covers warranty and returns.",
    ])
    report = add_paths(kb, [str(pdf)])
    assert report.sources[0].status == "added"
    rows = kb.catalog.db.execute(
        "SELECT c.idx, c.page, c.text, c.indexed_by, c.indexed_at, s.type, s.file_name, s.chunk_count, "
        "s.content_hash, s.captured_by, s.pages FROM chunks c JOIN sources s ON s.id = c.source_id "
        "ORDER BY c.idx").fetchall()
    assert [r["page"] for r in rows] == [1, 2, 3]
    assert "ERR_4521" in rows[1]["text"]
    assert all(r["type"] == "pdf" and r["file_name"] == "manual.pdf" for r in rows)
    assert all(r["chunk_count"] == 3 and r["pages"] == 3 and r["indexed_by"] == "cli" for r in rows)
    assert all(len(r["content_hash"]) == 64 and r["indexed_at"] > 0 for r in rows)
    sources, total = list_sources(kb)
    assert total == 1 and sources[0]["chunks"] == 3


def test_a_chunk_never_spans_two_pdf_pages(kb, tmp_path):
    pdf = make_pdf(tmp_path / "two.pdf", ["alpha " * 30, "omega " * 30])
    add_paths(kb, [str(pdf)])
    texts = {r["page"]: r["text"] for r in kb.catalog.db.execute("SELECT page, text FROM chunks")}
    assert "omega" not in texts[1] and "alpha" not in texts[2]


def test_chunks_fit_the_model_window(kb):
    doc = extract_text("# Heading\n\n" + long_text(40) + " " + "x" * 3000, title="A long title " * 5)
    add_document(kb, doc, key="text:long")
    counter = kb.embedder.tokenizer
    for (text,) in kb.catalog.db.execute("SELECT text FROM chunks"):
        from localkb.ingest.chunk import passage_text

        n = len(counter.encode(passage_text(doc.title, text)).ids)
        assert n <= 256
        assert len(kb.embedder._counter.encode(passage_text(doc.title, text)).ids) <= 256


def test_corrupt_model_file_raises_embedding_unavailable(tmp_path):
    from localkb.embedding.embedder import MiniLMEmbedder, packaged_model_path

    bad = tmp_path / "model.onnx"
    data = bytearray(packaged_model_path().read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(EmbeddingUnavailable, match="not the verified file"):
        MiniLMEmbedder(model_path=bad).embed(["hello"])
    with pytest.raises(EmbeddingUnavailable, match="missing"):
        MiniLMEmbedder(model_path=tmp_path / "absent.onnx").embed(["hello"])


def test_embedder_pools_over_the_real_attention_mask():
    from localkb.embedding.embedder import MiniLMEmbedder

    e = MiniLMEmbedder()
    short = "disk full"
    alone = e.embed([short])[0]
    padded = e.embed([short, "a much longer sentence " * 20])[0]
    assert np.dot(alone, padded) > 0.9999
    assert alone.shape == (384,) and abs(np.linalg.norm(alone) - 1) < 1e-5


def test_writing_nothing_is_an_error_and_keeps_what_was_stored(kb, monkeypatch):
    key = "https://example.test/keep"
    first = add_document(kb, extract_text(long_text(4), title="T", url=key), key=key)

    def broken(texts, progress=None, **kw):
        raise EmbeddingUnavailable("onnxruntime failed while embedding: simulated outage")

    monkeypatch.setattr(kb.embedder, "embed", broken)
    with pytest.raises(NothingWritten, match="simulated outage"):
        add_document(kb, extract_text(long_text(6, seed=3), title="T", url=key), key=key)
    assert real_rows(kb) == first.total
    errors, _ = kb.catalog.errors(source="ingest")
    assert errors and "simulated outage" in errors[0]["message"]


def test_partial_failure_reports_n_of_m(kb, monkeypatch):
    real = kb.embedder._run

    def poisoned(batch_ids):
        out = real(batch_ids)
        marker = kb.embedder.tokenizer.token_to_id("poison")
        for row, ids in enumerate(batch_ids):
            if marker in ids:
                out[row] = np.nan
        return out

    monkeypatch.setattr(kb.embedder, "_run", poisoned)
    text = "\n\n".join(
        (f"Paragraph {i} about poison control. " if i in (2, 5, 7) else f"Paragraph {i} about ledgers. ")
        * 25 for i in range(9))
    rep = add_document(kb, extract_text(text, title="T"), key="text:partial")
    assert rep.status == "partial"
    assert rep.failed >= 3
    assert rep.summary.startswith(f"{rep.failed} of {rep.total} passages could not be saved")
    assert rep.added == rep.total - rep.failed == real_rows(kb)
    assert all("non-finite" in f["reason"] for f in rep.failures)


def test_folder_with_a_broken_file_indexes_the_rest_and_accounts_for_every_file(kb, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(5):
        (folder / f"note{i}.md").write_text(f"# Note {i}\n\nThis is note number {i} about topic {i}.")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    (folder / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (folder / "empty.txt").write_bytes(b"")
    (folder / ".hidden.md").write_text("# hidden")
    report = add_paths(kb, [str(folder)])
    by_name = {Path(s.name).name: s for s in report.sources}
    assert set(by_name) == {"note0.md", "note1.md", "note2.md", "note3.md", "note4.md", "broken.pdf",
                            "image.png", "empty.txt"}
    assert by_name["broken.pdf"].status == "failed"
    assert by_name["broken.pdf"].error["code"] == "invalid_document"
    assert by_name["image.png"].status == "skipped"
    assert by_name["image.png"].reason == "unsupported type: image/png"
    assert by_name["empty.txt"].status == "skipped" and by_name["empty.txt"].reason == "empty"
    assert all(by_name[f"note{i}.md"].status == "added" for i in range(5))
    assert real_rows(kb) == 5
    totals = report.totals()
    assert totals["files_seen"] == 8 == sum(totals["by_status"].values())
    assert totals["by_status"] == {"added": 5, "updated": 0, "unchanged": 0, "partial": 0, "skipped": 2,
                                   "failed": 1}
    assert report.excluded == 1  # the hidden file: counted, not listed
    logged = {e["ref"]: e for e in kb.catalog.errors(source="ingest", limit=50)[0]}
    assert logged[str(folder / "broken.pdf")]["code"] == "invalid_document"
    assert logged[str(folder / "image.png")]["code"] == "skipped"
    assert "image/png" in logged[str(folder / "image.png")]["message"]
    add_paths(kb, [str(folder)])  # the same skip is not logged twice
    assert kb.catalog.errors(source="ingest", limit=50)[1] == len(logged) + 1  # + the PDF again


def test_capture_from_the_extension_records_who_captured_it(kb):
    html = ("<html><head><title>Support</title></head><body><article><h1>Support</h1>"
            "<p>Error ERR_4521 means the disk is full; free space and retry.</p>"
            "<p>Error ERR_4512 means the network is unreachable.</p></article></body></html>")
    rep = add_capture(kb, url="https://intranet.test/support#top", title="Support", html=html,
                      captured_by="context-menu")
    assert rep.status == "added"
    row = kb.catalog.db.execute("SELECT s.url, s.captured_by, s.key, c.text FROM sources s "
                                "JOIN chunks c ON c.source_id = s.id").fetchone()
    assert row["captured_by"] == "context-menu"
    assert row["key"] == "https://intranet.test/support"
    assert "ERR_4521" in row["text"] and "\\_" not in row["text"]


def test_a_saved_selection_is_its_own_source_and_never_replaces_the_saved_page(kb):
    # The extension addresses a selection by a text fragment of its page (capture.js
    # selectionPayload); an ordinary fragment (#top) still names the page itself.
    html = ("<html><head><title>Codes</title></head><body><article><h1>Codes</h1>"
            "<p>ERR_4521 means the disk is full; free space and retry.</p>"
            "<p>ERR_4512 means the network is unreachable.</p></article></body></html>")
    add_capture(kb, url="https://intranet.test/codes", title="Codes", html=html)
    picked = add_capture(kb, url="https://intranet.test/codes#:~:text=ERR_4512%20means",
                         title="Codes (selection)", text="ERR_4512 means the network is unreachable.")
    assert picked.status == "added"
    keys = sorted(r["key"] for r in kb.catalog.db.execute("SELECT key FROM sources"))
    assert keys == ["https://intranet.test/codes", "https://intranet.test/codes#:~:text=ERR_4512%20means"]
    again = add_capture(kb, url="https://intranet.test/codes#top", title="Codes", html=html)
    assert again.status == "unchanged"


def test_remove_source_deletes_its_chunks_everywhere(kb):
    add_document(kb, extract_text(long_text(6), title="T", url="https://x.test/a"), key="https://x.test/a")
    res = remove_source(kb, "https://x.test/a")
    assert res["removed_chunks"] > 0
    assert real_rows(kb) == 0
    vi, ki = kb.indexes()
    assert len(vi) == ki.doc_count() == 0


def test_stale_index_is_caught_up_on_open(store, kb):
    add_document(kb, extract_text(long_text(3), title="A", url="https://x.test/1"), key="https://x.test/1")
    files = [kb.vector_path, kb.vector_path.with_suffix(".json"), kb.vector_path.with_suffix(".log")]
    saved = [f.read_bytes() for f in files]
    add_document(kb, extract_text(long_text(5, 2), title="B", url="https://x.test/2"), key="https://x.test/2")
    # Simulate a crash after the catalogue commit but before the vector index was saved.
    for f, data in zip(files, saved, strict=True):
        f.write_bytes(data)
    store.close()
    from localkb.store.kb import Store

    fresh = Store(store.settings)
    kb2 = fresh.open_kb("Docs")
    vi, ki = kb2.indexes()
    assert len(vi) == ki.doc_count() == real_rows(kb2)
    assert doctor(fresh)["clean"]


def test_doctor_repairs_a_deleted_index(store, kb):
    add_document(kb, extract_text(long_text(3), title="A"), key="text:a")
    kb.close()
    import shutil

    shutil.rmtree(kb.keyword_path)
    report = doctor(store)
    # A missing derived index is rebuilt from the complete catalogue on next use: noted, not a
    # failure. --repair builds it now.
    assert report["clean"] and "missing" in report["knowledge_bases"][0]["notes"][0]
    repaired = doctor(store, repair=True)
    assert repaired["knowledge_bases"][0]["problems_after_repair"] == []
    after = doctor(store)
    assert after["clean"] and after["knowledge_bases"][0]["notes"] == []


def test_url_fetch_checks_type_and_size(kb, tmp_path):
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = {"/page": (b"<html><head><title>Served</title></head><body><article><p>"
                              + b"Loopback page about SKU-88-A widgets and their warranty. " * 5
                              + b"</p></article></body></html>", "text/html"),
                    "/img": (b"\x89PNG....", "image/png"),
                    "/big": (b"x" * 5000, "text/plain")}.get(self.path)
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", body[1])
            self.send_header("Content-Length", str(len(body[0])))
            self.end_headers()
            self.wfile.write(body[0])

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        from dataclasses import replace

        kb.store.settings = replace(kb.store.settings, fetch_url_max_bytes=4000)
        report = add_paths(kb, [f"{base}/page", f"{base}/img", f"{base}/big", f"{base}/missing"])
    finally:
        server.shutdown()
    status = {s.name.rsplit("/", 1)[-1]: s for s in report.sources}
    assert status["page"].status == "added"
    assert status["img"].error["code"] == "fetch_failed" and "image/png" in status["img"].error["message"]
    assert "cap" in status["big"].error["message"]
    assert "404" in status["missing"].error["message"]
    row = kb.catalog.db.execute("SELECT captured_by, url FROM sources").fetchone()
    assert row["captured_by"] == "url" and row["url"].endswith("/page")


def test_cli_json_output_is_parseable(tmp_path):
    home = tmp_path / "home"
    note = tmp_path / "n.md"
    note.write_text("# Widgets\n\nThe SKU-88-A widget ships with a two-year warranty.")
    assert run_cli(["kb", "create", "Docs", "--json"], home).returncode == 0
    added = json.loads(run_cli(["add", "Docs", str(note), "--json"], home).stdout)
    assert added["totals"]["added"] == 1
    listed = json.loads(run_cli(["kb", "list", "--json"], home).stdout)
    assert listed["knowledge_bases"][0]["chunks"] == 1
    found = json.loads(run_cli(["search", "Docs", "SKU-88-A warranty", "--json"], home).stdout)
    assert found["hits"][0]["title"] == "Widgets"
    assert json.loads(run_cli(["doctor", "--json"], home).stdout)["clean"] is True
    assert json.loads(run_cli(["sources", "Docs", "--json"], home).stdout)["total"] == 1
    assert "errors" in json.loads(run_cli(["errors", "--json"], home).stdout)
    missing = run_cli(["search", "Nope", "x", "--json"], home)
    assert missing.returncode == 3 and json.loads(missing.stdout)["error"]["code"] == "kb_not_found"


def _write_notes(folder: Path, prefix: str, n: int) -> None:
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"{prefix}{i}.md").write_text(
            f"# {prefix} note {i}\n\n" + f"Fact {i} of the {prefix} collection concerns topic {i}. " * 8)


def test_two_processes_adding_at_once_store_every_chunk_once(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    _write_notes(tmp_path / "a", "alpha", 12)
    _write_notes(tmp_path / "b", "beta", 12)
    env = {**os.environ, "LOCALKB_HOME": str(home)}
    procs = [subprocess.Popen([sys.executable, "-m", "localkb", "add", "Docs", str(tmp_path / x), "--json"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for x in ("a", "b")]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    db = sqlite3.connect(home / "catalog.sqlite")
    assert db.execute("SELECT COUNT(*) FROM sources").fetchone()[0] == 24
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM chunks").fetchone() == (24, 24)
    report = json.loads(run_cli(["doctor", "--json"], home).stdout)
    assert report["clean"], report


def test_sigkill_during_a_big_add_leaves_whole_source_or_none(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    big = tmp_path / "big.txt"
    big.write_text(long_text(400, seed=7))
    env = {**os.environ, "LOCALKB_HOME": str(home)}
    outcomes = set()
    for delay in (0.5, 2.0, 4.0):
        proc = subprocess.Popen([sys.executable, "-m", "localkb", "add", "Docs", str(big)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        db = sqlite3.connect(home / "catalog.sqlite")
        sources = db.execute("SELECT chunk_count FROM sources").fetchall()
        chunks = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        db.close()
        if sources:
            assert chunks == sources[0][0]
            outcomes.add("whole")
        else:
            assert chunks == 0
            outcomes.add("none")
        report = json.loads(run_cli(["doctor", "--json"], home).stdout)
        assert report["clean"], report
        if "whole" in outcomes:
            break
    assert outcomes
