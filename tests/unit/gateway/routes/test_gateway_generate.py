"""Gateway._generate without Ray: a non-streamed answer runs to its end and is charged even when the
client hangs up; a streamed one is handed to tracked_stream with its number of choices."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from starlette.responses import JSONResponse, StreamingResponse

from gateway.routes import openai_api as gateway_module
from gateway.routes.openai_api import OpenAIRoutes
from tests.fakes.engine import FakeLLMEngine, ingress_args
from tests.fakes.settings import gateway_settings
from vllm_bridge.compat import ChatCompletionRequest, OpenAiIngress


class Gateway(OpenAIRoutes, OpenAiIngress):
    """The gateway's OpenAI routes over ray.serve.llm's ingress and a fake engine, as deployments/gateway.py
    combines them, without Ray: its constructor sets only what _generate and _finish read."""

    def __init__(self, engine: FakeLLMEngine) -> None:
        super().__init__(*ingress_args(engine, "m"))
        self._settings = gateway_settings()
        self._healthy_until = 0.0


@pytest.fixture
def gateway(monkeypatch):
    recorded = []

    async def record_usage(request, model, usage, status=200):
        recorded.append((model, usage, status))

    monkeypatch.setattr(gateway_module, "record_usage", record_usage)
    gw = Gateway(FakeLLMEngine(started=True))
    gw.recorded = recorded
    return gw


def test_a_non_streamed_answer_is_finished_and_charged_after_the_client_hangs_up(gateway):
    started, release = asyncio.Event(), asyncio.Event()
    usage = {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}

    async def engine():
        started.set()
        await release.wait()
        return JSONResponse({"choices": [{"message": {"content": "done"}}], "usage": usage})

    async def scenario():
        request = SimpleNamespace(scope={})
        task = asyncio.ensure_future(
            gateway._generate(request, "m", engine(), SimpleNamespace(stream=False, n=1), None, (True, False))
        )
        await asyncio.wait_for(started.wait(), timeout=10)
        task.cancel()  # what the server does when the client hangs up
        await asyncio.sleep(0)
        assert not task.done(), "the cancellation waits for the answer (it cannot end before release)"
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)

    asyncio.run(scenario())
    assert gateway.recorded == [("m", usage, 200)]


def test_a_streamed_answer_is_tracked_with_its_choices(gateway, monkeypatch):
    seen = {}

    def tracked(body_iterator, request, model, cited, *wanted, on_broken=None, choices_per_prompt=1, trim_at_cap=False):
        seen.update(model=model, choices_per_prompt=choices_per_prompt, trim_at_cap=trim_at_cap)
        return body_iterator

    monkeypatch.setattr(gateway_module, "tracked_stream", tracked)

    async def parts():
        yield "data: [DONE]\n\n"

    async def engine():
        return StreamingResponse(parts(), media_type="text/event-stream")

    response = asyncio.run(
        gateway._generate(
            SimpleNamespace(scope={}), "m", engine(), SimpleNamespace(stream=True, n=3), None, (False, False)
        )
    )
    assert isinstance(response, StreamingResponse)
    assert seen == {"model": "m", "choices_per_prompt": 3, "trim_at_cap": False}  # not a RAG answer: as generated


def _slow_engine(release: asyncio.Event):
    async def engine():
        await release.wait()
        return "answered"

    return engine()


@pytest.mark.parametrize("running", [True, None])
def test_a_slow_call_to_a_running_or_unknown_engine_is_left_to_finish(gateway, running):
    gateway._settings = gateway._settings.model_copy(update={"health_timeout_s": 0.01})
    asked = []

    async def engine_running(model):
        asked.append(model)
        return running

    gateway._engine_running = engine_running

    async def scenario():
        release = asyncio.Event()
        task = asyncio.ensure_future(gateway._engine(_slow_engine(release), "m"))
        while len(asked) < 3:  # it asked several times and kept waiting
            await asyncio.sleep(0.01)
        release.set()
        return await asyncio.wait_for(task, timeout=10)

    assert asyncio.run(scenario()) == "answered"
    assert set(asked) == {"m"}


def test_a_call_to_an_engine_without_a_running_replica_is_refused_and_cancelled(gateway):
    from gateway.http_errors import EngineNotRunning, map_exception

    gateway._settings = gateway._settings.model_copy(update={"health_timeout_s": 0.01})
    gateway._healthy_until = 1e12
    cancelled = asyncio.Event()

    async def engine_running(model):
        return False

    async def queued_forever():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    gateway._engine_running = engine_running

    async def scenario():
        with pytest.raises(EngineNotRunning) as refused:
            await asyncio.wait_for(gateway._engine(queued_forever(), "m"), timeout=10)
        await asyncio.wait_for(cancelled.wait(), timeout=10)
        return refused.value

    error = asyncio.run(scenario())
    response = map_exception(error, 7)
    assert response.status_code == 503 and response.headers["Retry-After"] == "7"
    assert gateway._healthy_until == 0.0  # /healthz asks every replica again


def test_an_engine_answer_through_the_ingress_is_charged_the_usage_it_reports(gateway):
    body = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "four words of prompt"}], max_tokens=5
    )
    request = SimpleNamespace(scope={}, headers={})
    response = asyncio.run(
        gateway._generate(request, "m", OpenAiIngress.chat(gateway, body, None), body, None, (True, False))
    )
    assert json.loads(response.body)["choices"][0]["message"]["content"] == "test_0 test_1 test_2 test_3 test_4"
    [(model, usage, status)] = gateway.recorded
    assert (model, usage["prompt_tokens"], usage["completion_tokens"], status) == ("m", 4, 5, 200)


@pytest.mark.parametrize("stream", [False, True])
def test_a_generation_says_where_its_time_went_in_a_server_timing_header(gateway, stream):
    from bench.harness.first_token import server_timing
    from gateway.middleware.request_timing import TIMING_KEY, RequestTiming

    body = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "four words of prompt"}], max_tokens=5, stream=stream
    )
    timing = RequestTiming()
    timing.mark("admitted")  # as the auth middleware does once the tenant is admitted
    request = SimpleNamespace(scope={TIMING_KEY: timing}, headers={})
    response = asyncio.run(
        gateway._generate(request, "m", OpenAiIngress.chat(gateway, body, None), body, None, (True, False))
    )
    parts = server_timing(response.headers["Server-Timing"])
    assert list(parts) == ["admit", "prepare", "wake", "engine"]
    assert all(ms >= 0 for ms in parts.values())
    # Each part is the time between two marks taken in order: together they are the gateway's whole time.
    whole = (timing.engine_answered - timing.arrived) * 1000
    assert sum(parts.values()) == pytest.approx(whole, abs=0.05)
