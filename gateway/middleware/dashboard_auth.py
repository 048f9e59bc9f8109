"""Who may open /dashboard: a request with the admin key as Bearer, or with the session cookie the
dashboard's login form sets (dashboard/session.py). Everything else is sent to the login form (a page
load) or answered 401 (the page's JSON refresh). Called by TenantAuthMiddleware before any route runs."""

from __future__ import annotations

from starlette.responses import RedirectResponse, Response

from dashboard import session
from gateway.error_body import error_body

DASHBOARD = "/dashboard"
LOGIN = "/dashboard/login"
STATIC = "/dashboard/static/"  # the script, style and vendored uPlot: public code, no data


def is_dashboard_path(path: str) -> bool:
    return path == DASHBOARD or path.startswith(DASHBOARD + "/")


def _header(scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return value.decode("latin-1")
    return None


def signed_in(guard, scope) -> bool:
    bearer = _header(scope, b"authorization") or ""
    scheme, _, token = bearer.partition(" ")
    if scheme.lower() == "bearer" and guard.admin_allowed(token.strip()):
        return True
    return session.valid(guard.admin_key, session.cookie_from(_header(scope, b"cookie")))


def dashboard_gate(guard, scope, path: str) -> Response | None:
    """None when the request may go on; else the answer it gets instead."""
    if not guard.admin_key:
        return error_body(404, "the dashboard is disabled: set POOLSERVE_ADMIN_KEY to enable it", "not_found_error")
    if path == LOGIN or path.startswith(STATIC) or signed_in(guard, scope):
        return None
    if path == DASHBOARD and scope["method"] == "GET":
        # Relative, so it works under any route prefix: /p/dashboard -> /p/dashboard/login.
        return RedirectResponse("dashboard/login", status_code=303)
    return error_body(
        401,
        "sign in at /dashboard/login, or send the admin key as 'Authorization: Bearer <key>'",
        "authentication_error",
    )
