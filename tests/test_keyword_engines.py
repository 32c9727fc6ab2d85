"""Both keyword engines index the same terms and answer alike; the engine is chosen per knowledge base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from localkb.doctor import doctor
from localkb.ingest.extract import extract_text
from localkb.ingest.pipeline import add_document
from localkb.retrieval.search import Searcher
from localkb.store import analysis, keyword_engine
from localkb.store.analysis import analyze, query_terms
from localkb.store.tantivy_index import pre_tokenized

SCIFACT = next((p / "shared" / "datasets" / "beir-scifact" for p in (REPO.parent, REPO.parent.parent)
                if (p / "shared").is_dir()), REPO / "absent")


def _passages() -> list[tuple[str, str]]:
    """The code-heavy eval's pages plus SciFact abstracts when the data set is here."""
    rows = [json.loads(line) for line in (REPO / "evals" / "codes" / "corpus.jsonl").open()]
    if (SCIFACT / "corpus.jsonl").is_file():
        with (SCIFACT / "corpus.jsonl").open() as fh:
            rows += [json.loads(next(fh)) for _ in range(400)]
    return [(f"d{i}", f"{r.get('title', '')}\n{r['text']}") for i, r in enumerate(rows)]


def _queries() -> list[str]:
    qs = [json.loads(line)["text"] for line in (REPO / "evals" / "codes" / "queries.jsonl").open()]
    if (SCIFACT / "queries.jsonl").is_file():
        with (SCIFACT / "queries.jsonl").open() as fh:
            qs += [json.loads(next(fh))["text"] for _ in range(100)]
    return qs


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    docs = _passages()
    out = {}
    for engine in keyword_engine.ENGINES:
        ki = keyword_engine.create(engine, tmp_path_factory.mktemp(engine) / "kw")
        ki.write(docs, [], 1)
        out[engine] = ki
    yield out
    for ki in out.values():
        ki.close()


def _analyze_before(text: str) -> list[tuple[str, int]]:
    """``analyze`` as it was before its loop was optimised: the oracle its output is pinned to."""
    out: list[tuple[str, int]] = []
    pos = 0
    for token in analysis.TOKEN.findall(text):
        terms, width = analysis.token_terms(token)
        out.extend((t, pos + off) for t, off in terms)
        pos += width
    return out


_VARIED = [
    "Call asyncio.Task.done() after os.replace(src, dst); see ERR_4521, not ERR_4512.",
    "Upgrade from v2.3 to V2.3.1 (version 2.3 is gone); 10.0.0.1 is not a version, 3.14 may be.",
    "getElementById, PQbackendPID, mRNA, siRNA and PYTHONHASHSEED are names; e-mail is a word.",
    "Le café était très bon, und die Straße heißt Müllerstraße. Ça va? Naïve façade, œuvre.",
    "Paths: /usr/local/lib/python3.11/site-packages/numpy/__init__.py and https://x.org/a/b/c/d/e/f/g",
    "SKU-88-A, il-6, p53-dependent, rock'n'roll, it’s, don't, O'Brien — 東京 and Москва 2024.",
    "The of and a to in is was: stopwords keep their positions; Task is done; the task_done flag.",
    "pg_trgm.similarity_threshold = 0.3; x86_64; __dunder__; a__b; _lead; trail_; 1e-9; 0x1F.",
    "",
    "   ",
    "ǅungla ﬁnance Ⅻ ²³ ½ ٣٤ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 emoji🙂word tab\tseparated\nlines",
    "no\u00a0break\u2028line\u200bzero\u3000wide\x1cfile\x85next_\u2009thin a_b.c-d 123abc ab12_",
    "under_score __init__ _ __ a_ _a x-y- -x .x x. x..y x.-y 'quoted' ’curly’ v1. 1.2. ..",
]


def test_analyze_gives_exactly_the_terms_and_positions_it_gave_before_it_was_optimised():
    texts = _VARIED + [text for _, text in _passages()]
    texts += [" ".join(texts)]  # long text: positions far from 0, tokens repeated
    for text in texts:
        assert analysis.tokens(text) == analysis.TOKEN.findall(text), text[:80]
        assert analyze(text) == _analyze_before(text), text[:80]
        assert analyze(text) == _analyze_before(text), text[:80]  # from the cache this time


