"""SciFact nDCG@10 of every MiniLM variant, and of mixed pairs (queries by A, documents by B).

    python bench/variants_scifact.py [--threads 2] [--out DIR] [--with-st]

Decides whether the variants may share one model id: a variant is interchangeable
with built-fp32 when its nDCG@10 is within 0.005 of fp32's and no mixed pair that
involves it falls more than 0.005 below fp32's. Documents are title + " " + text,
truncated at 256 tokens; the 300 test queries of qrels/test.tsv; exact cosine search
with numpy; nDCG@10 as BEIR computes it (pytrec_eval's ndcg_cut_10, linear gains,
a document whose id equals the query id ignored). Takes minutes at 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "datasets" / "beir-scifact"

sys.path.insert(0, str(REPO / "host"))
from localkb import modelbuild as mb  # noqa: E402

TOLERANCE = 0.005
ST = "sentence-transformers-fp32"


def load_scifact() -> tuple[list[str], list[str], list[str], list[str], dict[str, dict[str, int]]]:
    """(doc ids, doc texts, query ids, query texts, qrels) of the SciFact test split."""
    doc_ids, docs = [], []
    with open(SCIFACT / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            doc_ids.append(str(row["_id"]))
            docs.append((row.get("title", "") + " " + row["text"]).strip())
    qrels: dict[str, dict[str, int]] = {}
    with open(SCIFACT / "qrels" / "test.tsv", encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    query_text = {}
    with open(SCIFACT / "queries.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            query_text[str(row["_id"])] = row["text"]
    query_ids = [qid for qid in qrels if qid in query_text]
    return doc_ids, docs, query_ids, [query_text[q] for q in query_ids], qrels


def ndcg_at_10(queries: np.ndarray, docs: np.ndarray, query_ids: list[str],
               doc_ids: list[str], qrels: dict[str, dict[str, int]]) -> float:
    """Mean nDCG@10 over the queries (BEIR / trec_eval definition)."""
    scores = queries @ docs.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :11]
    total = 0.0
    for row, qid in enumerate(query_ids):
        ranked = [doc_ids[j] for j in top[row] if doc_ids[j] != qid][:10]
        rels = qrels[qid]
        dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked))
        ideal = sorted(rels.values(), reverse=True)[:10]
        idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
        total += dcg / idcg if idcg > 0 else 0.0
    return total / len(query_ids)


def embed_st(texts: list[str], threads: int) -> np.ndarray:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(mb.weights_dir()), device="cpu")
    model.max_seq_length = mb.MAX_TOKENS
    return np.asarray(model.encode(texts, batch_size=32, normalize_embeddings=True),
                      dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the built models (default: a temporary one)")
    parser.add_argument("--with-st", action="store_true",
                        help="also embed with sentence-transformers fp32 (torch)")
    args = parser.parse_args()
    if not (SCIFACT / "corpus.jsonl").is_file():
        raise SystemExit(f"SciFact not found at {SCIFACT}")

    doc_ids, docs, query_ids, queries, qrels = load_scifact()
    tok = mb.load_tokenizer()
    doc_vecs: dict[str, np.ndarray] = {}
    query_vecs: dict[str, np.ndarray] = {}
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="localkb-scifact-") as tmp:
        out = args.out or Path(tmp) / "minilm-built"
        mb.build(out)
        for name, path in mb.variant_paths(out).items():
            session = mb.open_session(path, args.threads)
            start = time.perf_counter()
            doc_vecs[name] = mb.embed_with(session, tok, docs)
            query_vecs[name] = mb.embed_with(session, tok, queries)
            seconds[name] = time.perf_counter() - start
            print(f"embedded with {name} in {seconds[name]:.0f} s", file=sys.stderr, flush=True)
    if args.with_st:
        start = time.perf_counter()
        doc_vecs[ST] = embed_st(docs, args.threads)
        query_vecs[ST] = embed_st(queries, args.threads)
        seconds[ST] = time.perf_counter() - start

    names = list(doc_vecs)
    table = {(qv, dv): ndcg_at_10(query_vecs[qv], doc_vecs[dv], query_ids, doc_ids, qrels)
             for qv in names for dv in names}
    ref = table[(mb.BUILT_FP32, mb.BUILT_FP32)]

    print(f"SciFact test: {len(query_ids)} queries, {len(doc_ids)} docs (title + text, "
          f"truncation {mb.MAX_TOKENS}), exact cosine, threads {args.threads}")
    print(f"{'variant':<28}{'nDCG@10':>9}{'vs fp32':>9}{'doc cos':>9}{'embed s':>9}")
    for name in names:
        cos = float(np.mean(np.sum(doc_vecs[name] * doc_vecs[mb.BUILT_FP32], axis=1)))
        own = table[(name, name)]
        print(f"{name:<28}{own:>9.4f}{own - ref:>+9.4f}{cos:>9.4f}{seconds[name]:>9.0f}")
    print()
    print("mixed pairs: rows = queries by, columns = documents by (nDCG@10)")
    width = max(len(n) for n in names) + 2
    print(" " * width + "".join(f"{n:>{width}}" for n in names))
    for qv in names:
        print(f"{qv:<{width}}" + "".join(f"{table[(qv, dv)]:>{width}.4f}" for dv in names))
    print()
    for name in names:
        if name == mb.BUILT_FP32:
            continue
        own_ok = abs(table[(name, name)] - ref) <= TOLERANCE
        worst = min(table[(a, b)] for a in names for b in names
                    if a != b and name in (a, b) and mb.BUILT_FP32 in (a, b))
        mixed_ok = worst >= ref - TOLERANCE
        verdict = "interchangeable" if own_ok and mixed_ok else "NOT interchangeable"
        print(f"{name}: {verdict} with built-fp32 (own {table[(name, name)] - ref:+.4f}, "
              f"worst mixed pair with fp32 {worst - ref:+.4f}; tolerance {TOLERANCE})")


if __name__ == "__main__":
    main()
