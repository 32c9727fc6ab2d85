"""Hybrid retrieval that tells the truth, on the real model and real indexes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from localkb.config import Settings
from localkb.errors import EmbeddingUnavailable, InvalidInput, KnowledgeBaseNotFound
from localkb.ingest.extract import extract_text
from localkb.ingest.pipeline import add_document, ingest_documents
from localkb.retrieval.evaluate import run_eval
from localkb.retrieval.hybrid import rrf, tied_ranks
from localkb.retrieval.search import Searcher, fetch_k, keyword_weight, status_line
from localkb.store import keyword_engine
from localkb.store.analysis import query_terms
from localkb.store.keywords import KeywordHit

CODES = REPO / "evals" / "codes"


@pytest.fixture(params=keyword_engine.ENGINES)
def engine(request) -> str:
    """Every keyword, identifier, absent-term and status test runs on both keyword engines."""
    return request.param


@pytest.fixture
def settings(tmp_path: Path, engine: str) -> Settings:
    import os

    return Settings.from_env({"LOCALKB_HOME": str(tmp_path / "data"),
                              "LOCALKB_MODEL_DIR": os.environ["LOCALKB_MODEL_DIR"],
                              "LOCALKB_KEYWORD_ENGINE": engine})

PAGES = {
    "err4521": ("ERR_4521 disk full",
                "ERR_4521 is raised when the local disk is full. Free space, then retry."),
    "err4512": ("ERR_4512 network", "ERR_4512 is raised when the server cannot be reached. Check the proxy."),
    "v23": ("Release v2.3", "Version v2.3 added offline mode for documents opened recently."),
    "v32": ("Release v3.2", "Version v3.2 removed the legacy sync API."),
    "sku": ("SKU-88-A widget", "The SKU-88-A blue widget has a two-year warranty."),
    "mail": ("Mail relay", "Outgoing e-mail goes through the relay on port 587."),
}


@pytest.fixture
def docs_kb(kb):
    for key, (title, text) in PAGES.items():
        add_document(kb, extract_text(text, title=title), key=f"page:{key}")
    return kb


# Identifier handling, the floor, weaker, empty, unavailable and per-source results are
# tested on both stores of the seam in test_store_seam.py.


def search(store, query, **kw):
    return Searcher(store).search(kw.pop("kbs", ["Docs"]), query, **kw)


def test_query_terms_keep_code_like_terms_whole_and_drop_stopwords():
    terms = query_terms("What does ERR_4521 mean for v2.3, the e-mail and SKU-88-A? le la der die")
    assert "err_4521" in terms and "v2.3" in terms and "e-mail" in terms and "sku-88-a" in terms
    assert not {"what", "the", "le", "la", "der", "die", "err", "4521", "mail", "sku"} & set(terms)
    assert len(query_terms(" ".join(f"word{i}" for i in range(30)))) == 12
    assert query_terms("«ERR_4521»!") == ["err_4521"]


def test_a_code_part_still_finds_the_compound():
    from localkb.store.analysis import index_terms

    assert index_terms("e-mail")[0] == "e-mail" and "mail" in index_terms("e-mail")
    assert index_terms("ERR_4521")[:1] == ("err_4521",)


def test_embedder_failure_degrades_to_keyword_hits_and_is_logged(store, docs_kb, monkeypatch):
    def broken(*_a, **_k):
        raise EmbeddingUnavailable("the embedding model file is missing")

    monkeypatch.setattr(docs_kb.embedder, "embed", broken)
    res = search(store, "SKU-88-A warranty")
    st = res.statuses[0]
    assert st.status == "passages" and st.degraded
    assert "embedder is unavailable" in st.message and "did not run" in st.message
    assert res.hits[0].title == "SKU-88-A widget" and res.hits[0].degraded
    vec = search(store, "SKU-88-A warranty", mode="vector").statuses[0]
    assert vec.status == "unavailable" and "says nothing about what is stored" in vec.message
    assert status_line(vec) == "Docs · unavailable · the search could not run"
    logged, _ = store.catalog.errors(source="rag-retrieval")
    assert logged and logged[0]["code"] == "embedding_unavailable"


def test_unknown_knowledge_base_is_an_error_not_a_status(store, kb):
    with pytest.raises(KnowledgeBaseNotFound):
        search(store, "x", kbs=["Nope"])


def test_fetch_k_and_rrf():
    assert [fetch_k(k) for k in (1, 5, 8, 50, 60)] == [20, 20, 32, 200, 200]
    fused = rrf({"vector": ["a", "b", "c"], "keyword": ["b", "a"]}, 60)
    assert fused["a"] == fused["b"] == pytest.approx((1 / 61 + 1 / 62) / (2 / 61))
    assert fused["c"] == pytest.approx((1 / 63) / (2 / 61))
    assert rrf({"vector": ["x"]})["x"] == 1.0
    # A list at weight w counts w/(60 + rank); the scale stays "first everywhere at full weight".
    weighted = rrf({"vector": ["a", "b"], "keyword": ["b", "a"]}, 60, {"keyword": 0.4})
    assert weighted["a"] == pytest.approx((1 / 61 + 0.4 / 62) / (2 / 61))
    assert weighted["a"] > weighted["b"]
    # Tied members of a list count alike: vector's order decides between them.
    assert tied_ranks(["x", "x", "y", "x", "y"]) == [1, 1, 3, 1, 3]
    tied = rrf({"vector": ["a", "b"], "keyword": ["b", "a", "c"]}, 60, {"keyword": 0.4},
               {"keyword": [1, 1, 3]})
    assert tied["a"] > tied["b"] and tied["c"] == pytest.approx((0.4 / 63) / (2 / 61))


def test_a_word_in_every_passage_barely_counts(tmp_path: Path, engine: str):
    """Lucene's idf: with Whoosh's own (never below ~1) the common word counted 1/5 of the rare one."""
    ki = keyword_engine.create(engine, tmp_path / "kw")
    docs = [(f"c{i}", f"protein note {i} about cells") for i in range(50)]
    docs.append(("rare", "protein note about zebrafish"))
    ki.write(docs, [], 1)
    hits = {h.chunk_id: h.bm25 for h in ki.search(["protein", "zebrafish"], 60)}
    assert len(hits) == 51
    assert hits["rare"] > 50 * max(b for c, b in hits.items() if c != "rare")
    ki.close()


def test_keyword_weight_follows_the_best_hits_share_of_the_query():
    def hit(n):
        return KeywordHit("c", 1.0, frozenset(f"t{i}" for i in range(n)))

    assert keyword_weight([hit(1), hit(3)], 6) == 1.0  # half the terms: a real keyword match
    assert keyword_weight([hit(1), hit(2)], 12) == 1.0  # two shared words rank by co-occurrence
    assert keyword_weight([hit(1)], 5) == pytest.approx(0.4)  # one shared word of five
    assert keyword_weight([hit(1)], 2) == 1.0  # one of two is half the question
    assert keyword_weight([], 5) == 1.0 and keyword_weight([hit(1)], 0) == 1.0


def test_one_shared_word_does_not_outvote_a_clear_vector_match(store, kb):
    """q18 of the code-heavy set: 'release' is in every release note's title.

    The keyword list holds only that one word of five, ordered by page length; at full
    weight its rank 2 beat the vector side's clear first (cosine 0.60 against 0.41).
    """
    notes = {
        "v2.3.1": "v2.3.1 is a hotfix for a crash on startup on machines with more than one monitor.",
        "v3.2": "Version v3.2 removed the legacy sync API. Integrations must move to the events API "
                "before upgrading.",
        "v3.3": "Version v3.3 introduced dark mode and keyboard shortcuts for the editor.",
    }
    for version, text in notes.items():
        add_document(kb, extract_text(text, title=f"Release notes {version}"), key=f"notes:{version}")
    res = search(store, "which release dropped the old synchronisation interface")
    assert res.hits[0].title == "Release notes v3.2", [(h.title, h.score, h.lists) for h in res.hits]
    # "release" is in every one of these pages: sharing it is no evidence, so the list has no
    # vote here (among many other pages it would count 2 x 1/5 = 0.4).
    assert res.trace["kbs"][kb.id]["weights"]["keyword"] == 0.0


def _bulk(kb, n: int, topic: str):
    def item(i):
        text = (f"{topic} note {i}: the {topic} team reviewed item {i} on floor {i % 9} "
                f"and filed report {i * 7} about scheduling, budgets and meeting rooms.")
        return (f"{topic}{i}", lambda t=text, i=i: (extract_text(t, title=f"{topic} {i}"), f"{topic}:{i}"))

    ingest_documents(kb, [item(i) for i in range(n)], captured_by="api", batch_tokens=131_072)


def test_small_kb_is_not_crowded_out_by_a_big_one(store):
    store.create_kb("Big")
    store.create_kb("Small")
    _bulk(store.open_kb("Big"), 3000, "operations")
    small = store.open_kb("Small")
    _bulk(small, 59, "garden")
    add_document(small, extract_text("The greenhouse sprinklers run at 06:00 and 19:00 every day; "
                                     "in July they also run at noon.", title="Greenhouse watering"),
                 key="garden:water")
    assert store.catalog.counts(small.id)["chunks"] == 60
    res = Searcher(store).search(["Big", "Small"], "when do the greenhouse sprinklers run?", k=5)
    assert res.hits[0].kb_name == "Small" and res.hits[0].title == "Greenhouse watering"
    by_kb = {s.kb_name: s for s in res.statuses}
    assert by_kb["Small"].status == "passages"
    assert {h.kb_name for h in res.hits} <= {"Big", "Small"}


def test_per_source_names_pages_not_passages(store, kb):
    """A long page whose every paragraph matches must not fill the whole result."""
    paragraphs = [f"Section {i}. The greenhouse sprinklers in bed {i} run at dawn and dusk; "
                  f"valve {i} is checked every Monday and the filter is rinsed monthly. "
                  f"Bed {i} grows tomatoes, basil and peppers along the south wall."
                  for i in range(8)]
    add_document(kb, extract_text("\n\n".join(paragraphs), title="Greenhouse manual"), key="long")
    add_document(kb, extract_text("Sprinklers in the orchard run every second night in summer.",
                                  title="Orchard sprinklers"), key="short")
    assert store.catalog.counts(kb.id)["chunks"] >= 6
    plain = search(store, "when do the greenhouse sprinklers run", k=5, floor=False)
    assert [h.title for h in plain.hits] == ["Greenhouse manual"] * 5
    res = search(store, "when do the greenhouse sprinklers run", k=5, floor=False, per_source=1)
    assert [h.title for h in res.hits] == ["Greenhouse manual", "Orchard sprinklers"]
    assert res.hits[0].chunk_id == plain.hits[0].chunk_id  # the page's best passage stands for it
    two = search(store, "when do the greenhouse sprinklers run", k=5, floor=False, per_source=2)
    assert [h.title for h in two.hits].count("Greenhouse manual") == 2
    with pytest.raises(InvalidInput):
        search(store, "sprinklers", per_source=0)


def test_cli_explain_draws_the_cutoff(tmp_path, engine: str):
    home = tmp_path / "home"
    note = tmp_path / "n.md"
    note.write_text("# Widgets\n\nThe SKU-88-A widget ships with a two-year warranty.")
    run_cli(["kb", "create", "Docs", "--keyword-engine", engine], home, check=True)
    run_cli(["add", "Docs", str(note)], home, check=True)
    out = run_cli(["search", "Docs", "SKU-88-A warranty", "--explain"], home).stdout
    assert "Docs · 1 passage" in out
    assert "cut-off 0.35" in out and "─" in out and "vector+keyword" in out
    assert "lists (Docs): vector 1 at weight 1, keyword 1 at weight 1, exact 1 at weight 1" in out
    assert "exact terms (Docs): SKU-88-A whole" in out
    note2 = tmp_path / "n2.md"
    note2.write_text("# Widgets, part two\n\nThe SKU-88-A widget's warranty covers the hinge.")
    run_cli(["add", "Docs", str(note2)], home, check=True)
    both = run_cli(["search", "Docs", "SKU-88-A warranty", "--per-source", "1", "--json"], home).stdout
    hits = json.loads(both)["hits"]
    assert len(hits) == 2 and len({h["source_id"] for h in hits}) == 2


def test_code_heavy_eval_meets_its_floor(engine: str):
    res = run_eval(CODES, keyword_engine=engine)
    assert res["keyword_engine"] == engine
    hybrid = res["modes"]["hybrid"]
    # Measured 27 of 28 (0.964). The one miss, q26 ("recover a file I deleted two months
    # ago" -> the nightly-backup page), shares no word with its answer and MiniLM puts it
    # third (cosine 0.18): no fusion can fix that, only a better model.
    assert hybrid["overall"]["recall@1"] >= 0.95, hybrid
    assert hybrid["by_kind"]["exact"]["recall@1"] == 1.0, hybrid
    assert res["failed_documents"] == []
    # Query by query, hybrid beats the sentence model alone beyond the spread of 28 questions
    # (measured +0.079, paired interval +0.018 to +0.153).
    assert res["compare"]["hybrid - vector"]["ci95"][0] > 0, res["compare"]


def test_hashing_canary_keeps_the_keyword_path_honest(engine: str):
    res = run_eval(CODES, model="hashing-256", modes=("keyword", "hybrid"), keyword_engine=engine)
    assert res["modes"]["keyword"]["by_kind"]["exact"]["recall@1"] == 1.0
    assert res["modes"]["hybrid"]["by_kind"]["exact"]["recall@1"] == 1.0


def test_eval_reads_any_beir_folder(tmp_path: Path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text(
        '{"_id": "a", "title": "Cats", "text": "Cats purr when content."}\n'
        '{"_id": "b", "title": "Dogs", "text": "Dogs bark at strangers."}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "1", "text": "why do cats purr"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\ta\t1\n")
    res = run_eval(tmp_path, modes=("vector",))
    assert res["modes"]["vector"]["overall"]["recall@1"] == 1.0
    assert res["queries"] == 1 and res["documents"] == 2


def test_eval_reports_capped_recall_and_the_recall_ceiling_of_queries_with_several_judged_pages():
    """BEIR's recall@1 of a query with two judged pages is at most 0.5, so a perfect ranking
    does not score 1; the eval also reports BEIR's capped recall (R_cap@k: hits over
    min(k, judged)) and, per kind, the best recall@1 the set allows."""
    from localkb.retrieval.evaluate import format_table, metrics

    m = metrics(["a", "x"], {"a": 1, "b": 1})
    assert m["recall@1"] == 0.5 and m["r_cap@1"] == 1.0
    assert metrics(["x", "a"], {"a": 1, "b": 1})["r_cap@1"] == 0.0
    assert metrics(["a"], {"a": 1})["r_cap@1"] == metrics(["a"], {"a": 1})["recall@1"] == 1.0
    res = run_eval(CODES, model="hashing-256", modes=("keyword",))
    assert res["recall@1_ceiling"]["overall"] == 1.0  # one judged page per question
    assert res["modes"]["keyword"]["overall"]["r_cap@1"] >= res["modes"]["keyword"]["overall"]["recall@1"]
    table = format_table(res)
    assert "r_cap@1" in table.splitlines()[1] and "recall@1 at best" in table


def test_eval_intervals_tell_a_real_difference_from_spread():
    from localkb.retrieval.evaluate import bootstrap_ci, compare

    assert bootstrap_ci([0.5] * 50) == (0.5, 0.5)
    spread = [1.0, 0.0] * 50
    lo, hi = bootstrap_ci(spread)
    assert lo < 0.5 < hi and hi - lo > 0.1
    assert bootstrap_ci(spread) == (lo, hi)  # fixed seed: the same interval every run
    # Two modes that both swing between 0 and 0.8, one always 0.1 better: apart, their
    # intervals overlap; paired query by query, the difference is certain.
    a = [i % 2 * 0.8 for i in range(100)]
    b = [x + 0.1 for x in a]
    assert bootstrap_ci(a)[1] > bootstrap_ci(b)[0]
    c = compare({"hybrid": b, "vector": a, "hybrid+rerank": a})
    assert c["hybrid - vector"] == {"ndcg@10": 0.1, "ci95": [0.1, 0.1], "better": 100, "worse": 0}
    assert c["hybrid+rerank - hybrid"]["ndcg@10"] == -0.1 and c["hybrid+rerank - hybrid"]["worse"] == 100


def test_an_index_that_cannot_be_opened_or_rebuilt_is_unavailable(settings, store, docs_kb):
    import shutil

    from localkb.store.kb import Store

    folder = store.kb_dir(docs_kb.id)
    store.close()
    shutil.rmtree(folder)
    folder.write_text("a file where the index folder should be")
    fresh = Store(settings)
    res = Searcher(fresh).search(["Docs"], "ERR_4521")
    st = res.statuses[0]
    assert st.status == "unavailable" and st.error["code"] == "index_unavailable"
    assert "says nothing about what is stored" in st.message
    assert fresh.catalog.counts(docs_kb.id)["chunks"] == len(PAGES)  # the catalogue is intact
    fresh.close()


def _length_scorer(folder: Path) -> Path:
    """A real ONNX "cross-encoder" whose score is the passage's token count (segment B).

    No cross-encoder model ships on PyPI here, so the hook is proven with a graph whose
    ranking is known in advance; the eval reports rerank figures when a real model is given.
    """
    import shutil

    import onnx
    from onnx import TensorProto, helper

    from localkb.embedding.files import tokenizer_path

    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"])
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 1])
    nodes = [helper.make_node("Mul", ["token_type_ids", "attention_mask"], ["seg"]),
             helper.make_node("Cast", ["seg"], ["segf"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["segf", "axes"], ["logits"], keepdims=1)]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(nodes, "length", inputs, [out], initializer=[axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "scorer.onnx"
    onnx.save_model(model, str(path))
    shutil.copy(tokenizer_path(), folder / "tokenizer.json")
    return path


def test_rerank_hook_reorders_the_top_by_the_cross_encoder(store, docs_kb, tmp_path):
    from localkb.retrieval.search import Reranker

    reranker = Reranker(_length_scorer(tmp_path))
    plain = Searcher(store).search(["Docs"], "release version", k=6, floor=False)
    reranked = Searcher(store, reranker=reranker).search(["Docs"], "release version", k=6,
                                                         floor=False, rerank=True)
    scores = [h.rerank_score for h in reranked.hits]
    assert all(s is not None for s in scores) and scores == sorted(scores, reverse=True)
    longest = max(plain.hits, key=lambda h: len(docs_kb.embedder.tokenizer.encode(h.text).ids))
    assert reranked.hits[0].chunk_id == longest.chunk_id
    assert "rerank_ms" in next(iter(reranked.trace["kbs"].values()))
    with pytest.raises(Exception, match="rerank needs"):
        Searcher(store).search(["Docs"], "x", rerank=True)
