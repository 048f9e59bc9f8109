"""Where a ranked list of retrieved chunks first reaches a right document: the rank that recall@k and MRR are
computed from (bench/bench_rag_quality.py, bench/rag_baselines.py)."""

from __future__ import annotations


def rank_of(hits, answers: set[str]) -> int | None:
    """The 1-based position of the first hit whose document_id is one of answers; None when none is."""
    for position, hit in enumerate(hits, start=1):
        if hit.document_id in answers:
            return position
    return None
