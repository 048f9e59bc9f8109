"""Runs late: data survives a restart (SQLite is the truth; FAISS is rebuilt from it), and so do an
admin's revocations and deletions, even of keys and tenants that the tenants file and the environment
would otherwise bring back."""

from __future__ import annotations

import stat

import httpx
import pytest

from tests.integration.conftest import DEMO_KEY
from tests.integration.conftest import all_documents

pytestmark = pytest.mark.late("restarts the stack")

FACT = "The Quorvex lighthouse on Brisa Island was built by Admiral Tovin Selk in 1874."


def test_data_revocations_and_deletions_survive_a_restart(stack, demo_headers, admin_headers):
    with httpx.Client(base_url=stack.url, headers=demo_headers, timeout=120) as http:
        assert http.post("/v1/collections/durable/documents", json={"documents": [
            {"id": "lighthouse", "text": FACT}, {"id": "noise", "text": "Bananas are rich in potassium."}]}).status_code == 200
        question = {"collection": "durable", "question": "Who built the Quorvex lighthouse?", "top_k": 2, "max_tokens": 40}
        before = http.post("/v1/rag/query", json=question).json()
        info_before = all_documents(http, "durable")
    with httpx.Client(base_url=stack.url, headers=admin_headers, timeout=60) as admin:
        second_key = admin.post("/admin/tenants/demo/keys").json()["api_key"]
        demo_key_id = DEMO_KEY.split("_")[1]
        assert admin.delete(f"/admin/tenants/demo/keys/{demo_key_id}").status_code == 200
        assert admin.delete("/admin/tenants/seeded").status_code == 200
    assert httpx.get(f"{stack.url}/v1/models", headers=demo_headers, timeout=30).status_code == 401

    # Same environment (POOLSERVE_DEMO_KEY still set) and the same tenants file: neither comes back.
    restart_seconds = stack.restart(demo_key=True)
    print(f"restart to healthy: {restart_seconds:.0f}s")
    assert httpx.get(f"{stack.url}/v1/models", headers=demo_headers, timeout=30).status_code == 401
    with httpx.Client(base_url=stack.url, headers=admin_headers, timeout=60) as admin:
        names = [t["name"] for t in admin.get("/admin/tenants").json()["data"]]
        assert "seeded" not in names and "demo" in names
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {second_key}"}, timeout=120) as http:
        assert all_documents(http, "durable") == info_before
        after = http.post("/v1/rag/query", json=question).json()
    assert [c["chunk_id"] for c in after["citations"]] == [c["chunk_id"] for c in before["citations"]]
    assert after["citations"][0]["document_id"] == "lighthouse"
    assert "Selk" in after["answer"]
    key_file = stack.state_dir / "keys" / "seeded.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
