"""One search over a collection, dense, lexical or both fused: what a RAG query retrieves.

`retrieve` runs next to the store (in the retriever replica, or in-process in the benchmark and
the tests), so a hybrid search is one call: both candidate lists and the fusion stay local.
Metadata filters (rag/retrieval/filters.py) are applied by the store inside both searches.

Besides the hits, a search reports `best_similarity`: the highest cosine similarity between the
question and any chunk the filters allow (the dense list's first score). It is what the pipeline's
no-answer threshold reads: a hybrid hit's score is a fusion of normalised scores or of ranks
(rag.retrieval.fusion), which says how a chunk ranked among the candidates, not whether anything in the
collection is related.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import ConfigDict

from planner.profile import FusionSpec
from rag.retrieval.fusion import reciprocal_rank_fusion, weighted_score_fusion
from rag.retrieval.prompt import RetrievedChunk

RetrievalMode = Literal["dense", "lexical", "hybrid"]
RETRIEVAL_MODES: tuple[str, ...] = ("dense", "lexical", "hybrid")


class FusionSettings(FusionSpec):
    """How hybrid retrieval merges the two rankings: the profile's `rag.fusion`, one definition
    (planner/profile.py FusionSpec; defaults measured in docs/BENCHMARKS.md section 7)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class SearchQuery:
    """What to look for. `vector` is the embedded `text` (needed unless the mode is lexical).
    `filters`: metadata filters in the shape of rag/retrieval/filters.py; only matching documents' chunks."""

    text: str
    top_k: int
    mode: RetrievalMode = "hybrid"
    vector: np.ndarray | None = None
    filters: dict[str, Any] | None = field(default=None)


@dataclass(frozen=True)
class SearchResult:
    """The top_k chunks, best first, and the best cosine similarity of the question with any chunk
    the filters allow (None in lexical mode, or when no chunk matched)."""

    hits: list[RetrievedChunk]
    best_similarity: float | None = None


class SearchableStore(Protocol):
    """The two searches a store offers (rag.store.knowledge_store.KnowledgeStore)."""

    def search(
        self, tenant: str, collection: str, vector, top_k: int, filters: dict | None = None
    ) -> list[RetrievedChunk]: ...

    def search_lexical(
        self, tenant: str, collection: str, text: str, top_k: int, filters: dict | None = None
    ) -> list[RetrievedChunk]: ...


def retrieve(
    store: SearchableStore, tenant: str, collection: str, query: SearchQuery, fusion: FusionSettings = FusionSettings()
) -> SearchResult:
    """The query's top_k chunks, best first; in hybrid mode each chunk's score is its fused score."""
    if query.mode not in RETRIEVAL_MODES:
        raise ValueError(f"retrieval mode {query.mode!r} is not one of {', '.join(RETRIEVAL_MODES)}")
    if query.mode != "lexical" and query.vector is None:
        raise ValueError(f"{query.mode} retrieval needs the query's vector")
    filters = query.filters or None
    # Spreading the top_k over documents needs the candidates behind it, in every mode.
    spread = fusion.chunks_per_document > 0
    depth = max(query.top_k, fusion.candidates) if query.mode == "hybrid" or spread else query.top_k
    if query.mode == "lexical":
        lexical = store.search_lexical(tenant, collection, query.text, depth, filters)
        return SearchResult(spread_over_documents(lexical, fusion.chunks_per_document)[: query.top_k])
    dense = store.search(tenant, collection, query.vector, depth, filters)
    best = dense[0].score if dense else None
    if query.mode == "dense":
        return SearchResult(spread_over_documents(dense, fusion.chunks_per_document)[: query.top_k], best)
    lexical = store.search_lexical(tenant, collection, query.text, depth, filters)
    return SearchResult(fuse(dense, lexical, query.top_k, fusion), best)


def fuse(
    dense: list[RetrievedChunk], lexical: list[RetrievedChunk], top_k: int, fusion: FusionSettings = FusionSettings()
) -> list[RetrievedChunk]:
    """The top_k of two rankings merged; each chunk keeps its row, with the fused score."""
    by_id = {chunk.chunk_id: chunk for chunk in [*lexical, *dense]}
    weights = (fusion.dense_weight, fusion.lexical_weight)
    if fusion.method == "rrf":
        fused = reciprocal_rank_fusion(
            [[c.chunk_id for c in dense], [c.chunk_id for c in lexical]], k=fusion.rrf_k, weights=weights
        )
    else:
        fused = weighted_score_fusion(
            [[(c.chunk_id, c.score) for c in dense], [(c.chunk_id, c.score) for c in lexical]], weights=weights
        )
    if fusion.document_support:
        fused = with_document_support(
            fused, {c.chunk_id: c.document_id for c in by_id.values()}, fusion.document_support
        )
    ranked = [replace(by_id[chunk_id], score=score) for chunk_id, score in fused]
    return spread_over_documents(ranked, fusion.chunks_per_document)[:top_k]


def spread_over_documents(hits: list[RetrievedChunk], most: int) -> list[RetrievedChunk]:
    """The ranking with each document's chunks beyond its first `most` moved, in order, after all the
    others' (0 = unchanged). Nothing is dropped: when fewer documents match, their later chunks fill in."""
    if most <= 0:
        return hits
    seen: dict[str, int] = {}
    ahead, behind = [], []
    for hit in hits:
        seen[hit.document_id] = seen.get(hit.document_id, 0) + 1
        (ahead if seen[hit.document_id] <= most else behind).append(hit)
    return ahead + behind


def with_document_support(
    fused: list[tuple[str, float]], document_of: dict[str, str], weight: float
) -> list[tuple[str, float]]:
    """Each chunk's score plus `weight` times the best score of another chunk of its document, best first
    (ties keep the fused order)."""
    best_two: dict[str, list[tuple[str, float]]] = {}
    for chunk_id, score in fused:  # best first: each document's first two are its best two
        top = best_two.setdefault(document_of[chunk_id], [])
        if len(top) < 2:
            top.append((chunk_id, score))
    supported = []
    for position, (chunk_id, score) in enumerate(fused):
        other = next((s for c, s in best_two[document_of[chunk_id]] if c != chunk_id), 0.0)
        supported.append((score + weight * other, -position, chunk_id))
    supported.sort(reverse=True)
    return [(chunk_id, score) for score, _, chunk_id in supported]
