"""Schemathesis over the gateway's own OpenAPI, with a tenant key, against the real stack:
whatever it sends, no response is a 5xx.

Generation lengths are capped (max_tokens 8, no min_tokens) so the fuzz exercises parsing,
validation and routing rather than waiting on long answers from a 2-core engine.
"""

from __future__ import annotations

import uuid

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

EXAMPLES_PER_OPERATION = 30
GENERATION_CAP = 8


@pytest.fixture(scope="module")
def fuzz_headers(stack, admin_headers) -> dict:
    name = f"fuzz-{uuid.uuid4().hex[:8]}"
    response = httpx.post(
        f"{stack.url}/admin/tenants", headers=admin_headers, timeout=30, json={"name": name, "tpm": 50_000}
    )
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['api_key']}"}


def _bounded(case) -> None:
    """Keep every generation short; everything else stays as the fuzzer made it."""
    if isinstance(case.body, dict) and case.path in ("/v1/chat/completions", "/v1/completions", "/v1/rag/query"):
        case.body["max_tokens"] = GENERATION_CAP
        for field in ("max_completion_tokens", "min_tokens"):
            case.body.pop(field, None)


def test_no_input_gets_a_server_error(stack, fuzz_headers):
    # schemathesis' own pytest plugin does not run under pytest 9; its Python API with hypothesis does.
    schema = schemathesis.openapi.from_url(f"{stack.url}/openapi.json")
    server_errors, calls = [], []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def fuzz(case):
            _bounded(case)
            response = case.call(base_url=stack.url, headers=fuzz_headers, timeout=120)
            calls.append(response.status_code)
            if response.status_code >= 500:
                server_errors.append(
                    f"{case.method} {case.path} -> {response.status_code}: "
                    f"{response.text[:300]} | body: {str(case.body)[:300]}"
                )

        fuzz()
    print(
        f"fuzz: {len(calls)} requests over {len(operations)} operations; status counts "
        f"{ {code: calls.count(code) for code in sorted(set(calls))} }"
    )
    assert not server_errors, "\n".join(server_errors[:10])
