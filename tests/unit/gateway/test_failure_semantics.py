"""Failure semantics: a dead or restarting replica is a 503 with Retry-After (not a 500), work a
hung-up client started still runs to its end, and auth sees the path inside the app."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.http_errors import map_exception, unavailable
from gateway.middleware.tenant_auth import app_path
from gateway.work import run_to_completion

RETRY_AFTER_S = 10  # the profile default (gateway.unavailable_retry_after_s)

pytestmark = pytest.mark.timeout(60)


def _named(name: str, message: str) -> Exception:
    """An exception of a class with this name (Ray's and vLLM's are matched by name, as they may
    arrive wrapped in a RayTaskError whose text names the cause)."""
    return type(name, (Exception,), {})(message)


def _body(response) -> dict:
    return json.loads(response.body)


@pytest.mark.parametrize(
    "exc, replica",
    [
        (_named("EngineDeadError", "EngineCore encountered an issue"), "chat"),
        (_named("ActorDiedError", "The actor died unexpectedly before finishing this task."), "backend"),
        (_named("DeploymentUnavailableError", "deployment Embedder is unavailable"), "backend"),
        (_named("BackPressureError", "queue is full"), "backend"),
        (RuntimeError("ray.exceptions.RayTaskError(ActorUnavailableError): replica restarting"), "backend"),
        (RuntimeError("wrapped: vllm.v1.engine.exceptions.EngineDeadError: engine is dead"), "chat"),
    ],
)
def test_unavailable_replicas_are_503_with_retry_after(exc, replica):
    response = map_exception(exc, RETRY_AFTER_S)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == str(RETRY_AFTER_S)
    body = _body(response)
    assert body["object"] == "error" and body["message"] == body["error"]["message"]
    assert body["error"]["code"] == 503 and body["error"]["type"] == "service_unavailable"
    assert body["error"]["message"].startswith(f"the {replica} replica is unavailable")
    assert type(exc).__name__ in body["error"]["message"]


def test_an_ordinary_error_stays_a_500_without_retry_after():
    response = map_exception(ValueError("bad things"), RETRY_AFTER_S)
    assert response.status_code == 500 and "retry-after" not in response.headers
    body = _body(response)
    assert body["error"] == {"message": "internal error: ValueError", "type": "internal_error", "code": 500}
    assert "bad things" not in body["message"], "internal details are not shown to clients"


def test_context_length_is_a_400_and_an_http_status_is_kept():
    response = map_exception(RuntimeError("This model's maximum context length is 4096 tokens"), RETRY_AFTER_S)
    assert response.status_code == 400 and _body(response)["error"]["type"] == "invalid_request_error"

    class Upstream(Exception):
        status_code, type, message = 429, "rate_limit_error", "slow down"

    response = map_exception(Upstream(), RETRY_AFTER_S)
    assert response.status_code == 429
    assert _body(response)["error"] == {"message": "slow down", "type": "rate_limit_error", "code": 429}


def test_unavailable_body():
    response = unavailable("chat", "  EngineDeadError: boom\n" + "x" * 1000, retry_after_s=7)
    assert response.status_code == 503 and response.headers["Retry-After"] == "7"
    body = _body(response)
    message = body["error"]["message"]
    assert message.startswith(
        "the chat replica is unavailable (restarting); retry after 7s. Cause: EngineDeadError: boom"
    )
    assert len(message) < 400, "the cause is cut short"
    assert body == {
        "error": {"message": message, "type": "service_unavailable", "code": 503},
        "object": "error",
        "message": message,
    }


# ---- run_to_completion ---------------------------------------------------------------------


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_run_to_completion_returns_the_value():
    async def work():
        await asyncio.sleep(0.01)
        return 42

    assert _run(run_to_completion(work())) == 42


def test_run_to_completion_passes_an_error_on():
    async def work():
        raise KeyError("x")

    with pytest.raises(KeyError):
        _run(run_to_completion(work()))


@pytest.mark.parametrize("cancels", [1, 3])
def test_a_cancelled_request_waits_for_its_work_to_finish(cancels):
    # Conditions, not sleeps: the work runs until the test releases it, after every cancellation.
    state = {"done": False}

    async def main():
        started, release = asyncio.Event(), asyncio.Event()

        async def work():
            started.set()
            await release.wait()
            state["done"] = True
            return "stored"

        request = asyncio.ensure_future(run_to_completion(work()))
        await asyncio.wait_for(started.wait(), timeout=5)
        for _ in range(cancels):  # a client hanging up, and a server cancelling again
            request.cancel()
            for _ in range(5):  # let the cancellation reach run_to_completion and the shield
                await asyncio.sleep(0)
        assert not request.done() and not state["done"], "cancelling must not end the request before its work"
        release.set()
        done, _ = await asyncio.wait([request], timeout=5)
        return request in done, request

    finished, request = _run(main())
    assert finished and state["done"]
    assert request.cancelled(), "the cancellation still goes through once the work is done"


# ---- app_path ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scope, expected",
    [
        ({"path": "/api/v1/models", "root_path": "/api"}, "/v1/models"),
        ({"path": "/api", "root_path": "/api"}, "/"),
        ({"path": "/api/", "root_path": "/api/"}, "/"),
        ({"path": "/api/admin/tenants", "root_path": "/api/"}, "/admin/tenants"),
        ({"path": "/v1/models"}, "/v1/models"),
        ({"path": "/v1/models", "root_path": ""}, "/v1/models"),
        ({"path": "/apix/v1", "root_path": "/api"}, "/apix/v1"),
        ({"path": "/v1/models", "root_path": "/api"}, "/v1/models"),  # already stripped by the server
        ({"path": "//admin", "root_path": ""}, "/admin"),
    ],
)
def test_app_path(scope, expected):
    assert app_path(scope) == expected
