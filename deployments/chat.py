"""Chat replica: ray.serve.llm's LLMServer (vLLM) configured from the plan, warmed up before ready."""

from __future__ import annotations

import logging
import time

from ray.serve.llm import LLMConfig
from ray.serve.llm.deployment import LLMServer

from deployments.process_memory import process_tree_memory
from deployments.start_order import wait_for_predecessors
from planner.plan import ReplicaPlan
from planner.profile import ChatSpec

logger = logging.getLogger("poolserve.chat")
# The replica actor itself only relays requests; the engine's CPU share sits in its bundle.
REPLICA_ACTOR_CPUS = 0.05


class PoolserveLLMServer(LLMServer):
    """LLMServer that answers one short request before Serve marks the replica ready."""

    async def start(self):
        # Engines start one at a time: each after the one before has allocated its KV cache.
        from ray import serve

        start_after = [tuple(p) for p in self._llm_config.experimental_configs.get("start_after", [])]
        await wait_for_predecessors(self._llm_config.model_id, start_after, serve.get_replica_context().app_name)
        await super().start()
        await self._warm_up()

    async def _warm_up(self) -> None:
        from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest

        prompt = self._llm_config.experimental_configs.get("warmup_prompt", "Say OK.")
        request = ChatCompletionRequest(
            model=self._llm_config.model_id, messages=[{"role": "user", "content": prompt}],
            max_tokens=4, temperature=0.0, stream=False,
        )
        started = time.monotonic()
        async for _ in await self.chat(request):
            pass
        logger.info("chat warm-up answered in %.1fs", time.monotonic() - started)

    async def memory(self) -> dict:
        return process_tree_memory()


def engine_placement(chat_plan: ReplicaPlan) -> tuple[dict, dict, dict[str, str]]:
    """The replica actor's options, the engine's bundle and the env vLLM needs, as ray.serve.llm 2.60 and
    vLLM 0.32 read them (site-packages paths under ray/llm/_internal/serve and vllm/):

    - core/server/llm_server.py get_deployment_options: the replica's num_cpus/num_gpus/memory are added to
      the engine's first bundle and the replica actor runs in bundle 0.
    - engines/vllm/vllm_models.py: a GPU key in a bundle makes the engine a GPU one, which forces
      distributed_executor_backend="ray" (CPU bundles: "mp"); the vLLM worker is then a Ray actor of its own.
    - vllm/v1/executor/ray_executor.py _init_workers_ray: that worker asks num_gpus=VLLM_RAY_PER_WORKER_GPUS
      (default 1.0) from the first bundle that has a GPU key (or VLLM_RAY_BUNDLE_INDICES).
    So the engine's whole GPU share sits in its bundle, the replica actor asks none (it only relays; a
    share of its own would double bundle 0's GPU), and VLLM_RAY_PER_WORKER_GPUS must equal the share.
    """
    options = chat_plan.ray_actor_options
    gpus = options.num_gpus or 0
    actor = options.as_dict()
    for key in ("num_cpus", "num_gpus"):
        actor.pop(key, None)
    bundle: dict = {"CPU": max(0.05, options.num_cpus - REPLICA_ACTOR_CPUS)}
    env: dict[str, str] = {}
    if gpus:
        bundle["GPU"] = gpus
        # vllm_models.py get_runtime_env_with_local_env_vars derives this same value (str of the bundle's
        # fraction) but only for its own start-up tasks' runtime_env, not the replica's, and the executor
        # reads it in the EngineCore the replica spawns: without it the worker asks a whole GPU from a
        # fractional bundle and never schedules (ray#58328). Set here, it reaches the replica's env.
        env["VLLM_RAY_PER_WORKER_GPUS"] = str(gpus)
    return {**actor, "num_cpus": REPLICA_ACTOR_CPUS}, bundle, env


def llm_config_from_plan(chat: ChatSpec, chat_plan: ReplicaPlan, start_after: list[tuple[str, str]]) -> LLMConfig:
    """One engine's ray.serve.llm config, every number from its plan. The replica's Serve name is
    `PoolserveLLMServer:<plan name>` (`chat` for the first engine)."""
    actor_options, bundle, gpu_env = engine_placement(chat_plan)
    return LLMConfig(
        model_loading_config={"model_id": chat.model_id, "model_source": chat.model},
        engine_kwargs=chat_plan.vllm.as_dict(),
        deployment_config={
            "name": chat_plan.name,
            "num_replicas": 1,
            "max_ongoing_requests": 256,
            "ray_actor_options": actor_options,
            "health_check_period_s": 10,
            "health_check_timeout_s": 60,
        },
        placement_group_config={"bundles": [bundle], "strategy": "PACK"},
        runtime_env={"env_vars": {**chat_plan.env, **gpu_env}},
        experimental_configs={"warmup_prompt": chat.warmup_prompt, "start_after": [list(p) for p in start_after]},
        log_engine_metrics=True,
    )