def test_tokens_are_the_token_patterns_matches_on_random_text():
    import random

    rng = random.Random(18)
    alphabet = "aZ9_-./:'’ \t\n\u00a0\u2028\u200b\x1c,;()é東²½Ⅻ🙂ǅ"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert analysis.tokens(text) == analysis.TOKEN.findall(text), repr(text)
        assert analyze(text) == _analyze_before(text), repr(text)


def test_analyze_is_unchanged_when_its_cache_fills(monkeypatch):
    monkeypatch.setattr(analysis, "_ANALYZED_MAX", 5)
    monkeypatch.setattr(analysis, "_ANALYZED", {})
    for text in _VARIED:
        assert analyze(text) == _analyze_before(text)
    assert len(analysis._ANALYZED) <= 5


def test_tantivy_is_fed_exactly_our_terms_at_our_positions():
    text = "The ERR_4521 error, in v2.3 of pathlib.Path.walk: e-mail it."
    tokens = [(t.text, t.position) for t in pre_tokenized(text).tokens]
    assert tokens == analyze(text)
    # Several terms at one position, as analysis.py indexes them: the whole and its first part.
    assert ("err_4521", 1) in tokens and ("err", 1) in tokens and ("4521", 2) in tokens
    assert ("pathlib.path.walk", 7) in tokens and ("path.walk", 8) in tokens


def test_an_identifier_phrase_and_its_whole_match_on_both_engines(both):
    """The whole name and its parts as a phrase share positions on both engines."""
    for engine, ki in both.items():
        whole = set(ki.chunks_with("err_4521"))
        assert whole, engine
        assert whole <= set(ki.phrase(("err", "4521"))), engine


def test_engines_rank_the_same_passages_with_the_same_terms(both):
    overlaps, compared = [], 0
    for q in _queries():
        terms = query_terms(q)
        w = both["whoosh"].search(terms, 10)
        t = both["tantivy"].search(terms, 10)
        assert len(w) == len(t), q
        if not w:
            continue
        overlaps.append(len({h.chunk_id for h in w} & {h.chunk_id for h in t}) / len(w))
        wt = {h.chunk_id: h for h in w}
        for h in t:
            if h.chunk_id in wt:
                compared += 1
                assert h.terms == wt[h.chunk_id].terms, q
                # Same BM25 up to how each engine rounds a passage's length (one byte each).
                assert h.bm25 == pytest.approx(wt[h.chunk_id].bm25, rel=0.08), q
    # The code-heavy eval alone gives ~70 shared hits; with SciFact's abstracts, hundreds.
    assert compared > (100 if (SCIFACT / "corpus.jsonl").is_file() else 40)
    assert sum(overlaps) / len(overlaps) >= 0.95


def test_engines_agree_on_phrases_and_document_frequency(both):
    for terms in (["disk", "full"], ["full", "disk"], ["err_4521"], ["cell", "line"], ["nonexistentterm"]):
        got = {e: sorted(ki.phrase(terms, 500)) for e, ki in both.items()}
        assert got["whoosh"] == got["tantivy"], terms
    for term in ("err_4521", "err_4512", "cell", "e-mail", "mail", "nonexistentterm"):
        assert both["whoosh"].doc_frequency(term) == both["tantivy"].doc_frequency(term), term
    assert both["tantivy"].doc_frequency("nonexistentterm") == 0


@pytest.mark.parametrize("engine", keyword_engine.ENGINES)
def test_every_engine_writes_a_stream_of_upserts(tmp_path: Path, engine: str):
    """A big switch streams its passages (a generator) into the engine, a slice at a time."""
    ki = keyword_engine.create(engine, tmp_path / "kw")
    ki.write(((f"c{i}", f"passage {i} about ERR_{i:04d}") for i in range(50)), [], 1)
    assert ki.doc_count() == 50 and [h.chunk_id for h in ki.search(["err_0007"], 5)] == ["c7"]
    segments = ki.segment_count()
    ki.write(iter(()), [], 2)  # nothing to write: the generation moves, no commit
    assert (ki.generation, ki.segment_count(), ki.doc_count()) == (2, segments, 50)
    ki.write(iter([("c3", "rewritten")]), ["c4"], 3)
    assert ki.doc_count() == 49 and ki.search(["err_0003"], 5) == [] and ki.search(["err_0004"], 5) == []
    ki.close()
    again = keyword_engine.load(engine, tmp_path / "kw")
    assert (again.generation, again.doc_count()) == (3, 49)
    again.close()


