"""Runs the chosen layers against one deployment and returns the report; every layer is bounded, and
the tenants it made are deleted at the end whatever happened."""

from __future__ import annotations

import os
import platform
import secrets
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import psutil

from planner.profile import Profile
from stress.basic import layer1, layer2
from stress.client import Admin
from stress.context import RunContext
from stress.loaded import layer3, layer4, layer6, start_thermal, stop_thermal
from stress.recovery import layer5
from stress.report import LayerResult, StressReport
from stress.stack import StackControl
from stress.upgrade import layer7

LAYERS = {1: layer1, 2: layer2, 3: layer3, 4: layer4, 5: layer5, 6: layer6, 7: layer7}
# Layer 6 samples through 3 and 4, so it is judged right after them; 5 and 7 restart things, so they go last.
RUN_ORDER = (1, 2, 3, 4, 6, 5, 7)


@dataclass(frozen=True)
class StressOptions:
    base_url: str
    admin_key: str
    profile: Profile
    profile_label: str
    layers: list[int]
    quick: bool
    serve_config: Path | None = None
    profile_path: Path | None = None
    pool: str | None = None
    notes: tuple[str, ...] = ()


def _utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def machine() -> dict:
    memory = psutil.virtual_memory()
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(memory.total / 2**30, 1),
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def run_stress(options: StressOptions, log=print, on_layer=None) -> StressReport:
    """`on_layer(report)` is called after each layer with the report so far (the CLI writes it, so a long
    run that is cut short still leaves its finished layers)."""
    report = StressReport(
        profile=options.profile_label,
        base_url=options.base_url,
        quick=options.quick,
        started_utc=_utc(),
        machine=machine(),
        notes=list(options.notes),
    )
    admin = Admin(options.base_url, options.admin_key)
    stack = None
    if options.serve_config is not None:
        stack = StackControl(
            options.serve_config.resolve(),
            options.profile_path.resolve(),
            Path(options.profile.state_dir),
            options.pool,
            log,
        )
    ctx = RunContext(
        base_url=options.base_url,
        admin_key=options.admin_key,
        profile=options.profile,
        quick=options.quick,
        run_id=secrets.token_hex(3),
        admin=admin,
        stack=stack,
        log=log,
    )
    results: dict[int, LayerResult] = {}
    try:
        if not admin.reachable():
            raise RuntimeError(f"{options.base_url}/healthz is not 200: is the stack running there?")
        ctx.setup_tenants(options.profile.stress.concurrency_tenants)
        for layer in (n for n in RUN_ORDER if n in options.layers):
            result = LayerResult.start(layer)
            log(f"stress: layer {layer} ({result.name})")
            started = time.monotonic()
            if layer == 3:
                start_thermal(ctx)
            try:
                LAYERS[layer](ctx, result)
            except Exception as exc:  # one layer's crash is its failure, not the end of the run
                result.check("layer ran to the end", False, f"{type(exc).__name__}: {exc}")
                result.notes.append(traceback.format_exc(limit=3).strip().splitlines()[-1])
            finally:
                if layer == 4 or (layer == 3 and 4 not in options.layers):
                    stop_thermal(ctx)
            result.seconds = round(time.monotonic() - started, 1)
            results[layer] = result.settle()
            log(f"stress: layer {layer}: {result.verdict} in {result.seconds:.0f} s")
            if on_layer is not None:
                report.layers = [results[n] for n in sorted(results)]
                on_layer(report)
    finally:
        failed = admin.delete_created() if ctx.keys else []
        if failed:
            report.notes.append(f"could not delete the run's tenants: {failed}")
        admin.close()
    report.layers = [results[n] for n in sorted(results)]
    report.finished_utc = _utc()
    return report
