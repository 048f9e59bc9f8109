"""`poolserve plan`'s section for on-demand chat engines (Plan.on_demand): what each holds awake and asleep,
how it sleeps and wakes, and the awake set the pool holds."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from planner.plan import Plan
from planner.units import gib


def print_on_demand(plan: Plan, console: Console) -> None:
    """Nothing when no engine is on demand."""
    od = plan.on_demand
    if od is None:
        return
    table = Table(
        title=f"on-demand engines: at most {od.max_awake} awake at once; the pool holds "
        f"{', '.join(od.worst_awake_set)} awake, the rest asleep"
    )
    for col in (
        "engine",
        "idle sleep",
        "sleep (asked)",
        "wake",
        "awake",
        "asleep",
        "asleep on host",
        "wake peak",
        "free to wake",
    ):
        table.add_column(col, justify="left" if col in ("engine", "sleep (asked)", "wake") else "right")
    for name, e in od.engines.items():
        table.add_row(
            f"{name} ({e.model_id})",
            f"{e.idle_sleep_s:g} s",
            f"{e.sleep} (level {e.level_asked})",
            e.wake,
            gib(e.awake_bytes),
            gib(e.asleep_bytes),
            gib(e.asleep_host_bytes),
            gib(e.wake_peak_bytes),
            gib(e.wake_check_bytes),
        )
    console.print(table)
    console.print(
        f"on-demand room (free - Ray, page cache, always-on replicas) {gib(od.room_bytes)}; planned for "
        f"them {gib(od.planned_bytes)} ({od.planned_bytes:,} B: every engine asleep + the awake set)"
        + (
            f"; host memory of sleeping engines at most {gib(od.asleep_host_bytes_most)}"
            if od.asleep_host_bytes_most
            else ""
        ),
        highlight=False,
    )
    for name, e in od.engines.items():
        for line, value in e.asleep_breakdown.items():
            console.print(f"  {name} asleep: {line} {value:,} ({gib(value)})", highlight=False, markup=False)
        for line, value in e.asleep_host_breakdown.items():
            console.print(f"  {name} asleep, host: {line} {value:,} ({gib(value)})", highlight=False, markup=False)
