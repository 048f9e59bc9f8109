"""rag.retrieval.pipeline.RagPipeline driven with a fake embedder and a fake chat engine, over the real
store (rag.local.LocalIndex) or a fake index: ingest, retrieval modes, answers, chat-with-RAG."""

import asyncio

import numpy as np
import pytest

from rag.local import LocalIndex
from rag.retrieval.pipeline import DocumentInput, InvalidQuery, PipelineSettings, RagPipeline
from rag.retrieval.prompt import SYSTEM_INSTRUCTION, RetrievedChunk
from rag.retrieval.search import FusionSettings
from rag.store.knowledge_store import KnowledgeStore
from tests.fakes.rag import DIM, FakeChat, FakeEmbedder, RecordingIndex, bag_of_words

DOCS = [
    DocumentInput(
        "reactor", "The Zorblax reactor was built by Mira Quell.\n\nIt produces forty megawatts.", {"src": "r"}
    ),
    DocumentInput("cats", "Cats sleep for most of the day.\n\nA cat purrs when content."),
    DocumentInput("codes", "Error E1101 is raised when the attribute is missing."),
]


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.fixture
def store(tmp_path):
    knowledge = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    yield knowledge
    knowledge.close()


def pipeline_over(store, **settings) -> tuple[RagPipeline, FakeEmbedder, FakeChat]:
    embedder, chat = FakeEmbedder(), FakeChat()
    return RagPipeline(embedder, LocalIndex(store), PipelineSettings(**settings), chat=chat), embedder, chat


def test_ingest_chunks_embeds_and_stores_every_document(store):
    pipeline, embedder, _ = pipeline_over(store, embed_title=False)
    assert run(pipeline.ingest("t", "kb", DOCS)) == [2, 2, 1]
    assert embedder.document_calls == [
        [
            "The Zorblax reactor was built by Mira Quell.",
            "It produces forty megawatts.",
            "Cats sleep for most of the day.",
            "A cat purrs when content.",
            "Error E1101 is raised when the attribute is missing.",
        ]
    ]
    info = store.collection_info("t", "kb")
    assert info["chunk_count"] == info["indexed_vectors"] == 5
    assert {d["id"]: d["metadata"] for d in store.list_documents("t", "kb", limit=10)["data"]}["reactor"] == {
        "src": "r"
    }
    assert {d["id"]: d["chars"] for d in store.list_documents("t", "kb", limit=10)["data"]}["codes"] == len(
        DOCS[2].text
    )


def test_ingest_embeds_in_bounded_batches_and_keeps_vectors_with_their_documents():
    index = RecordingIndex()
    embedder = FakeEmbedder()
    pipeline = RagPipeline(embedder, index, PipelineSettings(embed_batch_chunks=2, embed_title=False))
    assert run(pipeline.ingest("t", "kb", DOCS)) == [2, 2, 1]
    assert [len(call) for call in embedder.document_calls] == [2, 2, 1]
    ((_, _, stored),) = index.upserts
    for doc_id, chunks, vectors, _, _ in stored:
        assert len(vectors) == len(chunks)
        for chunk, vector in zip(chunks, vectors):
            np.testing.assert_array_equal(vector, bag_of_words(chunk.text))


def test_ingest_reports_its_progress_after_chunking_each_embedder_call_before_and_after_storing():
    heard = []

    async def on_progress(progress):  # an async listener is awaited, a plain one just called
        heard.append((progress.stage, progress.documents, progress.chunks, progress.chunks_embedded))

    pipeline = RagPipeline(FakeEmbedder(), RecordingIndex(), PipelineSettings(embed_batch_chunks=2))
    run(pipeline.ingest("t", "kb", DOCS, on_progress))
    assert heard == [
        ("chunked", 3, 5, 0),
        ("embedding", 3, 5, 2),
        ("embedding", 3, 5, 4),
        ("embedding", 3, 5, 5),
        ("storing", 3, 5, 5),
        ("stored", 3, 5, 5),
    ]


