"""Knowledge bases and RAG over them: ingest, cite, stream, replace, delete."""

from __future__ import annotations

import json

import httpx

ZORB = (
    "The Zorblax reactor was invented by Dr. Mira Quell in 2031 at the Tallin Institute. "
    "It runs on liquid helium and produces 40 megawatts of power."
)
FILLER = [
    ("cats", "Cats are small domesticated carnivores. They sleep around fifteen hours per day."),
    ("bread", "Sourdough bread is leavened with a culture of wild yeast and lactic acid bacteria."),
    ("tides", "Ocean tides are caused mainly by the gravitational pull of the Moon on the Earth."),
]


def _ingest(client, collection: str, docs: list[tuple[str, str]]):
    response = client.post(
        f"/v1/collections/{collection}/documents",
        json={"documents": [{"id": i, "text": t, "metadata": {"src": i}} for i, t in docs]},
    )
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
    response = client.post(
        "/v1/rag/query",
        json={"collection": "facts", "question": "Who invented the Zorblax reactor?", "top_k": 3, "temperature": 0},
    )
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
    with client.stream(
        "POST",
        "/v1/rag/query",
        json={
            "collection": "facts",
            "question": "How much power does the Zorblax reactor produce?",
            "top_k": 2,
            "stream": True,
        },
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert parsed[0]["object"] == "rag.citations" and parsed[0]["citations"][0]["document_id"] == "zorblax"
    answer = "".join(e["delta"] for e in parsed if e["object"] == "rag.delta")
    assert "40" in answer
    assert any(e["object"] == "rag.usage" for e in parsed)


CAPPED = "Explain in detail everything the context says about the Zorblax reactor: who, when, where, how and why."
CAP = 40


def _ends_at_a_sentence(text: str) -> bool:
    from rag.retrieval.answer_trim import last_sentence_end

    return bool(text) and last_sentence_end(text) == len(text)


def test_a_capped_rag_answer_ends_at_its_last_sentence_streamed_or_not(client, openai_client):
    """An answer that hits max_tokens ends at its last complete sentence (rag.trim_capped_answers), says so
    (finish_reason "length") and is charged every generated token; the stream holds back only the partial
    sentence and sends the same text."""
    _ingest(client, "facts", [("zorblax", ZORB), *FILLER])
    ask = {"collection": "facts", "question": CAPPED, "top_k": 2, "max_tokens": CAP, "temperature": 0}
    body = client.post("/v1/rag/query", json=ask).json()
    assert body["finish_reason"] == "length" and body["usage"]["completion_tokens"] == CAP
    assert _ends_at_a_sentence(body["answer"]), body["answer"]
    events = []
    with client.stream("POST", "/v1/rag/query", json={**ask, "stream": True}) as response:
        for line in response.iter_lines():  # bounded by the client's timeout
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: ") :]))
    assert "".join(e["delta"] for e in events if e["object"] == "rag.delta") == body["answer"]
    assert [e["finish_reason"] for e in events if e["object"] == "rag.finish"] == ["length"]
    assert [e["usage"]["completion_tokens"] for e in events if e["object"] == "rag.usage"] == [CAP]

    chat = dict(
        model="smollm2-135m-instruct",
        temperature=0,
        max_tokens=CAP,
        messages=[{"role": "user", "content": CAPPED}],
        extra_body={"rag": {"collection": "facts", "top_k": 2}},
    )
    response = openai_client.chat.completions.create(**chat)
    content = response.choices[0].message.content
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == CAP
    assert _ends_at_a_sentence(content), content
    chunks = list(openai_client.chat.completions.create(**chat, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_context_tokens_keep_the_best_passages_that_fit_and_shorten_the_prompt(openai_client, client):
    _ingest(client, "budget", [("zorblax", ZORB), *FILLER])
    ask = {
        "collection": "budget",
        "question": "Who invented the Zorblax reactor?",
        "top_k": 4,
        "max_tokens": 4,
        "min_score": -1,
    }
    whole = client.post("/v1/rag/query", json=ask).json()
    # ZORB is about 40 of SmolLM2's tokens and each filler about 20: 45 holds the best passage alone.
    budgeted = client.post("/v1/rag/query", json={**ask, "context_tokens": 45}).json()
    assert len(whole["citations"]) == 4
    assert [c["document_id"] for c in budgeted["citations"]] == ["zorblax"]
    assert budgeted["citations"][0]["text"] == ZORB
    assert budgeted["usage"]["prompt_tokens"] < whole["usage"]["prompt_tokens"] - 40
    # Cut to fit: a budget shorter than the best passage keeps its beginning, offsets moved to match.
    cut = client.post("/v1/rag/query", json={**ask, "context_tokens": 10}).json()["citations"]
    assert len(cut) == 1 and ZORB.startswith(cut[0]["text"]) and len(cut[0]["text"]) < len(ZORB)
    assert cut[0]["end"] - cut[0]["start"] == len(cut[0]["text"])
    response = openai_client.chat.completions.create(
        model="smollm2-135m-instruct",
        temperature=0,
        max_tokens=4,
        messages=[{"role": "user", "content": "Who invented the Zorblax reactor?"}],
        extra_body={"rag": {"collection": "budget", "top_k": 4, "context_tokens": 45}},
    )
    assert [c["document_id"] for c in response.model_extra["citations"]] == ["zorblax"]
    bad = client.post("/v1/rag/query", json={**ask, "context_tokens": 0})
    assert bad.status_code in (400, 422) and "context_tokens" in bad.text


def test_chat_completions_with_rag_extra_body(openai_client, client):
    _ingest(client, "facts", [("zorblax", ZORB), *FILLER])
    response = openai_client.chat.completions.create(
        model="smollm2-135m-instruct",
        temperature=0,
        max_tokens=40,
        messages=[{"role": "user", "content": "Who invented the Zorblax reactor?"}],
        extra_body={"rag": {"collection": "facts", "top_k": 2}},
    )
    citations = response.model_extra["citations"]
    assert citations[0]["document_id"] == "zorblax"
    assert "Quell" in response.choices[0].message.content


def test_chat_completions_with_rag_stream_puts_citations_on_first_chunk(openai_client, client):
    _ingest(client, "facts", [("zorblax", ZORB), *FILLER])
    stream = openai_client.chat.completions.create(
        model="smollm2-135m-instruct",
        temperature=0,
        max_tokens=20,
        stream=True,
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
    hits = client.post(
        "/v1/rag/query", json={"collection": "replace", "question": "What is the secret code word?", "top_k": 5}
    ).json()["citations"]
    assert len(hits) == 1 and "walrus" in hits[0]["text"]


def test_delete_document_and_listing(client):
    _ingest(client, "deleting", [("a", "Alpha document."), ("b", "Beta document.")])
    names = {c["name"] for c in client.get("/v1/collections").json()["data"]}
    assert "deleting" in names
    assert client.delete("/v1/collections/deleting/documents/a").status_code == 200
    info = client.get("/v1/collections/deleting").json()
    assert info["document_count"] == 1 and info["indexed_vectors"] == 1 and "documents" not in info
    listed = client.get("/v1/collections/deleting/documents", params={"limit": 1}).json()
    assert [d["id"] for d in listed["data"]] == ["b"] and listed["has_more"] is False
    _ingest(client, "deleting", [("c", "Gamma document."), ("d", "Delta document.")])
    first = client.get("/v1/collections/deleting/documents", params={"limit": 2}).json()
    rest = client.get("/v1/collections/deleting/documents", params={"limit": 2, "after": first["last_id"]}).json()
    assert ([d["id"] for d in first["data"]], first["has_more"]) == (["b", "c"], True)
    assert ([d["id"] for d in rest["data"]], rest["has_more"]) == (["d"], False)
    assert rest["data"][0]["metadata"] == {"src": "d"}
    assert client.delete("/v1/collections/deleting/documents/a").status_code == 404


def test_an_unrelated_question_gets_the_no_answer_reply_without_generating(client, openai_client):
    from rag.retrieval.no_answer import NO_ANSWER

    _ingest(client, "facts", [("zorblax", ZORB), *FILLER])
    question = "How many players are on the field in a rugby union team?"
    body = client.post("/v1/rag/query", json={"collection": "facts", "question": question}).json()
    assert body["answer"] == NO_ANSWER and body["citations"] == [] and body["refused"] is True, body
    assert body["best_similarity"] < 0.3 and body["usage"]["completion_tokens"] == 0
    # The request may lower the threshold: then it is answered from the closest passages, as before.
    lowered = client.post(
        "/v1/rag/query",
        json={"collection": "facts", "question": question, "top_k": 1, "max_tokens": 8, "min_score": -1},
    ).json()
    assert lowered["refused"] is False and len(lowered["citations"]) == 1 and lowered["usage"]["completion_tokens"] > 0
    chat = openai_client.chat.completions.create(
        model="smollm2-135m-instruct",
        max_tokens=8,
        messages=[{"role": "user", "content": question}],
        extra_body={"rag": {"collection": "facts"}},
    )
    assert chat.choices[0].message.content == NO_ANSWER and chat.model_extra["citations"] == []
    assert chat.model_extra["refused"] is True and chat.usage.total_tokens == 0


# ---- metadata filters, offsets, search -----------------------------------------------------------

POLICIES = [
    ("hr-2023", "Travel policy 2023: employees may book economy class for flights under six hours.", "hr", 2023),
    ("hr-2024", "Travel policy 2024: employees may book premium economy for flights over six hours.", "hr", 2024),
    ("hr-2025", "Travel policy 2025: employees may book business class for flights over ten hours.", "hr", 2025),
    ("it-2025", "Laptop policy 2025: employees may book a new laptop every three years.", "it", 2025),
]
FLIGHTS = "What class may employees book for flights?"


def _ingest_policies(client):
    response = client.post(
        "/v1/collections/policies/documents",
        json={
            "documents": [
                {"id": i, "text": t, "metadata": {"source": source, "year": year}} for i, t, source, year in POLICIES
            ]
        },
    )
    assert response.status_code == 200, response.text


def test_rag_query_filters_by_equality_and_in(client):
    _ingest_policies(client)
    ask = {"collection": "policies", "question": FLIGHTS, "top_k": 4, "max_tokens": 8, "min_score": -1}
    cited = client.post("/v1/rag/query", json={**ask, "filters": {"source": "hr", "year": {"in": [2024, 2025]}}})
    assert cited.status_code == 200, cited.text
    assert {c["document_id"] for c in cited.json()["citations"]} == {"hr-2024", "hr-2025"}
    only_it = client.post("/v1/rag/query", json={**ask, "filters": {"source": "it"}}).json()["citations"]
    assert [(c["document_id"], c["metadata"]) for c in only_it] == [("it-2025", {"source": "it", "year": 2025})]
    bad = client.post("/v1/rag/query", json={**ask, "filters": {"year": {"gt": 2020}}})
    assert bad.status_code == 422 and "filters.year" in bad.json()["error"]["message"]


def test_chat_rag_field_filters_with_the_openai_client(openai_client, client):
    import openai
    import pytest

    _ingest_policies(client)
    response = openai_client.chat.completions.create(
        model="smollm2-135m-instruct",
        temperature=0,
        max_tokens=8,
        messages=[{"role": "user", "content": FLIGHTS}],
        extra_body={"rag": {"collection": "policies", "top_k": 4, "min_score": -1, "filters": {"year": 2023}}},
    )
    assert [c["document_id"] for c in response.model_extra["citations"]] == ["hr-2023"]
    with pytest.raises(openai.UnprocessableEntityError, match="filters.year"):
        openai_client.chat.completions.create(
            model="smollm2-135m-instruct",
            max_tokens=8,
            messages=[{"role": "user", "content": FLIGHTS}],
            extra_body={"rag": {"collection": "policies", "filters": {"year": [2023, 2024]}}},
        )


MANUAL = (
    "Pumps\n\nThe Zorblax reactor's primary coolant pump runs at 2,400 rpm.  Its seals are replaced "
    "every 9 months; a café-grade grease (naïve choice!) voids the warranty.\n\n"
    + " ".join(f"Valve {n} is inspected on day {n} of every quarter by the duty engineer." for n in range(60))
    + "\n\nShutdown\n\nIn an emergency the reactor is flooded with helium within 30 seconds."
)


def test_citation_offsets_point_into_the_ingested_text(client):
    assert _ingest(client, "manual", [("manual", MANUAL)])["documents"][0]["chunks"] >= 3
    for question in (
        "How often are the pump seals replaced?",
        "What happens in an emergency shutdown?",
        "When is valve 42 inspected?",
    ):
        passages = client.get("/v1/collections/manual/search", params={"q": question, "top_k": 3}).json()["data"]
        assert passages
        for passage in passages:
            assert MANUAL[passage["start"] : passage["end"]] == passage["text"], passage
    cited = client.post(
        "/v1/rag/query",
        json={
            "collection": "manual",
            "question": "How often are the pump seals replaced?",
            "top_k": 2,
            "max_tokens": 8,
        },
    ).json()["citations"]
    assert cited and all(MANUAL[c["start"] : c["end"]] == c["text"] for c in cited)
    assert cited[0]["metadata"] == {"src": "manual"}


def test_search_route_returns_passages_without_generating(client, stack):
    _ingest(client, "facts", [("zorblax", ZORB), *FILLER])
    _ingest_policies(client)
    response = client.get("/v1/collections/facts/search", params={"q": "Who invented the Zorblax reactor?", "top_k": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["retrieval"] == "hybrid" and body["best_similarity"] > 0.3
    first = body["data"][0]
    assert first["document_id"] == "zorblax" and first["chunk_id"] == "zorblax#0"
    assert (first["start"], first["end"], first["text"], first["metadata"]) == (0, len(ZORB), ZORB, {"src": "zorblax"})
    filtered = client.get(
        "/v1/collections/policies/search",
        params={"q": FLIGHTS, "top_k": 4, "filters": json.dumps({"year": {"in": [2023, 2025]}, "source": "hr"})},
    ).json()
    assert {p["document_id"] for p in filtered["data"]} == {"hr-2023", "hr-2025"}
    posted = client.post("/v1/collections/policies/search", json={"q": FLIGHTS, "filters": {"source": "it"}}).json()
    assert [p["document_id"] for p in posted["data"]] == ["it-2025"]
    for path, params, status in [
        ("/v1/collections/no-such-collection/search", {"q": "x"}, 404),
        ("/v1/collections/..%2Fetc/search", {"q": "x"}, 400),
        ("/v1/collections/facts/search", {"q": "x", "top_k": 10_000}, 400),
        ("/v1/collections/facts/search", {"q": "x", "filters": "{"}, 400),
    ]:
        assert client.get(path, params=params).status_code == status, (path, params)
    assert httpx.get(f"{stack.url}/v1/collections/facts/search", params={"q": "x"}, timeout=30).status_code == 401


def test_healthz_needs_no_key(stack):
    assert httpx.get(f"{stack.url}/healthz", timeout=30).status_code == 200
