"""Merging ranked lists from the dense and the lexical index into one ranking.

Two methods, compared on bench/bench_rag_quality.py (docs/BENCHMARKS.md section 7):
- reciprocal-rank fusion: score = sum over lists of weight / (k + rank), rank counted from 1.
  It reads only ranks, so cosine similarities and bm25 values, which live on unrelated scales,
  need no calibration.
- weighted scores: each list's scores min-max normalised to [0, 1] (best = 1), then the weighted
  sum; an item absent from a list gets 0 from it.
Ties keep the order of first appearance (the first list first), so fusion is deterministic.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

Key = TypeVar("Key", bound=Hashable)


def _check_weights(lists: Sequence, weights: Sequence[float] | None) -> Sequence[float]:
    weights = [1.0] * len(lists) if weights is None else weights
    if len(weights) != len(lists):
        raise ValueError(f"{len(lists)} ranked lists but {len(weights)} weights")
    if any(w < 0 for w in weights):
        raise ValueError("fusion weights must not be negative")
    return weights


def _ordered(scores: dict, first_seen: dict) -> list[tuple]:
    return sorted(scores.items(), key=lambda item: (-item[1], first_seen[item[0]]))


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Key]], k: float = 60.0, weights: Sequence[float] | None = None
) -> list[tuple[Key, float]]:
    """(key, fused score) best first. `rankings` are lists of keys, best first."""
    if k < 0:
        raise ValueError("the RRF constant k must not be negative")
    weights = _check_weights(rankings, weights)
    scores: dict = {}
    first_seen: dict = {}
    for ranking, weight in zip(rankings, weights):
        for rank, key in enumerate(ranking, start=1):
            first_seen.setdefault(key, len(first_seen))
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
    return _ordered(scores, first_seen)


def weighted_score_fusion(
    scored: Sequence[Sequence[tuple[Key, float]]], weights: Sequence[float] | None = None
) -> list[tuple[Key, float]]:
    """(key, fused score) best first. `scored` are lists of (key, score), higher scores better."""
    weights = _check_weights(scored, weights)
    scores: dict = {}
    first_seen: dict = {}
    for items, weight in zip(scored, weights):
        if not items:
            continue
        values = [score for _, score in items]
        low, high = min(values), max(values)
        for key, score in items:
            first_seen.setdefault(key, len(first_seen))
            normalised = 1.0 if high == low else (score - low) / (high - low)
            scores[key] = scores.get(key, 0.0) + weight * normalised
    return _ordered(scores, first_seen)
