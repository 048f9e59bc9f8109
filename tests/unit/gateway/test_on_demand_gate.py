"""The gateway's side of on-demand engines (gateway/on_demand_gate.py) with a fake coordinator: a request to
an on-demand model waits for ensure_awake and is counted in flight until it ends on every path (a plain
answer, an error, a stream's end, a client that leaves mid-stream); refusals become 503/429 with Retry-After
and the coordinator's message; always-on models and a stack without on-demand engines pass straight through."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from fastapi import HTTPException
from starlette.responses import JSONResponse, StreamingResponse

from gateway.middleware.tenant_guard import TENANT_KEY
from gateway.on_demand_gate import OnDemandGate
from planner.wake_ledger import WakeAnswer
from tests.fakes.handles import RemoteMethod


class FakeCoordinator:
    def __init__(self, answer: WakeAnswer):
        self.asked, self.ended = [], []
        self.ensure_awake = RemoteMethod(lambda model, tenant: self.asked.append((model, tenant)) or answer)
        self.request_ended = RemoteMethod(self.ended.append)
        self.states = RemoteMethod(lambda: {"m": "asleep"})


def _request(tenant: str | None = "acme"):
    return SimpleNamespace(scope={TENANT_KEY: SimpleNamespace(name=tenant)} if tenant else {})


async def _settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_plain_answer_is_counted_in_flight_until_it_is_returned():
    async def run():
        coordinator = FakeCoordinator(WakeAnswer(outcome="go"))
        gate = OnDemandGate(coordinator, {"m"})

        async def call():
            assert coordinator.ended == []  # in flight while the engine answers
            return JSONResponse({"ok": True})

        await gate.run("m", _request(), call)
        await _settle()
        assert coordinator.asked == [("m", "acme")] and coordinator.ended == ["m"]

    asyncio.run(run())


def test_a_failed_call_still_ends_the_request():
    async def run():
        coordinator = FakeCoordinator(WakeAnswer(outcome="go"))

        async def call():
            raise RuntimeError("engine failed")

        with pytest.raises(RuntimeError):
            await OnDemandGate(coordinator, {"m"}).run("m", _request(None), call)
        await _settle()
        assert coordinator.asked == [("m", "")] and coordinator.ended == ["m"]  # tenancy off: charged to ""

    asyncio.run(run())


def test_a_stream_ends_the_request_when_it_ends_or_when_the_client_leaves():
    async def run():
        coordinator = FakeCoordinator(WakeAnswer(outcome="go"))
        gate = OnDemandGate(coordinator, {"m"})

        async def chunks():
            for part in ("a", "b", "c"):
                yield part

        async def call():
            return StreamingResponse(chunks())

        whole = await gate.run("m", _request(), call)
        assert [c async for c in whole.body_iterator] == ["a", "b", "c"]
        await _settle()
        assert coordinator.ended == ["m"]

        left = await gate.run("m", _request(), call)
        iterator = left.body_iterator
        assert await iterator.__anext__() == "a"
        await _settle()
        assert coordinator.ended == ["m"]  # still in flight mid-stream
        await iterator.aclose()  # what Starlette does when the client disconnects
        await _settle()
        assert coordinator.ended == ["m", "m"]

    asyncio.run(run())


@pytest.mark.parametrize("outcome, status", [("busy", 503), ("over_budget", 429)])
def test_a_refusal_is_an_http_error_with_retry_after_and_the_coordinators_message(outcome, status):
    async def run():
        answer = WakeAnswer(outcome=outcome, message="model 'm' is asleep and ...", retry_after_s=45)
        coordinator = FakeCoordinator(answer)
        called = []

        async def call():
            called.append(1)

        with pytest.raises(HTTPException) as refused:
            await OnDemandGate(coordinator, {"m"}).run("m", _request(), call)
        assert refused.value.status_code == status and refused.value.headers == {"Retry-After": "45"}
        assert "model 'm'" in refused.value.detail and called == [] and coordinator.ended == []

    asyncio.run(run())


def test_always_on_models_and_stacks_without_on_demand_engines_pass_straight_through():
    async def run():
        coordinator = FakeCoordinator(WakeAnswer(outcome="busy"))

        async def call():
            return JSONResponse({})

        await OnDemandGate(coordinator, {"m"}).run("other", _request(), call)
        assert coordinator.asked == []
        off = OnDemandGate(None, set())
        await off.run("m", _request(), call)
        assert await off.states() == {} and await off.metrics_text() == b""

    asyncio.run(run())


def test_a_model_card_has_a_status_only_when_engines_are_on_demand():
    from gateway.schemas import ServedModelCard, ServedModelList

    card = {"id": "m", "object": "model", "owned_by": "poolserve", "permission": [], "metadata": {}}
    assert ServedModelList(data=[ServedModelCard(**card)]).model_dump()["data"][0] == card  # OpenAI's shape as before
    listed = ServedModelList(data=[ServedModelCard(**card, status="asleep")]).model_dump()
    assert listed["data"][0] == {**card, "status": "asleep"} and listed["object"] == "list"


def test_coordinator_calls_leave_the_requests_context_so_serve_cannot_cancel_them():
    """Serve cancels every call made under a request it cancels (the client left): request_ended, and
    ensure_awake, go out from a fresh context, where Serve's request context is unset."""
    from ray.serve.context import _serve_request_context

    async def run():
        contexts = []
        coordinator = FakeCoordinator(WakeAnswer(outcome="go"))
        for name in ("ensure_awake", "request_ended"):
            inner = getattr(coordinator, name).fn
            setattr(
                coordinator,
                name,
                RemoteMethod(lambda *a, inner=inner: contexts.append(_serve_request_context.get()) or inner(*a)),
            )
        gate = OnDemandGate(coordinator, {"m"})
        _serve_request_context.set("the client's request")
        await gate.run("m", _request(), lambda: _json())
        await _settle()
        assert coordinator.ended == ["m"] and contexts == [None, None]

    asyncio.run(run())


async def _json():
    return JSONResponse({"ok": True})


def test_a_client_that_leaves_during_the_wake_is_ended_once_the_wake_says_go():
    async def run():
        release = asyncio.Event()
        coordinator = FakeCoordinator(WakeAnswer(outcome="go"))

        async def slow_wake(model, tenant):
            await release.wait()
            return WakeAnswer(outcome="go")

        coordinator.ensure_awake = SimpleNamespace(remote=lambda *a: slow_wake(*a))
        gate = OnDemandGate(coordinator, {"m"})
        request = asyncio.ensure_future(gate.run("m", _request(), _json))
        await _settle()
        request.cancel()  # the client left mid-wake: Serve cancels its request
        await _settle()
        assert coordinator.ended == []  # the wake goes on in the coordinator
        release.set()
        await _settle()
        assert request.cancelled() and coordinator.ended == ["m"]  # its "go" was counted, so it is ended

    asyncio.run(run())


def test_the_coordinators_memory_is_measured_only_where_there_is_one():
    async def run():
        coordinator = FakeCoordinator(WakeAnswer(outcome="go"))
        coordinator.memory = RemoteMethod(lambda: {"measured_bytes": 101_000_000})
        [(name, reading)] = OnDemandGate(coordinator, {"m"}).measured()
        assert name == "wake_coordinator" and (await reading)["measured_bytes"] == 101_000_000
        assert OnDemandGate(None, set()).measured() == []

    asyncio.run(run())
