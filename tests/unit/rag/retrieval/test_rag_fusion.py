"""Fusion arithmetic (rag/retrieval/fusion.py) and how rag.retrieval.search applies it to the two rankings."""

import pytest

from rag.retrieval.fusion import reciprocal_rank_fusion, weighted_score_fusion
from rag.retrieval.prompt import RetrievedChunk
from rag.retrieval.search import (
    FusionSettings,
    SearchQuery,
    fuse,
    retrieve,
    spread_over_documents,
    with_document_support,
)


def test_rrf_sums_reciprocal_ranks():
    fused = dict(reciprocal_rank_fusion([["a", "b", "c"], ["b", "d"]], k=60))
    assert fused["a"] == pytest.approx(1 / 61)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"] == pytest.approx(1 / 63)
    assert fused["d"] == pytest.approx(1 / 62)
    assert [key for key, _ in reciprocal_rank_fusion([["a", "b", "c"], ["b", "d"]], k=60)] == ["b", "a", "d", "c"]


def test_rrf_weights_and_k():
    fused = dict(reciprocal_rank_fusion([["a"], ["b"]], k=0, weights=[2.0, 1.0]))
    assert fused == {"a": pytest.approx(2.0), "b": pytest.approx(1.0)}
    # A small k lets the head of one list win; a large k favours items both lists share.
    lists = [["x", "both"], ["y", "both"]]
    assert reciprocal_rank_fusion(lists, k=0)[0][0] in {"x", "y"}
    assert reciprocal_rank_fusion(lists, k=60)[0][0] == "both"


def test_ties_keep_first_appearance_order():
    assert [key for key, _ in reciprocal_rank_fusion([["a", "b"], ["c", "d"]])] == ["a", "c", "b", "d"]


def test_weighted_fusion_normalises_each_list():
    fused = dict(
        weighted_score_fusion([[("a", 0.9), ("b", 0.5), ("c", 0.1)], [("c", 30.0), ("a", 10.0)]], weights=[0.5, 0.5])
    )
    assert fused["a"] == pytest.approx(0.5 * 1.0 + 0.5 * 0.0)
    assert fused["b"] == pytest.approx(0.5 * 0.5)
    assert fused["c"] == pytest.approx(0.5 * 0.0 + 0.5 * 1.0)
    # One item, or all equal scores: each counts as the best of its list.
    assert dict(weighted_score_fusion([[("a", 3.0)], []])) == {"a": pytest.approx(1.0)}


@pytest.mark.parametrize(
    "call",
    [
        lambda: reciprocal_rank_fusion([["a"]], weights=[1.0, 2.0]),
        lambda: reciprocal_rank_fusion([["a"]], k=-1),
        lambda: weighted_score_fusion([[("a", 1.0)]], weights=[-1.0]),
    ],
)
def test_bad_parameters_raise(call):
    with pytest.raises(ValueError):
        call()


def chunk(doc: str, score: float) -> RetrievedChunk:
    return RetrievedChunk(document_id=doc, chunk_id=f"{doc}#0", score=score, text=f"text of {doc}")


def test_fuse_keeps_rows_and_replaces_scores():
    dense = [chunk("a", 0.9), chunk("b", 0.8)]
    lexical = [chunk("b", 12.0), chunk("c", 3.0)]
    fused = fuse(
        dense, lexical, top_k=2, fusion=FusionSettings(method="rrf", rrf_k=60, dense_weight=1, lexical_weight=1)
    )
    assert [c.chunk_id for c in fused] == ["b#0", "a#0"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61) and fused[0].text == "text of b"
    weighted = fuse(
        [*dense, chunk("x", 0.1)],
        lexical,
        top_k=3,
        fusion=FusionSettings(method="weighted", dense_weight=0.5, lexical_weight=0.5),
    )
    # dense normalised: a 1, b 0.875, x 0; lexical: b 1, c 0
    assert [(c.chunk_id, round(c.score, 4)) for c in weighted] == [("b#0", 0.9375), ("a#0", 0.5), ("x#0", 0.0)]


