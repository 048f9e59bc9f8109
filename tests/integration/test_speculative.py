"""Runs last: stacks with ngram and draft_model speculation give the same greedy text as none.

Each stack is the embedded default with `chat.speculative` changed, started after the main stack
is stopped (one vLLM engine at a time). They run in float32: in bf16, verifying k+1 tokens in one
batched step rounds differently from one-token decode, so near-tied tokens can flip (measured in
docs/BENCHMARKS.md even between concurrency 1 and 4 without speculation). float32 removes that
rounding noise, so any difference left would be speculation changing the output.
"""

from __future__ import annotations

import httpx
import pytest

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


def _answers(url: str, headers: dict) -> list[str]:
    answers = []
    for messages in PROMPTS:
        response = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=300, json={
            "model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 48})
        assert response.status_code == 200, response.text
        answers.append(response.json()["choices"][0]["message"]["content"])
    return answers


def _run_stack(tmp_path, method: str, headers: dict) -> list[str]:
    port = _free_port()
    overrides = {"dtype": "float32", "kv_cache_bytes": "2GiB", "speculative": SPECULATIVE.get(method, {"method": "none"})}
    config = write_stack_config(tmp_path, port, overrides)
    spec_stack = Stack(config, port, tmp_path / "serve.log")
    try:
        seconds = spec_stack.start()
        print(f"{method} float32 stack healthy in {seconds:.0f}s")
        answers = _answers(spec_stack.url, headers)
        log = spec_stack.log_path.read_text(errors="replace")
        if method == "none":
            assert "speculative_config=None" in log
        else:
            assert f"method='{method}'" in log
        return answers
    finally:
        spec_stack.stop()


@pytest.fixture(scope="module")
def baseline(stack, demo_headers, tmp_path_factory):
    stack.stop()  # free the pool: one engine at a time
    return _run_stack(tmp_path_factory.mktemp("spec-none"), "none", demo_headers)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_stack_matches_greedy_output(baseline, method, tmp_path, demo_headers):
    assert _run_stack(tmp_path, method, demo_headers) == baseline