def test_chunks_are_embedded_with_their_documents_title_but_stored_without_it(store):
    pipeline, embedder, _ = pipeline_over(store)
    docs = [
        DocumentInput("guide", "Chapter one.\n\nMore text here.", {"title": "Zorblax guide"}),
        DocumentInput("notes", "Release notes\n\nFixed a crash."),
        DocumentInput("prose", "x" * 200 + "\n\nsecond part"),
    ]
    run(pipeline.ingest("t", "kb", docs))
    assert embedder.document_calls == [
        [
            "Zorblax guide\nChapter one.",
            "Zorblax guide\nMore text here.",  # the metadata's title
            "Release notes",
            "Release notes\nFixed a crash.",  # a short first line; not repeated in front of itself
            "x" * 200,
            "second part",  # a long first line is prose, not a title
        ]
    ]
    assert [h.text for h in store.search_lexical("t", "kb", "crash", 5)] == ["Fixed a crash."]


def test_ingest_of_an_empty_document_stores_it_without_chunks(store):
    pipeline, embedder, _ = pipeline_over(store)
    assert run(pipeline.ingest("t", "kb", [DocumentInput("empty", "   ")])) == [0]
    assert embedder.document_calls == []
    assert store.collection_info("t", "kb")["document_count"] == 1


def test_hybrid_is_the_default_and_finds_exact_codes_and_meaning(store):
    pipeline, embedder, _ = pipeline_over(store)
    run(pipeline.ingest("t", "kb", DOCS))
    # The hashed-words fake embedder puts another document first for the code; the lexical side still
    # brings it into the fused top 2 (default weighted 0.7/0.3), and RRF's equal say puts it first.
    assert "codes" in [h.document_id for h in run(pipeline.retrieve("t", "kb", "what does E1101 mean?", top_k=2))]
    assert run(pipeline.retrieve("t", "kb", "who built the Zorblax reactor?", top_k=1))[0].document_id == "reactor"
    assert embedder.queries == ["what does E1101 mean?", "who built the Zorblax reactor?"]
    rrf = RagPipeline(
        FakeEmbedder(),
        LocalIndex(store, FusionSettings(method="rrf", dense_weight=1, lexical_weight=1)),
        PipelineSettings(),
        chat=FakeChat(),
    )
    assert run(rrf.retrieve("t", "kb", "what does E1101 mean?", top_k=1))[0].document_id == "codes"


def test_mode_switch_changes_what_is_searched(store):
    # "kitten" is in no chunk: lexical finds nothing; dense (hashed words) still ranks every chunk.
    pipeline, embedder, _ = pipeline_over(store)
    run(pipeline.ingest("t", "kb", DOCS))
    assert run(pipeline.retrieve("t", "kb", "kitten", top_k=3, mode="lexical")) == []
    assert embedder.queries == []  # lexical retrieval never embeds the question
    assert len(run(pipeline.retrieve("t", "kb", "kitten", top_k=3, mode="dense"))) == 3
    assert len(run(pipeline.retrieve("t", "kb", "kitten", top_k=3, mode="hybrid"))) == 3
    lexical_only, _, _ = pipeline_over(store, retrieval="lexical")
    assert [h.document_id for h in run(lexical_only.retrieve("t", "kb", "megawatts", top_k=3))] == ["reactor"]


def test_settings_come_from_the_profile_rag_section():
    settings = PipelineSettings.model_validate(
        {
            "retrieval": "dense",
            "default_top_k": 3,
            "max_top_k": 9,
            "answer_max_tokens": 64,
            "chunk_tokens": 200,
            "state_dir": "/x",
        }
    )
    assert (settings.retrieval, settings.default_top_k, settings.max_top_k) == ("dense", 3, 9)
    with pytest.raises(ValueError):
        PipelineSettings(retrieval="fuzzy")


def test_query_carries_mode_top_k_vector_and_filters():
    index = RecordingIndex()
    pipeline = RagPipeline(FakeEmbedder(), index, PipelineSettings(default_top_k=3))
    run(pipeline.retrieve("t", "kb", "cats", filters={"lang": "en"}))
    ((tenant, collection, query),) = index.queries
    assert (tenant, collection, query.text, query.top_k, query.mode, query.filters) == (
        "t",
        "kb",
        "cats",
        3,
        "hybrid",
        {"lang": {"in": ["en"]}},
    )  # validated, in canonical form
    np.testing.assert_array_equal(query.vector, bag_of_words("cats"))


@pytest.mark.parametrize(
    "question, top_k, message",
    [
        ("   ", None, "no question"),
        ("cats", 21, "above the limit of 20"),
    ],
)
def test_invalid_queries_are_refused_before_any_work(question, top_k, message):
    embedder, index = FakeEmbedder(), RecordingIndex()
    pipeline = RagPipeline(embedder, index, PipelineSettings())
    with pytest.raises(InvalidQuery, match=message):
        run(pipeline.retrieve("t", "kb", question, top_k=top_k))
    assert embedder.queries == [] and index.queries == []


