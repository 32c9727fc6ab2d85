"""The same behaviour from both stores of the seam: the local one and the team one (real PostgreSQL).

Identifier handling, the relevance floor, per-source results, every status, honest
ingest reports and the .awkb round trip: one test body, run against SQLite + usearch +
Whoosh and against PostgreSQL + pgvector, through the one Searcher and pipeline.
"""

from __future__ import annotations

import io

import pytest

from localkb.errors import EmbeddingUnavailable, IndexUnavailable
from localkb.ingest.extract import extract_text
from localkb.ingest.pipeline import add_document
from localkb.retrieval.search import Searcher, status_line
from test_search import PAGES


@pytest.fixture
def docs(any_store):
    any_store.create_kb("Docs")
    kb = any_store.open_kb("Docs")
    for key, (title, text) in PAGES.items():
        add_document(kb, extract_text(text, title=title), key=f"page:{key}")
    return kb


def search(store, query, **kw):
    return Searcher(store).search(kw.pop("kbs", ["Docs"]), query, **kw)


def test_exact_identifier_never_matches_its_near_twin(any_store, docs):
    res = search(any_store, "ERR_4521")
    assert res.hits[0].title == "ERR_4521 disk full" and "exact" in res.hits[0].lists
    twin = [h for h in res.hits + res.weaker if h.title == "ERR_4512 network"]
    assert all(h.bm25 is None for h in twin)  # the keyword side never matched it
    assert [h.title for h in search(any_store, "v3.2", mode="keyword").hits] == ["Release v3.2"]
    # a part of a compound still finds it; the compound is asked for only whole
    assert search(any_store, "mail", mode="keyword").hits[0].title == "Mail relay"


def test_passages_status_with_numbers(any_store, docs):
    res = search(any_store, "which release removed the legacy sync API?")
    st = res.statuses[0]
    assert st.status == "passages" and st.count == len(res.hits) >= 1
    assert res.hits[0].title == "Release v3.2"
    assert status_line(st) == f"Docs · {st.count} passage{'s' if st.count > 1 else ''}"
    h = res.hits[0]
    assert h.kb == docs.id and h.kb_name == "Docs" and h.chunk_index == 0 and h.chunk_count == 1
    assert h.cosine is not None and 0 < h.score <= 1 and h.lists


def test_floor_nothing_and_weaker(any_store, docs):
    res = search(any_store, "chocolate cake recipe with strawberries")
    st = res.statuses[0]
    assert st.status == "nothing" and res.hits == []
    assert st.best is not None and st.best < st.cutoff == 0.35
    probe = search(any_store, "offline reading of documents", mode="vector").statuses[0].best
    res = search(any_store, "offline reading of documents", cutoff=probe + 0.02, mode="vector")
    st = res.statuses[0]
    assert st.status == "weaker" and st.weaker >= 1 and res.hits == []
    assert res.weaker and all(not h.relevant for h in res.weaker)


def test_empty_and_skipped(any_store, docs):
    any_store.create_kb("Blank")
    res = Searcher(any_store).search(["Blank"], "anything", skipped=[(docs.id, "Docs", "device only")])
    assert [s.status for s in res.statuses] == ["empty", "skipped"]
    assert status_line(res.statuses[1]) == "Docs · skipped · device only"


def test_unavailable_is_never_empty_or_nothing(any_store, docs, monkeypatch):
    def broken_embed(*_a, **_k):
        raise EmbeddingUnavailable("onnxruntime failed")

    def broken_keywords(*_a, **_k):
        raise IndexUnavailable("the keyword leg failed")

    monkeypatch.setattr(docs.embedder, "embed", broken_embed)
    monkeypatch.setattr(type(docs.legs()), "keyword", broken_keywords)
    res = search(any_store, "anything at all")
    assert [s.status for s in res.statuses] == ["unavailable"]
    assert "says nothing about what is stored" in res.statuses[0].message
    assert res.hits == [] and res.weaker == []


def test_embedder_outage_degrades_to_keyword_hits(any_store, docs, monkeypatch):
    def broken(*_a, **_k):
        raise EmbeddingUnavailable("the embedding model file is missing")

    monkeypatch.setattr(docs.embedder, "embed", broken)
    res = search(any_store, "SKU-88-A warranty")
    st = res.statuses[0]
    assert st.status == "passages" and st.degraded and res.hits[0].title == "SKU-88-A widget"


