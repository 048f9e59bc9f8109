"""Layer 5 (crash recovery): under steady load, SIGKILL the engine, the embedder, the retriever and the
gateway in turn, then stop and restart the whole stack. The failure semantics are the stack's own
(503 + Retry-After while a replica restarts, tests/integration/test_faults.py); this layer measures
them: time to healthy, the requests that failed, and that none hung."""

from __future__ import annotations

import threading
import time

from stress.context import COLLECTION, RunContext, not_local
from stress.load import run_clients
from stress.loaded import mixed_operation
from stress.report import LayerResult
from stress.stack import TARGETS
from stress.upgrade import restart_stack, snapshot

LOAD_CLIENTS = 4
SETTLE_S = 5.0  # load after each recovery, before the next kill
PAUSE_AFTER_FAILURE_S = 0.5  # a client whose request failed waits a little: no busy loop while a replica is down
PROXY_500 = "Internal Server Error"  # Ray Serve's proxy's body when the replica it routed to died


def layer5(ctx: RunContext, result: LayerResult) -> None:
    if not_local(result, ctx, "killing replicas and restarting the stack"):
        return
    spec = ctx.spec
    targets = spec.quick_kill_targets if ctx.quick else list(TARGETS)
    whole_stack = not ctx.quick
    result.thresholds = {
        "killed in turn": targets,
        "healthy again within": f"{spec.max_recovery_s:g} s",
        "whole stack restart": f"within {spec.max_restart_s:g} s"
        if whole_stack
        else "not in --quick mode (layer 7 restarts it)",
        "hung requests": 0,
        "500s to requests sent while a replica was down": 0,
        "acknowledged documents lost": 0,
    }
    gateways = [ctx.gateway(tenant, timeout_s=spec.client_timeout_s) for tenant in ctx.tenants]
    mixed = mixed_operation(ctx, gateways)
    stop = threading.Event()

    def operation(client: int, n: int):
        outcome = mixed(client, n)
        if outcome.kind != "ok":
            time.sleep(PAUSE_AFTER_FAILURE_S)
        return outcome

    box: dict = {}
    load = threading.Thread(
        target=lambda: box.update(
            outcomes=run_clients(
                LOAD_CLIENTS, operation, seconds=len(targets) * (spec.recovery_timeout_s + 60), stop=stop
            )
        ),
        daemon=True,
    )
    load.start()
    rows = []
    try:
        time.sleep(SETTLE_S)
        for target in targets:
            killed_at = time.monotonic()
            pid = ctx.stack.kill(target)
            seconds = ctx.admin.wait_healthy(killed_at, spec.recovery_timeout_s)
            rows.append({"killed": target, "pid": pid, "at": killed_at, "healthy_s": seconds})
            time.sleep(SETTLE_S)
    finally:
        stop.set()
        load.join(timeout=spec.client_timeout_s + 60)
        for gw in gateways:
            gw.close()
    outcomes = box.get("outcomes", [])
    kill_times = [row["at"] for row in rows]
    for row in rows:
        at, back = row["at"], row["at"] + (row["healthy_s"] or spec.recovery_timeout_s)
        # In flight when the process died: the stack can only fail those (the replica is gone).
        cut = [o for o in outcomes if in_flight_at(o, at)]
        # Sent while the replica was down: the stack promises 503 + Retry-After or an answer, never a 500.
        # A request still running when the next replica is killed is that kill's (in flight there).
        down = [
            o
            for o in outcomes
            if at <= o.started < back and not any(in_flight_at(o, other) for other in kill_times if other != at)
        ]
        if row["killed"] == "gateway":
            # The gateway is the process that answers 503s. Until Ray notices it died, Ray Serve's proxy
            # still routes requests to it and answers them with its own plain-text 500: those are cut by
            # the kill like the ones in flight (counted apart); a 500 from a gateway would be JSON.
            proxied = [o for o in down if o.status == 500 and o.detail == PROXY_500]
            cut += proxied
            down = [o for o in down if o not in proxied]
            row["proxy 500s"] = len(proxied)
        row.update(
            **{
                "in flight": len(cut),
                "in flight failed": sum(o.kind != "ok" for o in cut),
                "sent while down": len(down),
                "ok": sum(o.kind == "ok" for o in down),
                "503/429": sum(o.kind == "intended" for o in down),
                "failed": sum(o.kind == "error" for o in down),
                "500s": sum(o.status == 500 for o in down),
            }
        )
        failures = [f"{o.route} {o.status}: {o.detail[:80]}" for o in cut + down if o.kind in ("error", "timeout")]
        if failures:
            result.notes.append(f"{row['killed']}: " + "; ".join(sorted(set(failures))[:4]))
        result.check(
            f"{row['killed']} healthy again",
            row["healthy_s"] is not None and row["healthy_s"] <= spec.max_recovery_s,
            f"{row['healthy_s']:.1f} s" if row["healthy_s"] is not None else "never",
        )
        result.check(
            f"{row['killed']}: no 500 while down", row["500s"] == 0, f"{row['500s']} of {len(down)} sent while down"
        )
    result.check(
        "no request hung",
        all(o.kind != "timeout" for o in outcomes),
        f"{sum(o.kind == 'timeout' for o in outcomes)} of {len(outcomes)} (timeout {spec.client_timeout_s:g} s)",
    )
    if whole_stack:
        before = snapshot(ctx)
        restart = restart_stack(ctx)
        rows.append({"killed": "whole stack (stop, start)", "healthy_s": restart["healthy_s"]})
        result.check(
            "whole stack healthy again",
            restart["healthy_s"] is not None and restart["healthy_s"] <= spec.max_restart_s,
            f"stopped in {restart['stop_s']} s, healthy {restart['healthy_s']} s after the start",
        )
        ctx.restarted.update(before=before, **restart)
    for row in rows:
        row.pop("at", None)
        if isinstance(row.get("healthy_s"), float):
            row["healthy_s"] = round(row["healthy_s"], 1)
    result.figures["kills"] = rows
    result.figures["load"] = f"{LOAD_CLIENTS} clients, {len(outcomes)} requests through the kills"
    lost = missing_documents(ctx)
    result.check(
        "every acknowledged document still there",
        not lost,
        f"{sum(len(v) for v in ctx.acknowledged.values())} acknowledged, {len(lost)} missing {lost[:5]}",
    )


def in_flight_at(outcome, moment: float) -> bool:
    """Whether the request was running when `moment` came (a kill cut it)."""
    return outcome.started < moment < outcome.started + outcome.seconds


def missing_documents(ctx: RunContext) -> list[str]:
    missing = []
    for tenant, acknowledged in ctx.acknowledged.items():
        gw = ctx.gateway(tenant, timeout_s=60)
        try:
            stored = gw.document_ids(COLLECTION)
        except Exception as exc:  # the check fails with the reason, it does not crash the run
            return [f"{tenant}: {type(exc).__name__}: {exc}"]
        finally:
            gw.close()
        missing += [f"{tenant}/{doc}" for doc in sorted(acknowledged - stored)]
    return missing