def test_answer_prompts_with_numbered_context_and_returns_citations(store):
    pipeline, _, chat = pipeline_over(store, answer_max_tokens=77)
    run(pipeline.ingest("t", "kb", DOCS))
    result = run(pipeline.answer("t", "kb", "How much power does the Zorblax reactor produce?", top_k=2))
    assert result.reply == "the answer"
    assert result.citations[0]["document_id"] == "reactor"
    assert [c["score"] for c in result.citations] == sorted((c["score"] for c in result.citations), reverse=True)
    (call,) = chat.calls
    system, user = call["messages"]
    assert system["role"] == "system" and system["content"].startswith(SYSTEM_INSTRUCTION)
    assert f"[1] {result.hits[0].text}" in system["content"] and f"[2] {result.hits[1].text}" in system["content"]
    assert user == {"role": "user", "content": "How much power does the Zorblax reactor produce?"}
    assert (call["max_tokens"], call["temperature"], call["stream"]) == (77, 0.0, False)


def test_answer_passes_stream_and_limits_to_the_chat_engine():
    hit = RetrievedChunk("d", "d#0", 1.0, "context")
    chat = FakeChat()
    pipeline = RagPipeline(FakeEmbedder(), RecordingIndex([hit]), PipelineSettings(), chat=chat)
    run(pipeline.answer("t", "kb", "q", max_tokens=5, temperature=0.7, stream=True))
    assert (chat.calls[0]["max_tokens"], chat.calls[0]["temperature"], chat.calls[0]["stream"]) == (5, 0.7, True)
    with pytest.raises(RuntimeError, match="no chat engine"):
        run(RagPipeline(FakeEmbedder(), RecordingIndex(), PipelineSettings()).answer("t", "kb", "q"))


def test_augment_chat_retrieves_for_the_last_user_turn():
    hit = RetrievedChunk("d", "d#0", 1.0, "the context")
    index = RecordingIndex([hit])
    pipeline = RagPipeline(FakeEmbedder(), index, PipelineSettings())
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second question"},
    ]
    augmented, grounding = run(pipeline.augment_chat("t", "kb", messages, top_k=1))
    assert grounding.hits == [hit] and grounding.answerable and index.queries[0][2].text == "second question"
    assert augmented[0]["role"] == "system" and "[1] the context" in augmented[0]["content"]
    assert augmented[1:] == messages
    with pytest.raises(InvalidQuery):
        run(pipeline.augment_chat("t", "kb", [{"role": "assistant", "content": "hi"}]))


def test_replaced_document_is_not_retrieved_in_any_mode(store):
    pipeline, _, _ = pipeline_over(store)
    run(pipeline.ingest("t", "kb", [DocumentInput("doc", "The secret code word is pelican.")]))
    run(pipeline.ingest("t", "kb", [DocumentInput("doc", "The secret code word is walrus.")]))
    for mode in ("dense", "lexical", "hybrid"):
        hits = run(pipeline.retrieve("t", "kb", "What is the secret code word?", top_k=5, mode=mode))
        assert [h.text for h in hits] == ["The secret code word is walrus."], mode


# ---- metadata filters ------------------------------------------------------------------------