def test_per_source_names_pages_not_passages(any_store):
    any_store.create_kb("Docs")
    kb = any_store.open_kb("Docs")
    paragraphs = [f"Section {i}. The greenhouse sprinklers in bed {i} run at dawn and dusk; "
                  f"valve {i} is checked every Monday and the filter is rinsed monthly. "
                  f"Bed {i} grows tomatoes, basil and peppers along the south wall." for i in range(8)]
    add_document(kb, extract_text("\n\n".join(paragraphs), title="Greenhouse manual"), key="long")
    add_document(kb, extract_text("Sprinklers in the orchard run every second night in summer.",
                                  title="Orchard sprinklers"), key="short")
    plain = search(any_store, "when do the greenhouse sprinklers run", k=5, floor=False)
    assert [h.title for h in plain.hits] == ["Greenhouse manual"] * 5
    res = search(any_store, "when do the greenhouse sprinklers run", k=5, floor=False, per_source=1)
    assert [h.title for h in res.hits] == ["Greenhouse manual", "Orchard sprinklers"]


def test_reports_are_counted_from_rows_and_ids_are_deterministic(any_store):
    any_store.create_kb("Docs")
    kb = any_store.open_kb("Docs")
    long = "\n\n".join(f"Paragraph {i} about the coffee machine's descaling cycle, step {i} of twelve, "
                       f"with the water tank emptied and the drip tray rinsed before step {i + 1}."
                       for i in range(12))
    first = add_document(kb, extract_text(long, title="Descaling"), key="manual")
    assert first.status == "added" and first.added == first.total >= 3
    again = add_document(kb, extract_text(long, title="Descaling"), key="manual")
    assert again.status == "unchanged" and again.unchanged == first.total
    short = add_document(kb, extract_text(long.split("\n\n")[0], title="Descaling"), key="manual")
    assert short.status == "updated" and short.removed == first.total - 1
    assert short.source_id == first.source_id
    rows, total = kb.list_sources()
    assert total == 1 and rows[0]["chunks"] == 1 == any_store.counts(kb.id)["chunks"]


def _fill(store) -> None:
    store.create_kb("Docs")
    kb = store.open_kb("Docs")
    for key, (title, text) in PAGES.items():
        add_document(kb, extract_text(text, title=title), key=f"page:{key}")


def test_awkb_round_trip_between_the_two_stores(store, team_store):
    """Local -> .awkb -> team -> .awkb -> local: the same passages, found the same way, never re-embedded."""
    from localkb.portable.archive import export_kb, import_kb

    _fill(store)
    out = io.BytesIO()
    assert export_kb(store.open_kb("Docs"), out).chunks == len(PAGES)
    out.seek(0)
    into_team = import_kb(team_store, out, name="Copy")
    assert into_team.chunks == len(PAGES) and into_team.knowledge_base["id"].startswith("tkb_")
    assert Searcher(team_store).search(["Copy"], "ERR_4521").hits[0].title == "ERR_4521 disk full"
    back = io.BytesIO()
    export_kb(team_store.open_kb("Copy"), back)
    back.seek(0)
    assert import_kb(store, back, name="Back").chunks == len(PAGES)
    local = Searcher(store).search(["Docs"], "legacy sync", mode="vector").hits
    again = Searcher(store).search(["Back"], "legacy sync", mode="vector").hits
    assert [h.title for h in again] == [h.title for h in local]
    assert again[0].cosine == pytest.approx(local[0].cosine, abs=1e-5)  # the vectors travelled as is


def test_keyword_leg_ranks_alike_in_both_stores(store, team_store):
    """Our analyser's terms in a PostgreSQL tsvector, BM25 computed in SQL: Whoosh's ranking."""
    _fill(store)
    _fill(team_store)
    for query in ("ERR_4521 disk", "release offline documents", "widget warranty e-mail relay"):
        a = Searcher(store).search(["Docs"], query, mode="keyword", floor=False).hits
        b = Searcher(team_store).search(["Docs"], query, mode="keyword", floor=False).hits
        assert [h.title for h in a] == [h.title for h in b], query
        assert [h.bm25 for h in a] == pytest.approx([h.bm25 for h in b], rel=0.05), query
        assert [h.matched_terms for h in a] == [h.matched_terms for h in b], query


def test_reembedding_switches_model_and_keeps_every_passage(any_store, docs):
    from localkb.ingest.reembed import reembed, staged_count

    before = any_store.counts(docs.id)
    report = reembed(any_store, "Docs", "hashing-256", batch_size=2, lock_below=0)
    assert report.switched and report.embedded == before["chunks"] and report.to_model == "hashing-256"
    rec = any_store.resolve("Docs")
    assert (rec.model, rec.dim) == ("hashing-256", 256) and rec.generation == report.generation
    assert any_store.counts(docs.id) == before and staged_count(any_store, docs.id) == 0
    res = search(any_store, "ERR_4521")
    assert res.hits[0].title == "ERR_4521 disk full"
    assert search(any_store, "legacy sync API", mode="vector").statuses[0].status != "unavailable"
    again = reembed(any_store, "Docs", "hashing-256")
    assert not again.switched and again.summary == "Docs already uses hashing-256"


