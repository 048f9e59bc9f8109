"""Open WebUI's OpenAI connection, replayed: the requests its backend sends (open_webui/routers/openai.py
and retrieval/utils.py upstream), byte-shaped as it sends them, against the gateway. Open WebUI itself is
not installed here; what is checked is that every request it makes gets the answer it parses.

- the connection check and model list: GET {base}/models with Content-Type and Bearer headers;
- a chat turn: POST {base}/chat/completions with "stream": true and stream_options.include_usage forced
  on (it reads usage from the last chunk), the last message's content as a text part carrying
  "cache_control": {"type": "ephemeral"} (newer versions), or as a plain string (older ones, or caching off);
- title generation: the same route with "stream": false (Open WebUI sends no max_tokens there; the replay
  caps it at 16 to keep the suite short);
- its RAG embeddings: POST {base}/embeddings with {"input": [...], "model": ...}.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.integration.conftest import DEMO_KEY

CHAT_MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "all-minilm-l6-v2"
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {DEMO_KEY}"}


@pytest.fixture()
def base(stack):
    return f"{stack.url}/v1"  # what the user types as the connection's URL


def _events(response: httpx.Response) -> list:
    """SSE data lines as Open WebUI's stream reader takes them ('data: ' prefix, [DONE] last)."""
    lines = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_connection_check_lists_the_models(base):
    listing = httpx.get(f"{base}/models", headers=HEADERS, timeout=30)
    assert listing.status_code == 200
    ids = {model["id"] for model in listing.json()["data"]}  # it keeps entries with an id, names them by it
    assert {CHAT_MODEL, EMBED_MODEL} <= ids
    wrong_key = httpx.get(f"{base}/models", headers={**HEADERS, "Authorization": "Bearer wrong"}, timeout=30)
    assert wrong_key.status_code == 401 and "error" in wrong_key.json()  # it shows error bodies as they are


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "text", "text": "Say hello in three words.", "cache_control": {"type": "ephemeral"}}],
        "Say hello in three words.",
    ],
    ids=["text-part-with-cache-control", "plain-string"],
)
def test_streamed_chat_turn(base, content):
    body = {
        "model": CHAT_MODEL,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 24,
        "temperature": 0.8,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": content},
        ],
    }
    with httpx.stream("POST", f"{base}/chat/completions", headers=HEADERS, json=body, timeout=120) as response:
        assert response.status_code == 200 and "text/event-stream" in response.headers["content-type"]
        events = _events(response)
    text = "".join((choice.get("delta") or {}).get("content") or "" for e in events for choice in e.get("choices", []))
    assert text.strip()
    usage = [e["usage"] for e in events if e.get("usage")]
    assert usage and usage[-1]["completion_tokens"] <= 24 and usage[-1]["prompt_tokens"] > 0


def test_title_generation_is_a_plain_completion(base):
    body = {
        "model": CHAT_MODEL,
        "stream": False,
        "max_tokens": 16,
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "cache_control": {"type": "ephemeral"},
                        "text": "Give a 3-word title for: 'Say hello'.",
                    }
                ],
            }
        ],
    }
    response = httpx.post(f"{base}/chat/completions", headers=HEADERS, json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"].strip()


def test_rag_embeddings_batch(base):
    body = {"input": ["Annual leave is 25 days.", "Flights need approval."], "model": EMBED_MODEL}
    response = httpx.post(f"{base}/embeddings", headers=HEADERS, json=body, timeout=120)
    assert response.status_code == 200
    vectors = [item["embedding"] for item in response.json()["data"]]  # what it reads
    assert len(vectors) == 2 and all(len(v) == 384 for v in vectors)