SOURCES = [
    DocumentInput(
        f"{source}-{year}",
        f"The {source} policy of {year} covers travel expenses.",
        {"source": source, "year": year, "tags": [source, "policy"]},
    )
    for source in ("hr", "it", "legal")
    for year in (2023, 2024, 2025)
]


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
@pytest.mark.parametrize(
    "filters, expected",
    [
        ({"source": "hr"}, {"hr-2023", "hr-2024", "hr-2025"}),
        ({"source": "hr", "year": {"in": [2024, 2025]}}, {"hr-2024", "hr-2025"}),
        ({"year": {"in": [2025, "2024"]}}, {"hr-2025", "it-2025", "legal-2025"}),  # "2024" is a string: no match
        ({"tags": "policy", "source": {"in": ["it", "legal"]}, "year": 2023}, {"it-2023", "legal-2023"}),  # list member
        ({"source": "finance"}, set()),
    ],
)
def test_filters_keep_only_matching_documents_in_every_mode(store, mode, filters, expected):
    pipeline, _, _ = pipeline_over(store)
    run(pipeline.ingest("t", "kb", SOURCES))
    hits = run(pipeline.retrieve("t", "kb", "travel expenses policy", top_k=9, mode=mode, filters=filters))
    assert {h.document_id for h in hits} == expected


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_a_filtered_query_still_gets_top_k_when_the_matches_rank_below_the_candidates(store, mode):
    # Ten unfiltered documents match the question better than the four "archive" ones; each search takes
    # only 3 candidates. Filtering after the search would leave nothing; filtering inside it finds all 4.
    docs = [DocumentInput(f"best-{i}", f"Reactor cooling pumps and reactor valves, note {i}.") for i in range(10)]
    docs += [DocumentInput(f"old-{i}", f"Archive entry {i}: reactor.", {"shelf": "archive"}) for i in range(4)]
    pipeline = RagPipeline(FakeEmbedder(), LocalIndex(store, FusionSettings(candidates=3)), PipelineSettings())
    run(pipeline.ingest("t", "kb", docs))
    question = "reactor cooling pumps valves"
    assert not {h.document_id for h in run(pipeline.retrieve("t", "kb", question, top_k=3, mode=mode))} & {
        f"old-{i}" for i in range(4)
    }
    hits = run(pipeline.retrieve("t", "kb", question, top_k=3, mode=mode, filters={"shelf": "archive"}))
    assert len(hits) == 3 and all(h.document_id.startswith("old-") for h in hits)


def test_an_invalid_filter_is_an_invalid_query_before_any_work():
    embedder, index = FakeEmbedder(), RecordingIndex()
    pipeline = RagPipeline(embedder, index, PipelineSettings())
    with pytest.raises(InvalidQuery, match=r"filters\.year: unknown operator 'gt'"):
        run(pipeline.retrieve("t", "kb", "q", filters={"year": {"gt": 2020}}))
    assert embedder.queries == [] and index.queries == []


# ---- citations ---------------------------------------------------------------------------------


def test_citations_carry_offsets_into_the_ingested_text_and_the_metadata(store):
    pipeline, _, _ = pipeline_over(store)
    run(pipeline.ingest("t", "kb", DOCS))
    texts = {doc.id: doc.text for doc in DOCS}
    result = run(pipeline.answer("t", "kb", "How much power does the Zorblax reactor produce?", top_k=5, min_score=-1))
    assert len(result.citations) == 5
    for citation in result.citations:
        assert texts[citation["document_id"]][citation["start"] : citation["end"]] == citation["text"]
    by_id = {c["chunk_id"]: c for c in result.citations}
    assert by_id["reactor#1"]["start"] == DOCS[0].text.index("It produces") and by_id["reactor#1"]["metadata"] == {
        "src": "r"
    }


# ---- the no-answer threshold ---------------------------------------------------------------------


def test_below_min_score_the_model_is_not_asked_and_nothing_is_cited():
    hit = RetrievedChunk("d", "d#0", 0.02, "unrelated passage")
    chat = FakeChat()
    pipeline = RagPipeline(
        FakeEmbedder(), RecordingIndex([hit], best_similarity=0.2), PipelineSettings(min_score=0.3), chat=chat
    )
    result = run(pipeline.answer("t", "kb", "q"))
    assert result.reply is None and result.citations == [] and chat.calls == []
    assert (result.grounding.answerable, result.grounding.best_similarity, result.grounding.min_score) == (
        False,
        0.2,
        0.3,
    )
    # The request's own min_score overrides the profile's, either way.
    assert run(pipeline.answer("t", "kb", "q", min_score=0.1)).reply == "the answer"
    strict = RagPipeline(
        FakeEmbedder(), RecordingIndex([hit], best_similarity=0.5), PipelineSettings(min_score=0.3), chat=chat
    )
    assert run(strict.answer("t", "kb", "q")).reply == "the answer"
    assert run(strict.answer("t", "kb", "q", min_score=0.6)).reply is None


def test_the_threshold_reads_the_best_similarity_not_the_fused_score():
    # A fused (RRF) score of 0.016 is normal for a perfect hit; only the similarity decides.
    hit = RetrievedChunk("d", "d#0", 1 / 61, "passage")
    pipeline = RagPipeline(
        FakeEmbedder(), RecordingIndex([hit], best_similarity=0.8), PipelineSettings(min_score=0.3), chat=FakeChat()
    )
    grounding = run(pipeline.ground("t", "kb", "q"))
    assert grounding.answerable and grounding.citations[0]["score"] == round(1 / 61, 6)


