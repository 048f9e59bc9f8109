"""The OpenAI-compatible surface, driven with the real `openai` client."""

from __future__ import annotations

import numpy as np

CHAT_MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "all-minilm-l6-v2"


def test_models_lists_chat_and_embedding_models(openai_client):
    ids = {model.id for model in openai_client.models.list().data}
    assert {CHAT_MODEL, EMBED_MODEL} <= ids


def test_chat_non_stream_answers_and_reports_usage(openai_client):
    response = openai_client.chat.completions.create(
        model=CHAT_MODEL,
        temperature=0,
        max_tokens=24,
        messages=[{"role": "user", "content": "Reply with one word: what colour is the sky on a clear day?"}],
    )
    assert response.choices[0].message.content.strip()
    assert response.usage.prompt_tokens > 10
    assert 0 < response.usage.completion_tokens <= 24
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_chat_stream_yields_deltas_that_match_non_stream(openai_client):
    messages = [{"role": "user", "content": "Count from one to five in words."}]
    full = openai_client.chat.completions.create(model=CHAT_MODEL, temperature=0, max_tokens=20, messages=messages)
    stream = openai_client.chat.completions.create(
        model=CHAT_MODEL,
        temperature=0,
        max_tokens=20,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(pieces) == full.choices[0].message.content
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens


def test_chat_stream_without_usage_option_has_no_usage_chunk(openai_client):
    stream = openai_client.chat.completions.create(
        model=CHAT_MODEL,
        temperature=0,
        max_tokens=8,
        stream=True,
        messages=[{"role": "user", "content": "Say hello."}],
    )
    chunks = list(stream)
    assert chunks and all(chunk.choices for chunk in chunks)


def test_embeddings_are_unit_vectors_and_semantic(openai_client):
    response = openai_client.embeddings.create(
        model=EMBED_MODEL,
        input=["A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell sharply."],
    )
    vectors = np.array([item.embedding for item in response.data])
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert response.usage.prompt_tokens > 0


def test_embeddings_float_format_matches_base64(client):
    body = {"model": EMBED_MODEL, "input": "hello world"}
    as_float = client.post("/v1/embeddings", json={**body, "encoding_format": "float"}).json()
    as_b64 = client.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    import base64

    decoded = np.frombuffer(base64.b64decode(as_b64["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, as_float["data"][0]["embedding"], atol=1e-6)


def test_completions_endpoint_works(openai_client):
    response = openai_client.completions.create(
        model=CHAT_MODEL, prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert response.choices[0].text
    assert response.usage.completion_tokens > 0


def test_healthz_is_ok_when_running(stack):
    import httpx

    assert httpx.get(f"{stack.url}/healthz", timeout=30).status_code == 200
