"""Knowledge bases and RAG over them: ingest, cite, stream, replace, delete."""

from __future__ import annotations

import json

import httpx

ZORB = ("The Zorblax reactor was invented by Dr. Mira Quell in 2031 at the Tallin Institute. "
        "It runs on liquid helium and produces 40 megawatts of power.")
FILLER = [
    ("cats", "Cats are small domesticated carnivores. They sleep around fifteen hours per day."),
    ("bread", "Sourdough bread is leavened with a culture of wild yeast and lactic acid bacteria."),
    ("tides", "Ocean tides are caused mainly by the gravitational pull of the Moon on the Earth."),
]


def _ingest(client, collection: str, docs: list[tuple[str, str]]):
    response = client.post(f"/v1/collections/{collection}/documents",
                           json={"documents": [{"id": i, "text": t, "metadata": {"src": i}} for i, t in docs]})
    assert response.status_code == 200, response.text
    return response.json()


def test_ingest_reports_chunks_per_document(client):
    long_text = " ".join(f"Paragraph {n} talks about topic number {n} in some detail." for n in range(200))
    body = _ingest(client, "ingest-demo", [("long", long_text), ("short", "A short note.")])
    counts = {d["id"]: d["chunks"] for d in body["documents"]}
    assert counts["short"] == 1 and counts["long"] > 3
    info = client.get("/v1/collections/ingest-demo").json()
    assert info["chunk_count"] == counts["long"] + 1 == info["indexed_vectors"]


def test_rag_query_cites_the_right_document_first_and_states_the_fact(client):
    _ingest(client, "facts", [("zorblax", ZORB), *FILLER])
    response = client.post("/v1/rag/query", json={"collection": "facts", "question": "Who invented the Zorblax reactor?",
                                                  "top_k": 3, "temperature": 0})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["citations"][0]["document_id"] == "zorblax"
    assert [c["score"] for c in body["citations"]] == sorted((c["score"] for c in body["citations"]), reverse=True)
    assert {"document_id", "chunk_id", "score", "text"} <= set(body["citations"][0])
    assert "Quell" in body["answer"]
    assert body["usage"]["completion_tokens"] > 0


def test_rag_query_stream_sends_citations_and_answer(client):
    _ingest(client, "facts", [("zorblax", ZORB), *FILLER])
    events = []
    with client.stream("POST", "/v1/rag/query", json={"collection": "facts", "question": "How much power does the Zorblax reactor produce?",
                                                      "top_k": 2, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert parsed[0]["object"] == "rag.citations" and parsed[0]["citations"][0]["document_id"] == "zorblax"
    answer = "".join(e["delta"] for e in parsed if e["object"] == "rag.delta")
    assert "40" in answer
    assert any(e["object"] == "rag.usage" for e in parsed)


def test_chat_completions_with_rag_extra_body(openai_client, client):
    _ingest(client, "facts", [("zorblax", ZORB), *FILLER])
    response = openai_client.chat.completions.create(
        model="smollm2-135m-instruct", temperature=0, max_tokens=40,
        messages=[{"role": "user", "content": "Who invented the Zorblax reactor?"}],
        extra_body={"rag": {"collection": "facts", "top_k": 2}},
    )
    citations = response.model_extra["citations"]
    assert citations[0]["document_id"] == "zorblax"
    assert "Quell" in response.choices[0].message.content


def test_chat_completions_with_rag_stream_puts_citations_on_first_chunk(openai_client, client):
    _ingest(client, "facts", [("zorblax", ZORB), *FILLER])
    stream = openai_client.chat.completions.create(
        model="smollm2-135m-instruct", temperature=0, max_tokens=20, stream=True,
        messages=[{"role": "user", "content": "Who invented the Zorblax reactor?"}],
        extra_body={"rag": {"collection": "facts", "top_k": 2}},
    )
    chunks = list(stream)
    assert chunks[0].model_extra["citations"][0]["document_id"] == "zorblax"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_reposting_a_document_replaces_it(client):
    _ingest(client, "replace", [("doc", "The secret code word is pelican.")])
    _ingest(client, "replace", [("doc", "The secret code word is walrus.")])
    info = client.get("/v1/collections/replace").json()
    assert info["document_count"] == 1 and info["indexed_vectors"] == info["chunk_count"] == 1
    hits = client.post("/v1/rag/query", json={"collection": "replace", "question": "What is the secret code word?",
                                              "top_k": 5}).json()["citations"]
    assert len(hits) == 1 and "walrus" in hits[0]["text"]


def test_delete_document_and_listing(client):
    _ingest(client, "deleting", [("a", "Alpha document."), ("b", "Beta document.")])
    names = {c["name"] for c in client.get("/v1/collections").json()["data"]}
    assert "deleting" in names
    assert client.delete("/v1/collections/deleting/documents/a").status_code == 200
    info = client.get("/v1/collections/deleting").json()
    assert [d["id"] for d in info["documents"]] == ["b"] and info["indexed_vectors"] == 1
    assert client.delete("/v1/collections/deleting/documents/a").status_code == 404


def test_rag_on_empty_results_still_answers(client):
    _ingest(client, "tiny", [("only", "Nothing but this sentence.")])
    response = client.post("/v1/rag/query", json={"collection": "tiny", "question": "What is the airspeed of a swallow?",
                                                  "top_k": 1, "max_tokens": 16})
    assert response.status_code == 200 and len(response.json()["citations"]) == 1


def test_healthz_needs_no_key(stack):
    assert httpx.get(f"{stack.url}/healthz", timeout=30).status_code == 200
