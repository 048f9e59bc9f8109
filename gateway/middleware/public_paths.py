"""What a request without a valid key may cost: the public paths take no body (the login form a small
one), every such request counts against its client address's limits (tenancy/client_limits.py), and
all of it is decided from the headers, before a byte of the body is read.

Called by TenantAuthMiddleware (gateway/middleware/tenant_auth.py), which runs before the body guard.
"""

from __future__ import annotations

from starlette.responses import Response

from gateway.error_body import error_body
from gateway.middleware.dashboard_auth import LOGIN, STATIC
from tenancy.client_limits import ClientLimiter, ClientRefusal

# The only routes served without a key; every other path needs the tenant key (fail closed).
PUBLIC_PATHS = ("/healthz", "/docs", "/docs/oauth2-redirect", "/openapi.json")


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path == LOGIN or path.startswith(STATIC)


def body_limit(method: str, path: str, login_form_max_bytes: int) -> int:
    """Bytes of body a public request may carry: the login form's POST a small form, the rest none."""
    return login_form_max_bytes if method == "POST" and path == LOGIN else 0


def _header(scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return value.decode("latin-1")
    return None


def body_refusal(scope, path: str, limit: int) -> Response | None:
    """The answer for a public request whose headers announce more body than `limit`, or None.
    A body without a Content-Length (chunked) is refused too: its size is unknown until read."""
    declared = _header(scope, b"content-length")
    chunked = _header(scope, b"transfer-encoding") is not None
    where = f"{scope['method']} {path}"
    if declared is not None and not (declared.strip().isascii() and declared.strip().isdigit()):
        return error_body(400, f"Content-Length header {declared[:40]!r} is not a byte count", "invalid_request_error")
    size = int(declared) if declared is not None else None
    if limit == 0 and (chunked or (size or 0) > 0):
        return error_body(
            413,
            f"{where} takes no request body (this one is "
            f"{f'{size} bytes' if size is not None else 'chunked'}); it was not read",
            "invalid_request_error",
        )
    if limit > 0 and chunked and size is None:
        return error_body(
            411,
            f"{where} needs a Content-Length (at most {limit} bytes: gateway.login_form_max_bytes)",
            "invalid_request_error",
        )
    if size is not None and size > limit:
        return error_body(
            413,
            f"{where} takes at most {limit} bytes of body (gateway.login_form_max_bytes); "
            f"this one is {size}; it was not read",
            "invalid_request_error",
        )
    return None


def client_address(scope) -> str:
    """The peer's address (behind a proxy, the proxy's: the limits then apply to it as one client)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def too_many(refusal: ClientRefusal) -> Response:
    response = error_body(429, refusal.message, "rate_limit_error")
    response.headers["Retry-After"] = str(refusal.retry_after_seconds)
    return response


async def serve_public(app, clients: ClientLimiter, login_form_max_bytes: int, path: str, scope, receive, send) -> None:
    """A public request: refused from its headers when it is one too many or carries a body it may
    not; else served, holding one of its client's in-flight slots until answered."""
    address = client_address(scope)
    refusal = clients.enter(address)
    if refusal is not None:
        return await too_many(refusal)(scope, receive, send)
    try:
        refused = body_refusal(scope, path, body_limit(scope["method"], path, login_form_max_bytes))
        await (refused or app)(scope, receive, send)
    finally:
        clients.leave(address)


async def refuse_unauthenticated(clients: ClientLimiter, answer: Response, scope, receive, send) -> None:
    """A request with a missing or wrong key: its 401 (or redirect), or 429 once its client is over
    the minute's limit; the body is never read."""
    refusal = clients.note_rejected_key(client_address(scope))
    await (too_many(refusal) if refusal is not None else answer)(scope, receive, send)
