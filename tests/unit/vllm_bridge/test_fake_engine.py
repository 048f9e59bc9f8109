"""tests/fakes/engine.py, the engine the route tests can put behind ray.serve.llm's own ingress without Ray: its
answers are OpenAI's shapes (checked by vLLM's own response models), deterministic, streamed as SSE with usage
when stream_options asks, and the ingress turns them into the JSONResponse or StreamingResponse the gateway
gets from a running stack."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from tests.fakes.engine import FakeLLMEngine, engine_ingress
from vllm_bridge.compat import ChatCompletionRequest, CompletionRequest, OpenAIHTTPException


def _request() -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""})


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="chat-model", messages=[{"role": "user", "content": "three word prompt"}], **fields
    )


def _streamed(call) -> tuple[StreamingResponse, list]:
    """The response of `call` (a coroutine) and its events, read on the loop that started the stream."""

    async def read():
        response = await call
        return response, await _events(response)

    return asyncio.run(read())


async def _events(response: StreamingResponse) -> list:
    events = []
    async for part in response.body_iterator:
        for line in (part.decode() if isinstance(part, bytes) else part).split("\n\n"):
            if line.startswith("data: "):
                events.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return events


def test_a_chat_answer_is_deterministic_and_counts_its_tokens():
    engine = FakeLLMEngine(started=True)
    ingress = engine_ingress(engine)
    first = asyncio.run(ingress.chat(_chat(max_tokens=3), _request()))
    again = asyncio.run(ingress.chat(_chat(max_tokens=3), _request()))
    assert isinstance(first, JSONResponse)
    body = json.loads(first.body)
    assert body["choices"][0]["message"]["content"] == "test_0 test_1 test_2"
    assert body["choices"][0]["finish_reason"] == "length"  # the cap stopped it
    counted = {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert counted == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert json.loads(again.body)["choices"] == body["choices"] and len(engine.requests) == 2


def test_a_reply_shorter_than_the_cap_stops():
    ingress = engine_ingress(FakeLLMEngine(reply="Mira Quell", started=True))
    body = json.loads(asyncio.run(ingress.chat(_chat(max_tokens=50, n=2), _request())).body)
    assert [c["message"]["content"] for c in body["choices"]] == ["Mira Quell", "Mira Quell"]
    assert {c["finish_reason"] for c in body["choices"]} == {"stop"}
    assert body["usage"]["completion_tokens"] == 4


def test_a_stream_carries_usage_on_every_chunk_and_at_its_end_when_asked():
    ingress = engine_ingress(FakeLLMEngine(reply="one two three", started=True))
    options = {"include_usage": True, "continuous_usage_stats": True}
    response, events = _streamed(ingress.chat(_chat(stream=True, stream_options=options), _request()))
    assert isinstance(response, StreamingResponse)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "one two three"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert [c["usage"]["completion_tokens"] for c in chunks[1:-1]] == [1, 2, 3]  # after the role chunk


def test_a_stream_without_stream_options_has_no_usage():
    ingress = engine_ingress(FakeLLMEngine(started=True))
    _, events = _streamed(ingress.chat(_chat(stream=True, max_tokens=2), _request()))
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])


def test_completions_answer_and_stream_text():
    ingress = engine_ingress(FakeLLMEngine(started=True))
    body = json.loads(
        asyncio.run(
            ingress.completions(CompletionRequest(model="chat-model", prompt="a b", max_tokens=2), _request())
        ).body
    )
    assert body["choices"][0]["text"] == "test_0 test_1" and body["usage"]["prompt_tokens"] == 2
    streamed = CompletionRequest(model="chat-model", prompt="a b", max_tokens=2, stream=True)
    _, events = _streamed(ingress.completions(streamed, _request()))
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "test_0 test_1"


def test_an_engine_not_started_fails_like_rays_mock_and_an_unknown_model_is_a_404():
    with pytest.raises(RuntimeError, match="not started"):
        asyncio.run(engine_ingress(FakeLLMEngine()).chat(_chat(), _request()))
    with pytest.raises(Exception) as refused:
        asyncio.run(
            engine_ingress(FakeLLMEngine(started=True)).chat(_chat().model_copy(update={"model": "other"}), _request())
        )
    assert getattr(refused.value, "status_code", None) == 404 and not isinstance(refused.value, OpenAIHTTPException)
