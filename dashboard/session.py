"""Dashboard sessions: a browser cannot send a Bearer header when it loads a page, so the login form
trades the admin key for a cookie holding an HMAC-signed expiry.

Stateless: the signing key is derived from the admin key, so every gateway replica accepts the same
cookie, and changing the admin key ends every session. The cookie holds no secret that would let
anyone call the admin API: it only opens /dashboard.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

COOKIE_NAME = "poolserve_dashboard"
SESSION_TTL_S = 8 * 3600
_KEY_CONTEXT = b"poolserve dashboard session v1"


def _signing_key(admin_key: str) -> bytes:
    return hmac.new(admin_key.encode(), _KEY_CONTEXT, hashlib.sha256).digest()


def _signature(admin_key: str, payload: str) -> str:
    digest = hmac.new(_signing_key(admin_key), payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def issue(admin_key: str, now: float | None = None, ttl_s: int = SESSION_TTL_S) -> str:
    """'<expiry>.<nonce>.<signature>': the nonce makes every login's token different."""
    payload = f"{int((now if now is not None else time.time()) + ttl_s)}.{secrets.token_urlsafe(12)}"
    return f"{payload}.{_signature(admin_key, payload)}"


def valid(admin_key: str, token: str | None, now: float | None = None, ttl_s: int = SESSION_TTL_S) -> bool:
    """True for an unexpired token this admin key signed; False for anything else (never raises)."""
    if not admin_key or not token or len(token) > 200:
        return False
    payload, _, signature = token.rpartition(".")
    expiry, _, nonce = payload.partition(".")
    if not expiry.isdigit() or not nonce:
        return False
    if not hmac.compare_digest(signature.encode(), _signature(admin_key, payload).encode()):
        return False
    now = now if now is not None else time.time()
    return now < int(expiry) <= now + ttl_s


def cookie_from(header: str | None) -> str | None:
    """The session token in a Cookie header, or None."""
    for part in (header or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE_NAME and value:
            return value
    return None


def cookie_secure(setting: bool | str, scheme: str, forwarded_proto: str | None, trust_forwarded: bool) -> bool:
    """The Secure flag: the profile's true/false, or for "auto" whether the browser reached us over
    https: the request's own scheme, or (only when the operator says a TLS proxy sets it, since a
    client could send it too) the first X-Forwarded-Proto."""
    if setting != "auto":
        return bool(setting)
    if scheme == "https":
        return True
    return trust_forwarded and (forwarded_proto or "").split(",")[0].strip().lower() == "https"


def set_cookie_header(token: str, path: str, secure: bool, max_age: int = SESSION_TTL_S) -> str:
    """HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it), Secure over https."""
    return f"{COOKIE_NAME}={token}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict" + (
        "; Secure" if secure else ""
    )
