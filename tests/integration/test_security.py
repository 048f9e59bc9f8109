"""Hardening against the real stack: nothing but the gateway reachable, private state, every bad input a
clear 4xx with nothing stored, limits charged before work runs, per-tenant prefix-cache salts."""

from __future__ import annotations

import json
import socket
import stat
import time
import uuid

import grpc
import httpx
import pytest

from stackctl.processes import is_loopback, listening_sockets
from tests.integration.conftest import with_most_of_a_minute_left

MODEL = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"


def _new_tenant(stack, admin_headers, **limits) -> tuple[str, dict]:
    name = f"sec-{uuid.uuid4().hex[:8]}"
    response = httpx.post(
        f"{stack.url}/admin/tenants", headers=admin_headers, timeout=30, json={"name": name, **limits}
    )
    assert response.status_code == 201, response.text
    return name, {"Authorization": f"Bearer {response.json()['api_key']}"}


def _unauthenticated_grpc_call(port: int) -> grpc.StatusCode:
    """Ray Serve's inter-replica gRPC method, called without Ray's token."""
    with grpc.insecure_channel(f"{_machine_address()}:{port}") as channel:
        call = channel.unary_unary(
            "/ray.serve.ASGIService/HandleRequest", request_serializer=lambda x: x, response_deserializer=lambda x: x
        )
        try:
            call(b"", timeout=10)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def _machine_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent; picks the outward interface
        return probe.getsockname()[0]


def assert_only_the_gateway_is_reachable(stack) -> None:
    pids = stack.pids()
    assert len(pids) >= 8, "the stack's processes carry its marker"
    sockets = listening_sockets(pids)
    assert any(port == stack.port for _, _, port in sockets), "the gateway is among the stack's sockets"
    exposed = [(pid, address, port) for pid, address, port in sockets if not is_loopback(address)]
    # Ray Serve 2.60 binds each replica's inter-deployment gRPC server to [::] (hard-coded); those
    # ports must refuse a caller without Ray's token. Anything else off loopback is a failure.
    for pid, address, port in exposed:
        assert _unauthenticated_grpc_call(port) == grpc.StatusCode.UNAUTHENTICATED, (pid, address, port)
    for pid, address, port in exposed:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        assert "ServeReplica" in cmdline, f"{cmdline[:80]} listens on {address}:{port}"


def test_only_loopback_listens_or_rays_token_is_required(stack):
    assert_only_the_gateway_is_reachable(stack)


def test_state_is_private(stack, client):
    client.post("/v1/collections/private/documents", json={"documents": [{"id": "d", "text": "private text"}]})
    state = stack.state_dir
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name.endswith("-wal") for p in files) and any(p.name == "ray-auth-token" for p in files)
    loose = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in files if stat.S_IMODE(p.stat().st_mode) & 0o077}
    assert not loose


