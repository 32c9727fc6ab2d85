"""Reciprocal-rank fusion, and nothing else."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence


def rrf(ranked_lists: Mapping[str, Sequence[Hashable]], k: int = 60,
        weights: Mapping[str, float] | None = None,
        ranks: Mapping[str, Sequence[int]] | None = None) -> dict[Hashable, float]:
    """Fuse ranked lists: ``score = sum w/(k + rank)`` (rank from 1, ``w`` 1 unless given), 0..1.

    ``ranks`` gives a list's ranks where some of its items are tied (one per item, in the
    list's order: ``[1, 1, 3]``); a list without them ranks its items 1, 2, 3, ...
    1.0 means first in every list that ran, at full weight; the normalisation
    divides by that maximum, so scores are comparable between knowledge bases
    searched separately.
    """
    if not ranked_lists:
        return {}
    weights = weights or {}
    ranks = ranks or {}
    scores: dict[Hashable, float] = {}
    for name, items in ranked_lists.items():
        w = weights.get(name, 1.0)
        for rank, item in zip(ranks.get(name) or range(1, len(items) + 1), items, strict=True):
            scores[item] = scores.get(item, 0.0) + w / (k + rank)
    best = len(ranked_lists) / (k + 1)
    return {item: s / best for item, s in scores.items()}


def tied_ranks(groups: Sequence[Hashable]) -> list[int]:
    """Competition ranks ("1224") of a list whose items are equal when their group is:
    each item takes the rank of the first item of its group."""
    first: dict[Hashable, int] = {}
    return [first.setdefault(g, i) for i, g in enumerate(groups, start=1)]
