"""gateway/middleware/proxy_guard.py: Ray's proxy refuses from the headers what a public path may not carry, like the gateway."""

import asyncio
import json

import pytest

from gateway.middleware import proxy_guard
from gateway.middleware.proxy_guard import (
    PublicBodyRefusal,
    UnansweredIsUnavailable,
    middlewares,
    path_in_app,
    proxy_env,
)


def _run(guard, method: str, path: str, headers: dict) -> tuple[int, dict, bytes, list[str]]:
    """Status, headers and body of the answer to one request through `guard`, and the paths that reached the
    app behind it."""
    sent, reached = [], []

    async def downstream(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive():
        raise AssertionError("the body was read")

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(guard(downstream)(scope, receive, send))
    start = sent[0]
    return (
        start["status"],
        {k.decode(): v.decode() for k, v in start["headers"]},
        b"".join(m.get("body", b"") for m in sent[1:]),
        reached,
    )


def _guard(prefix="/", login=4096):
    return lambda downstream: PublicBodyRefusal(downstream, route_prefix=prefix, login_form_max_bytes=login)


def test_a_body_on_a_public_path_is_refused_unread_and_the_connection_closed():
    status, headers, body, reached = _run(_guard(), "GET", "/healthz", {"content-length": str(8 * 2**20)})
    assert status == 413 and headers["connection"] == "close" and not reached
    assert "GET /healthz takes no request body" in json.loads(body)["error"]["message"]
    status, _, _, reached = _run(_guard(), "GET", "/docs", {"transfer-encoding": "chunked"})
    assert status == 413 and not reached
    status, _, _, reached = _run(_guard(), "GET", "/openapi.json", {"content-length": "12x"})
    assert status == 400 and not reached


def test_everything_else_goes_on_to_the_gateway():
    for method, path, headers in [
        ("GET", "/healthz", {}),
        ("GET", "/healthz", {"content-length": "0"}),
        ("POST", "/v1/chat/completions", {"content-length": "100"}),
        ("POST", "/dashboard/login", {"content-length": "100"}),
    ]:
        status, _, _, reached = _run(_guard(), method, path, headers)
        assert status == 200 and reached == [path], (method, path)


def test_the_route_prefix_is_where_the_public_paths_are():
    assert path_in_app("/api/healthz", "/api") == "/healthz" and path_in_app("/api", "/api/") == "/"
    assert path_in_app("/apix/healthz", "/api") is None and path_in_app("/healthz", "/") == "/healthz"
    status, _, _, reached = _run(_guard("/api"), "GET", "/api/healthz", {"content-length": "5"})
    assert status == 413 and not reached
    status, _, _, reached = _run(_guard("/api"), "GET", "/healthz", {"content-length": "5"})
    assert status == 200 and reached == ["/healthz"]  # outside the app: Ray's own 404, not ours


def test_the_callback_reads_its_settings_from_the_environment(monkeypatch):
    monkeypatch.delenv(proxy_guard.SETTINGS_ENV, raising=False)
    assert middlewares() == []
    env = proxy_env("/api", 4096)
    assert env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == "gateway.middleware.proxy_guard.middlewares"
    monkeypatch.setenv(proxy_guard.SETTINGS_ENV, env[proxy_guard.SETTINGS_ENV])
    [middleware] = middlewares()
    assert middleware.cls is PublicBodyRefusal and middleware.kwargs == {
        "route_prefix": "/api",
        "login_form_max_bytes": 4096,
        "refusal_delay_s": 0.0,
        "refusal_delay_max": 0,
    }
    monkeypatch.setenv(proxy_guard.SETTINGS_ENV, proxy_env("/api", 4096, retry_after_s=10)[proxy_guard.SETTINGS_ENV])
    refusal, unanswered = middlewares()  # Ray wraps its app in them in order: the last is outermost
    assert refusal.cls is PublicBodyRefusal and "retry_after_s" not in refusal.kwargs
    assert unanswered.cls is UnansweredIsUnavailable and unanswered.kwargs == {"retry_after_s": 10}


def test_a_refusal_waits_out_its_delay_unless_too_many_already_wait():
    async def scenario():
        guard = PublicBodyRefusal(None, refusal_delay_s=0.3, refusal_delay_max=2)
        sent = []

        async def send(message):
            sent.append((message.get("status"), asyncio.get_running_loop().time()))

        async def refuse():
            scope = {"type": "http", "method": "GET", "path": "/healthz", "headers": [(b"content-length", b"9")]}
            await guard(scope, None, send)

        start = asyncio.get_running_loop().time()
        await asyncio.gather(*(refuse() for _ in range(3)))
        times = sorted(round(at - start, 1) for status, at in sent if status == 413)
        assert guard.delayed == 0
        return times

    assert asyncio.run(scenario()) == [0.0, 0.3, 0.3]  # two waited, the third found both places taken


@pytest.mark.parametrize("module", ["gateway.middleware.proxy_guard"])
def test_the_proxy_imports_nothing_heavy(module):
    import subprocess
    import sys

    code = f"import sys, {module}; print(sorted(m for m in ('vllm', 'ray', 'torch', 'fastapi') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def _through_unanswered(downstream) -> list[dict]:
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    asyncio.run(UnansweredIsUnavailable(downstream, retry_after_s=10)(scope, receive, send))
    return sent


def test_a_request_the_proxy_leaves_unanswered_gets_503_with_retry_after():
    """Ray's proxy sends nothing for a request whose replica died under it (Uvicorn would answer a bare 500)."""

    async def replica_died(scope, receive, send):
        return None

    async def proxy_failed(scope, receive, send):
        raise RuntimeError("the actor died")

    for downstream in (replica_died, proxy_failed):
        start, body = _through_unanswered(downstream)
        headers = dict(start["headers"])
        assert start["status"] == 503 and headers[b"retry-after"] == b"10"
        error = json.loads(body["body"])["error"]
        assert error["code"] == 503 and "retry" in error["message"]
        assert headers[b"content-length"] == str(len(body["body"])).encode()


def test_an_answer_or_a_started_stream_passes_untouched():
    async def answers(scope, receive, send):
        await send({"type": "http.response.start", "status": 429, "headers": [(b"retry-after", b"3")]})
        await send({"type": "http.response.body", "body": b"slow down"})

    assert [m.get("status") for m in _through_unanswered(answers)] == [429, None]

    async def cut_mid_stream(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("the replica died mid-stream")

    with pytest.raises(RuntimeError):  # its status line is gone: nothing to add
        _through_unanswered(cut_mid_stream)