def test_a_new_tantivy_index_keeps_the_last_of_an_id_written_twice_in_one_write(tmp_path: Path):
    """A new index skips the delete before each passage, never for an id the write already added.

    (As before that skip; Whoosh keeps both within one writer, as it always has.)
    """
    ki = keyword_engine.create("tantivy", tmp_path / "kw")
    ki.write(iter([("c1", "first ERR_0001"), ("c2", "other ERR_0002"), ("c1", "second ERR_0003")]), [], 1)
    assert ki.doc_count() == 2
    assert ki.search(["err_0001"], 5) == [] and [h.chunk_id for h in ki.search(["err_0003"], 5)] == ["c1"]
    ki.write(iter([("c2", "rewritten ERR_0004")]), [], 2)  # no longer new: the upsert replaces
    assert ki.doc_count() == 2 and ki.search(["err_0002"], 5) == []
    ki.close()


def _fill(kb, n: int = 6) -> None:
    for i in range(n):
        add_document(kb, extract_text(f"Error ERR_45{i:02d} means disk {i} is full. Replace disk {i}.",
                                      title=f"ERR_45{i:02d}"), key=f"page:{i}")


def test_a_tantivy_write_killed_before_its_commit_does_not_block_the_next_one(tmp_path: Path):
    """Before: after a kill -9 between writing a delete file and committing ``meta.json``, the
    next write reached the same opstamp and failed, "FileAlreadyExists(<segment>.25.del)", so
    the knowledge base could not be written again (seen in the random-kill ingest test)."""
    import shutil

    from localkb.store.tantivy_index import TantivyIndex

    folder = tmp_path / "kw"
    ki = TantivyIndex.create(folder)
    ki.write([(f"c{i}", f"valve V-{i} opens at {i} bar") for i in range(20)], [], 1)
    committed = tmp_path / "committed-meta.json"
    shutil.copy(folder / "meta.json", committed)
    ki.write([("c3", "valve V-3 was replaced")], ["c5"], 2)
    ki.close()
    # What the kill leaves: the write's files on disk, the commit before it in meta.json.
    assert any(p.suffix == ".del" for p in folder.iterdir())
    shutil.copy(committed, folder / "meta.json")
    ki = TantivyIndex.load(folder)
    ki.write([("c3", "valve V-3 was replaced")], ["c5"], 2)
    assert ki.doc_count() == 19 and ki.chunks_with("replac") == ["c3"] and ki.chunks_with("v-5") == []
    ki.close()


def test_switching_the_engine_rebuilds_the_index_from_the_catalogue(store, kb):
    store.update_kb("Docs", keyword_engine="whoosh")
    kb = store.open_kb("Docs")
    _fill(kb)
    assert kb.record.keyword_engine == "whoosh"
    before = Searcher(store).search(["Docs"], "ERR_4503 disk", mode="keyword").hits
    rec = store.update_kb("Docs", keyword_engine="tantivy")
    assert rec.keyword_engine == "tantivy" and rec.public()["keyword_engine_choice"] == "tantivy"
    assert not (store.kb_dir(kb.id) / "keywords").exists()  # the other engine's index is gone
    kb2 = store.open_kb("Docs")
    _, ki = kb2.indexes()
    assert ki.engine == "tantivy" and ki.doc_count() == 6
    after = Searcher(store).search(["Docs"], "ERR_4503 disk", mode="keyword").hits
    assert [h.chunk_id for h in after][:1] == [h.chunk_id for h in before][:1]
    assert after[0].title == "ERR_4503"
    assert doctor(store)["clean"]
    _fill(kb2, 8)  # writes keep going to the engine now chosen
    assert kb2.indexes()[1].doc_count() == 8


