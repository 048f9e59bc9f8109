"""The gateway's FastAPI app and its route map: which method answers which path."""

from __future__ import annotations

from fastapi import FastAPI

from gateway.http_errors import install_error_handlers
from gateway.middleware.request_guard import RequestBodyGuard
from gateway.middleware.tenant_auth import TenantAuthMiddleware
from gateway.routes.admin import ADMIN_ENDPOINTS
from gateway.routes.dashboard_api import DASHBOARD_ENDPOINTS
from gateway.routes.ingest_jobs import JOB_ENDPOINTS
from gateway.routes.uploads import INGEST_OPENAPI
from planner.outputs import GatewayEdge
from gateway.schemas import ServedModelList
from vllm_bridge.compat import ModelCard

ENDPOINTS = {
    "models": lambda app: app.get("/v1/models", response_model=ServedModelList),
    "model_data": lambda app: app.get("/v1/models/{model:path}", response_model=ModelCard),
    "completions": lambda app: app.post("/v1/completions"),
    "chat": lambda app: app.post("/v1/chat/completions"),
    "embeddings": lambda app: app.post("/v1/embeddings"),
    "healthz": lambda app: app.get("/healthz"),
    **ADMIN_ENDPOINTS,
    **DASHBOARD_ENDPOINTS,  # /status, /admin/collections, /dashboard
    # `:path` lets a name with '/' reach validation and get a 400 instead of a routing 404.
    "add_documents": lambda app: app.post("/v1/collections/{collection:path}/documents", openapi_extra=INGEST_OPENAPI),
    "list_collections": lambda app: app.get("/v1/collections"),
    "delete_document": lambda app: app.delete("/v1/collections/{collection:path}/documents/{document_id:path}"),
    "list_documents": lambda app: app.get("/v1/collections/{collection:path}/documents"),
    # Before get_collection, whose `:path` would otherwise take "{c}/search" for a collection name.
    "search_collection": lambda app: app.get("/v1/collections/{collection:path}/search"),
    "search_collection_post": lambda app: app.post("/v1/collections/{collection:path}/search"),
    "get_collection": lambda app: app.get("/v1/collections/{collection:path}"),
    "delete_collection": lambda app: app.delete("/v1/collections/{collection:path}"),
    "rag_query": lambda app: app.post("/v1/rag/query"),
    **JOB_ENDPOINTS,  # /v1/ingest/jobs
}


def make_app(edge: GatewayEdge) -> FastAPI:
    """The gateway's FastAPI app: error mapping, a strict body guard, and outermost tenant auth.
    No CORS middleware: cross-origin browser calls stay closed unless an operator adds it."""
    app = FastAPI(title="poolserve", docs_url="/docs", redoc_url=None)
    install_error_handlers(app, edge.gateway.unavailable_retry_after_s)
    # An over-long body is a JSON 413, and NaN, lone surrogates, invalid UTF-8 or absurd nesting a 400
    # naming the field, before anything parses or stores it.
    app.add_middleware(RequestBodyGuard, max_body_bytes=edge.gateway.max_body_bytes)
    # Outermost (added last): a request without a valid key, or one the pool guard sheds, is answered
    # before its body is even read, so unauthenticated clients cannot make the gateway buffer and parse.
    app.add_middleware(TenantAuthMiddleware, edge=edge)
    return app
