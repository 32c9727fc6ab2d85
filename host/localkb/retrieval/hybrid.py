"""Reciprocal-rank fusion, and nothing else."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence


def rrf(ranked_lists: Mapping[str, Sequence[Hashable]], k: int = 60,
        weights: Mapping[str, float] | None = None) -> dict[Hashable, float]:
    """Fuse ranked lists: ``score = sum w/(k + rank)`` (rank from 1, ``w`` 1 unless given), 0..1.

    1.0 means first in every list that ran, at full weight; the normalisation
    divides by that maximum, so scores are comparable between knowledge bases
    searched separately.
    """
    if not ranked_lists:
        return {}
    weights = weights or {}
    scores: dict[Hashable, float] = {}
    for name, items in ranked_lists.items():
        w = weights.get(name, 1.0)
        for rank, item in enumerate(items, start=1):
            scores[item] = scores.get(item, 0.0) + w / (k + rank)
    best = len(ranked_lists) / (k + 1)
    return {item: s / best for item, s in scores.items()}
