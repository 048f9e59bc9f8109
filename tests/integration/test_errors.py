"""Every client mistake is a 4xx whose message names the problem: never a 500, never a hang."""

from __future__ import annotations

import pytest

CHAT = "/v1/chat/completions"
MODEL = "smollm2-135m-instruct"


def _message(response) -> str:
    return response.json()["error"]["message"]


def test_malformed_json_is_400(client):
    response = client.post(CHAT, content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"})
    assert response.status_code == 400 and "JSON" in _message(response)


def test_missing_field_names_the_field(client):
    response = client.post(CHAT, json={"model": MODEL})
    assert response.status_code in (400, 422) and "messages" in _message(response)


def test_unknown_model_is_404(client):
    response = client.post(CHAT, json={"model": "gpt-17", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 404 and "gpt-17" in _message(response)


def test_unknown_embedding_model_is_404(client):
    response = client.post("/v1/embeddings", json={"model": "nope-embed", "input": "hi"})
    assert response.status_code == 404


def test_over_long_prompt_is_400_saying_so(client):
    response = client.post(CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": "word " * 6000}]})
    assert response.status_code == 400 and "context" in _message(response)


def test_over_long_rag_question_is_413(client):
    client.post("/v1/collections/errs/documents", json={"documents": [{"id": "d", "text": "Some text."}]})
    response = client.post("/v1/rag/query", json={"collection": "errs", "question": "why " * 6000})
    # 24,000 characters: over rag.max_question_chars (8,000) before it could reach the context limit; no
    # request could carry it (413)
    assert response.status_code == 413 and "rag.max_question_chars" in _message(response)


def test_openai_client_sees_bad_request_for_long_prompt(openai_client):
    import openai

    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 6000}])


@pytest.mark.parametrize(
    "method,path",
    [
        ("get", "/v1/collections/no-such-collection"),
        ("delete", "/v1/collections/no-such-collection/documents/x"),
    ],
)
def test_unknown_collection_is_404(client, method, path):
    response = getattr(client, method)(path)
    assert response.status_code == 404 and "no-such-collection" in _message(response)


def test_unknown_collection_in_rag_is_404(client, openai_client):
    import openai

    response = client.post("/v1/rag/query", json={"collection": "no-such-collection", "question": "hi"})
    assert response.status_code == 404
    with pytest.raises(openai.NotFoundError):
        openai_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"rag": {"collection": "no-such-collection"}},
        )


def test_unknown_document_delete_is_404(client):
    client.post("/v1/collections/errs/documents", json={"documents": [{"id": "d", "text": "Some text."}]})
    response = client.delete("/v1/collections/errs/documents/missing-doc")
    assert response.status_code == 404 and "missing-doc" in _message(response)


@pytest.mark.parametrize("name", ["..%2F..%2Fetc", "a%2Fb", "%2E%2E", "x" * 300, "bad%00name", "%2Fabs", "a%5Cb"])
def test_path_like_or_absurd_collection_names_are_400(client, name):
    response = client.post(f"/v1/collections/{name}/documents", json={"documents": [{"id": "d", "text": "t"}]})
    assert response.status_code == 400, response.text
    assert "collection name" in _message(response)


@pytest.mark.parametrize("doc_id", ["../x", "a/b", "y" * 500, ""])
def test_path_like_document_ids_are_400(client, doc_id):
    response = client.post("/v1/collections/errs/documents", json={"documents": [{"id": doc_id, "text": "t"}]})
    assert response.status_code == 400 and "document id" in _message(response)


def test_path_like_collection_in_rag_is_400(client):
    response = client.post("/v1/rag/query", json={"collection": "../etc", "question": "hi"})
    assert response.status_code == 400


def test_top_k_over_limit_is_400(client):
    client.post("/v1/collections/errs/documents", json={"documents": [{"id": "d", "text": "Some text."}]})
    response = client.post("/v1/rag/query", json={"collection": "errs", "question": "hi", "top_k": 10_000})
    assert response.status_code == 400 and "top_k" in _message(response)


def test_body_over_limit_is_413(client):
    response = client.post(
        "/v1/collections/errs/documents", content=b"x" * (9 * 2**20), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


def test_unknown_route_is_openai_shaped_404(client):
    response = client.get("/v1/no-such-route")
    assert response.status_code == 404 and "no route" in _message(response)


def test_empty_documents_list_is_rejected(client):
    response = client.post("/v1/collections/errs/documents", json={"documents": []})
    assert response.status_code in (400, 422) and "documents" in _message(response)


def test_unknown_rag_field_is_rejected(client):
    response = client.post(
        CHAT,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "rag": {"collection": "errs", "bogus": 1},
        },
    )
    assert response.status_code in (400, 422) and "bogus" in _message(response)


def test_over_long_completion_prompt_is_400(client):
    response = client.post("/v1/completions", json={"model": MODEL, "prompt": "word " * 6000})
    assert response.status_code == 400 and "context" in _message(response)


def test_content_parts_are_accepted(client):
    response = client.post(
        CHAT,
        json={
            "model": MODEL,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}],
        },
    )
    assert response.status_code == 200, response.text