def test_a_rebuild_streams_the_catalogue_into_the_engine(store, kb, monkeypatch):
    from localkb.store.tantivy_index import TantivyIndex

    store.update_kb("Docs", keyword_engine="whoosh")
    _fill(store.open_kb("Docs"))
    given = []
    real = TantivyIndex.write

    def spy(self, upserts, deletes, generation):
        given.append(type(upserts).__name__)
        return real(self, upserts, deletes, generation)

    monkeypatch.setattr(TantivyIndex, "write", spy)
    store.update_kb("Docs", keyword_engine="tantivy")
    # Read from the catalogue as the engine indexes it, never all passages in one list first.
    assert given and "list" not in given
    assert store.open_kb("Docs").indexes()[1].doc_count() == 6


def test_the_engine_choice_and_the_remembered_sync_folder_share_the_settings(store, kb, tmp_path):
    from localkb.ingest.sync import SyncRules, remember, remembered

    folder = tmp_path / "notes"
    folder.mkdir()
    remember(kb, SyncRules(folder, ("*.md",), ()))
    store.update_kb("Docs", keyword_engine="tantivy")
    kb2 = store.open_kb("Docs")
    assert remembered(kb2) == SyncRules(folder, ("*.md",), ())
    remember(kb2, SyncRules(folder, (), ("*.tmp",)))
    rec = store.resolve("Docs")
    assert (rec.settings["keyword_engine"], rec.keyword_engine) == ("tantivy", "tantivy")
    assert remembered(kb2) == SyncRules(folder, (), ("*.tmp",))


def test_doctor_finds_and_repairs_a_broken_tantivy_index(store, kb):
    import shutil

    store.update_kb("Docs", keyword_engine="tantivy")
    _fill(store.open_kb("Docs"))
    store.open_kb("Docs").close()
    folder = store.kb_dir(kb.id) / "keywords-tantivy"
    shutil.rmtree(folder)
    # A missing index is built on next use (a note, not a problem); a broken one is a problem.
    report = doctor(store)
    assert any("keyword index is missing" in n for n in report["knowledge_bases"][0]["notes"])
    folder.mkdir()
    (folder / "meta.json").write_text("{not json")
    report = doctor(store)
    assert not report["clean"] and any("keyword index" in p for p in report["knowledge_bases"][0]["problems"])
    repaired = doctor(store, repair=True)
    assert repaired["knowledge_bases"][0]["problems_after_repair"] == []
    assert doctor(store)["knowledge_bases"][0]["keyword_index"]["engine"] == "tantivy"


def test_auto_writes_a_small_knowledge_base_with_tantivy(store, kb):
    # tantivy is Whoosh's equal on search at small sizes and a quarter of its CPU per
    # passage written (RESULTS.md "Which engine, by measurement"), so ``auto`` is tantivy at any size.
    assert kb.record.settings["keyword_engine"] == "auto"
    _fill(kb, 3)
    rec = store.resolve("Docs")
    assert (rec.keyword_engine, rec.public()["keyword_engine_choice"]) == ("tantivy", "auto")
    _, ki = kb.indexes()
    assert ki.engine == "tantivy" and ki.doc_count() == 3
    assert not (store.kb_dir(kb.id) / "keywords").exists()  # no Whoosh index written at all
    assert keyword_engine.built_engine(store.kb_dir(kb.id)) == "tantivy"
    assert doctor(store)["clean"]


def test_an_auto_knowledge_base_on_whoosh_moves_to_tantivy_on_open(settings, tmp_path):
    from localkb.store.kb import Store

    # A knowledge base that ``auto`` wrote with Whoosh before (a small one, under the old rule).
    old = Store(settings)
    old.create_kb("Docs", keyword_engine="whoosh")
    _fill(old.open_kb("Docs"), 4)
    before = Searcher(old).search(["Docs"], "ERR_4502 disk", mode="keyword").hits
    kb_id = old.resolve("Docs").id
    old.catalog.update_settings(kb_id, keyword_engine="auto")
    old.close()

    store = Store(settings)
    try:
        # Before it is opened, doctor says what will happen rather than calling it broken.
        report = doctor(store)["knowledge_bases"][0]
        assert report["problems"] == [] and report["keyword_index"]["engine"] == "whoosh"
        assert any("moves to tantivy" in n for n in report["notes"]), report["notes"]
        after = Searcher(store).search(["Docs"], "ERR_4502 disk", mode="keyword").hits
        assert [h.chunk_id for h in after][:1] == [h.chunk_id for h in before][:1]
        rec = store.resolve("Docs")
        assert (rec.keyword_engine, rec.public()["keyword_engine_choice"]) == ("tantivy", "auto")
        assert store.open_kb("Docs").indexes()[1].doc_count() == 4
        assert not (store.kb_dir(kb_id) / "keywords").exists()  # the Whoosh index is removed
        after_open = doctor(store)["knowledge_bases"][0]
        assert after_open["problems"] == after_open["notes"] == []
        assert after_open["keyword_index"]["engine"] == "tantivy"
    finally:
        store.close()


