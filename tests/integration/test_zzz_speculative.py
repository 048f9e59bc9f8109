"""Runs last: stacks with ngram and draft_model speculation give the same greedy text as none.

Each speculative stack is the embedded default with only `chat.speculative` changed, started
after the main stack is stopped (one vLLM engine at a time fits this machine's plan).
"""

from __future__ import annotations

import httpx
import pytest

from tests.integration.conftest import ROOT, Stack, _free_port, write_stack_config

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


def _answers(url: str, headers: dict) -> list[str]:
    answers = []
    for messages in PROMPTS:
        response = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=300, json={
            "model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 48})
        assert response.status_code == 200, response.text
        answers.append(response.json()["choices"][0]["message"]["content"])
    return answers


@pytest.fixture(scope="module")
def baseline(stack, admin_headers):
    created = httpx.post(f"{stack.url}/admin/tenants", json={"name": "spec-baseline"}, headers=admin_headers, timeout=30)
    assert created.status_code == 201, created.text
    answers = _answers(stack.url, {"Authorization": f"Bearer {created.json()['api_key']}"})
    stack.stop()  # free the pool for the speculative stacks
    return answers


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_stack_matches_greedy_output(baseline, method, tmp_path, demo_headers):
    port = _free_port()
    config = write_stack_config(tmp_path, port, {"speculative": SPECULATIVE[method]})
    spec_stack = Stack(config, port, tmp_path / "serve.log")
    try:
        seconds = spec_stack.start()
        print(f"{method} stack healthy in {seconds:.0f}s")
        assert _answers(spec_stack.url, demo_headers) == baseline
        log = spec_stack.log_path.read_text(errors="replace")
        assert "speculative_config=None" not in log and f"method='{method}'" in log
    finally:
        spec_stack.stop()
