"""Which rule of the keyword analysis costs what: each rule switched off in turn, one run.

    python bench/ablate_keyword.py SET [SET ...] [--model hashing-256] [--modes keyword]
                                    [--index-dir DIR] [--split test] [--rules all caps ...]

Each set (BEIR layout, e.g. ``evals/codes``, ``evals/pgdocs/sample`` or BEIR SciFact) is
indexed once (``--index-dir`` keeps it, so a second run, or a set indexed by
``localkb eval --index-dir``, is not indexed again). Then, for the rules as they are and
for each rule switched off, the keyword index is rebuilt from the catalogue (the vectors
are kept) and every mode asked is scored through the eval's own path, beside plain BM25
over whole pages (rank_bm25, ``\\w+`` tokens). The table prints nDCG@10 and recall@1 per
variant, and the paired difference against the rules as they are.

The rules (``store/analysis.py`` and ``retrieval/search.py``):

- ``caps``: ALL-CAPS words of four letters or more are exact terms (``PYTHONHASHSEED``).
- ``camel``: camelCase words are exact terms (``mRNA``, ``getElementById``).
- ``dotted``: a bare dotted number (``2.3``) is the version ``v2.3``, in text and queries.
- ``stopparts``: the parts of a code-like token keep stopwords (``up-regulated`` -> ``up``).
- ``parts``: code-like tokens are indexed under their qualified suffixes and parts too.
- ``backoff``: an exact term no passage holds whole is looked for through its back-off forms.
- ``exactlist``: exact terms get a ranked list of their own in the fusion.
- ``fetch``: per-source searches fetch deeper until k pages are in.

A rule is switched off by replacing one function for the run (this script only); the
keyword index is analysed again for each variant that changes what is indexed.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "host"))

from localkb.retrieval import evaluate, search  # noqa: E402
from localkb.store import analysis  # noqa: E402

RULES = ("caps", "camel", "dotted", "stopparts", "parts", "backoff", "exactlist", "fetch")
#: Rules whose switch changes what a passage is indexed under: the keyword index is rebuilt.
INDEXING = {"dotted", "stopparts", "parts"}


_TOKEN_TERMS = analysis.token_terms  # the cached function, whatever a variant puts in its place


def _clear_caches() -> None:
    _TOKEN_TERMS.cache_clear()


@contextlib.contextmanager
def switched_off(rule: str | None):
    """The analysis with ``rule`` switched off (None: as it is)."""
    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    if rule in ("caps", "camel"):
        orig = analysis.is_exact_token

        def without(token: str, *, shouting: bool = False) -> bool:
            if token.isalpha() and (rule == "camel") == bool(analysis._CAMEL.search(token)):
                return False
            return orig(token, shouting=shouting)
        patch(analysis, "is_exact_token", without)
    elif rule == "backoff":
        patch(analysis, "backoff", lambda token: ())
    elif rule == "dotted":
        patch(analysis, "_VERSION", re.compile(r"^[vV](\d+(?:\.\d+)+)$"))
    elif rule == "stopparts":
        orig_norm = analysis.normalize

        def parts(token: str) -> list[str]:
            return [n for p in analysis._JOINERS.split(token) if p and (n := orig_norm(p))]
        patch(analysis, "_parts", parts)
    elif rule == "parts":
        orig_tt = analysis.token_terms.__wrapped__

        def whole_only(token: str):
            terms, _width = orig_tt(token)
            return (terms[:1], 1)
        patch(analysis, "token_terms", whole_only)
    elif rule == "exactlist":
        orig_cand = search.Searcher._candidates

        def no_exact_list(self, *a, **kw):
            got = orig_cand(self, *a, **kw)
            if isinstance(got, search.Candidates):
                got.lists.pop("exact", None)
            return got
        patch(search.Searcher, "_candidates", no_exact_list)
    elif rule == "fetch":
        patch(search, "MAX_FETCH", 0)
    _clear_caches()
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
        _clear_caches()


def _drop_keyword_index(index_dir: Path) -> None:
    """Remove the kept eval store's keyword index: the next open rebuilds it from the catalogue."""
    for kb_dir in (index_dir / "kbs").iterdir():
        shutil.rmtree(kb_dir / "keywords", ignore_errors=True)
        (kb_dir / "keywords.json").unlink(missing_ok=True)


