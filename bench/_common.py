"""Shared by the benchmarks: where SciFact is, and a fallback text generator."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Beside the checkout (CI's layout), or where LOCALKB_SCIFACT says (a worktree elsewhere).
SCIFACT = Path(os.environ.get("LOCALKB_SCIFACT") or REPO.parent / "shared" / "datasets" / "beir-scifact")


def scifact_docs(limit: int | None = None) -> list[dict]:
    """SciFact abstracts ({_id, title, text}); generated text when the data set is absent."""
    path = SCIFACT / "corpus.jsonl"
    if path.exists():
        docs = []
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                docs.append(json.loads(line))
                if limit and len(docs) >= limit:
                    break
        return docs
    rng = random.Random(7)
    words = ("cell protein gene expression tumour immune response patient cohort trial dose "
             "receptor pathway mouse model signal increase decrease risk association").split()
    return [{"_id": str(i), "title": " ".join(rng.choices(words, k=8)),
             "text": ". ".join(" ".join(rng.choices(words, k=18)) for _ in range(9)) + "."}
            for i in range(limit or 2000)]


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
