"""Runs last: engines with ngram and draft_model speculation give the same greedy text as one without.

One stack, started after the main stack is stopped, hosts three engines of the same SmolLM2 folder in
one pool: the default chat with `speculative: none` and two more engines (`engines:`), alike but for
their speculation and their model_id; each request picks its engine by `model`. They run in float32:
in bf16, verifying k+1 tokens in one batched step rounds differently from one-token decode, so
near-tied tokens can flip (measured in docs/BENCHMARKS.md even between concurrency 1 and 4 without
speculation). float32 removes that rounding noise, so any difference left would be speculation
changing the output. One stack instead of one per method: one Ray/embedder/gateway start, not three.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest
import yaml

from tests.integration.conftest import ROOT, Stack, _free_port, write_stack_config

pytestmark = [pytest.mark.late("stops the stack"), pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
CONTEXT = ("[1] The Velmora bridge spans the Istra river and was opened in 1962 by mayor Ana Kovač. "
           "[2] It is 412 metres long and carries two tram lines and four lanes of traffic. "
           "[3] The bridge was repainted green in 2019 after a public vote.")
PROMPTS = [
    [{"role": "system", "content": f"Answer from the context only.\n{CONTEXT}"},
     {"role": "user", "content": "How long is the Velmora bridge and what does it carry?"}],
    [{"role": "system", "content": f"Answer from the context only.\n{CONTEXT}"},
     {"role": "user", "content": "Who opened the Velmora bridge, and when?"}],
    [{"role": "user", "content": "List three uses of copper."}],
]
SPECULATIVE = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "draft_model": {"method": "draft_model", "model": str(ROOT / "models" / "SmolLM2-135M-Instruct-draft6"),
                    "num_speculative_tokens": 3},
}
# The engine (model_id) of each method; `none` is the default chat.
MODEL_IDS = {"none": MODEL, "ngram": "smollm2-135m-ngram", "draft_model": "smollm2-135m-draft"}
# Every engine alike but for speculation (so greedy text can differ only through it), each with the
# embedded default's 1 GiB KV pool (the float32 engines plan ~4 GiB each; the pool the fixture sizes from
# the plan is 19 GiB): max_num_seqs 16 x 1,024 tokens needs 720 MiB of float32 KV, 864 MiB with the draft's
# 6 layers, or the planner refuses the profile. The same Ray CPU share each: three of the default 0.5
# and the other replicas' 0.6 ask for 2.1 of the 2 cores, which the planner refuses too.
ENGINE = {"dtype": "float32", "kv_cache_bytes": "1GiB", "num_cpus": 0.3}


def _answers(url: str, headers: dict, model: str) -> list[str]:
    answers = []
    for messages in PROMPTS:
        response = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=300, json={
            "model": model, "messages": messages, "temperature": 0, "max_tokens": 48})
        assert response.status_code == 200, response.text
        assert response.json()["model"] == model, response.text
        answers.append(response.json()["choices"][0]["message"]["content"])
    return answers


def _three_engine_config(workdir) -> tuple:
    """The embedded default with chat in float32 without speculation, plus an ngram and a draft_model
    engine of the same folder and settings."""
    port = _free_port()
    config = write_stack_config(workdir, port, {**ENGINE, "speculative": {"method": "none"}})
    profile_path = workdir / "profile.yaml"
    profile = yaml.safe_load(profile_path.read_text())
    profile["engines"] = [{**profile["chat"], "model_id": MODEL_IDS[method], "speculative": SPECULATIVE[method]}
                          for method in ("ngram", "draft_model")]
    profile_path.write_text(yaml.safe_dump(profile))
    return config, port


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
def spec_stack(stack, tmp_path_factory):
    stopped = time.monotonic()
    stack.stop()  # free the pool: one stack at a time
    print(f"session stack stopped in {time.monotonic() - stopped:.0f}s")
    workdir = tmp_path_factory.mktemp("speculative")
    config, port = _three_engine_config(workdir)
    running = Stack(config, port, workdir / "serve.log")
    try:
        print(f"float32 stack (none, ngram, draft_model engines) healthy in {running.start():.0f}s")
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def baseline(spec_stack, demo_headers):
    return _answers(spec_stack.url, demo_headers, MODEL_IDS["none"])


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_stack_matches_greedy_output(spec_stack, baseline, method, demo_headers):
    assert _answers(spec_stack.url, demo_headers, MODEL_IDS[method]) == baseline
    configs = _engine_configs(spec_stack.log_path.read_text(errors="replace"))
    assert "speculative_config=None" in configs.get(MODEL_IDS["none"], ""), configs
    assert f"method='{method}'" in configs.get(MODEL_IDS[method], ""), configs
