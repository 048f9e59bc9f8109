"""LangChain's own OpenAI integration against the gateway, unchanged: chat, streaming, embeddings.

The settings a user gives LangChain are the README's: base_url `<gateway>/v1`, the tenant key, the model
ids from /v1/models. `check_embedding_ctx_length=False` is LangChain's switch for servers that are not
OpenAI's: without it OpenAIEmbeddings tokenizes with tiktoken (a download) and sends token ids.
"""

from __future__ import annotations

import math

from tests.integration.conftest import DEMO_KEY

CHAT_MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "all-minilm-l6-v2"


def test_langchain_chat_invoke_and_stream(stack):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        base_url=f"{stack.url}/v1",
        api_key=DEMO_KEY,
        model=CHAT_MODEL,
        temperature=0,
        max_tokens=16,
        timeout=120,
        max_retries=0,
    )
    answer = chat.invoke("Reply with one word: what colour is grass?")
    assert answer.content.strip()
    assert answer.usage_metadata and answer.usage_metadata["output_tokens"] <= 16
    streamed = list(chat.stream("Reply with one word: what colour is grass?"))
    assert len(streamed) > 1 and "".join(piece.content for piece in streamed) == answer.content


def test_langchain_embeddings_are_unit_vectors_of_the_models_size(stack):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        base_url=f"{stack.url}/v1",
        api_key=DEMO_KEY,
        model=EMBED_MODEL,
        check_embedding_ctx_length=False,
        timeout=120,
        max_retries=0,
    )
    documents = embeddings.embed_documents(["The sky is blue.", "Grass is green."])
    query = embeddings.embed_query("What colour is the sky?")
    assert len(documents) == 2 and all(len(vector) == 384 for vector in [*documents, query])
    assert all(math.isclose(math.fsum(x * x for x in vector), 1.0, abs_tol=1e-3) for vector in documents)
    similarity = [math.fsum(a * b for a, b in zip(query, vector)) for vector in documents]
    assert similarity[0] > similarity[1]  # the sky question is closer to the sky sentence
