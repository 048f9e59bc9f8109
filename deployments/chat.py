"""Chat replica: ray.serve.llm's LLMServer (vLLM) configured from the plan, warmed up before ready."""

from __future__ import annotations

import logging
import time

from ray.serve.llm import LLMConfig
from ray.serve.llm.deployment import LLMServer

from deployments.process_memory import process_tree_rss
from planner.plan import Plan
from planner.profile import Profile

logger = logging.getLogger("poolserve.chat")
# The replica actor itself only relays requests; the engine's CPU share sits in its bundle.
REPLICA_ACTOR_CPUS = 0.05


class PoolserveLLMServer(LLMServer):
    """LLMServer that answers one short request before Serve marks the replica ready."""

    async def start(self):
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
        return process_tree_rss()


def llm_config_from_plan(profile: Profile, plan: Plan) -> LLMConfig:
    chat_plan = plan.replica("chat")
    engine_cpus = max(0.05, chat_plan.ray_actor_options.get("num_cpus", 0.5) - REPLICA_ACTOR_CPUS)
    actor_options = {k: v for k, v in chat_plan.ray_actor_options.items() if k != "num_cpus"}
    return LLMConfig(
        model_loading_config={"model_id": profile.chat.model_id, "model_source": profile.chat.model},
        engine_kwargs=dict(chat_plan.vllm),
        deployment_config={
            "name": "chat",
            "num_replicas": 1,
            "max_ongoing_requests": 256,
            "ray_actor_options": {**actor_options, "num_cpus": REPLICA_ACTOR_CPUS},
            "health_check_period_s": 10,
            "health_check_timeout_s": 60,
        },
        placement_group_config={"bundles": [{"CPU": engine_cpus}], "strategy": "PACK"},
        runtime_env={"env_vars": dict(chat_plan.env)},
        experimental_configs={"warmup_prompt": profile.chat.warmup_prompt},
        log_engine_metrics=True,
    )