def test_nothing_retrieved_is_never_answered_and_lexical_mode_answers_any_match(store):
    pipeline, _, chat = pipeline_over(store, min_score=-1.0)
    run(pipeline.ingest("t", "kb", DOCS))
    assert run(pipeline.answer("t", "kb", "Zorblax?", filters={"src": "none"})).reply is None  # filtered to nothing
    lexical, _, _ = pipeline_over(store, retrieval="lexical", min_score=0.99)
    assert run(lexical.ground("t", "kb", "kitten")).answerable is False  # no term matched
    grounding = run(lexical.ground("t", "kb", "megawatts"))  # lexical has no similarity: the threshold cannot apply
    assert grounding.answerable and grounding.best_similarity is None


def test_chat_below_the_threshold_keeps_the_messages_unchanged():
    pipeline = RagPipeline(
        FakeEmbedder(),
        RecordingIndex([RetrievedChunk("d", "d#0", 0.1, "x")], best_similarity=0.1),
        PipelineSettings(min_score=0.3),
    )
    messages = [{"role": "user", "content": "a question"}]
    augmented, grounding = run(pipeline.augment_chat("t", "kb", messages))
    assert augmented == messages and not grounding.answerable and grounding.citations == []


# ---- the context budget ----------------------------------------------------------------------------
def _words(n: int, word: str = "w") -> str:
    return " ".join([word] * n)


def test_fit_context_keeps_the_best_passages_that_fit_in_rank_order():
    from rag.retrieval.prompt import fit_context

    hits = [
        RetrievedChunk("a", "a#0", 0.9, _words(50)),
        RetrievedChunk("b", "b#0", 0.8, _words(40)),
        RetrievedChunk("c", "c#0", 0.7, _words(5)),
    ]
    count = lambda text: len(text.split())  # noqa: E731
    assert fit_context(hits, None, count) == hits
    assert fit_context(hits, 95, count) == hits
    assert fit_context(hits, 90, count) == hits[:2]
    # The third, shorter passage is not pulled in ahead of the second one that did not fit.
    assert fit_context(hits, 60, count) == hits[:1]


def test_fit_context_cuts_a_first_passage_longer_than_the_budget_at_a_word():
    from rag.retrieval.prompt import fit_context

    text = " ".join(f"word{i}" for i in range(100))
    hit = RetrievedChunk("a", "a#0", 0.9, text, start=1000, end=1000 + len(text))
    [cut] = fit_context([hit, RetrievedChunk("b", "b#0", 0.5, "x")], 10, lambda t: len(t.split()))
    assert text.startswith(cut.text) and 0 < len(cut.text.split()) <= 10 and not cut.text.endswith(" ")
    assert (cut.start, cut.end) == (1000, 1000 + len(cut.text)) and cut.citation()["end"] == cut.end


def test_answer_prompts_and_cites_only_what_fits_the_budget():
    hits = [RetrievedChunk("d", f"d#{i}", 1.0 - i / 10, _words(30, f"p{i}")) for i in range(4)]
    chat = FakeChat()
    pipeline = RagPipeline(
        FakeEmbedder(),
        RecordingIndex(hits),
        PipelineSettings(context_tokens=70),
        chat=chat,
        count_tokens=lambda text: len(text.split()),
    )
    result = run(pipeline.answer("t", "kb", "q"))
    assert [h.chunk_id for h in result.grounding.hits] == ["d#0", "d#1"]
    system = chat.calls[0]["messages"][0]["content"]
    assert "[2] p1" in system and "p2" not in system
    # A request may ask for fewer tokens, not more than the profile allows.
    result = run(pipeline.answer("t", "kb", "q", context_tokens=40))
    assert [h.chunk_id for h in result.grounding.hits] == ["d#0"]
    with pytest.raises(InvalidQuery, match="context_tokens 100 is above the limit of 70"):
        run(pipeline.answer("t", "kb", "q", context_tokens=100))
    unlimited = RagPipeline(
        FakeEmbedder(),
        RecordingIndex(hits),
        PipelineSettings(),
        chat=FakeChat(),
        count_tokens=lambda text: len(text.split()),
    )
    assert len(run(unlimited.answer("t", "kb", "q", context_tokens=40)).grounding.hits) == 1
    _, grounding = run(pipeline.augment_chat("t", "kb", [{"role": "user", "content": "q"}], context_tokens=30))
    assert [h.chunk_id for h in grounding.hits] == ["d#0"]