@pytest.mark.parametrize(
    "body, status, names",
    [
        (b'{"documents":[{"id":"a","text":"x","metadata":{"score":NaN}}]}', 400, "documents[0].metadata.score"),
        (b'{"documents":[{"id":"a","text":"x","metadata":{"v":Infinity}}]}', 400, "documents[0].metadata.v"),
        (b'{"documents":[{"id":"a","text":"bad \\ud800 text"}]}', 400, "documents[0].text"),
        (b'{"documents":[{"id":"a","text":"\xff\xfe broken"}]}', 400, "UTF-8"),
        (
            json.dumps({"documents": [{"id": "a", "text": "x", "metadata": {"k": "v" * 9000}}]}).encode(),
            422,
            "metadata",
        ),
        (
            json.dumps(
                {"documents": [{"id": "a", "text": "x", "metadata": {"a": {"b": {"c": {"d": {"e": 1}}}}}}]}
            ).encode(),
            422,
            "metadata",
        ),
    ],
)
def test_bad_documents_are_refused_and_nothing_is_stored(client, body, status, names):
    collection = f"bad-{uuid.uuid4().hex[:6]}"
    response = client.post(
        f"/v1/collections/{collection}/documents", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    assert names in response.json()["error"]["message"]
    assert client.get(f"/v1/collections/{collection}").status_code == 404


def test_an_ingest_is_atomic(client):
    collection = f"atomic-{uuid.uuid4().hex[:6]}"
    docs = [{"id": "good", "text": "A fine document."}, {"id": "../evil", "text": "path-like id"}]
    response = client.post(f"/v1/collections/{collection}/documents", json={"documents": docs})
    assert response.status_code == 400 and "evil" in response.json()["error"]["message"]
    assert client.get(f"/v1/collections/{collection}").status_code == 404
    too_long = [{"id": "ok", "text": "fine"}, {"id": "big", "text": "x" * 2_000_001}]
    response = client.post(f"/v1/collections/{collection}/documents", json={"documents": too_long})
    assert response.status_code == 413 and "documents[1].text" in response.json()["error"]["message"]
    assert client.get(f"/v1/collections/{collection}").status_code == 404


@pytest.mark.parametrize(
    "path, payload, names",
    [
        ("/v1/embeddings", {"model": EMBED, "input": "lone \ud800 surrogate"}, "input"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 32}, "n is 32"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi \udfff"}]},
            "messages[0].content",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": ["p"] * 17, "max_tokens": 1}, "17 prompts"),
        ("/v1/completions", {"model": MODEL, "prompt": "p", "n": 5, "max_tokens": 1}, "n is 5"),
        ("/v1/rag/query", {"collection": "any", "question": "q", "top_k": 999}, "top_k"),
        ("/v1/embeddings", {"model": EMBED, "input": ["x"] * 2049}, "2049"),
    ],
)
def test_bad_requests_name_the_field(client, path, payload, names):
    body = json.dumps(payload, ensure_ascii=True).encode()  # lone surrogates travel as \\ud800 escapes
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert names in response.json()["error"]["message"], response.text


def test_an_oversized_body_is_an_openai_shaped_413(client):
    response = client.post(
        "/v1/embeddings",
        content=b'{"input": "' + b"a" * (9 * 2**20) + b'"}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 413
    assert response.headers["content-type"].startswith("application/json")
    assert "max_body_bytes" in response.json()["error"]["message"]


def test_tpm_charges_the_estimate_before_running_and_settles_after(stack, admin_headers):
    name, headers = _new_tenant(stack, admin_headers, tpm=300)
    # A new minute between the requests would hold none of the first's tokens; they take about a second.
    with_most_of_a_minute_left(10)
    with httpx.Client(base_url=stack.url, headers=headers, timeout=120) as http:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "temperature": 0}
        ok = http.post("/v1/chat/completions", json={**chat, "max_tokens": 20})
        assert ok.status_code == 200, ok.text
        used = ok.json()["usage"]["total_tokens"]
        # prompt + 120 x 2 fits the TPM but not what is left of the minute: refused before the engine runs.
        started = time.monotonic()
        refused = http.post("/v1/chat/completions", json={**chat, "max_tokens": 120, "n": 2, "temperature": 0.8})
        assert refused.status_code == 429 and "estimated" in refused.json()["error"]["message"], refused.text
        assert int(refused.headers["Retry-After"]) >= 1 and time.monotonic() - started < 5
        # prompt + 200 x 2 is over the whole TPM: no minute could hold it, so no Retry-After and nothing charged.
        too_large = http.post("/v1/chat/completions", json={**chat, "max_tokens": 200, "n": 2, "temperature": 0.8})
        assert too_large.status_code == 429 and "Request too large" in too_large.json()["error"]["message"]
        assert "Limit 300, Requested" in too_large.json()["error"]["message"] and "Retry-After" not in too_large.headers
        # Settled to the real count (not the 4k-token default budget): small requests still fit.
        assert http.post("/v1/chat/completions", json={**chat, "max_tokens": 20}).status_code == 200
    usage = httpx.get(f"{stack.url}/admin/tenants/{name}/usage", headers=admin_headers, timeout=30).json()["usage"]
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in usage) >= 2 * used - 4