class TwoLists:
    """A store whose dense and lexical searches return fixed rankings, recording the depth and filters asked."""

    def __init__(self, dense, lexical):
        self.dense, self.lexical, self.asked = dense, lexical, []

    def search(self, tenant, collection, vector, top_k, filters=None):
        self.asked.append(("dense", top_k, filters))
        return self.dense[:top_k]

    def search_lexical(self, tenant, collection, text, top_k, filters=None):
        self.asked.append(("lexical", top_k, filters))
        return self.lexical[:top_k]


def ids(result):
    return [c.document_id for c in result.hits]


def test_retrieve_dispatches_on_the_mode_and_fuses_deeper_candidates():
    store = TwoLists([chunk("a", 0.9), chunk("b", 0.5)], [chunk("c", 5.0), chunk("b", 4.0)])
    query = dict(text="q", top_k=1, vector=[1.0])
    assert ids(retrieve(store, "t", "c", SearchQuery(mode="dense", **query))) == ["a"]
    assert ids(retrieve(store, "t", "c", SearchQuery(mode="lexical", **query))) == ["c"]
    store.asked.clear()
    rrf = FusionSettings(method="rrf", dense_weight=1, lexical_weight=1, candidates=7)
    hybrid = retrieve(store, "t", "c", SearchQuery(mode="hybrid", **query), rrf)
    assert ids(hybrid) == ["b"]  # with RRF, second in both lists beats first in one
    assert store.asked == [("dense", 7, None), ("lexical", 7, None)]


def test_best_similarity_is_the_dense_lists_first_score_whatever_the_fused_order():
    store = TwoLists([chunk("a", 0.9), chunk("b", 0.5)], [chunk("c", 5.0), chunk("b", 4.0)])
    query = dict(text="q", top_k=1, vector=[1.0])
    rrf = FusionSettings(method="rrf", dense_weight=1, lexical_weight=1)
    assert retrieve(store, "t", "c", SearchQuery(mode="hybrid", **query), rrf).best_similarity == 0.9  # b is first
    assert retrieve(store, "t", "c", SearchQuery(mode="dense", **query)).best_similarity == 0.9
    assert retrieve(store, "t", "c", SearchQuery(mode="lexical", **query)).best_similarity is None
    assert retrieve(TwoLists([], []), "t", "c", SearchQuery(mode="hybrid", **query)).best_similarity is None


def test_filters_reach_both_searches():
    store = TwoLists([chunk("a", 0.9)], [chunk("a", 2.0)])
    filters = {"lang": {"in": ["en"]}}
    retrieve(
        store, "t", "c", SearchQuery(text="q", top_k=2, vector=[1.0], filters=filters), FusionSettings(candidates=3)
    )
    assert store.asked == [("dense", 3, filters), ("lexical", 3, filters)]


def test_retrieve_refuses_what_it_cannot_do():
    store = TwoLists([], [])
    with pytest.raises(ValueError, match="vector"):
        retrieve(store, "t", "c", SearchQuery(text="q", top_k=1, mode="hybrid"))
    with pytest.raises(ValueError, match="mode"):
        retrieve(store, "t", "c", SearchQuery(text="q", top_k=1, mode="fuzzy"))  # type: ignore[arg-type]
    assert retrieve(store, "t", "c", SearchQuery(text="q", top_k=1, mode="lexical")).hits == []


def test_the_default_fusion_is_weighted_dense_first():
    # docs/BENCHMARKS.md 7.1 and 7.3: at or near the best recall on pydoc, the SQLite manual and LaTeX PDFs.
    default = FusionSettings()
    assert (default.method, default.dense_weight, default.lexical_weight) == ("weighted", 0.7, 0.3)
    assert default.document_support == 0.2  # docs/BENCHMARKS.md 7.6, 7.8
    assert default.chunks_per_document == 1  # docs/BENCHMARKS.md 7.8
    store = TwoLists([chunk("a", 0.9), chunk("b", 0.5)], [chunk("c", 5.0), chunk("b", 4.0)])
    hits = retrieve(store, "t", "c", SearchQuery(mode="hybrid", text="q", top_k=3, vector=[1.0])).hits
    assert [h.document_id for h in hits] == ["a", "c", "b"]  # 0.7, 0.3, 0: dense's first leads


