"""Runs last: the second stack variant, started once after the main stack is stopped, on the main
stack's state directory: a restart with a changed profile, as an operator makes one.

The restart: data survives it (SQLite is the truth; FAISS is rebuilt from it), and so do an admin's
revocations and deletions, even of keys and tenants that the tenants file and the environment would
otherwise bring back (the demo key is revoked before it, so this variant's requests use a second key of
the demo tenant). One stack start for both: each start costs minutes of CI.

The variant hosts three engines of the same SmolLM2 folder in one pool, served under `route_prefix: /api` by two
gateway replicas (one variant, not two: each stack start costs minutes of CI):
- speculation: the default chat with `speculative: none` and two more engines (`engines:`), alike but for
  their speculation and their model_id (each request picks its engine by `model`) give the same greedy
  text;
- the route prefix: auth must not depend on where the app is mounted, and nothing is served outside it;
- two gateway replicas: a tenant's limits hold across them (rpm N gives N requests a minute, not 2N);
- several engines: they start together (on a CPU; the rest after all of them), each answers, each enforces
  its own context length (the ngram engine's max_model_len is 512 against the others' 4096; the greedy
  prompts and their 48 tokens stay under 300), and each measures within its own plan.

The engines run in float32:
in bf16, verifying k+1 tokens in one batched step rounds differently from one-token decode, so
near-tied tokens can flip (measured in docs/BENCHMARKS.md even between concurrency 1 and 4 without
speculation). float32 removes that rounding noise, so any difference left would be speculation
changing the output. One stack instead of one per method: one Ray/embedder/gateway start, not three.
"""

from __future__ import annotations

import re
import stat
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

from tests.integration.conftest import ADMIN_KEY, DEMO_KEY, ROOT, Stack, _free_port, all_documents, write_stack_config
from tests.integration.test_security import assert_only_the_gateway_is_reachable

pytestmark = [pytest.mark.late("stops the stack"), pytest.mark.slow]

PREFIX = "/api"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
FACT = "The Quorvex lighthouse on Brisa Island was built by Admiral Tovin Selk in 1874."
QUESTION = {"collection": "durable", "question": "Who built the Quorvex lighthouse?", "top_k": 2, "max_tokens": 40}

MODEL = "smollm2-135m-instruct"
CONTEXT = (
    "[1] The Velmora bridge spans the Istra river and was opened in 1962 by mayor Ana Kovač. "
    "[2] It is 412 metres long and carries two tram lines and four lanes of traffic. "
    "[3] The bridge was repainted green in 2019 after a public vote."
)
PROMPTS = [
    [
        {"role": "system", "content": f"Answer from the context only.\n{CONTEXT}"},
        {"role": "user", "content": "How long is the Velmora bridge and what does it carry?"},
    ],
    [
        {"role": "system", "content": f"Answer from the context only.\n{CONTEXT}"},
        {"role": "user", "content": "Who opened the Velmora bridge, and when?"},
    ],
    [{"role": "user", "content": "List three uses of copper."}],
]
SPECULATIVE = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "draft_model": {
        "method": "draft_model",
        "model": str(ROOT / "models" / "SmolLM2-135M-Instruct-draft6"),
        "num_speculative_tokens": 3,
    },
}
# The engine (model_id) of each method; `none` is the default chat.
MODEL_IDS = {"none": MODEL, "ngram": "smollm2-135m-ngram", "draft_model": "smollm2-135m-draft"}
# Every engine alike but for speculation (so greedy text can differ only through it), each with the
# embedded default's 1 GiB KV pool (the float32 engines plan ~4 GiB each; the pool the fixture sizes from
# the plan is 19 GiB): max_num_seqs 16 x 1,024 tokens needs 720 MiB of float32 KV, 864 MiB with the draft's
# 6 layers, or the planner refuses the profile. The same Ray CPU share each: three of the default 0.5
# and the other replicas' 0.6 ask for 2.1 of the 2 cores, which the planner refuses too.
ENGINE = {"dtype": "float32", "kv_cache_bytes": "1GiB", "num_cpus": 0.3}
SHORT_CONTEXT = {"ngram": 512}  # max_model_len per method where it differs from the default chat's


def _answers(url: str, headers: dict, model: str) -> list[str]:
    answers = []
    for messages in PROMPTS:
        response = httpx.post(
            f"{url}/v1/chat/completions",
            headers=headers,
            timeout=300,
            json={"model": model, "messages": messages, "temperature": 0, "max_tokens": 48},
        )
        assert response.status_code == 200, response.text
        assert response.json()["model"] == model, response.text
        answers.append(response.json()["choices"][0]["message"]["content"])
    return answers


