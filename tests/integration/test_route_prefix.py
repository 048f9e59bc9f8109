"""Runs last: one more stack variant, started once after the main stack is stopped: served under
`route_prefix: /api`, with two gateway replicas and two chat engines in one pool
(configs/cpu-two-engines.yaml).

Auth must not depend on where the app is mounted; a tenant's limits must hold across gateway replicas
(rpm N gives N requests a minute, not 2N); the engines start one at a time and both answer.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.integration.conftest import ADMIN_KEY, DEMO_KEY, Stack, _free_port, write_stack_config
from tests.integration.test_security import assert_only_the_gateway_is_reachable

pytestmark = pytest.mark.late("stops the stack")

PREFIX = "/api"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
DEMO = {"Authorization": f"Bearer {DEMO_KEY}"}


@pytest.fixture(scope="module")
def prefixed(stack, tmp_path_factory):
    stack.stop()  # one stack at a time on a 2-core machine
    workdir = tmp_path_factory.mktemp("prefixed")
    port = _free_port()
    config = write_stack_config(workdir, port, gateway_overrides={"replicas": 2}, route_prefix=PREFIX,
                                base_profile="cpu-two-engines.yaml")
    running = Stack(config, port, workdir / "serve.log", route_prefix=PREFIX)
    try:
        print(f"prefixed stack (2 gateways, 2 engines) healthy in {running.start():.0f}s")
        yield running
    finally:
        running.stop()


def test_keys_are_required_under_the_prefix(prefixed):
    with httpx.Client(base_url=prefixed.url, timeout=60) as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/v1/models").status_code == 401
        assert http.get("/v1/collections", headers={"Authorization": "Bearer ps_000000000000_wrongwrongwrongwrong"}).status_code == 401
        assert http.get("/admin/tenants").status_code == 401
        assert http.get("/admin/tenants", headers=DEMO).status_code == 401
        assert http.get("/status", headers=DEMO).status_code == 401
        assert http.get("/v1/models", headers=DEMO).status_code == 200
        assert http.get("/admin/tenants", headers=ADMIN).status_code == 200
    # Nothing is served outside the prefix.
    assert httpx.get(f"{prefixed.origin}/v1/models", headers=DEMO, timeout=30).status_code == 404


def test_the_openai_client_works_under_the_prefix(prefixed):
    from openai import OpenAI

    client = OpenAI(base_url=f"{prefixed.url}/v1", api_key=DEMO_KEY, timeout=120, max_retries=0)
    answer = client.chat.completions.create(model="smollm2-135m-instruct", max_tokens=8, temperature=0,
                                            messages=[{"role": "user", "content": "Say OK."}])
    assert answer.choices[0].message.content


def test_rpm_holds_across_two_gateway_replicas(prefixed):
    name = f"rpm-{uuid.uuid4().hex[:6]}"
    created = httpx.post(f"{prefixed.url}/admin/tenants", headers=ADMIN, timeout=30, json={"name": name, "rpm": 10})
    assert created.status_code == 201, created.text
    headers = {"Authorization": f"Bearer {created.json()['api_key']}"}
    gateway_pids = set()
    with httpx.Client(base_url=prefixed.url, timeout=60) as http:
        for _ in range(12):
            status = http.get("/status", headers=ADMIN).json()
            gateway_pids.update(p for r in status["replicas"] if r["name"] == "gateway" for p in r["pids"][:1])
        assert len(gateway_pids) == 2, "both gateway replicas answer"
        with ThreadPoolExecutor(max_workers=6) as pool:
            codes = list(pool.map(lambda _: http.get("/v1/models", headers=headers).status_code, range(30)))
    assert codes.count(200) == 10 and codes.count(429) == 20, codes


def test_only_the_gateway_is_reachable(prefixed):
    assert_only_the_gateway_is_reachable(prefixed)


def test_two_engines_share_the_pool_and_started_one_after_the_other(prefixed):
    with httpx.Client(base_url=prefixed.url, headers=DEMO, timeout=120) as http:
        listed = {m["id"] for m in http.get("/v1/models").json()["data"]}
        assert {"smollm2-135m-instruct", "smollm2-135m-plain"} <= listed
        for model in ("smollm2-135m-instruct", "smollm2-135m-plain"):
            answer = http.post("/v1/chat/completions", json={"model": model, "max_tokens": 8, "temperature": 0,
                                                            "messages": [{"role": "user", "content": "Say OK."}]})
            assert answer.status_code == 200 and answer.json()["model"] == model, answer.text
        too_long = http.post("/v1/completions", json={"model": "smollm2-135m-plain", "prompt": "word " * 2100,
                                                     "max_tokens": 4})
        assert too_long.status_code == 400 and "2048" in too_long.json()["error"]["message"], too_long.text
    status = httpx.get(f"{prefixed.url}/status", headers=ADMIN, timeout=60).json()
    engines = {r["name"]: r for r in status["replicas"] if r["name"].startswith("chat")}
    assert set(engines) == {"chat", "chat-smollm2-135m-plain"}
    for replica in engines.values():  # each engine against its own plan (the tolerance of test_plan_vs_measured)
        at_rest = replica["planned_at_rest_bytes"]
        assert abs(replica["measured_bytes"] - at_rest) <= 0.10 * at_rest, replica
    log = prefixed.log_path.read_text(errors="replace")
    waited = log.index("start order: smollm2-135m-plain waits for PoolserveLLMServer:chat")
    assert log.index("chat warm-up answered") < log.index("start order: smollm2-135m-plain starts")
    assert waited < log.index("start order: embedder starts")
