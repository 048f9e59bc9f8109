"""Chat replica: ray.serve.llm's LLMServer (vLLM) configured from the plan, warmed up before ready."""

from __future__ import annotations

import asyncio
import logging
import os
import time

from vllm_bridge.compat import (
    NODE_INIT_CALLBACK,
    Batcher,
    ChatCompletionRequest,
    LLMConfig,
    LLMServer,
    adapt_engine_env,
    ENGINE_START_TIMEOUT_S,
    engine_client,
    prepare_engine_config,
    release_engine_caches,
    start_engine_client,
    stop_output_handler,
    use_started_client,
)
from system.process_memory import process_tree_memory, release_freed_heap
from vllm_bridge.engine_ranks import end_local_engine, engine_processes, start_rank_hosts
from vllm_bridge.worker_extension import EXACT_SLEEP_BACKUPS_METHOD, WORKER_TRIM_METHOD
from deployments.start_order import wait_for_predecessors
from planner.engine_args import REPLICA_ONLY_ENV
from planner.gpu import engine_placement
from planner.on_demand_plan import OnDemandEngine
from planner.outputs import ChatReplicaSettings, EngineRank
from planner.plan import ReplicaPlan
from planner.profile import ChatSpec

logger = logging.getLogger("poolserve.chat")


class FirstOutputBatcher(Batcher):
    """ray.serve.llm's stream batcher, except that the first batch leaves as soon as the engine's first
    output does instead of at the end of the first interval (50 ms): up to one interval less to the first
    token, the same number of messages after it."""

    async def stream(self):
        if not self.interval_s:  # 0 (no batching) or None (one batch): the Batcher's own behaviour
            async for batch in super().stream():
                yield batch
            return
        try:
            batch = await self._first_outputs()
            more, is_done = self.check_done_and_drain()
            if batch or more:
                yield self._merge_results(batch + more)
            if is_done:
                self.read_task.result()  # the engine's exception, if any
                return
        except BaseException:
            self.read_task.cancel()  # the client left (or the engine failed) before the first batch
            raise
        async for batch in super().stream():
            yield batch

    async def _first_outputs(self) -> list:
        """The first output, once there is one (nothing if the engine's stream ends first)."""
        first_item = asyncio.ensure_future(self.queue.get())
        finished = asyncio.ensure_future(self.done_event.wait())
        try:
            await asyncio.wait({first_item, finished}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            finished.cancel()
            if not first_item.done():
                first_item.cancel()
        await asyncio.sleep(0)  # what the same engine step produced (the role chunk's content) goes too
        return [first_item.result()] if first_item.done() and not first_item.cancelled() else []


WORKER_RPC_TIMEOUT_S = 30.0  # a Worker busy with one long prefill answers the RPC after it
# Pinning a level-1 engine's host copies at its start: 16-18 s for a 27B's 50 GiB on the H100 (docs/GPU.md).
PIN_HOST_COPIES_TIMEOUT_S = 300.0
ENGINE_STOP_TIMEOUT_S = 30.0  # EngineCore ends its Workers and exits in ~1 s; a stuck one is killed after this


class PoolserveLLMServer(LLMServer):
    """LLMServer that answers one short request before Serve marks the replica ready, sends each
    stream's first output without waiting for the batching interval, and hands its vLLM Workers'
    freed heap back to the pool every `heap_trim_interval_s`."""

    def _batch_output_stream(self, generator):
        return FirstOutputBatcher(generator, interval_ms=self._get_batch_interval_ms()).stream()

    async def start(self):
        # On a GPU engines start one at a time, each after the one before has allocated its KV cache; on a
        # CPU together (PoolSpec.engines_start), with nothing to wait for.
        from ray import serve

        dropped = drop_replica_only_env()
        if dropped:
            logger.info("this replica's interpreter started with %s; its engine's processes will not", dropped)
        settings = replica_settings(self._llm_config)
        await wait_for_predecessors(
            self._llm_config.model_id,
            settings.start_after,
            serve.get_replica_context().app_name,
            settings.start_wait_timeout_s,
        )
        self._rank_lost: str | None = None
        self._engine_state = "awake"
        self._engine_state_lock = asyncio.Lock()  # one sleep or wake at a time
        if settings.ranks:
            self._watch_ranks(settings.ranks, settings.rank_engine_kwargs)
        if settings.start_asleep:  # beyond the plan's awake set: its first request wakes it
            self._engine_state = "asleep"
            logger.info("on-demand engine %s starts asleep (not started)", self._llm_config.model_id)
        else:
            await super().start()
            await self._keep_sleep_copies_exact()
            await self._warm_up()
        self._last_worker_trim: dict = {}
        interval = settings.heap_trim_interval_s
        if interval > 0:
            self._trim_task = asyncio.get_running_loop().create_task(self._trim_workers_every(interval))

    def _watch_ranks(self, ranks: list[EngineRank], engine_kwargs: dict) -> None:
        """A split engine: start its ranks on the other nodes and mark this replica unhealthy the moment one
        of them ends (its node lost, its process dead), so Serve replaces the replica and all its ranks
        together instead of leaving an engine that waits on a rank forever."""
        hosts = start_rank_hosts(ranks, engine_kwargs)

        async def watch(host, rank: EngineRank) -> None:
            try:
                code = await host.wait.remote()
                reason = f"exited with {code}"
            except Exception as exc:  # the actor died with its node, or was never placed
                reason = f"were lost ({type(exc).__name__}: {exc})"
            if self._rank_lost is None:
                self._rank_lost = f"the engine's ranks on node_rank {rank.node_rank} {reason}"
                ended = end_local_engine()
                logger.error(
                    "%s: this replica is now unhealthy (%d engine processes here ended)", self._rank_lost, ended
                )

        loop = asyncio.get_running_loop()
        self._rank_hosts = hosts  # kept: the actors live as long as this replica holds them
        self._rank_watches = [loop.create_task(watch(h, r)) for h, r in zip(hosts, ranks)]

    async def check_health(self) -> None:
        if getattr(self, "_rank_lost", None):
            raise RuntimeError(self._rank_lost)
        await super().check_health()

    async def _warm_up(self) -> None:
        prompt = replica_settings(self._llm_config).warmup_prompt
        request = ChatCompletionRequest(
            model=self._llm_config.model_id,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=4,
            temperature=0.0,
            stream=False,
        )
        started = time.monotonic()
        async for _ in await self.chat(request):
            pass
        logger.info("chat warm-up answered in %.1fs (%s)", time.monotonic() - started, self._llm_config.model_id)

    async def _trim_workers_every(self, interval_s: float) -> None:
        """glibc keeps what the Worker frees under load as free heap it never returns (mallinfo2's
        fordblks: +150 MiB in 7 minutes, docs/STRESS.md); malloc_trim(0) returns all of it. The RPC runs
        between two engine steps."""
        while True:
            await asyncio.sleep(interval_s)
            client = engine_client(self)
            if client is None:
                continue
            started = time.monotonic()
            try:
                await client.collective_rpc(WORKER_TRIM_METHOD, timeout=WORKER_RPC_TIMEOUT_S)
            except Exception:  # an engine that cannot run it (or died: its health check reports that)
                logger.warning("trimming the vLLM Workers' heap failed; not trying again", exc_info=True)
                return
            self._last_worker_trim = {"at": time.time(), "seconds": round(time.monotonic() - started, 4)}

    # ---- on demand (issue 48): the wake coordinator (deployments/wake_coordinator.py) calls these ----
    async def engine_state(self) -> str:
        """ "awake", "asleep", "sleeping" or "waking"."""
        return self._engine_state

    async def sleep_engine(self) -> dict:
        """Put the engine to sleep as planned: vLLM's sleep at the planned level (a GPU), or stop it (a CPU:
        no sleep mode; its EngineCore and Workers exit and their memory returns to the pool). The replica
        actor stays: what the plan counts as a sleeping engine's bytes. Returns the state and the seconds."""
        sleep = self._sleep_mode()
        async with self._engine_state_lock:
            if self._engine_state == "asleep":
                return {"state": "asleep", "seconds": 0.0}
            self._engine_state = "sleeping"
            started = time.monotonic()
            try:
                if sleep == "stop":
                    await self._stop_engine()
                else:
                    await self.sleep(level=1 if sleep == "level_1" else 2)
            except BaseException:
                self._engine_state = "awake"
                raise
            self._engine_state = "asleep"
            seconds = round(time.monotonic() - started, 2)
            logger.info("engine %s asleep (%s) in %.1fs", self._llm_config.model_id, sleep, seconds)
            return {"state": "asleep", "seconds": seconds}

    async def wake_engine(self) -> dict:
        """Wake the engine: vLLM's wake_up (a GPU) or a cold start as LLMServer.start does it (a CPU), then the
        warm-up request, so its first real request meets a warm engine. Returns the state and the seconds."""
        sleep = self._sleep_mode()
        async with self._engine_state_lock:
            if self._engine_state == "awake":
                return {"state": "awake", "seconds": 0.0}
            self._engine_state = "waking"
            started = time.monotonic()
            try:
                if sleep == "stop" or self.engine is None:  # a CPU, or an engine that started asleep
                    await asyncio.wait_for(self._cold_start(), timeout=ENGINE_START_TIMEOUT_S)
                else:
                    await self.wakeup()
                await self._warm_up()
            except BaseException:
                self._engine_state = "asleep"
                if sleep == "stop":
                    await self._stop_engine()  # a half-started engine's processes return their memory too
                raise
            self._engine_state = "awake"
            seconds = round(time.monotonic() - started, 2)
            logger.info("engine %s awake in %.1fs", self._llm_config.model_id, seconds)
            return {"state": "awake", "seconds": seconds}

    async def _cold_start(self) -> None:
        """A new engine, as LLMServer.start builds it, except that vLLM's blocking steps (its config, and the
        AsyncLLM constructor that waits while EngineCore loads the weights) run in a thread: on the replica's
        loop they would block its health checks past Serve's 60 s, and Serve would replace the replica."""
        engine = self._engine_cls(self._llm_config)
        prepared = await asyncio.to_thread(prepare_engine_config, engine, self._llm_config)
        client = await asyncio.to_thread(start_engine_client, engine, self._llm_config, prepared)
        self.engine = use_started_client(engine, prepared, client)
        await self._start_engine()
        await self._keep_sleep_copies_exact()

    async def _keep_sleep_copies_exact(self) -> None:
        """Level 1 (a discrete GPU): the engine's Workers keep the weights' host copies at their exact size, mapped
        and pinned now, at its start, and reused by every sleep (vllm_bridge/sleep_backups.py), as the plan counts
        them; vLLM's own copies round each allocation up to a power of two, and stay as well."""
        if replica_settings(self._llm_config).sleep != "level_1":
            return
        client = engine_client(self)
        try:
            installed = await client.collective_rpc(EXACT_SLEEP_BACKUPS_METHOD, timeout=PIN_HOST_COPIES_TIMEOUT_S)
        except Exception:  # the engine serves on; its first sleep makes (or fails to make) the copies
            logger.exception("engine %s: exact sleep copies not installed or not pinned", self._llm_config.model_id)
            return
        if all(installed):
            logger.info("engine %s: level-1 sleep keeps exact host copies", self._llm_config.model_id)
        else:
            logger.error(
                "engine %s: vLLM's own level-1 sleep kept (exact host copies not installed): its host memory "
                "asleep exceeds the plan",
                self._llm_config.model_id,
            )

    def _sleep_mode(self) -> str:
        sleep = replica_settings(self._llm_config).sleep
        if sleep is None:
            raise RuntimeError(f"engine {self._llm_config.model_id!r} is not on demand: it never sleeps")
        return sleep

    async def _stop_engine(self) -> None:
        """Shut vLLM's engine down and check that its processes are gone (those left after
        ENGINE_STOP_TIMEOUT_S are killed); the replica answers health checks asleep (engine None)."""
        client = engine_client(self)
        engine, self.engine = self.engine, None  # from here health checks pass and requests find no engine
        if client is not None:
            stop_output_handler(client)  # a planned stop logs no EngineDeadError traceback
            await asyncio.to_thread(client.shutdown, ENGINE_STOP_TIMEOUT_S)
        if engine is not None:
            await engine.shutdown()
        del client, engine
        release_engine_caches()  # else each stopped engine's tokenizers stay, +41 MiB a wake (vllm_bridge/compat.py)
        release_freed_heap()  # what the stopped engine's objects freed goes back to the pool now, not at a reading
        deadline = time.monotonic() + ENGINE_STOP_TIMEOUT_S
        while engine_processes() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        left = engine_processes()
        if left:
            logger.warning("%d engine processes outlived the shutdown; killing them", len(left))
            end_local_engine()

    async def memory(self) -> dict:
        # smaps reads of the engine's process tree: in a thread, not on the loop that streams tokens
        measured = await asyncio.to_thread(process_tree_memory)
        return {**measured, "worker_heap_trim": getattr(self, "_last_worker_trim", {})}


def drop_replica_only_env() -> dict[str, str]:
    """Remove from this process's environment what the plan set for its interpreter alone (read at its start),
    so that the engine processes it starts do not inherit it; returns what was removed."""
    return {name: os.environ.pop(name) for name in REPLICA_ONLY_ENV if name in os.environ}


# The key of experimental_configs (ray.serve.llm's free-form dict) that holds the replica's typed settings.
SETTINGS_KEY = "poolserve"


def replica_settings(llm_config: LLMConfig) -> ChatReplicaSettings:
    """The replica's settings, typed again should ray.serve.llm have copied its config through a dict."""
    return ChatReplicaSettings.model_validate(llm_config.experimental_configs[SETTINGS_KEY])


def rank_configs(rank_plans: list[ReplicaPlan]) -> list[EngineRank]:
    """A CPU split engine's shares on other nodes as the replica starts them: bundle i + 1 of its placement
    group is share i's node (vllm_bridge/engine_ranks.py)."""
    ranks = []
    for index, share in enumerate(rank_plans, start=1):
        bundle = engine_placement(share.ray_actor_options)[1]
        ranks.append(
            EngineRank(
                node_rank=share.engine_node_rank,
                bundle_index=index,
                num_cpus=bundle["CPU"],
                resources={k: v for k, v in bundle.items() if k != "CPU"},
                env=dict(share.env),
            )
        )
    return ranks


def llm_config_from_plan(
    chat: ChatSpec,
    chat_plan: ReplicaPlan,
    start_after: list[tuple[str, str]],
    rank_plans: list[ReplicaPlan] = (),
    on_demand: OnDemandEngine | None = None,
    start_asleep: bool = False,
) -> LLMConfig:
    """One engine's ray.serve.llm config, every number from its plan. The replica's Serve name is
    `PoolserveLLMServer:<plan name>` (`chat` for the first engine). `rank_plans`: a CPU engine split over
    nodes, its shares on the other nodes (ReplicaPlans with engine_node_rank), started by the replica.
    `on_demand`: the plan's entry of an on-demand engine; `start_asleep`: it is beyond the awake set."""
    actor_options, bundle = engine_placement(chat_plan.ray_actor_options)
    engine_kwargs = chat_plan.vllm.as_dict()  # complete as planned (planner/engine_args.py)
    ranks = rank_configs(list(rank_plans))
    return LLMConfig(
        model_loading_config={"model_id": chat.model_id, "model_source": chat.model},
        engine_kwargs=engine_kwargs,
        deployment_config={
            "name": chat_plan.name,
            "num_replicas": 1,
            **chat_plan.serve.deployment_options(),
            "ray_actor_options": actor_options,
        },
        placement_group_config={
            "bundles": [bundle, *(engine_placement(r.ray_actor_options)[1] for r in rank_plans)],
            "strategy": "PACK",
        },
        runtime_env={"env_vars": adapt_engine_env(chat_plan.env)},  # what the installed vLLM accepts
        experimental_configs={
            SETTINGS_KEY: ChatReplicaSettings(
                warmup_prompt=chat.warmup_prompt,
                start_after=list(start_after),
                start_wait_timeout_s=chat_plan.serve.start_wait_timeout_s,
                heap_trim_interval_s=chat.heap_trim_interval_s,
                ranks=ranks,
                # A headless rank is vLLM's own engine: it names the model as an argument, not as Serve's source.
                rank_engine_kwargs={**engine_kwargs, "model": chat.model} if ranks else {},
                sleep=on_demand.sleep if on_demand else None,
                start_asleep=start_asleep,
            ),
            "stream_batching_interval_ms": chat.stream_batching_interval_ms,  # ray.serve.llm's own key
        },
        log_engine_metrics=True,
        callback_config=NODE_INIT_CALLBACK,
    )
