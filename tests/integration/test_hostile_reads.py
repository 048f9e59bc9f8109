"""Reads as an attack (issue 23): a tenant with documents that carry as much metadata as a document may,
read by four clients of its own in a loop (every page of the document listing, collection info, searches
filtered by 16 keys of 64 values each, the most a filter takes), while another tenant chats and asks RAG
questions. Reads are paged and filters indexed (docs/SECURITY.md), so the other tenant's p95 stays within
the bound of test_hostile_clients.py, and every read the attacker gets is bounded (a page of at most
`rag.documents_page_max`, counts only for the collection)."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_hostile_clients import (  # noqa: F401  (module fixtures, measured again here)
    UNTIL_STDIN_CLOSES,
    _attacking_tenant,
    _latencies,
    _outcomes,
    _victim_round,
    assert_within_2x,
    attacking_process,
    quiet,
    victim,
)

pytestmark = pytest.mark.timeout(600)

DOCUMENTS = 300
READERS = 4
# 64 keys (the most metadata may have) of about 110 characters each: just under its 8 KiB.
METADATA = {f"field{k:02d}": "v" * 100 for k in range(64)}
# 16 keys of 64 values each, the largest filter rag/retrieval/filters.py takes; each key's last value is every
# document's, so the filter must check them all.
FILTERS = {f"field{k:02d}": {"in": [f"value-{k}-{v}" for v in range(63)] + ["v" * 100]} for k in range(16)}

READER = (
    """
import json, sys, threading, httpx
url, key, readers, log, filters = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
stop, lock = threading.Event(), threading.Lock()
def record(kind, response, size):
    with lock, open(log, "a") as out:
        out.write(json.dumps([kind, response.status_code, size]) + "\\n")
def read():
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        while not stop.is_set():
            after = None
            while not stop.is_set():  # every page of the listing
                page = http.get("/v1/collections/bulky/documents", params={"limit": 100, **({"after": after} if after else {})})
                body = page.json() if page.status_code == 200 else {}
                record("page", page, len(body.get("data", [])))
                after = body.get("last_id") if body.get("has_more") else None
                if after is None:
                    break
            info = http.get("/v1/collections/bulky")
            record("info", info, len(info.content))
            found = http.post("/v1/collections/bulky/search", json={"q": "document", "top_k": 20, "filters": filters})
            record("search", found, len(found.json().get("data", [])) if found.status_code == 200 else 0)
threads = [threading.Thread(target=read, daemon=True) for _ in range(readers)]
"""
    + UNTIL_STDIN_CLOSES
)


@pytest.fixture(scope="module")
def heavy_reads(stack, admin_headers, victim, quiet, tmp_path_factory) -> dict:
    log = tmp_path_factory.mktemp("reads") / "outcomes.jsonl"
    with _attacking_tenant(stack, admin_headers, "reads") as (attacker, admin):  # no rpm: its reads reach the store
        key = attacker.http.headers["Authorization"].removeprefix("Bearer ")
        for start in range(0, DOCUMENTS, 100):
            stored = attacker.http.post(
                "/v1/collections/bulky/documents",
                json={
                    "documents": [
                        {
                            "id": f"doc-{n:04d}",
                            "text": f"Document {n} of a tenant that reads a lot.",
                            "metadata": METADATA,
                        }
                        for n in range(start, start + 100)
                    ]
                },
            )
            assert stored.status_code == 200, stored.text
        with attacking_process(READER, [stack.url, key, str(READERS), str(log), json.dumps(FILTERS)], log, 2 * READERS):
            loud_chat, loud_rag, loud_statuses = _victim_round(victim)
        over_page = attacker.http.get("/v1/collections/bulky/documents", params={"limit": 1000})
    outcomes = _outcomes(log)
    figures = {
        "chat": _latencies(quiet["chat"], loud_chat),
        "rag": _latencies(quiet["rag"], loud_rag),
        "loud_statuses": loud_statuses,
        "over_page": (over_page.status_code, over_page.text[:300]),
        "reads": {
            kind: {
                str(status): sum(1 for k, s, _ in outcomes if k == kind and s == status)
                for status in {s for k, s, _ in outcomes if k == kind}
            }
            for kind in ("page", "info", "search")
        },
        "largest": {
            kind: max((size for k, _, size in outcomes if k == kind), default=0) for kind in ("page", "info", "search")
        },
        "seconds": {
            "chat_attack": sorted(round(v, 2) for v in loud_chat),
            "rag_attack": sorted(round(v, 2) for v in loud_rag),
        },
    }
    print(f"\nheavy reads: {figures}")
    return figures


def test_heavy_reads_are_bounded_and_refuse_the_other_tenant_nothing(heavy_reads):
    figures = heavy_reads
    assert set(figures["loud_statuses"]) == {200}, figures
    for kind in ("page", "info", "search"):
        assert figures["reads"][kind] and set(figures["reads"][kind]) <= {"200", "429"}, figures["reads"]
        assert figures["reads"][kind].get("200", 0) > 0, figures["reads"]
    assert figures["largest"]["page"] == 100  # rag.documents_page_max: 300 documents come in pages
    assert figures["over_page"][0] == 400 and "rag.documents_page_max" in figures["over_page"][1], figures["over_page"]
    assert figures["largest"]["info"] < 4096  # counts only, not 300 documents' 8 KiB of metadata
    assert figures["largest"]["search"] == 20  # every document matches (the filter's last values): top_k of them


def test_heavy_reads_leave_the_other_tenants_p95_within_2x(heavy_reads):
    """While the other tenant works, the reader's reads take turns and pause (gateway/middleware/read_lanes.py)."""
    for kind in ("chat", "rag"):
        assert_within_2x(heavy_reads[kind], (kind, heavy_reads))
