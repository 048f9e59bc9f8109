"""Which on-demand engines may be awake together, and which to put to sleep for a wake: pure functions of
the plan's on-demand section (Plan.on_demand), for the planner's own check and for the gateway.

The pool holds every always-on replica, every on-demand engine's asleep bytes, and the extra bytes of the
engines awake; a wake also needs its engine's wake check (awake bytes + wake peak, or vLLM's start request).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from planner.on_demand_plan import OnDemandPlan


class EngineActivity(BaseModel):
    """What the gateway knows of one on-demand engine now."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    awake: bool = Field(description="Awake (or waking) now.")
    in_flight: int = Field(0, ge=0, description="Requests in flight: an engine with any is not idle.")
    last_used: float = Field(0.0, description="Monotonic time its last request ended (or began).")


def held_bytes(plan: OnDemandPlan, awake: Iterable[str]) -> int:
    """Pool bytes the on-demand engines hold with this set awake and the rest asleep."""
    names = set(awake)
    return sum(e.awake_bytes if n in names else e.asleep_bytes for n, e in plan.engines.items())


def fits_awake(plan: OnDemandPlan, awake: Iterable[str]) -> bool:
    """True when this set may be awake at once: no more than max_awake engines, within the pool's room."""
    names = set(awake)
    unknown = names - set(plan.engines)
    if unknown:
        raise KeyError(f"not on-demand engines: {', '.join(sorted(unknown))}")
    return len(names) <= plan.max_awake and held_bytes(plan, names) <= plan.room_bytes


def can_wake(plan: OnDemandPlan, awake: Iterable[str], wanted: str) -> bool:
    """True when `wanted` may wake while `awake` stay awake: the set fits, and so does its wake check."""
    others = set(awake) - {wanted}
    if not fits_awake(plan, others | {wanted}):
        return False
    return wake_bytes(plan, others, wanted) <= plan.room_bytes


def wake_bytes(plan: OnDemandPlan, awake: Iterable[str], wanted: str) -> int:
    """Pool bytes while `wanted` wakes beside `awake`: theirs, the rest asleep, and its wake check."""
    engine = plan.engines[wanted]
    return held_bytes(plan, set(awake) - {wanted}) - engine.asleep_bytes + engine.wake_check_bytes


def engines_to_sleep(plan: OnDemandPlan, activity: Mapping[str, EngineActivity], wanted: str) -> list[str] | None:
    """The engines to put to sleep, least recently used idle first, so that `wanted` can wake; [] when it can
    wake now (or is awake), None when putting every idle engine to sleep would not make room."""
    awake = {n for n, a in activity.items() if a.awake and n != wanted}
    if activity.get(wanted, EngineActivity(awake=False)).awake:
        return []
    idle = sorted((n for n in awake if activity[n].in_flight == 0), key=lambda n: (activity[n].last_used, n))
    chosen: list[str] = []
    while not can_wake(plan, awake - set(chosen), wanted):
        if not idle:
            return None
        chosen.append(idle.pop(0))
    return chosen


def idle_past_their_time(plan: OnDemandPlan, activity: Mapping[str, EngineActivity], now: float) -> list[str]:
    """Awake engines with nothing in flight for their idle_sleep_s or longer, longest idle first."""
    due = [
        n
        for n, a in activity.items()
        if a.awake and a.in_flight == 0 and now - a.last_used >= plan.engines[n].idle_sleep_s
    ]
    return sorted(due, key=lambda n: (activity[n].last_used, n))


def worst_awake_set(plan: OnDemandPlan, count: int, without: str | None = None) -> list[str]:
    """The `count` engines (other than `without`) that add the most bytes awake: the set a plan must hold."""
    ranked = sorted((n for n in plan.engines if n != without), key=lambda n: (-plan.engines[n].awake_extra_bytes, n))
    return ranked[:count]


def shortfall(plan: OnDemandPlan) -> dict[str, int]:
    """What does not fit at the plan's max_awake, by check (empty when it all fits): the worst awake set
    ("awake set"), and each engine's wake beside the worst set of the others ("wake <name>")."""
    short = {}
    worst = worst_awake_set(plan, plan.max_awake)
    over = held_bytes(plan, worst) - plan.room_bytes
    if over > 0:
        short["awake set"] = over
    for name in plan.engines:
        others = worst_awake_set(plan, plan.max_awake - 1, without=name)
        over = wake_bytes(plan, others, name) - plan.room_bytes
        if over > 0:
            short[f"wake {name}"] = over
    return short
