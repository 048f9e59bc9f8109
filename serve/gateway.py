"""The gateway's Ray binding: ray.serve.llm's OpenAI ingress, extended with poolserve's routes.

The OpenAI protocol (parsing, SSE) stays with ray.serve.llm and vLLM; the routes poolserve owns live in
gateway/ (OpenAIRoutes, KnowledgeRoutes, TenantAdminRoutes, DashboardRoutes). This class only waits for
the replicas before it and hands their handles and the plan's settings to those routes.
"""

from __future__ import annotations

from types import SimpleNamespace

from enginepair.compat import OpenAiIngress
from gateway.dashboard import DashboardRoutes
from gateway.knowledge import KnowledgeRoutes
from gateway.openai_routes import OpenAIRoutes
from gateway.tenants import TenantAdminRoutes
from planner.outputs import GatewaySettings
from serve.start_order import StartOrder


class Gateway(OpenAIRoutes, KnowledgeRoutes, TenantAdminRoutes, DashboardRoutes, OpenAiIngress):
    async def __init__(self, llm_deployments, model_cards, *, embedder, retriever, settings: GatewaySettings,
                       start: StartOrder):
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
            self._engines[model_id] = SimpleNamespace(tokenizer=tokenizers[engine.path], replica=engine.replica,
                                                      max_model_len=engine.max_model_len)
        self._healthy_until = 0.0
        self._start_memory_history()  # the dashboard's last hour of measured memory