def test_doctor_repair_moves_an_auto_knowledge_base_off_whoosh(settings):
    from localkb.store.kb import Store

    old = Store(settings)
    old.create_kb("Docs", keyword_engine="whoosh")
    _fill(old.open_kb("Docs"), 2)
    old.catalog.update_settings(old.resolve("Docs").id, keyword_engine="auto")
    old.close()
    store = Store(settings)
    try:
        repaired = doctor(store, repair=True)["knowledge_bases"][0]
        assert repaired["repaired"] and repaired["problems_after_repair"] == []
        assert doctor(store)["knowledge_bases"][0]["keyword_index"]["engine"] == "tantivy"
    finally:
        store.close()


def test_whoosh_keeps_few_segments_over_many_small_writes(tmp_path: Path):
    ki = keyword_engine.create("whoosh", tmp_path / "kw")
    ki.write([(f"big{i}", f"passage {i} about cells") for i in range(300)], [], 1)
    for i in range(40):
        ki.write([(f"note{i}", f"a small note {i}")], [], i + 2)
    # A size tier (a factor of 4 in passages) holds at most MERGE_FACTOR - 1 old segments and the new one.
    import math

    from localkb.store.keywords import MERGE_FACTOR

    sizes = [seg.doc_count_all() for seg in ki.ix._segments()]
    tiers = [int(math.log(n, MERGE_FACTOR)) for n in sizes]
    assert max(tiers.count(t) for t in tiers) <= MERGE_FACTOR, sizes
    assert len(sizes) <= 1 + MERGE_FACTOR * 3  # the big one, and 40 notes span tiers 0-2
    assert ki.doc_count() == 340
    ki.close()


def test_cli_kb_update_switches_and_kb_list_reports_the_engine(tmp_path: Path):
    home = tmp_path / "home"
    note = tmp_path / "n.md"
    note.write_text("# Widgets\n\nThe SKU-88-A widget ships with a two-year warranty.")
    run_cli(["kb", "create", "Docs"], home, check=True)
    run_cli(["add", "Docs", str(note)], home, check=True)
    listed = json.loads(run_cli(["kb", "list", "--json"], home, check=True).stdout)["knowledge_bases"]
    assert (listed[0]["keyword_engine"], listed[0]["keyword_engine_choice"]) == ("tantivy", "auto")
    assert "tantivy (auto)" in run_cli(["kb", "list"], home, check=True).stdout
    out = run_cli(["kb", "update", "Docs", "--keyword-engine", "whoosh"], home, check=True).stdout
    assert "keyword engine whoosh" in out
    listed = json.loads(run_cli(["kb", "list", "--json"], home, check=True).stdout)["knowledge_bases"]
    assert (listed[0]["keyword_engine"], listed[0]["keyword_engine_choice"]) == ("whoosh", "whoosh")
    found = json.loads(run_cli(["search", "Docs", "SKU-88-A", "--json"], home, check=True).stdout)
    assert found["hits"][0]["title"] == "Widgets"
    bad = run_cli(["kb", "update", "Docs", "--keyword-engine", "lucene"], home)
    assert bad.returncode != 0


def test_a_tantivy_index_is_private_whatever_the_umask(tmp_path: Path):
    """tantivy writes its own files (from Rust): they follow the entry points' umask like Whoosh's."""
    from test_file_modes import cli, loose

    home = tmp_path / "home"
    note = tmp_path / "note.md"
    note.write_text("# Note\n\nThe turbine's spare valve is V-12.\n")
    cli(["kb", "create", "Docs", "--keyword-engine", "tantivy"], home)
    cli(["add", "Docs", str(note)], home)
    assert "V-12" in cli(["search", "Docs", "V-12"], home)
    assert list(home.glob("kbs/*/keywords-tantivy/*")) and loose(home) == [], loose(home)


