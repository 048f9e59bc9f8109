"""Layer 7 (upgrade compatibility): the stack restarted over the state the earlier layers wrote opens it
with no manual step (schema versions and migrations), keys still authenticate, collections still answer
and the index is rebuilt. tests/unit/rag/store/test_upgrade_fixture.py does the same for state an older schema wrote."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from rag.store.store_schema import SCHEMA_VERSION as KNOWLEDGE_SCHEMA_VERSION, STORE_FILE
from stress.client import FACTS, QUESTIONS
from stress.context import COLLECTION, RunContext, not_local
from stress.report import LayerResult
from system.sqlite import BUSY_TIMEOUT_SECONDS
from tenancy.models import SCHEMA_VERSION as TENANTS_SCHEMA_VERSION

DATABASES = {"tenants.sqlite3": TENANTS_SCHEMA_VERSION, STORE_FILE: KNOWLEDGE_SCHEMA_VERSION}


def snapshot(ctx: RunContext) -> dict:
    """What must survive a restart: each tenant's document ids and the retriever's vector count."""
    documents = {}
    for tenant in ctx.tenants:
        gw = ctx.gateway(tenant, timeout_s=60)
        try:
            documents[tenant] = sorted(gw.document_ids(COLLECTION))
        finally:
            gw.close()
    return {"documents": documents, "retriever": ctx.admin.status().get("retriever", {})}


def restart_stack(ctx: RunContext) -> dict:
    """Stop the stack through its launcher and start it again with the same config; seconds to healthy."""
    started = time.monotonic()
    ctx.log("stress: stopping the whole stack")
    ctx.stack.stop()
    stopped = time.monotonic() - started
    ctx.log("stress: starting it again")
    started = time.monotonic()
    ctx.stack.start(ctx.admin_key)
    healthy = ctx.admin.wait_healthy(started, ctx.spec.recovery_timeout_s + ctx.spec.max_restart_s)
    return {
        "stop_s": round(stopped, 1),
        "healthy_s": round(healthy, 1) if healthy is not None else None,
        "log": str(ctx.stack.restart_log),
    }


def schema_versions(state_dir: Path) -> dict[str, int | None]:
    """PRAGMA user_version of each database, opened read-only."""
    versions = {}
    for name in DATABASES:
        path = state_dir / name
        if not path.exists():
            versions[name] = None
            continue
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_SECONDS) as db:
            versions[name] = db.execute("PRAGMA user_version").fetchone()[0]
    return versions


def layer7(ctx: RunContext, result: LayerResult) -> None:
    if not_local(result, ctx, "restarting the stack over its state"):
        return
    result.thresholds = {
        "schema versions": DATABASES,
        "keys": "all authenticate",
        "documents": "all still listed",
        "index": "rebuilt to the same vector count; the planted fact is found first",
        "restart within": f"{ctx.spec.max_restart_s:g} s",
    }
    if "before" not in ctx.restarted:  # layer 5 did not restart the stack in this run
        ctx.restarted.update(before=snapshot(ctx), **restart_stack(ctx))
    before, healthy = ctx.restarted["before"], ctx.restarted["healthy_s"]
    result.figures["restart"] = {k: ctx.restarted[k] for k in ("stop_s", "healthy_s", "log")}
    result.check(
        "stack healthy again in time",
        healthy is not None and healthy <= ctx.spec.max_restart_s,
        f"{healthy} s after the start",
    )
    if healthy is None:
        return
    versions = schema_versions(ctx.stack.layout.state_dir)
    result.figures["schema versions"] = versions
    for name, wanted in DATABASES.items():
        result.check(f"{name} at schema {wanted}", versions[name] == wanted, f"user_version {versions[name]}")
    for tenant in ctx.tenants:
        gw = ctx.gateway(tenant, timeout_s=120)
        try:
            models = gw.http.get("/v1/models")
            result.check(
                f"{tenant}: key made before the restart authenticates",
                models.status_code == 200,
                f"{models.status_code}",
            )
            stored = sorted(gw.document_ids(COLLECTION))
            result.check(
                f"{tenant}: collection unchanged",
                stored == before["documents"][tenant],
                f"{len(stored)} documents, {len(before['documents'][tenant])} before",
            )
        finally:
            gw.close()
    retriever = ctx.admin.status().get("retriever", {})
    result.figures["retriever before / after"] = {"before": before["retriever"], "after": retriever}
    result.check(
        "index rebuilt",
        retriever.get("vectors") == before["retriever"].get("vectors"),
        f"{retriever.get('vectors')} vectors, {before['retriever'].get('vectors')} before",
    )
    gw = ctx.gateway(ctx.tenants[0], timeout_s=120)
    try:
        search = gw.http.get(f"/v1/collections/{COLLECTION}/search", params={"q": QUESTIONS[0], "top_k": 2})
        first = (search.json().get("data") or [{}])[0].get("document_id") if search.status_code == 200 else None
        result.check("search finds the planted fact", first == "fact-0", f"{search.status_code}, first {first}")
        answer = gw.rag(COLLECTION, QUESTIONS[0], max_tokens=32)
        result.check("RAG query answers", answer.kind == "ok", f"{answer.status} {answer.detail[:80]}")
    finally:
        gw.close()
    result.notes.append(
        f"planted fact: {FACTS[0]!r}; state written by an older schema is opened by "
        "tests/unit/rag/store/test_upgrade_fixture.py (tests/fixtures/state-v0)"
    )
