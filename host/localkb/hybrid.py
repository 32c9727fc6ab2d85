"""Reciprocal-rank fusion, and nothing else."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def rrf(ranked_lists: dict[str, Sequence[Hashable]], k: int = 60) -> dict[Hashable, float]:
    """Fuse ranked lists: ``score = sum 1/(k + rank)`` (rank from 1), normalised to 0..1.

    1.0 means first in every list that ran; the normalisation divides by that maximum,
    so scores are comparable between knowledge bases searched separately.
    """
    lists = list(ranked_lists.values())
    if not lists:
        return {}
    scores: dict[Hashable, float] = {}
    for items in lists:
        for rank, item in enumerate(items, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    best = len(lists) / (k + 1)
    return {item: s / best for item, s in scores.items()}
