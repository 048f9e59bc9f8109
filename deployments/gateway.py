"""The gateway's Ray binding: ray.serve.llm's OpenAI ingress, extended with poolserve's routes.

The OpenAI protocol (parsing, SSE) stays with ray.serve.llm and vLLM; the routes poolserve owns live in
gateway/ (OpenAIRoutes, KnowledgeRoutes, TenantAdminRoutes, DashboardRoutes). This class only waits for
the replicas before it and hands their handles and the plan's settings to those routes.
"""

from __future__ import annotations

from types import SimpleNamespace

from deployments.start_order import StartOrder
from gateway.on_demand_gate import OnDemandGate
from gateway.routes.admin import TenantAdminRoutes
from gateway.routes.dashboard_api import DashboardRoutes
from gateway.routes.knowledge import KnowledgeRoutes
from gateway.routes.openai_api import OpenAIRoutes
from planner.outputs import GatewaySettings
from vllm_bridge.compat import OpenAiIngress


class Gateway(OpenAIRoutes, KnowledgeRoutes, TenantAdminRoutes, DashboardRoutes, OpenAiIngress):
    async def __init__(
        self,
        llm_deployments,
        model_cards,
        *,
        embedder,
        retriever,
        settings: GatewaySettings,
        start: StartOrder,
        wake=None,
    ):
        from ray import serve
        from transformers import AutoTokenizer

        await start.wait("gateway", serve.get_replica_context().app_name)
        super().__init__(llm_deployments, model_cards)

        self._embedder = embedder
        self._retriever = retriever
        self._settings = settings
        self._chat_model_id = settings.chat_model_id
        self._embed_model_id = settings.embed_model_id
        # Each engine's tokenizer lets the gateway refuse an over-long prompt with a 400 before the engine.
        tokenizers = {}
        self._engines = {}
        for model_id, engine in settings.chat_models.items():
            if engine.path not in tokenizers:
                tokenizers[engine.path] = AutoTokenizer.from_pretrained(engine.path)
            self._engines[model_id] = SimpleNamespace(
                tokenizer=tokenizers[engine.path], replica=engine.replica, max_model_len=engine.max_model_len
            )
        # issue 48: the pool's wake coordinator (deployments/wake_coordinator.py), None with no on-demand engine
        self._on_demand = OnDemandGate(wake, {m for m, card in settings.chat_models.items() if card.on_demand})
        self._healthy_until = 0.0
        self._start_memory_history()  # the dashboard's last hour of measured memory

    async def _engine_running(self, model: str) -> bool | None:
        """Whether the engine's deployment has a RUNNING replica, as the Serve controller sees it (a replica
        whose node is lost is STARTING again, or pending, until a node with its resource is back)."""
        import asyncio

        from ray import serve

        deployment = f"PoolserveLLMServer:{self._engines[model].replica}"
        try:
            status = await asyncio.to_thread(serve.status)
            app = status.applications[serve.get_replica_context().app_name]
            return app.deployments[deployment].replica_states.get("RUNNING", 0) > 0
        except Exception:  # the controller is busy or moving: unknown, the call keeps waiting
            return None