def run_set(path: Path, *, rules: list[str], modes: list[str], model: str | None,
            index_dir: Path, split: str) -> list[tuple[str, dict]]:
    rows = []
    base_ndcg: dict[str, list[float]] = {}
    for rule in [None, *rules]:
        t0 = time.perf_counter()
        with switched_off(rule):
            if index_dir.exists() and (rule in INDEXING or (rows and rows[-1][0] in INDEXING)):
                _drop_keyword_index(index_dir)
            res = evaluate.run_eval(path, modes=modes, model=model, split=split,
                                    baseline="bm25" if rule is None else None,
                                    index_dir=index_dir, per_query=True)
        res["seconds"] = round(time.perf_counter() - t0, 1)
        if rule is None:
            base_ndcg = {m: res["per_query_ndcg"][m] for m in modes}
        else:
            for m in modes:
                diffs = [a - b for a, b in zip(res["per_query_ndcg"][m], base_ndcg[m], strict=True)]
                res["modes"][m]["vs_rules"] = (sum(diffs) / len(diffs), evaluate.bootstrap_ci(diffs))
        rows.append((rule or "as is", res))
        print(f"  {path.name}: {rule or 'as is'} done in {res['seconds']} s", file=sys.stderr, flush=True)
        print(table(path, rows[-1:] if rule else rows, modes).split("\n", 2)[-1], file=sys.stderr, flush=True)
    # The index as the rules build it, for the next run.
    if rules and rules[-1] in INDEXING:
        _drop_keyword_index(index_dir)
    return rows


def table(path: Path, rows: list[tuple[str, dict]], modes: list[str]) -> str:
    first = rows[0][1]
    out = [f"{path} ({first['split']} split): {first['documents']} documents, "
           f"{first['passages']} passages, {first['queries']} queries; model {first['model']}",
           f"{'variant':22} {'mode':8} {'nDCG@10':>8} {'R@1':>6}  {'vs as is (paired 95% CI)':>28}"]
    if "bm25" in first["modes"]:
        bm = first["modes"]["bm25"]["overall"]
        out.append(f"{'bm25 (whole pages)':22} {'':8} {bm['ndcg@10']:8.3f} {bm['recall@1']:6.3f}")
    for name, res in rows:
        label = name if name == "as is" else f"no {name}"
        for m in modes:
            row = res["modes"][m]
            vs = ""
            if "vs_rules" in row:
                d, (lo, hi) = row["vs_rules"]
                vs = f"{d:+.4f} ({lo:+.4f} to {hi:+.4f})"
            o = row["overall"]
            out.append(f"{label:22} {m:8} {o['ndcg@10']:8.3f} {o['recall@1']:6.3f}  {vs:>28}")
            for kind, k in row.get("by_kind", {}).items():
                out.append(f"{'':22}   {kind[:6]:6} {k['ndcg@10']:8.3f} {k['recall@1']:6.3f}")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sets", nargs="+", type=Path)
    p.add_argument("--model", default=None, help="embedding model (default: the store's default)")
    p.add_argument("--modes", nargs="+", default=["keyword"])
    p.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES)
    p.add_argument("--index-dir", type=Path, default=None,
                   help="keep each set's index under DIR/<set name> (default: a temporary folder)")
    p.add_argument("--split", default="test")
    args = p.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="localkb-ablate-") as tmp:
        root = args.index_dir or Path(tmp)
        for path in args.sets:
            rows = run_set(path, rules=args.rules, modes=args.modes, model=args.model,
                           index_dir=root / path.resolve().name, split=args.split)
            print(table(path, rows, args.modes), flush=True)
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
