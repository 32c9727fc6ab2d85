"""Retrieval evals on any folder in BEIR layout, through the real search path.

``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl`` (``_id``,
``text``, optional ``kind``) and ``qrels/test.tsv``. The corpus is indexed into
a throw-away store; each mode ranks documents by their best passage.

Every nDCG@10 comes with a 95 % bootstrap interval over the queries, and each
mode is compared with hybrid query by query (a paired bootstrap of the
differences), so a reader can tell a real difference from the spread of a
few hundred questions.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from localkb.config import Settings
from localkb.errors import InvalidInput
from localkb.ingest.extract import Document, Section
from localkb.ingest.pipeline import ingest_documents
from localkb.retrieval.search import Reranker, Searcher
from localkb.store.base import KnowledgeStore
from localkb.store.kb import Store

CUTS = (1, 3, 5, 10)
#: Bootstrap resamples for the intervals; the seed is fixed so a run prints the same interval twice.
BOOTSTRAP_ROUNDS = 2000


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
    """recall@1/3/5/10, MRR@10 and nDCG@10 (BEIR's definitions) for one query."""
    out = {}
    for cut in CUTS:
        out[f"recall@{cut}"] = len(set(ranked[:cut]) & set(relevant)) / len(relevant)
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
             progress=None, store: KnowledgeStore | None = None) -> dict:
    """Index the corpus into a temporary store and score every mode; returns a dict of figures.

    ``store`` runs the same eval on another store of the seam (the team store on PostgreSQL:
    ``localkb eval PATH --store team``); it must not hold a knowledge base named ``eval``.
    """
    corpus, queries, qrels = load_beir(Path(path))
    if limit_queries:
        queries = dict(list(queries.items())[:limit_queries])
    reranker = Reranker(Path(rerank_model)) if rerank_model else None
    run_modes = [(m, False) for m in modes] + ([("hybrid", True)] if reranker else [])
    given = store
    with tempfile.TemporaryDirectory(prefix="localkb-eval-") as tmp:
        base = settings or Settings.from_env()
        store = given or Store(replace(base, data_dir=Path(tmp)))
        try:
            store.create_kb("eval", model=model)
            kb = store.open_kb("eval")
            t0 = time.perf_counter()
            jobs = [(doc_id, _loader(doc_id, d)) for doc_id, d in corpus.items()]
            if given is None:
                reports = ingest_documents(kb, jobs, captured_by="api", progress=progress,
                                           batch_tokens=262_144)
            else:  # another store of the seam: its writer (ingest.seam), the same passages
                from localkb.ingest.seam import ingest_documents as ingest_through_seam

                reports = ingest_through_seam(kb, jobs, captured_by="api", progress=progress,
                                              batch_tokens=262_144)
            index_s = time.perf_counter() - t0
            failed = [r.name for r in reports if r.status == "failed"]
            sid_to_doc = {r.source_id: r.name for r in reports if r.source_id}
            searcher = Searcher(store, reranker=reranker)
            results: dict = {"dataset": str(path), "model": kb.record.model,
                             "variant": kb.embedder.describe().get("variant"),
                             "documents": len(corpus), "passages": store.counts(kb.id)["chunks"],
                             "store": "local" if given is None else type(given).__name__,
                             "queries": len(queries), "index_seconds": round(index_s, 1),
                             "failed_documents": failed, "modes": {}}
            ndcgs: dict[str, list[float]] = {}
            for mode, rerank in run_modes:
                per_query, latencies = {}, []
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
                    per_query[qid] = metrics(ranked, qrels[qid])
                kinds: dict[str, list] = defaultdict(list)
                for qid, m in per_query.items():
                    kinds[str(queries[qid].get("kind") or "all")].append(m)
                name = mode + ("+rerank" if rerank else "")
                ndcgs[name] = [m["ndcg@10"] for m in per_query.values()]
                results["modes"][name] = {
                    "overall": _mean(list(per_query.values())),
                    "ndcg@10_ci95": list(bootstrap_ci(ndcgs[name])),
                    "by_kind": {kind: _mean(rows) for kind, rows in sorted(kinds.items())}
                    if len(kinds) > 1 else {},
                    "median_ms": round(statistics.median(latencies), 2),
                    "p95_ms": round(sorted(latencies)[int(0.95 * (len(latencies) - 1))], 2),
                }
            results["compare"] = compare(ndcgs)
            return results
        finally:
            if given is None:
                store.close()


def _loader(doc_id: str, d: dict):
    def load() -> tuple[Document, str]:
        title = (d.get("title") or "").strip()
        text = (d.get("text") or "").strip() or title
        return Document(title=title, type="text", sections=[Section(text)]), f"doc:{doc_id}"

    return load


def format_table(res: dict) -> str:
    """The figures as a plain table, one row per mode (and per kind when queries have kinds)."""
    cols = ["recall@1", "recall@3", "recall@5", "recall@10", "mrr@10", "ndcg@10"]
    lines = [f"{res['dataset']}: {res['documents']} documents, {res['passages']} passages, "
             f"{res['queries']} queries; model {res['model']} ({res['variant']}); "
             f"indexed in {res['index_seconds']} s",
             f"{'mode':22} " + " ".join(f"{c:>9}" for c in cols)
             + f" {'ndcg@10 95% CI':>15} {'median ms':>10} {'p95 ms':>8}"]
    for mode, m in res["modes"].items():
        lo, hi = m["ndcg@10_ci95"]
        lines.append(f"{mode:22} " + " ".join(f"{m['overall'][c]:9.3f}" for c in cols)
                     + f" {f'{lo:.3f}-{hi:.3f}':>15} {m['median_ms']:10.2f} {m['p95_ms']:8.2f}")
        for kind, row in m["by_kind"].items():
            lines.append(f"  {kind:20} " + " ".join(f"{row[c]:9.3f}" for c in cols))
    for label, c in res.get("compare", {}).items():
        lo, hi = c["ci95"]
        lines.append(f"{label}: nDCG@10 {c['ndcg@10']:+.3f} (paired 95% CI {lo:+.3f} to {hi:+.3f}; "
                     f"better on {c['better']} queries, worse on {c['worse']})")
    if res["failed_documents"]:
        lines.append(f"{len(res['failed_documents'])} documents could not be indexed: "
                     + ", ".join(res["failed_documents"][:10]))
    return "\n".join(lines)
