"""The OpenAI-shaped error answer, in a module light enough for Ray's HTTP proxy to import (starlette only):
gateway/middleware/proxy_guard.py refuses there what the gateway would refuse from the headers alone."""

from __future__ import annotations

from starlette.responses import JSONResponse


def error_body(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "code": status}, "object": "error", "message": message},
    )
