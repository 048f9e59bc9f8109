"""The chat replica's periodic trim of its vLLM Workers' freed heap: the interval comes from the
profile, the Workers get the extension whose method the RPC names (a name: vLLM's IPC carries no
function), and an engine that cannot run it stops the loop with a logged warning instead of retrying
every interval. The engine client is a fake (no vLLM here); the method itself runs for real."""

from __future__ import annotations

import asyncio
import logging

from planner.plan import build_plan
from planner.profile import load_profile
from deployments.chat import PoolserveLLMServer, llm_config_from_plan, replica_settings
from tests.fakes.engine import FakeLLMEngine
from vllm_bridge.worker_extension import WORKER_EXTENSION, WORKER_TRIM_METHOD, PoolserveWorkerExtension


class FakeEngineClient:
    def __init__(self, fail_after: int | None = None):
        self.calls, self.fail_after = [], fail_after

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise RuntimeError("this engine runs no callables")
        assert isinstance(method, str), "vLLM's msgspec IPC refuses a function"
        self.calls.append((method, timeout))
        return [getattr(PoolserveWorkerExtension(), method)()]  # what vLLM's run_method does in the Worker


def server_with(client) -> PoolserveLLMServer:
    server = PoolserveLLMServer.__new__(PoolserveLLMServer)  # no Serve replica, no engine start
    server.engine = FakeLLMEngine(client=client)
    server._last_worker_trim = {}
    return server


def test_the_interval_comes_from_the_profile_and_the_workers_get_the_extension():
    profile = load_profile("configs/cpu-tiny.yaml")
    profile.chat.heap_trim_interval_s = 12.5
    config = llm_config_from_plan(profile.chat, build_plan(profile).replica("chat"), [])
    assert replica_settings(config).heap_trim_interval_s == 12.5
    assert config.engine_kwargs["worker_extension_cls"] == "vllm_bridge.worker_extension.PoolserveWorkerExtension"
    profile.chat.heap_trim_interval_s = 0
    off = llm_config_from_plan(profile.chat, build_plan(profile).replica("chat"), [])
    assert "worker_extension_cls" not in off.engine_kwargs


def test_the_stream_batching_interval_comes_from_the_profile():
    profile = load_profile("configs/cpu-tiny.yaml")
    config = llm_config_from_plan(profile.chat, build_plan(profile).replica("chat"), [])
    assert config.experimental_configs["stream_batching_interval_ms"] == 50.0  # Ray Serve LLM's own default
    profile.chat.stream_batching_interval_ms = 0
    unbatched = llm_config_from_plan(profile.chat, build_plan(profile).replica("chat"), [])
    assert unbatched.experimental_configs["stream_batching_interval_ms"] == 0


def test_the_extension_is_importable_by_the_name_vllm_is_given():
    import importlib

    module, name = WORKER_EXTENSION.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is PoolserveWorkerExtension
    assert getattr(PoolserveWorkerExtension(), WORKER_TRIM_METHOD)() is None


def test_each_interval_trims_every_worker_and_records_how_long_it_took():
    client = FakeEngineClient()
    server = server_with(client)

    async def run():
        task = asyncio.create_task(server._trim_workers_every(0.01))
        for _ in range(200):  # bounded: at most 2 s
            if len(client.calls) >= 3:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(run())
    assert len(client.calls) >= 3
    assert all(method == WORKER_TRIM_METHOD and timeout == 30.0 for method, timeout in client.calls)
    assert server._last_worker_trim["seconds"] >= 0 and server._last_worker_trim["at"] > 0


def test_an_engine_that_cannot_run_it_stops_the_loop_with_a_warning(caplog):
    client = FakeEngineClient(fail_after=1)
    server = server_with(client)
    with caplog.at_level(logging.WARNING, logger="poolserve.chat"):
        asyncio.run(asyncio.wait_for(server._trim_workers_every(0.01), timeout=5))  # returns: no retry loop
    assert len(client.calls) == 1
    assert any("not trying again" in r.getMessage() and r.exc_info for r in caplog.records)


def test_no_engine_yet_is_skipped_not_an_error():
    server = server_with(None)

    async def run():
        task = asyncio.create_task(server._trim_workers_every(0.01))
        await asyncio.sleep(0.05)
        assert not task.done()
        task.cancel()

    asyncio.run(run())
    assert server._last_worker_trim == {}


def test_a_level_1_engine_on_a_discrete_gpu_gets_the_extension_and_installs_exact_sleep_copies(caplog):
    from vllm_bridge.worker_extension import EXACT_SLEEP_BACKUPS_METHOD

    profile = load_profile("configs/gpu-on-demand.yaml")
    profile.chat.heap_trim_interval_s = 0
    plan = build_plan(profile)
    config = llm_config_from_plan(profile.chat, plan.replica("chat"), [], on_demand=plan.on_demand.engines["chat"])
    assert replica_settings(config).sleep == "level_1"
    assert config.engine_kwargs["worker_extension_cls"] == "vllm_bridge.worker_extension.PoolserveWorkerExtension"

    class Workers:
        def __init__(self, answer: bool):
            self.calls, self.answer = [], answer

        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            self.calls.append(method)
            assert timeout >= 60  # pinning a 27B's copies took 16-18 s on the H100
            return [self.answer]

    for answer in (True, False):
        server = server_with(Workers(answer))
        server._llm_config = config
        with caplog.at_level(logging.INFO, logger="poolserve.chat"):
            caplog.clear()
            asyncio.run(server._keep_sleep_copies_exact())
        assert server.engine._engine_client.calls == [EXACT_SLEEP_BACKUPS_METHOD]
        assert ("exceeds the plan" in caplog.text) is not answer

    server = server_with(FakeEngineClient(fail_after=0))  # an engine whose Workers lack the method: it still serves
    server._llm_config = config
    with caplog.at_level(logging.INFO, logger="poolserve.chat"):
        caplog.clear()
        asyncio.run(server._keep_sleep_copies_exact())
    assert "exact sleep copies not installed or not pinned" in caplog.text and "exceeds the plan" not in caplog.text

    cpu = load_profile("configs/cpu-on-demand.yaml")
    cpu_config = llm_config_from_plan(
        cpu.chat, build_plan(cpu).replica("chat"), [], on_demand=build_plan(cpu).on_demand.engines["chat"]
    )
    server = server_with(Workers(True))
    server._llm_config = cpu_config
    asyncio.run(server._keep_sleep_copies_exact())  # a CPU engine stops instead: nothing to install
    assert server.engine._engine_client.calls == []
