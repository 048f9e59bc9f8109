import json

import pytest

from rag.retrieval.prompt import (
    SYSTEM_INSTRUCTION,
    RetrievedChunk,
    augment_chat,
    citations,
    context_block,
    last_user_text,
    rag_messages,
)

CHUNKS = [
    RetrievedChunk("doc-a", "doc-a#0", 0.91234567, "  Paris is the capital of France.\n", {"source": "atlas"}),
    RetrievedChunk("doc-b", "doc-b#3", 0.5, "The Seine flows through Paris.", start=120, end=150),
    RetrievedChunk("doc-a", "doc-a#1", 0.1, "France uses the euro."),
]


def test_rag_messages_numbers_chunks_in_order_after_the_instruction():
    messages = rag_messages("What is the capital of France?", CHUNKS)
    assert [m["role"] for m in messages] == ["system", "user"]
    system = messages[0]["content"]
    assert system.startswith(SYSTEM_INSTRUCTION + "\n\nContext:\n")
    context = system[len(SYSTEM_INSTRUCTION) :]  # the instruction itself mentions [1], [2]
    assert "[1] Paris is the capital of France." in context  # text stripped
    assert "[2] The Seine flows through Paris." in context
    assert "[3] France uses the euro." in context
    assert "[4]" not in context
    assert context.index("[1]") < context.index("[2]") < context.index("[3]")
    assert messages[1] == {"role": "user", "content": "What is the capital of France?"}


def test_instruction_asks_for_citations_and_honesty():
    assert "[1]" in SYSTEM_INSTRUCTION
    assert "don't know" in SYSTEM_INSTRUCTION
    assert "only" in SYSTEM_INSTRUCTION


def test_context_block_exact_format():
    assert context_block(CHUNKS[1:]) == ("Context:\n[1] The Seine flows through Paris.\n\n[2] France uses the euro.")


def test_no_chunks_says_so():
    assert context_block([]) == "Context: (no passages found)"
    messages = rag_messages("anything?", [])
    assert messages[0]["content"] == f"{SYSTEM_INSTRUCTION}\n\nContext: (no passages found)"
    assert "[1]" not in messages[0]["content"].replace(SYSTEM_INSTRUCTION, "")


def test_rag_messages_keeps_history_before_the_question_and_does_not_mutate_it():
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    before = json.dumps(history)
    messages = rag_messages("Capital of France?", CHUNKS, history=history)
    assert messages[1:] == [*history, {"role": "user", "content": "Capital of France?"}]
    assert json.dumps(history) == before


def test_rag_messages_with_empty_question_adds_no_user_turn():
    assert rag_messages("", CHUNKS) == [rag_messages("q", CHUNKS)[0]]


def test_augment_chat_prepends_context_and_keeps_client_messages():
    client = [
        {"role": "system", "content": "You are a pirate. Answer like one."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Arr, Paris."},
        {"role": "user", "content": "And its river?"},
    ]
    before = json.dumps(client)
    messages = augment_chat(client, CHUNKS)
    assert len(messages) == len(client) + 1
    assert messages[0]["role"] == "system"
    assert messages[0]["content"].startswith(SYSTEM_INSTRUCTION)
    assert "[2] The Seine flows through Paris." in messages[0]["content"]
    # The client's system message survives, after ours, and the conversation is unchanged and in order.
    assert messages[1:] == client
    assert messages[1] == {"role": "system", "content": "You are a pirate. Answer like one."}
    assert json.dumps(client) == before


def test_augment_chat_does_not_append_an_extra_user_turn():
    client = [{"role": "user", "content": "Q?"}]
    messages = augment_chat(client, [])
    assert messages[1:] == client
    assert sum(m["role"] == "user" for m in messages) == 1


def test_last_user_text_picks_the_latest_user_turn():
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "another answer"},
    ]
    assert last_user_text(messages) == "second question"


def test_last_user_text_joins_list_content_text_parts():
    messages = [
        {"role": "user", "content": "older"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in"},
                {"type": "image_url", "image_url": {"url": "http://example.com/x.png"}},
                "not-a-dict part",
                {"type": "text", "text": "this picture?"},
            ],
        },
    ]
    assert last_user_text(messages) == "What is in  this picture?"
    assert last_user_text(messages).split() == ["What", "is", "in", "this", "picture?"]


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "system", "content": "only system"}],
        [{"role": "assistant", "content": "only assistant"}],
    ],
)
def test_last_user_text_without_user_turn_is_empty(messages):
    assert last_user_text(messages) == ""


def test_last_user_text_skips_user_turn_without_usable_content():
    messages = [{"role": "user", "content": "usable"}, {"role": "user", "content": None}]
    assert last_user_text(messages) == "usable"
    assert last_user_text([{"role": "user"}]) == ""


def test_citations_carry_the_fields():
    result = citations(CHUNKS)
    assert result == [
        {
            "document_id": "doc-a",
            "chunk_id": "doc-a#0",
            "score": 0.912346,
            "text": "  Paris is the capital of France.\n",
            "start": None,
            "end": None,
            "metadata": {"source": "atlas"},
        },
        {
            "document_id": "doc-b",
            "chunk_id": "doc-b#3",
            "score": 0.5,
            "text": "The Seine flows through Paris.",
            "start": 120,
            "end": 150,
            "metadata": {},
        },
        {
            "document_id": "doc-a",
            "chunk_id": "doc-a#1",
            "score": 0.1,
            "text": "France uses the euro.",
            "start": None,
            "end": None,
            "metadata": {},
        },
    ]
    json.dumps(result)  # JSON-serialisable


def test_citation_score_is_a_plain_float_even_from_numpy():
    import numpy as np

    chunk = RetrievedChunk("d", "d#0", np.float32(0.123456789), "t")
    score = chunk.citation()["score"]
    assert type(score) is float
    assert score == pytest.approx(0.123457, abs=1e-6)
    json.dumps(chunk.citation())


def test_citations_of_nothing_is_empty():
    assert citations([]) == []