def test_a_search_never_rereads_the_whoosh_table_of_contents(store, kb, monkeypatch):
    """Whoosh's ``Index.doc_count()`` reads and unpickles the index's TOC from disk on every call
    (48 ms p50 at 17,530 SciFact passages under load); the search asks for the passage count
    on every query, so it must come from the open searcher."""
    from whoosh.index import FileIndex

    _fill(kb)
    searcher = Searcher(store)
    assert searcher.search(["Docs"], "ERR_4503 disk", mode="keyword").hits  # opens the index
    reads = []
    real = FileIndex._read_toc
    monkeypatch.setattr(FileIndex, "_read_toc", lambda self: reads.append(1) or real(self))
    for query in ("ERR_4503 disk", "disk full", "replace disk 2"):
        assert searcher.search(["Docs"], query, mode="keyword").hits
    assert reads == []
    _fill(kb, 7)  # a write still shows: the next search counts the new passage
    assert kb.indexes()[1].doc_count() == 7


def _whoosh_of(folder: Path, n: int):
    ki = keyword_engine.create("whoosh", folder)
    ki.write([(f"p{i}", f"passage {i} about cells and growth factor {i * 7} in cohort {i % 97}, "
                        f"assay ERR_{i}") for i in range(n)], [], 1)
    ki.close()
    return keyword_engine.load("whoosh", folder)


def test_opening_and_writing_a_whoosh_index_costs_the_same_at_4x_the_size(tmp_path: Path):
    """A write must cost what it writes, not what the index holds. Whoosh's mmap'd compound
    segments were copied whole into a BytesIO by every reader opened on them (the searcher, and
    a writer's own for its deletions): memory allocated by opening the index and by a one-note
    write grew with the index (2x of it for the write, ~150 MB at 30,000 passages)."""
    import tracemalloc

    peaks = {}
    for n in (1000, 4000):
        ki = _whoosh_of(tmp_path / f"kw{n}", n)
        tracemalloc.start()
        try:
            assert ki.doc_count() == n  # opens the searcher
            opened = tracemalloc.get_traced_memory()[1]
            tracemalloc.reset_peak()
            ki.write([("note", "a small note about cells")], [], 2)
            written = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert ki.doc_count() == n + 1 and ki.chunks_with("note") == ["note"]
        ki.close()
        peaks[n] = (opened, written)
    (open_1k, write_1k), (open_4k, write_4k) = peaks[1000], peaks[4000]
    assert open_4k < 1.5 * open_1k + 100_000, peaks
    assert write_4k < 1.5 * write_1k, peaks


_COLD_SEARCH = r"""
import sys
from localkb.config import Settings
from localkb.retrieval.search import Searcher
from localkb.store.kb import Store
store = Store(Settings.from_env())
res = Searcher(store).search(["Cold"], "widget cable", k=3)
assert res.hits, res
# Whoosh's stopword lists and Porter stemmer (whoosh.lang) are the analyser's, for both engines.
print(" ".join(sorted({m for m in sys.modules if m == "tantivy"
                       or (m.startswith("whoosh.") and not m.startswith("whoosh.lang"))})))
"""


def test_a_tantivy_knowledge_base_opens_and_searches_without_importing_whoosh(tmp_path):
    """Whoosh's index machinery (whoosh.analysis, fields, index: ~12-40 ms of a cold start)
    is imported only by a knowledge base whose keyword index is Whoosh's. A Whoosh index
    written before still opens in a new process (its pickled schema names the tokenizer class)."""
    import subprocess
    import sys

    home = tmp_path / "home"
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.md").write_text("# Widgets\n\nA widget on a cable.")
    env = {"LOCALKB_HOME": str(home), "PATH": "/usr/bin:/bin"}
    for name, engine in (("Cold", "tantivy"), ("Old", "whoosh")):
        run_cli(["kb", "create", name, "--model", "hashing-256", "--keyword-engine", engine], home,
                check=True)
        run_cli(["add", name, str(folder)], home, check=True)
    out = subprocess.run([sys.executable, "-c", _COLD_SEARCH], capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(REPO / "host")}, timeout=120, check=True)
    assert out.stdout.split() == ["tantivy"], out.stdout
    found = run_cli(["search", "Old", "widget cable", "--json"], home, check=True)
    assert json.loads(found.stdout)["hits"], found.stdout
