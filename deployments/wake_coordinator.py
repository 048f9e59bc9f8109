"""The wake coordinator: one per pool (a single-replica Serve deployment, so every gateway replica asks the
same one), it keeps the pool's on-demand engines within the plan's awake set: it wakes an engine for a
request, first putting the least recently used idle ones to sleep when the wake does not fit, and puts
engines idle past their idle_sleep_s to sleep. Its decisions are planner/wake_ledger.py's; this class only
awaits the engines' sleep_engine()/wake_engine() (deployments/chat.py) and keeps the counters for /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import CollectorRegistry, Counter, generate_latest
from ray import serve

from planner.on_demand_plan import OnDemandPlan
from planner.plan import WAKE_COORDINATOR
from planner.wake_ledger import WakeAnswer, WakeLedger
from system.process_memory import process_tree_memory

logger = logging.getLogger("poolserve.wake")
IDLE_CHECK_EVERY_S = 5.0  # idle_sleep_s is minutes; a few seconds late is nothing (also the state check's period)
ROOM_RECHECK_S = 0.5  # a request waiting for room looks again this often (busy engines finishing)
STATE_TIMEOUT_S = 5.0  # an engine's state is an attribute read; a replica that does not answer is starting


@serve.deployment(name=WAKE_COORDINATOR)  # its options: the plan's (planner/plan.py _wake_coordinator)
class WakeCoordinator:
    def __init__(self, plan: OnDemandPlan, engines: dict):
        """`engines`: each on-demand engine's handle by model id (the replicas of deployments/chat.py)."""
        self._plan = plan
        self._engines = engines
        self._ledger = WakeLedger(plan, plan.worst_awake_set, time.monotonic())  # the engines start as planned
        self._room = asyncio.Lock()  # one change of the pool's awake set at a time
        registry = CollectorRegistry()
        self._registry = registry
        self._wakes = Counter(
            "on_demand_wakes", "On-demand engine wakes, by model.", ["model"], namespace="poolserve", registry=registry
        )
        self._sleeps = Counter(
            "on_demand_sleeps",
            "On-demand engine sleeps, by model and why (room for another engine's wake, or idle).",
            ["model", "reason"],
            namespace="poolserve",
            registry=registry,
        )
        self._wake_seconds = Counter(
            "on_demand_wake_seconds",
            "Seconds spent waking, by model (a CPU: cold start + warm-up).",
            ["model"],
            namespace="poolserve",
            registry=registry,
        )
        self._idle_task = asyncio.get_event_loop().create_task(self._sleep_idle_engines())

    async def ensure_awake(self, model: str, tenant: str) -> WakeAnswer:
        """Return "go" once `model` is awake, the request counted in flight (request_ended() must follow);
        else "busy" (503) when no room was made within its wake_timeout_s, or "over_budget" (429)."""
        ledger, now = self._ledger, time.monotonic()
        if ledger.state[model] == "awake":
            ledger.request_began(model, now)
            return WakeAnswer(outcome="go")
        if not ledger.within_budget(tenant, model, now):
            return ledger.over_budget(tenant, model)
        started = now
        deadline = now + ledger.engine(model).wake_timeout_s
        try:
            await asyncio.wait_for(self._room.acquire(), timeout=max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            return ledger.busy(model, time.monotonic() - started)
        try:
            woke = False
            while ledger.state[model] != "awake":
                chosen = ledger.to_sleep_for(model)
                if chosen is None:
                    if time.monotonic() >= deadline:
                        return ledger.busy(model, time.monotonic() - started)
                    await asyncio.sleep(ROOM_RECHECK_S)
                    continue
                for other in chosen:  # all marked before the first await: no request goes to them meanwhile
                    self._ledger.state[other] = "sleeping"
                for other in chosen:
                    await self._sleep(other, "room")
                ledger.charge_wake(tenant, model, time.monotonic())
                await self._wake(model)
                woke = True
            ledger.request_began(model, time.monotonic())
            return WakeAnswer(outcome="go", woke=woke)
        finally:
            self._room.release()

    async def request_ended(self, model: str) -> None:
        self._ledger.request_ended(model, time.monotonic())

    async def states(self) -> dict[str, str]:
        """Each on-demand engine's state by model id: awake, asleep, waking or sleeping."""
        return dict(self._ledger.state)

    async def metrics_text(self) -> bytes:
        return generate_latest(self._registry)

    def memory(self) -> dict:
        """Its process's memory (PSS), measured against its planned line like every replica's (/status)."""
        return process_tree_memory()

    async def _wake(self, model: str) -> None:
        self._ledger.state[model] = "waking"
        started = time.monotonic()
        try:
            await self._engines[model].wake_engine.remote()
        except BaseException:
            self._ledger.state[model] = "asleep"  # the engine stopped what it had started (deployments/chat.py)
            raise
        self._ledger.state[model] = "awake"
        self._ledger.last_used[model] = time.monotonic()
        self._wakes.labels(model=model).inc()
        self._wake_seconds.labels(model=model).inc(time.monotonic() - started)

    async def _sleep(self, model: str, reason: str) -> None:
        self._ledger.state[model] = "sleeping"  # no new request goes to it from here on
        try:
            await self._engines[model].sleep_engine.remote()
        except BaseException:
            self._ledger.state[model] = "awake"
            raise
        self._ledger.state[model] = "asleep"
        self._sleeps.labels(model=model, reason=reason).inc()

    async def _reconcile(self) -> None:
        """Ask the engines their state; adopt it where it changed behind the ledger's back (a replica Serve
        replaced starts as the plan says), and put idle engines to sleep should the awake set no longer fit."""
        async with self._room:  # no change of ours under way: a difference is theirs
            models = list(self._engines)
            answers = await asyncio.gather(
                *(asyncio.wait_for(self._engines[m].engine_state.remote(), STATE_TIMEOUT_S) for m in models),
                return_exceptions=True,
            )
            reported = {m: a for m, a in zip(models, answers) if isinstance(a, str)}  # a replica starting: unknown
            for model in self._ledger.reconcile(reported):
                logger.warning(
                    "engine %s reports %s: its replica was replaced; the ledger follows",
                    model,
                    self._ledger.state[model],
                )
            for model in self._ledger.over_the_awake_set() or []:
                await self._sleep(model, "room")

    async def _sleep_idle_engines(self) -> None:
        while True:
            await asyncio.sleep(IDLE_CHECK_EVERY_S)
            try:
                await self._reconcile()
            except Exception:
                logger.exception("checking the engines' states failed")
            if not self._ledger.idle_due(time.monotonic()):
                continue
            async with self._room:
                for model in self._ledger.idle_due(time.monotonic()):
                    if model not in self._ledger.idle_due(time.monotonic()):  # a request came meanwhile
                        continue
                    try:
                        await self._sleep(model, "idle")
                    except Exception:
                        logger.exception("putting idle engine %s to sleep failed", model)
