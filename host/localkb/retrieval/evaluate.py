r"""Retrieval evals on any folder in BEIR layout, through the real search path.

``corpus.jsonl`` (``_id``, ``title``, ``text``; optional ``html``: the page itself, then
indexed through the HTML extractor as a saved page would be), ``queries.jsonl`` (``_id``,
``text``, optional ``kind``) and ``qrels/test.tsv``. The corpus is indexed into a
throw-away store; each mode ranks documents by their best passage.

Queries of ``kind: absent`` have no judgements: they name something no document holds,
and the right answer is "no passage mentions it". For them the eval counts, per mode,
how many were wrongly reported as passages above the floor (the product's own search,
floor on). ``baseline="bm25"`` adds plain BM25 over whole pages (rank_bm25's Okapi,
``\w+`` tokens, lower case) as the simplest competitor, scored on the same queries.

Every nDCG@10 comes with a 95 % bootstrap interval over the queries, and each
mode is compared with hybrid query by query (a paired bootstrap of the
differences), so a reader can tell a real difference from the spread of a
few hundred questions.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from localkb.config import Settings
from localkb.errors import InvalidInput
from localkb.ingest.extract import Document, Section, extract_html
from localkb.ingest.pipeline import ingest_documents
from localkb.retrieval.search import Reranker, Searcher
from localkb.store.base import KnowledgeStore
from localkb.store.kb import Store

CUTS = (1, 3, 5, 10)
#: Bootstrap resamples for the intervals; the seed is fixed so a run prints the same interval twice.
BOOTSTRAP_ROUNDS = 2000


ABSENT = "absent"
BASELINES = ("bm25",)


def load_absent(path: Path) -> dict:
    """The ``kind: absent`` queries of a BEIR folder (they have no judgements)."""
    out = {}
    with open(Path(path) / "queries.jsonl", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                q = json.loads(line)
                if q.get("kind") == ABSENT:
                    out[str(q["_id"])] = q
    return out


def load_beir(path: Path, split: str = "test") -> tuple[dict, dict, dict]:
    """(corpus, queries, qrels) of a BEIR folder; queries limited to those with judgements."""
    path = Path(path)
    try:
        corpus = {}
        with open(path / "corpus.jsonl", encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    d = json.loads(line)
                    corpus[str(d["_id"])] = d
        qrels: dict[str, dict[str, int]] = defaultdict(dict)
        with open(path / "qrels" / f"{split}.tsv", encoding="utf-8") as fh:
            for n, line in enumerate(fh):
                parts = line.rstrip("\n").split("\t")
                if n == 0 and not parts[-1].lstrip("-").isdigit():
                    continue
                if len(parts) >= 3 and int(parts[2]) > 0:
                    qrels[parts[0]][parts[1]] = int(parts[2])
        queries = {}
        with open(path / "queries.jsonl", encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    q = json.loads(line)
                    if str(q["_id"]) in qrels:
                        queries[str(q["_id"])] = q
    except (OSError, ValueError, KeyError) as err:
        raise InvalidInput(f"{path} is not a readable BEIR folder: {err}") from err
    return corpus, queries, dict(qrels)


def metrics(ranked: Sequence[str], relevant: dict[str, int]) -> dict[str, float]:
    """recall@1/3/5/10, R_cap@1, MRR@10 and nDCG@10 (BEIR's definitions) for one query.

    recall@k is the judged pages in the top k over all judged pages, so a query with two
    judged pages scores at most 0.5 at k=1 however good the ranking; BEIR's capped recall
    divides by min(k, judged) instead (R_cap@1: whether the first page is a judged one).
    """
    out = {}
    for cut in CUTS:
        out[f"recall@{cut}"] = len(set(ranked[:cut]) & set(relevant)) / len(relevant)
    out["r_cap@1"] = float(bool(ranked[:1]) and ranked[0] in relevant)
    rr = next((1.0 / (i + 1) for i, d in enumerate(ranked[:10]) if d in relevant), 0.0)
    out["mrr@10"] = rr
    dcg = sum(relevant.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(relevant.values(), reverse=True)[:10]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    out["ndcg@10"] = dcg / idcg if idcg else 0.0
    return out


def bootstrap_ci(values: Sequence[float], *, rounds: int = BOOTSTRAP_ROUNDS,
                 seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the mean of ``values`` (one per query).

    For a paired comparison pass the per-query differences. Resamples in blocks so a
    large query set does not need a rounds-by-queries array of indices at once.
    """
    import numpy as np

    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return (0.0, 0.0)
    if v.size == 1:
        return (float(v[0]), float(v[0]))
    rng = np.random.default_rng(seed)
    means = np.empty(rounds)
    block = max(1, 1_000_000 // v.size)
    for start in range(0, rounds, block):
        n = min(block, rounds - start)
        means[start : start + n] = v[rng.integers(0, v.size, size=(n, v.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return (round(float(lo), 4), round(float(hi), 4))


def compare(per_mode: dict[str, list[float]], base: str = "hybrid") -> dict[str, dict]:
    """Each mode against ``base`` (and reranking against hybrid): mean nDCG@10 difference, paired interval."""
    if base not in per_mode:
        return {}
    out: dict[str, dict] = {}
    for name, vals in per_mode.items():
        if name == base:
            continue
        # Reranking is measured as what it adds to hybrid; the single lists as what hybrid adds to them.
        rerank = name.endswith("+rerank")
        new, old = (vals, per_mode[base]) if rerank else (per_mode[base], vals)
        label = f"{name} - {base}" if rerank else f"{base} - {name}"
        diffs = [x - y for x, y in zip(new, old, strict=True)]
        out[label] = {"ndcg@10": round(sum(diffs) / len(diffs), 4), "ci95": list(bootstrap_ci(diffs)),
                      "better": sum(d > 0 for d in diffs), "worse": sum(d < 0 for d in diffs)}
    return out


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(sum(r[k] for r in rows) / len(rows), 4) for k in rows[0]} if rows else {}


def run_eval(path: str | Path, *, modes: Sequence[str] = ("vector", "keyword", "hybrid"),
             model: str | None = None, k: int = 10, rerank_model: str | None = None,
             limit_queries: int | None = None, settings: Settings | None = None,
             keyword_engine: str | Sequence[str] | None = None, baseline: str | None = None,
             split: str = "test", index_dir: Path | None = None, progress=None,
             per_query: bool = False, store: KnowledgeStore | None = None) -> dict:
    """Index the corpus into a temporary store and score every mode; returns a dict of figures.

    ``index_dir`` keeps the store there instead: a later run on the same folder scores the
    index already built (a bench on a large corpus pays for indexing once). ``per_query``
    adds each mode's nDCG@10 per query, in query order (for paired comparisons across runs).

    Several keyword engines (``keyword_engine=["whoosh", "tantivy"]``) are scored on the
    same passages and vectors: after the first, the knowledge base is switched (its keyword
    index rebuilt from the catalogue) and the keyword-using modes run again, named
    ``mode[engine]`` and compared with the first engine's hybrid query by query.
    ``store`` runs the same eval on another store of the seam (the team store on PostgreSQL:
    ``localkb eval PATH --store team``); it must not hold a knowledge base named ``eval``.
    """
    if baseline is not None and baseline not in BASELINES:
        raise InvalidInput(f"baseline must be one of {', '.join(BASELINES)}")
    if store is not None and index_dir is not None:
        raise InvalidInput("index_dir keeps a local index; it does not go with another store")
    engines = [keyword_engine] if isinstance(keyword_engine, str) or keyword_engine is None \
        else list(keyword_engine)
    if store is not None and engines != [None]:
        raise InvalidInput("--keyword-engine chooses a local engine; the team store searches with "
                           "PostgreSQL's full-text search")
    corpus, queries, qrels = load_beir(Path(path), split)
    absent = load_absent(Path(path))
    if limit_queries:
        queries = dict(list(queries.items())[:limit_queries])
    reranker = Reranker(Path(rerank_model)) if rerank_model else None
    run_modes = [(m, False) for m in modes] + ([("hybrid", True)] if reranker else [])
    given = store
    with tempfile.TemporaryDirectory(prefix="localkb-eval-") as tmp:
        base = settings or Settings.from_env()
        store = given or Store(replace(base, data_dir=Path(index_dir or tmp)))
        try:
            pages: dict[str, str] = {}  # each document's whole text, for the baseline
            jobs = [(doc_id, _loader(doc_id, d, pages)) for doc_id, d in corpus.items()]
            t0 = time.perf_counter()
            if given is None and any(r.name == "eval" for r in store.kbs()):
                # A kept index (index_dir): scored as it was built; only the baseline's page
                # texts are extracted again.
                kb = store.open_kb("eval")
                sid_to_doc = {row[0]: row[1].removeprefix("doc:") for row in store.catalog.db.execute(
                    "SELECT id, key FROM sources WHERE kb_id = ?", (kb.id,))}
                failed = sorted(set(corpus) - set(sid_to_doc.values()))
                if engines[0] is not None:
                    store.update_kb(kb.id, keyword_engine=engines[0])
                if baseline:
                    for _, load in jobs:
                        load()
            else:
                if given is None:
                    store.create_kb("eval", model=model, keyword_engine=engines[0])
                else:
                    store.create_kb("eval", model=model)
                kb = store.open_kb("eval")
                # Either store of the seam: the one pipeline, the same passages.
                reports = ingest_documents(kb, jobs, captured_by="api", progress=progress,
                                           batch_tokens=262_144)
                failed = [r.name for r in reports if r.status == "failed"]
                sid_to_doc = {r.source_id: r.name for r in reports if r.source_id}
            index_s = time.perf_counter() - t0
            searcher = Searcher(store, reranker=reranker)
            results: dict = {"dataset": str(path), "model": kb.record.model,
                             "variant": kb.embedder.describe().get("variant"),
                             "documents": len(corpus), "passages": store.counts(kb.id)["chunks"],
                             "store": "local" if given is None else type(given).__name__,
                             "queries": len(queries), "absent_queries": len(absent),
                             "split": split, "index_seconds": round(index_s, 1),
                             "failed_documents": failed, "modes": {},
                             "keyword_engine": store.resolve(kb.id).keyword_engine,
                             "keyword_engines": [store.resolve(kb.id).keyword_engine, *engines[1:]]}
            ndcgs: dict[str, list[float]] = {}
            if baseline == "bm25":
                ranked_by = bm25_pages(pages)
                scored = {qid: metrics(ranked_by(q["text"])[:k], qrels[qid])
                          for qid, q in queries.items()}
                ndcgs["bm25"] = [m["ndcg@10"] for m in scored.values()]
                results["modes"]["bm25"] = _summary(scored, queries, ndcgs["bm25"], [])
                results["modes"]["bm25"]["absent_reported"] = sum(
                    bool(ranked_by(q["text"])) for q in absent.values())
            passes = [(m, r, m + ("+rerank" if r else "")) for m, r in run_modes]
            for e in engines[1:]:
                passes.append((e, None, None))  # switch the engine, then its keyword modes
                passes += [(m, r, f"{m}{'+rerank' if r else ''}[{e}]") for m, r in run_modes
                           if m != "vector"]
            for mode, rerank, name in passes:
                if name is None:
                    store.update_kb(kb.id, keyword_engine=mode)
                    continue
                scored, latencies = {}, []
                for qid, q in queries.items():
                    t1 = time.perf_counter()
                    # The metrics rank documents, so the search is asked for documents: the
                    # best passage of each of the top k sources, from the lists a k-result
                    # search fetches (fetch_k(k) each).
                    res = searcher.search([kb.id], q["text"], k=k, mode=mode, rerank=rerank,
                                          floor=False, per_source=1)
                    latencies.append((time.perf_counter() - t1) * 1000)
                    ranked: list[str] = []
                    for h in res.hits:
                        doc = sid_to_doc.get(h.source_id)
                        if doc and doc not in ranked:
                            ranked.append(doc)
                    scored[qid] = metrics(ranked, qrels[qid])
                ndcgs[name] = [m["ndcg@10"] for m in scored.values()]
                results["modes"][name] = _summary(scored, queries, ndcgs[name], latencies)
                if absent:
                    # The product's own search, floor on: does it say "no passage mentions"?
                    wrong = []
                    for qid, q in absent.items():
                        res = searcher.search([kb.id], q["text"], k=k, mode=mode, rerank=rerank)
                        if any(st.status == "passages" for st in res.statuses):
                            wrong.append(qid)
                    results["modes"][name]["absent_reported"] = len(wrong)
                    results["modes"][name]["absent_wrong"] = wrong
            # The best recall@1 the judgements allow (1/judged pages per query), per kind.
            results["recall@1_ceiling"] = _ceiling(queries, qrels)
            results["compare"] = compare(ndcgs)
            if per_query:
                results["per_query_ndcg"] = ndcgs
            if "bm25" in ndcgs:
                results["compare"].update(compare_baseline(ndcgs))
            return results
        finally:
            if given is None:
                store.close()


def _ceiling(queries: dict, qrels: dict) -> dict[str, float]:
    """The mean of min(1, 1/judged pages): recall@1 of a ranking whose first page is always judged."""
    best = {qid: min(1.0, 1 / len(qrels[qid])) for qid in queries}
    kinds: dict[str, list[float]] = defaultdict(list)
    for qid, b in best.items():
        kinds[str(queries[qid].get("kind") or "all")].append(b)
    out = {"overall": round(sum(best.values()) / max(1, len(best)), 4)}
    if len(kinds) > 1:
        out.update({k: round(sum(v) / len(v), 4) for k, v in sorted(kinds.items())})
    return out


def _summary(per_query: dict, queries: dict, ndcg: list[float], latencies: list[float]) -> dict:
    kinds: dict[str, dict] = defaultdict(dict)
    for qid, m in per_query.items():
        kinds[str(queries[qid].get("kind") or "all")][qid] = m
    out = {
        "overall": _mean(list(per_query.values())),
        "ndcg@10_ci95": list(bootstrap_ci(ndcg)),
        "by_kind": {kind: {**_mean(list(rows.values())),
                           "ndcg@10_ci95": list(bootstrap_ci([m["ndcg@10"] for m in rows.values()])),
                           "queries": len(rows)}
                    for kind, rows in sorted(kinds.items())} if len(kinds) > 1 else {},
    }
    if latencies:
        out["median_ms"] = round(statistics.median(latencies), 2)
        out["p95_ms"] = round(sorted(latencies)[int(0.95 * (len(latencies) - 1))], 2)
    return out


def compare_baseline(per_mode: dict[str, list[float]], base: str = "bm25") -> dict[str, dict]:
    """Each mode against the baseline, query by query: mean nDCG@10 difference, paired interval."""
    out = {}
    for name, vals in per_mode.items():
        if name == base:
            continue
        diffs = [x - y for x, y in zip(vals, per_mode[base], strict=True)]
        out[f"{name} - {base}"] = {"ndcg@10": round(sum(diffs) / len(diffs), 4),
                                   "ci95": list(bootstrap_ci(diffs)),
                                   "better": sum(d > 0 for d in diffs),
                                   "worse": sum(d < 0 for d in diffs)}
    return out


_WORD = re.compile(r"\w+")


def bm25_pages(pages: dict[str, str]):
    """Plain BM25 (rank_bm25's Okapi, defaults) over whole pages, ``\\w+`` tokens in lower case.

    Returns ``rank(query) -> [doc ids]``, best first, only documents scoring above zero.
    """
    try:
        from rank_bm25 import BM25Okapi
    except ImportError as err:
        raise InvalidInput("the bm25 baseline needs rank-bm25 (pip install rank-bm25)") from err
    ids = list(pages)
    bm25 = BM25Okapi([_WORD.findall(pages[i].lower()) for i in ids])

    def rank(query: str) -> list[str]:
        scores = bm25.get_scores(_WORD.findall(query.lower()))
        order = sorted(range(len(ids)), key=lambda n: scores[n], reverse=True)
        return [ids[n] for n in order if scores[n] > 0]

    return rank


def _loader(doc_id: str, d: dict, pages: dict[str, str]):
    def load() -> tuple[Document, str]:
        if d.get("html"):
            doc = extract_html(d["html"])  # the extractor finds the title, as for a saved page
            doc.file_name = doc_id
        else:
            title = (d.get("title") or "").strip()
            text = (d.get("text") or "").strip() or title
            doc = Document(title=title, type="text", sections=[Section(text)])
        pages[doc_id] = f"{doc.title}\n{doc.text}"
        return doc, f"doc:{doc_id}"

    return load


def format_table(res: dict) -> str:
    """The figures as a plain table, one row per mode (and per kind when queries have kinds)."""
    cols = ["recall@1", "r_cap@1", "recall@3", "recall@5", "recall@10", "mrr@10", "ndcg@10"]
    split = "" if res.get("split", "test") == "test" else f" ({res['split']} split)"
    absent = res.get("absent_queries", 0)
    lines = [f"{res['dataset']}{split}: {res['documents']} documents, {res['passages']} passages, "
             f"{res['queries']} queries" + (f" + {absent} absent" if absent else "")
             + f"; model {res['model']} ({res['variant']}); keyword engine {res.get('keyword_engine')}; "
             f"indexed in {res['index_seconds']} s",
             f"{'mode':22} " + " ".join(f"{c:>9}" for c in cols)
             + f" {'ndcg@10 95% CI':>15} {'median ms':>10} {'p95 ms':>8}"
             + (f" {'absent reported':>16}" if absent else "")]
    for mode, m in res["modes"].items():
        lo, hi = m["ndcg@10_ci95"]
        label = "bm25 (whole pages)" if mode == "bm25" else mode
        ms = (f"{m['median_ms']:10.2f} {m['p95_ms']:8.2f}" if "median_ms" in m
              else f"{'-':>10} {'-':>8}")
        wrong = (f" {m['absent_reported']:>10} of {absent:<3}" if absent and "absent_reported" in m
                 else "")
        lines.append(f"{label:22} " + " ".join(f"{m['overall'][c]:9.3f}" for c in cols)
                     + f" {f'{lo:.3f}-{hi:.3f}':>15} {ms}{wrong}")
        for kind, row in m["by_kind"].items():
            klo, khi = row.get("ndcg@10_ci95", (0.0, 0.0))
            lines.append(f"  {kind + ' (' + str(row.get('queries', '?')) + ')':20} "
                         + " ".join(f"{row[c]:9.3f}" for c in cols) + f" {f'{klo:.3f}-{khi:.3f}':>15}")
    for label, c in res.get("compare", {}).items():
        lo, hi = c["ci95"]
        lines.append(f"{label}: nDCG@10 {c['ndcg@10']:+.3f} (paired 95% CI {lo:+.3f} to {hi:+.3f}; "
                     f"better on {c['better']} queries, worse on {c['worse']})")
    if res.get("recall@1_ceiling"):
        lines.append("recall@1 at best (a judged page first for every query; r_cap@1 counts that as 1): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in res["recall@1_ceiling"].items()))
    for mode, m in res["modes"].items():
        if m.get("absent_wrong"):
            lines.append(f"{mode}: absent queries reported as passages: "
                         + ", ".join(m["absent_wrong"][:10]))
    if res["failed_documents"]:
        lines.append(f"{len(res['failed_documents'])} documents could not be indexed: "
                     + ", ".join(res["failed_documents"][:10]))
    return "\n".join(lines)