def _three_engine_config(workdir, state_dir) -> tuple:
    """The embedded default with chat in float32 without speculation, plus an ngram and a draft_model
    engine of the same folder and settings, on `state_dir`."""
    port = _free_port()
    config = write_stack_config(
        workdir,
        port,
        {**ENGINE, "speculative": {"method": "none"}},
        gateway_overrides={"replicas": 2},
        route_prefix=PREFIX,
        state_dir=state_dir,
    )
    profile_path = workdir / "profile.yaml"
    profile = yaml.safe_load(profile_path.read_text())
    profile["engines"] = [
        {
            **profile["chat"],
            "model_id": MODEL_IDS[method],
            "speculative": SPECULATIVE[method],
            "max_model_len": SHORT_CONTEXT.get(method, profile["chat"]["max_model_len"]),
        }
        for method in ("ngram", "draft_model")
    ]
    profile_path.write_text(yaml.safe_dump(profile))
    return config, port


LOG_FORWARD_WAIT_S = 30


def _engine_configs(log: str) -> dict[str, str]:
    """vLLM's engine-config line of each served model name in a serve log: model_id -> line."""
    configs = {}
    for line in log.splitlines():
        if "speculative_config=" in line:
            served = re.search(r"served_model_name=([\w.-]+)", line)
            if served:
                configs.setdefault(served.group(1), line)
    return configs


@pytest.fixture(scope="module")
def before_restart(stack, demo_headers, admin_headers) -> dict:
    """On the session's stack, before it stops: a collection and its RAG answer, a second key of the demo
    tenant; then the demo key revoked and the file-seeded tenant deleted."""
    with httpx.Client(base_url=stack.url, headers=demo_headers, timeout=120) as http:
        assert (
            http.post(
                "/v1/collections/durable/documents",
                json={
                    "documents": [
                        {"id": "lighthouse", "text": FACT},
                        {"id": "noise", "text": "Bananas are rich in potassium."},
                    ]
                },
            ).status_code
            == 200
        )
        answer = http.post("/v1/rag/query", json=QUESTION).json()
        documents = all_documents(http, "durable")
    with httpx.Client(base_url=stack.url, headers=admin_headers, timeout=60) as admin:
        second_key = admin.post("/admin/tenants/demo/keys").json()["api_key"]
        assert admin.delete(f"/admin/tenants/demo/keys/{DEMO_KEY.split('_')[1]}").status_code == 200
        assert admin.delete("/admin/tenants/seeded").status_code == 200
    assert httpx.get(f"{stack.url}/v1/models", headers=demo_headers, timeout=30).status_code == 401
    return {"answer": answer, "documents": documents, "key": second_key}


@pytest.fixture(scope="module")
def demo_key(before_restart) -> str:
    return before_restart["key"]


@pytest.fixture(scope="module")
def demo(demo_key) -> dict:
    return {"Authorization": f"Bearer {demo_key}"}


@pytest.fixture(scope="module")
def spec_stack(stack, before_restart, tmp_path_factory):
    stopped = time.monotonic()
    stack.stop()  # free the pool: one stack at a time
    print(f"session stack stopped in {time.monotonic() - stopped:.0f}s")
    workdir = tmp_path_factory.mktemp("speculative")
    config, port = _three_engine_config(workdir, stack.state_dir)
    running = Stack(config, port, workdir / "serve.log", route_prefix=PREFIX)
    try:
        # The same environment (POOLSERVE_DEMO_KEY still set) and tenants file as the session's stack.
        print(
            f"float32 stack (none, ngram, draft_model engines; 2 gateways under {PREFIX}) on the session's "
            f"state healthy in {running.start(demo_key=True):.0f}s"
        )
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def baseline(spec_stack, demo):
    return _answers(spec_stack.url, demo, MODEL_IDS["none"])


# ---- the restart -------------------------------------------------------------------------------
def test_data_revocations_and_deletions_survive_a_restart(
    spec_stack, before_restart, demo, demo_headers, admin_headers
):
    assert httpx.get(f"{spec_stack.url}/v1/models", headers=demo_headers, timeout=30).status_code == 401
    with httpx.Client(base_url=spec_stack.url, headers=admin_headers, timeout=60) as admin:
        names = [t["name"] for t in admin.get("/admin/tenants").json()["data"]]
        assert "seeded" not in names and "demo" in names
    with httpx.Client(base_url=spec_stack.url, headers=demo, timeout=120) as http:
        assert all_documents(http, "durable") == before_restart["documents"]
        after = http.post("/v1/rag/query", json=QUESTION).json()
    before = before_restart["answer"]
    assert [c["chunk_id"] for c in after["citations"]] == [c["chunk_id"] for c in before["citations"]]
    assert after["citations"][0]["document_id"] == "lighthouse"
    assert "Selk" in after["answer"]
    key_file = spec_stack.state_dir / "keys" / "seeded.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


# ---- speculation -------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_stack_matches_greedy_output(spec_stack, baseline, method, demo):
    assert _answers(spec_stack.url, demo, MODEL_IDS[method]) == baseline
    # Ray forwards a worker's lines to the serve log late (the 2026-12-08 CI read it before the ngram engine's came)
    deadline = time.monotonic() + LOG_FORWARD_WAIT_S
    while True:
        configs = _engine_configs(spec_stack.log_path.read_text(errors="replace"))
        if {MODEL_IDS["none"], MODEL_IDS[method]} <= configs.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert "speculative_config=None" in configs.get(MODEL_IDS["none"], ""), configs
    assert f"method='{method}'" in configs.get(MODEL_IDS[method], ""), configs


