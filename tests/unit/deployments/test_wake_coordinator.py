"""The wake coordinator (deployments/wake_coordinator.py) with fake engine handles: it wakes an asleep engine
for a request after putting the least recently used idle one to sleep, never one with a request in flight,
answers busy (the gateway's 503) when no room comes within wake_timeout_s and over_budget (429) past the
tenant's wakes, counts wakes and sleeps for /metrics, and puts engines idle past their time to sleep."""

from __future__ import annotations

import asyncio

import pytest

import deployments.wake_coordinator as wake_coordinator
from deployments.wake_coordinator import WakeCoordinator
from planner.on_demand_plan import OnDemandEngine, OnDemandPlan
from tests.fakes.handles import RemoteMethod

GB = 10**9


class FakeEngineHandle:
    """A chat replica's handle as the coordinator calls it: wake_engine, sleep_engine, engine_state."""

    def __init__(self, model, log, state):
        self.model, self.log, self.state = model, log, state
        self.wake_engine, self.sleep_engine = RemoteMethod(self._turn("wake")), RemoteMethod(self._turn("sleep"))
        self.engine_state = RemoteMethod(lambda: self.state)

    def _turn(self, name):
        async def turn():
            self.log.append((self.model, name))
            await asyncio.sleep(0.01)
            self.state = "awake" if name == "wake" else "asleep"

        return turn


def _plan(wake_timeout_s: float = 0.3, idle_s: float = 300.0, wakes: int = 5) -> OnDemandPlan:
    def engine(model):
        return OnDemandEngine(
            model_id=model,
            idle_sleep_s=idle_s,
            wake_timeout_s=wake_timeout_s,
            tenant_wakes_per_hour=wakes,
            level_asked=1,
            sleep="stop",
            wake="cold_start",
            awake_bytes=4 * GB,
            asleep_bytes=0,
            asleep_breakdown={},
            wake_peak_bytes=0,
            wake_request_bytes=0,
            wake_check_bytes=4 * GB,
        )

    return OnDemandPlan(
        max_awake=1,
        room_bytes=5 * GB,
        engines={"ra": engine("a"), "rb": engine("b")},
        worst_awake_set=["ra"],
        planned_bytes=4 * GB,
    )


def _coordinator(log, **plan):
    cls = WakeCoordinator.func_or_class
    started = {"a": "awake", "b": "asleep"}  # as the plan's awake set starts them
    return cls(_plan(**plan), {m: FakeEngineHandle(m, log, started[m]) for m in ("a", "b")})


def test_a_request_for_the_awake_engine_goes_at_once_and_is_counted_in_flight():
    async def run():
        log = []
        coordinator = _coordinator(log)
        answer = await coordinator.ensure_awake("a", "t1")
        assert answer.outcome == "go" and not answer.woke and log == []
        assert coordinator._ledger.in_flight["a"] == 1
        await coordinator.request_ended("a")
        assert coordinator._ledger.in_flight["a"] == 0

    asyncio.run(run())


def test_a_request_for_an_asleep_engine_puts_the_idle_one_to_sleep_first_then_wakes_it():
    async def run():
        log = []
        coordinator = _coordinator(log)
        answer = await coordinator.ensure_awake("b", "t1")
        assert answer.outcome == "go" and answer.woke
        assert log == [("a", "sleep"), ("b", "wake")]  # sleep first: never both awake
        assert await coordinator.states() == {"a": "asleep", "b": "awake"}
        text = (await coordinator.metrics_text()).decode()
        assert 'poolserve_on_demand_wakes_total{model="b"} 1.0' in text
        assert 'poolserve_on_demand_sleeps_total{model="a",reason="room"} 1.0' in text
        assert 'poolserve_on_demand_wake_seconds_total{model="b"}' in text

    asyncio.run(run())