# -- the one ingest pipeline, on both stores ------------------------------------------------
def _manual(n: int, changed: int | None = None) -> str:
    return "\n\n".join(
        f"Paragraph {i} of the boiler manual: open valve {i}, wait {i + 2} minutes, then read "
        f"gauge {i} and write the pressure in the log before you close valve {i}."
        + (" This step was rewritten for the new pump." if i == changed else "")
        for i in range(n))


@pytest.fixture
def embedded(any_kb, monkeypatch):
    """Every text the model is asked to embed, whichever handle (or thread) asks."""
    seen: list[str] = []
    lock = __import__("threading").Lock()
    real = type(any_kb.embedder).embed

    def counting(self, texts, *a, **k):
        with lock:
            seen.extend(texts)
        return real(self, texts, *a, **k)

    monkeypatch.setattr(type(any_kb.embedder), "embed", counting)
    return seen


def test_pipeline_readd_unchanged_and_edit_reuses_vectors(any_store, any_kb, embedded):
    from localkb.ingest.pipeline import add_document as pipeline_add

    first = pipeline_add(any_kb, extract_text(_manual(10), title="Boiler"), key="boiler")
    assert first.status == "added" and first.added == first.total >= 3
    assert len(embedded) == first.total
    again = pipeline_add(any_kb, extract_text(_manual(10), title="Boiler"), key="boiler")
    assert again.status == "unchanged" and again.unchanged == first.total and len(embedded) == first.total
    embedded.clear()
    edited = pipeline_add(any_kb, extract_text(_manual(10, changed=5), title="Boiler"), key="boiler")
    assert edited.status == "updated" and edited.source_id == first.source_id
    assert 1 <= edited.updated <= 2 and edited.unchanged == edited.total - edited.updated
    assert len(embedded) == edited.updated  # only the changed passages met the model
    assert all("rewritten" in t for t in embedded)
    rows, total = any_kb.list_sources()
    assert total == 1 and rows[0]["chunks"] == edited.total == any_store.counts(any_kb.id)["chunks"]


def test_pipeline_big_source_interrupted_keeps_old_whole_and_resumes(any_store, any_kb, embedded):
    from localkb.errors import Cancelled
    from localkb.ingest.pipeline import ingest_documents

    def job(text):
        return [("manual", lambda: (extract_text(text, title="Boiler"), "boiler"))]

    old = ingest_documents(any_kb, job(_manual(6)), batch_tokens=400)[0]
    assert old.status == "added"
    old_texts = {r["text"] for r in any_store.passage_window(any_kb.id, old.source_id, 0, 5)}
    new_text = _manual(40).replace("Paragraph", "Step")
    embedded.clear()

    def cancel_after_two_batches():
        if len(embedded) >= 8:
            raise Cancelled("stop")

    with pytest.raises(Cancelled):
        ingest_documents(any_kb, job(new_text), batch_tokens=400, check_cancelled=cancel_after_two_batches)
    staged_once = len(embedded)
    assert staged_once >= 8
    # The old version is still the whole, only, visible one.
    rows, total = any_kb.list_sources()
    assert total == 1 and rows[0]["chunks"] == old.total
    assert {r["text"] for r in any_store.passage_window(any_kb.id, old.source_id, 0, 5)} == old_texts
    embedded.clear()
    done = ingest_documents(any_kb, job(new_text), batch_tokens=400)[0]
    assert done.status == "updated" and done.total > staged_once and done.failed == 0
    assert done.resumed >= 4  # the staged batches of the interrupted run were kept
    assert len(embedded) == done.total - done.resumed  # and not embedded again
    rows, total = any_kb.list_sources()
    assert rows[0]["chunks"] == done.total == any_store.counts(any_kb.id)["chunks"]


def test_pipeline_two_adds_of_one_source_at_once_embed_once(any_store, any_kb, embedded):
    import threading

    from localkb.ingest.pipeline import add_document as pipeline_add

    text = _manual(12)
    reports = []
    handles = [any_store.open_kb("Docs"), any_store.open_kb("Docs")]
    threads = [threading.Thread(target=lambda h=h: reports.append(
        pipeline_add(h, extract_text(text, title="Boiler"), key="boiler"))) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(r.status for r in reports) == ["added", "unchanged"]
    assert len(embedded) == reports[0].total  # the second waited for the first and found it stored
    assert any_store.counts(any_kb.id)["chunks"] == reports[0].total
