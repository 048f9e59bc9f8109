"""Client mistakes become 4xx with an OpenAI-style error body naming the problem; never a 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from ray.exceptions import RayTaskError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from gateway.error_body import error_body
from rag.documents.ids import InvalidIdError
from rag.store.knowledge_store import CapacityExceeded, CollectionNotFound, DocumentNotFound
from vllm_bridge.compat import VLLM_CLIENT_ERRORS, OpenAIHTTPException

logger = logging.getLogger("poolserve.gateway")

# vLLM's wording when a prompt does not fit; it can arrive wrapped in a Ray task error.
CONTEXT_ERROR_MARKERS = ("maximum context length", "longer than the maximum model length", "max_model_len")


class EngineNotRunning(RuntimeError):
    """A chat engine's deployment has no running replica: the call would wait in Ray Serve's queue."""


# A replica that died or is being restarted by Ray Serve: the request may be retried shortly.
UNAVAILABLE_MARKERS = (
    "EngineNotRunning",
    "EngineDeadError",
    "EngineCore",
    "ActorDiedError",
    "ActorUnavailableError",
    "RayActorError",
    "DeploymentUnavailableError",
    "BackPressureError",
    "WorkerCrashedError",
    "ObjectLostError",
    "engine is dead",
    "ReplicaUnavailableError",
)


def unavailable(replica: str, detail: str, retry_after_s: int) -> JSONResponse:
    response = error_body(
        503,
        f"the {replica} replica is unavailable (restarting); retry after {retry_after_s}s. "
        f"Cause: {detail.strip()[:300]}",
        "service_unavailable",
    )
    response.headers["Retry-After"] = str(retry_after_s)
    return response


def _describe_validation(exc: RequestValidationError) -> tuple[int, str]:
    errors = exc.errors()
    if any(err.get("type") == "json_invalid" for err in errors):
        return 400, "request body is not valid JSON: " + "; ".join(
            str(e.get("ctx", {}).get("error", e.get("msg"))) for e in errors
        )
    parts = []
    for err in errors[:5]:
        location = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{location or 'body'}: {err.get('msg')}")
    return 422, "invalid request: " + "; ".join(parts)


def context_length_message(exc: BaseException) -> str | None:
    text = str(exc)
    if any(marker in text for marker in CONTEXT_ERROR_MARKERS):
        return "prompt is longer than the model's context: " + text.strip().splitlines()[-1][:300]
    return None


def install_error_handlers(app: FastAPI, unavailable_retry_after_s: int) -> None:
    """unavailable_retry_after_s: the plan's Retry-After of a 503 while a replica restarts."""

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        status, message = _describe_validation(exc)
        return error_body(status, message, "invalid_request_error")

    @app.exception_handler(ValidationError)
    async def _model_validation(_: Request, exc: ValidationError):
        # Nested bodies validated by hand (e.g. the `rag` field of a chat request).
        parts = [
            f"{'.'.join(str(p) for p in err.get('loc', ())) or 'body'}: {err.get('msg')}" for err in exc.errors()[:5]
        ]
        return error_body(422, f"invalid {exc.title}: " + "; ".join(parts), "invalid_request_error")

    @app.exception_handler(InvalidIdError)
    async def _invalid_id(_: Request, exc: InvalidIdError):
        return error_body(400, str(exc), "invalid_request_error")

    @app.exception_handler(CollectionNotFound)
    @app.exception_handler(DocumentNotFound)
    async def _not_found(_: Request, exc: LookupError):
        return error_body(404, str(exc.args[0] if exc.args else exc), "not_found_error")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        kind = {404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable"}.get(
            exc.status_code, "invalid_request_error"
        )
        message = str(exc.detail)
        if exc.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
            message = f"no route for {request.method} {request.url.path}"
        response = error_body(exc.status_code, message, kind)
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    async def _mapped(_: Request, exc: Exception):
        return map_exception(exc, unavailable_retry_after_s)

    # Named classes go through Starlette's ExceptionMiddleware; only truly unexpected errors
    # reach the catch-all (which Starlette logs and re-raises after answering).
    app.add_exception_handler(OpenAIHTTPException, _mapped)
    app.add_exception_handler(RayTaskError, _mapped)
    app.add_exception_handler(Exception, _mapped)


def map_exception(exc: Exception, unavailable_retry_after_s: int) -> JSONResponse:
    # Errors raised inside other replicas arrive as RayTaskError subclasses of the cause.
    for kind, status in (
        (InvalidIdError, 400),
        (CollectionNotFound, 404),
        (DocumentNotFound, 404),
        (CapacityExceeded, 413),
    ):
        if isinstance(exc, kind):
            cause = getattr(exc, "cause", exc)
            return error_body(status, str(cause.args[0] if cause.args else cause), "invalid_request_error")
    cause = getattr(exc, "cause", exc)
    if isinstance(cause, VLLM_CLIENT_ERRORS) or isinstance(exc, VLLM_CLIENT_ERRORS):
        # vLLM's request validation (a missing prompt, a bad parameter): the client's mistake.
        return error_body(400, f"invalid request: {cause}", "invalid_request_error")
    message = context_length_message(exc)
    if message:
        return error_body(400, message, "invalid_request_error")
    text = f"{type(exc).__name__}: {exc}"
    if any(marker in text for marker in UNAVAILABLE_MARKERS):
        logger.warning("a replica is unavailable: %s", text[:500])
        return unavailable(
            "chat" if "Engine" in text or "LLM" in text else "backend", text.splitlines()[0], unavailable_retry_after_s
        )
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status < 600:
        kind = getattr(exc, "type", None) or ("invalid_request_error" if status < 500 else "internal_error")
        return error_body(status, str(getattr(exc, "message", exc)), kind)
    logger.exception("unhandled error")
    return error_body(500, f"internal error: {type(exc).__name__}", "internal_error")