# ---- the route prefix and two gateway replicas -------------------------------------------------
def test_keys_are_required_under_the_prefix(spec_stack, demo):
    with httpx.Client(base_url=spec_stack.url, timeout=60) as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/v1/models").status_code == 401
        assert (
            http.get(
                "/v1/collections", headers={"Authorization": "Bearer ps_000000000000_wrongwrongwrongwrong"}
            ).status_code
            == 401
        )
        assert http.get("/admin/tenants").status_code == 401
        assert http.get("/admin/tenants", headers=demo).status_code == 401
        assert http.get("/status", headers=demo).status_code == 401
        assert http.get("/v1/models", headers=demo).status_code == 200
        assert http.get("/admin/tenants", headers=ADMIN).status_code == 200
    # Nothing is served outside the prefix.
    assert httpx.get(f"{spec_stack.origin}/v1/models", headers=demo, timeout=30).status_code == 404


def test_the_openai_client_works_under_the_prefix(spec_stack, demo_key):
    from openai import OpenAI

    client = OpenAI(base_url=f"{spec_stack.url}/v1", api_key=demo_key, timeout=120, max_retries=0)
    answer = client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0, messages=[{"role": "user", "content": "Say OK."}]
    )
    assert answer.choices[0].message.content


def test_rpm_holds_across_two_gateway_replicas(spec_stack):
    name = f"rpm-{uuid.uuid4().hex[:6]}"
    created = httpx.post(f"{spec_stack.url}/admin/tenants", headers=ADMIN, timeout=30, json={"name": name, "rpm": 10})
    assert created.status_code == 201, created.text
    headers = {"Authorization": f"Bearer {created.json()['api_key']}"}
    gateway_pids = set()
    with httpx.Client(base_url=spec_stack.url, timeout=60) as http:
        for _ in range(12):
            status = http.get("/status", headers=ADMIN).json()
            gateway_pids.update(p for r in status["replicas"] if r["name"] == "gateway" for p in r["pids"][:1])
        assert len(gateway_pids) == 2, "both gateway replicas answer"
        with ThreadPoolExecutor(max_workers=6) as pool:
            codes = list(pool.map(lambda _: http.get("/v1/models", headers=headers).status_code, range(30)))
    assert codes.count(200) == 10 and codes.count(429) == 20, codes


def test_only_the_gateway_is_reachable(spec_stack):
    assert_only_the_gateway_is_reachable(spec_stack)


# ---- several engines in one pool ---------------------------------------------------------------
def test_the_engines_share_the_pool_and_started_together(spec_stack, demo):
    with httpx.Client(base_url=spec_stack.url, headers=demo, timeout=120) as http:
        listed = {m["id"] for m in http.get("/v1/models").json()["data"]}
        assert set(MODEL_IDS.values()) <= listed
        short = MODEL_IDS["ngram"]
        too_long = http.post("/v1/completions", json={"model": short, "prompt": "word " * 600, "max_tokens": 4})
        assert too_long.status_code == 400 and "512" in too_long.json()["error"]["message"], too_long.text
        fits_the_default = http.post("/v1/completions", json={"model": MODEL, "prompt": "word " * 600, "max_tokens": 4})
        assert fits_the_default.status_code == 200, fits_the_default.text  # each engine its own limit
    status = httpx.get(f"{spec_stack.url}/status", headers=ADMIN, timeout=60).json()
    engines = {r["name"]: r for r in status["replicas"] if r["name"].startswith("chat")}
    assert set(engines) == {"chat", "chat-smollm2-135m-ngram", "chat-smollm2-135m-draft"}
    for replica in engines.values():  # each engine against its own plan (the tolerance of test_plan_vs_measured)
        at_rest = replica["planned_at_rest_bytes"]
        assert abs(replica["measured_bytes"] - at_rest) <= 0.10 * at_rest, replica
    log = spec_stack.log_path.read_text(errors="replace")
    # On a CPU the three engines start together (PoolSpec.engines_start), and the rest after all three.
    assert (
        "PoolserveLLMServer:chat + PoolserveLLMServer:chat-smollm2-135m-ngram + "
        "PoolserveLLMServer:chat-smollm2-135m-draft, then embedder" in log
    )
    for model in MODEL_IDS.values():
        assert f"start order: {model} starts, nothing to wait for" in log
        assert f"start order: {model} waits" not in log
        assert re.search(rf"chat warm-up answered in [\d.]+s \({re.escape(model)}\)", log), model
    for deployment in ("chat", "chat-smollm2-135m-ngram", "chat-smollm2-135m-draft"):
        assert f"start order: embedder starts, PoolserveLLMServer:{deployment} is running" in log