def test_a_client_that_hangs_up_still_pays_and_holds_its_slot(stack, admin_headers):
    name, headers = _new_tenant(stack, admin_headers, max_concurrency=1)
    texts = [f"passage {i} " + "word " * 200 for i in range(384)]
    with httpx.Client(base_url=stack.url, headers=headers) as http:
        with pytest.raises(httpx.TimeoutException):
            http.post("/v1/embeddings", json={"model": EMBED, "input": texts}, timeout=1.0)
        # The embedder is still working on the abandoned request: the slot is still taken.
        busy = http.post("/v1/embeddings", json={"model": EMBED, "input": "second"}, timeout=30)
        assert busy.status_code == 429 and "concurrent" in busy.json()["error"]["message"]
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if http.post("/v1/embeddings", json={"model": EMBED, "input": "again"}, timeout=30).status_code == 200:
                break
            time.sleep(1)
        else:
            pytest.fail("the slot was never released")
    usage = httpx.get(f"{stack.url}/admin/tenants/{name}/usage", headers=admin_headers, timeout=30).json()["usage"]
    assert sum(r["prompt_tokens"] for r in usage) > 384 * 200, "the abandoned work was charged"


def _charged(stack, admin_headers, name: str) -> tuple[int, int]:
    usage = httpx.get(f"{stack.url}/admin/tenants/{name}/usage", headers=admin_headers, timeout=30).json()["usage"]
    return sum(r["prompt_tokens"] for r in usage), sum(r["completion_tokens"] for r in usage)


def _until_charged(stack, admin_headers, name: str, completion_at_least: int) -> tuple[int, int]:
    deadline, charged = time.monotonic() + 120, (0, 0)
    while time.monotonic() < deadline:
        charged = _charged(stack, admin_headers, name)
        if charged[1] >= completion_at_least:
            return charged
        time.sleep(0.5)
    pytest.fail(f"charged {charged} (prompt, completion) after 120 s; expected {completion_at_least}+ completion")


def test_a_non_streamed_chat_whose_client_hangs_up_runs_on_and_is_charged(stack, admin_headers):
    name, headers = _new_tenant(stack, admin_headers)
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to one hundred."}],
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=stack.url, headers=headers) as http:
        with pytest.raises(httpx.TimeoutException):
            http.post("/v1/chat/completions", json=chat, timeout=0.5)
    prompt, completion = _until_charged(stack, admin_headers, name, 48)
    assert prompt > 0 and completion == 48, "what ran was charged: the whole answer"


def test_a_cut_stream_of_n_choices_is_charged_every_choice(stack, admin_headers):
    name, headers = _new_tenant(stack, admin_headers)
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "n": 3,
        "max_tokens": 64,
        "temperature": 0.8,
        "ignore_eos": True,
        "stream": True,
    }
    received = {}
    with httpx.Client(base_url=stack.url, headers=headers, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json=chat) as response:
            assert response.status_code == 200
            for line in response.iter_lines():  # leave once every choice has sent 8 pieces
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:]).get("choices", []):
                        received[choice["index"]] = received.get(choice["index"], 0) + 1
                if len(received) == 3 and min(received.values()) >= 8:
                    break
    _, completion = _until_charged(stack, admin_headers, name, 3 * 6)
    assert completion >= 3 * 6, f"every choice's tokens so far were charged, not one choice's: {completion}"


def test_each_tenant_gets_its_own_prefix_cache_namespace(client):
    # vLLM accepts the salt the gateway sets (and one the client adds, which only splits its own namespace).
    for salt in (None, "client-salt"):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 4, "temperature": 0}
        if salt:
            body["cache_salt"] = salt
        assert client.post("/v1/chat/completions", json=body).status_code == 200
