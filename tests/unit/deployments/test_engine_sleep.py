"""The chat replica's sleep_engine()/wake_engine() (issue 48), with a fake engine (no vLLM start here): on a
GPU they are vLLM's sleep(level)/wake_up through LLMServer's sleep()/wakeup(); on a CPU sleeping stops the
engine (shutdown, its processes checked gone) and waking starts a new one the way LLMServer.start does, then
warms it up. The CPU path runs for real in tests/integration/test_on_demand.py."""

from __future__ import annotations

import asyncio

import pytest

import deployments.chat as chat
from deployments.chat import PoolserveLLMServer, llm_config_from_plan, replica_settings
from planner.plan import build_plan
from planner.profile import load_profile
from tests.fakes.engine import FakeLLMEngine


def _config(sleep: str | None, start_asleep: bool = False):
    profile = load_profile("configs/cpu-on-demand.yaml")
    plan = build_plan(profile)
    on_demand = plan.on_demand.engines["chat"].model_copy(update={"sleep": sleep}) if sleep else None
    return llm_config_from_plan(profile.chat, plan.replica("chat"), [], (), on_demand, start_asleep)


def _server(sleep: str | None, log: list) -> PoolserveLLMServer:
    server = PoolserveLLMServer.__new__(PoolserveLLMServer)  # no Serve replica, no engine start
    server._llm_config = _config(sleep)
    server.engine = FakeLLMEngine(log=log)
    server._engine_cls = lambda config: FakeLLMEngine(config, log=log)
    server._engine_state, server._engine_state_lock = "awake", asyncio.Lock()

    async def warm_up():
        log.append(("warm_up",))

    server._warm_up = warm_up
    server._start_engine = lambda: server.engine.start()
    return server


def test_the_plan_tells_the_replica_how_it_sleeps_and_whether_it_starts_asleep():
    assert replica_settings(_config("stop", start_asleep=True)).sleep == "stop"
    assert replica_settings(_config("stop", start_asleep=True)).start_asleep
    always_on = replica_settings(_config(None))
    assert always_on.sleep is None and not always_on.start_asleep
    assert "sleep" not in always_on.model_dump() and "start_asleep" not in always_on.model_dump()


@pytest.mark.parametrize("sleep, level", [("level_1", 1), ("level_2", 2)])
def test_on_a_gpu_sleep_and_wake_are_vllms_sleep_mode(sleep, level):
    log = []
    server = _server(sleep, log)
    engine = server.engine
    assert asyncio.run(server.sleep_engine())["state"] == "asleep"
    assert log == [("sleep", {"level": level})] and server.engine is engine  # the engine stays, asleep
    assert asyncio.run(server.engine_state()) == "asleep"
    assert asyncio.run(server.wake_engine())["state"] == "awake"
    assert log[1:] == [("wakeup", {}), ("warm_up",)]
    assert asyncio.run(server.engine_state()) == "awake"


def test_on_a_cpu_sleep_stops_the_engine_and_waits_for_its_processes(monkeypatch):
    log, left = [], [["EngineCore"], []]  # one check still sees the process, the next none
    monkeypatch.setattr(chat, "engine_processes", lambda: left.pop(0) if len(left) > 1 else left[0])
    monkeypatch.setattr(chat, "release_engine_caches", lambda: log.append(("release_engine_caches",)))
    server = _server("stop", log)
    asyncio.run(server.sleep_engine())
    assert log == [("client.shutdown", chat.ENGINE_STOP_TIMEOUT_S), ("engine.shutdown",), ("release_engine_caches",)]
    assert server.engine is None  # LLMServer.check_health answers healthy with no engine
    assert asyncio.run(server.sleep_engine()) == {"state": "asleep", "seconds": 0.0}  # asleep already: nothing


def test_on_a_cpu_processes_that_outlive_the_shutdown_are_killed(monkeypatch):
    killed = []
    monkeypatch.setattr(chat, "engine_processes", lambda: ["EngineCore"])
    monkeypatch.setattr(chat, "end_local_engine", lambda: killed.append(1) or 1)
    monkeypatch.setattr(chat, "ENGINE_STOP_TIMEOUT_S", 0.05)
    asyncio.run(_server("stop", []).sleep_engine())
    assert killed == [1]


def _off_loop_start(monkeypatch, log):
    """vLLM's blocking start steps, recorded with whether they ran off the replica's event loop."""

    def off_loop() -> bool:
        try:
            asyncio.get_running_loop()
            return False
        except RuntimeError:
            return True

    monkeypatch.setattr(
        chat,
        "prepare_engine_config",
        lambda engine, config: log.append(("config", off_loop())) or ("engine args", "frontend args", "vllm config"),
    )
    monkeypatch.setattr(
        chat,
        "start_engine_client",
        lambda engine, config, prepared: log.append(("AsyncLLM", off_loop(), prepared[2])) or "new client",
    )


def test_on_a_cpu_wake_is_a_new_engine_started_off_the_loop_and_warmed_up(monkeypatch):
    log = []
    monkeypatch.setattr(chat, "engine_processes", lambda: [])
    _off_loop_start(monkeypatch, log)
    server = _server("stop", log)
    old = server.engine
    asyncio.run(server.sleep_engine())
    log.clear()
    assert asyncio.run(server.wake_engine())["state"] == "awake"
    # the health checks go on meanwhile: config and AsyncLLM in a thread, the rest of start() on the loop
    assert log == [("config", True), ("AsyncLLM", True, "vllm config"), ("start",), ("warm_up",)]
    assert server.engine is not old and server.engine._start_async_llm_engine() == "new client"
    assert server.engine._prepare_engine_config(None)[2] == "vllm config"


def test_a_wake_that_fails_leaves_the_engine_asleep_with_its_processes_stopped(monkeypatch):
    log = []
    monkeypatch.setattr(chat, "engine_processes", lambda: [])
    _off_loop_start(monkeypatch, log)
    server = _server("stop", log)
    asyncio.run(server.sleep_engine())

    async def failing_warm_up():
        raise RuntimeError("warm-up failed")

    server._warm_up = failing_warm_up
    with pytest.raises(RuntimeError):
        asyncio.run(server.wake_engine())
    assert asyncio.run(server.engine_state()) == "asleep" and server.engine is None


def test_an_always_on_engine_refuses_to_sleep():
    with pytest.raises(RuntimeError, match="not on demand"):
        asyncio.run(_server(None, []).sleep_engine())