def test_an_engine_with_a_request_in_flight_is_never_put_to_sleep_the_wait_ends_busy():
    async def run():
        log = []
        coordinator = _coordinator(log, wake_timeout_s=0.3)
        assert (await coordinator.ensure_awake("a", "t1")).outcome == "go"  # a: one request in flight
        answer = await coordinator.ensure_awake("b", "t2")
        assert answer.outcome == "busy" and "'b'" in answer.message and answer.retry_after_s >= 1
        assert log == [] and await coordinator.states() == {"a": "awake", "b": "asleep"}

    asyncio.run(run())


def test_a_wait_for_room_goes_on_when_the_busy_engine_finishes_in_time():
    async def run():
        log = []
        coordinator = _coordinator(log, wake_timeout_s=5.0)
        await coordinator.ensure_awake("a", "t1")
        waiting = asyncio.ensure_future(coordinator.ensure_awake("b", "t2"))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await coordinator.request_ended("a")
        assert (await waiting).outcome == "go"
        assert log == [("a", "sleep"), ("b", "wake")]

    asyncio.run(run())


def test_a_tenant_past_its_wakes_gets_over_budget_and_is_not_charged_for_awake_engines():
    async def run():
        log = []
        coordinator = _coordinator(log, wakes=1)
        assert (await coordinator.ensure_awake("b", "t1")).woke
        await coordinator.request_ended("b")
        assert (await coordinator.ensure_awake("b", "t1")).outcome == "go"  # awake: no wake, no charge
        await coordinator.request_ended("b")
        assert (await coordinator.ensure_awake("a", "t1")).woke  # a is another engine's budget
        await coordinator.request_ended("a")
        refused = await coordinator.ensure_awake("b", "t1")
        assert refused.outcome == "over_budget" and "1 wakes" in refused.message
        assert (await coordinator.ensure_awake("b", "t2")).outcome == "go"  # another tenant pays its own

    asyncio.run(run())


def test_engines_idle_past_their_time_are_put_to_sleep_in_the_background(monkeypatch):
    monkeypatch.setattr(wake_coordinator, "IDLE_CHECK_EVERY_S", 0.02)

    async def run():
        log = []
        coordinator = _coordinator(log, idle_s=0.1)
        for _ in range(250):  # bounded: 5 s on a loaded host
            if await coordinator.states() == {"a": "asleep", "b": "asleep"}:
                break
            await asyncio.sleep(0.02)
        assert log == [("a", "sleep")]
        assert 'reason="idle"' in (await coordinator.metrics_text()).decode()
        coordinator._idle_task.cancel()

    asyncio.run(run())


def test_a_failed_wake_leaves_the_engine_asleep():
    async def run():
        log = []
        coordinator = _coordinator(log)

        def broken():
            async def call():
                raise RuntimeError("cold start failed")

            return call()

        coordinator._engines["b"].wake_engine.remote = broken
        with pytest.raises(RuntimeError):
            await coordinator.ensure_awake("b", "t1")
        assert (await coordinator.states())["b"] == "asleep"
        assert coordinator._ledger.in_flight["b"] == 0

    asyncio.run(run())


def test_a_replaced_replica_that_starts_awake_beside_another_is_followed_and_the_lru_put_to_sleep(monkeypatch):
    monkeypatch.setattr(wake_coordinator, "IDLE_CHECK_EVERY_S", 0.02)

    async def run():
        log = []
        coordinator = _coordinator(log)
        assert (await coordinator.ensure_awake("b", "t1")).woke  # a asleep, b awake
        await coordinator.request_ended("b")
        log.clear()
        coordinator._engines["a"].state = "awake"  # Serve replaced a's replica: it starts awake, as planned
        for _ in range(250):  # bounded: 5 s on a loaded host
            if log and await coordinator.states() == {"a": "asleep", "b": "awake"}:
                break
            await asyncio.sleep(0.02)
        # the ledger followed a; both awake do not fit, and a (idle, used least recently: before its sleep)
        # goes back to sleep, b (just used) stays
        assert log == [("a", "sleep")] and await coordinator.states() == {"a": "asleep", "b": "awake"}
        coordinator._idle_task.cancel()

    asyncio.run(run())