def test_document_support_adds_the_best_other_chunk_of_the_same_document():
    fused = [("a#0", 1.0), ("b#0", 0.9), ("b#1", 0.5), ("a#1", 0.1), ("b#2", 0.4)]
    document_of = {chunk: chunk.split("#")[0] for chunk, _ in fused}
    supported = dict(with_document_support(fused, document_of, 0.5))
    assert supported == {
        "a#0": pytest.approx(1.05),
        "b#0": pytest.approx(1.15),
        "b#1": pytest.approx(0.95),
        "a#1": pytest.approx(0.6),
        "b#2": pytest.approx(0.85),
    }
    assert [c for c, _ in with_document_support(fused, document_of, 0.5)] == ["b#0", "a#0", "b#1", "b#2", "a#1"]
    # a lone chunk gets no support; ties keep the fused order
    assert with_document_support([("x#0", 0.5), ("y#0", 0.5)], {"x#0": "x", "y#0": "y"}, 1.0) == [
        ("x#0", 0.5),
        ("y#0", 0.5),
    ]


def test_fuse_applies_document_support_unless_it_is_zero():
    def chunk(doc, n, score):
        return RetrievedChunk(document_id=doc, chunk_id=f"{doc}#{n}", score=score, text="t")

    dense = [chunk("a", 0, 0.9), chunk("b", 0, 0.85), chunk("b", 1, 0.84), chunk("c", 0, 0.1)]
    lexical = []
    alone = dict(chunks_per_document=0)  # the support alone, without spreading the top_k over documents
    assert [c.chunk_id for c in fuse(dense, lexical, 2, FusionSettings(document_support=0, **alone))] == ["a#0", "b#0"]
    supported = fuse(dense, lexical, 2, FusionSettings(document_support=0.5, **alone))
    assert [c.chunk_id for c in supported] == ["b#0", "b#1"]
    assert [c.chunk_id for c in fuse(dense, lexical, 2, FusionSettings(document_support=0.5))] == ["b#0", "a#0"]


def numbered(doc: str, n: int, score: float) -> RetrievedChunk:
    return RetrievedChunk(document_id=doc, chunk_id=f"{doc}#{n}", score=score, text="t")


def test_spread_over_documents_moves_a_documents_extra_chunks_behind_the_others():
    hits = [
        numbered("a", 0, 0.9),
        numbered("a", 1, 0.8),
        numbered("a", 2, 0.7),
        numbered("b", 0, 0.6),
        numbered("c", 0, 0.5),
        numbered("b", 1, 0.4),
    ]
    chunk_ids = [c.chunk_id for c in spread_over_documents(hits, 1)]
    assert chunk_ids == ["a#0", "b#0", "c#0", "a#1", "a#2", "b#1"]  # nothing dropped, order kept within each part
    assert [c.chunk_id for c in spread_over_documents(hits, 2)] == ["a#0", "a#1", "b#0", "c#0", "b#1", "a#2"]
    assert spread_over_documents(hits, 0) == hits
    one_document = [numbered("a", i, 1 - i / 10) for i in range(4)]
    assert spread_over_documents(one_document, 1) == one_document  # a lone document still fills the top_k


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_retrieve_spreads_the_top_k_over_documents_in_every_mode(mode):
    dense = [numbered("a", 0, 0.9), numbered("a", 1, 0.85), numbered("b", 0, 0.5)]
    lexical = [numbered("a", 0, 9.0), numbered("a", 1, 8.0), numbered("b", 0, 1.0)]
    store = TwoLists(dense, lexical)
    spread = FusionSettings(chunks_per_document=1, candidates=5)
    query = SearchQuery(mode=mode, text="q", top_k=2, vector=[1.0])
    assert [c.chunk_id for c in retrieve(store, "t", "c", query, spread).hits] == ["a#0", "b#0"]
    assert all(depth == 5 for _, depth, _ in store.asked)  # the candidates behind the top_k were fetched
    assert [c.chunk_id for c in retrieve(store, "t", "c", query, FusionSettings(chunks_per_document=0)).hits] == [
        "a#0",
        "a#1",
    ]
