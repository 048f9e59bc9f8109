"""Runs last: data survives a restart (SQLite is the truth; FAISS is rebuilt from it)."""

from __future__ import annotations

import stat

import httpx

from tests.integration.conftest import DEMO_KEY

FACT = "The Quorvex lighthouse on Brisa Island was built by Admiral Tovin Selk in 1874."


def test_collections_survive_restart_and_generated_key_file_is_0600(stack, demo_headers):
    with httpx.Client(base_url=stack.url, headers=demo_headers, timeout=120) as http:
        assert http.post("/v1/collections/durable/documents", json={"documents": [
            {"id": "lighthouse", "text": FACT}, {"id": "noise", "text": "Bananas are rich in potassium."}]}).status_code == 200
        question = {"collection": "durable", "question": "Who built the Quorvex lighthouse?", "top_k": 2, "max_tokens": 40}
        before = http.post("/v1/rag/query", json=question).json()
        info_before = http.get("/v1/collections/durable").json()

    # Restart without POOLSERVE_DEMO_KEY: the demo key is generated into a 0600 file instead.
    restart_seconds = stack.restart(demo_key=False)
    print(f"restart to healthy: {restart_seconds:.0f}s")
    key_file = stack.config_path.parent / "state" / "demo-api-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    new_key = key_file.read_text().strip()
    assert new_key != DEMO_KEY
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {new_key}"}, timeout=120) as http:
        assert http.get("/v1/collections/durable").json()["documents"] == info_before["documents"]
        after = http.post("/v1/rag/query", json=question).json()
        assert httpx.get(f"{stack.url}/v1/models", headers=demo_headers, timeout=30).status_code == 401
    assert [c["chunk_id"] for c in after["citations"]] == [c["chunk_id"] for c in before["citations"]]
    assert after["citations"][0]["document_id"] == "lighthouse"
    assert "Selk" in after["answer"]
