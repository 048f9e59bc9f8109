"""The gateway's choices of which on-demand engines may be awake together, on a hand-made plan section."""

import pytest

from planner.awake_sets import (
    EngineActivity,
    can_wake,
    engines_to_sleep,
    fits_awake,
    idle_past_their_time,
    shortfall,
    worst_awake_set,
)
from planner.on_demand_plan import OnDemandEngine, OnDemandPlan

GB = 10**9


def _engine(awake_gb: float, asleep_gb: float = 0.0, peak_gb: float = 0.0, idle_s: float = 60.0) -> OnDemandEngine:
    awake, asleep, peak = int(awake_gb * GB), int(asleep_gb * GB), int(peak_gb * GB)
    return OnDemandEngine(
        model_id="m",
        idle_sleep_s=idle_s,
        wake_timeout_s=60.0,
        tenant_wakes_per_hour=10,
        level_asked=1,
        sleep="level_1",
        wake="copy_from_host",
        awake_bytes=awake,
        asleep_bytes=asleep,
        asleep_breakdown={"cuda_context.worker": asleep},
        wake_peak_bytes=peak,
        wake_request_bytes=0,
        wake_check_bytes=awake + peak,
    )


def _plan(max_awake: int = 2, room_gb: float = 10.0) -> OnDemandPlan:
    # asleep: 0.5 GB each (1.5 GB); a 4 GB, b 5 GB, c 3 GB awake (extra 3.5, 4.5, 2.5)
    engines = {"a": _engine(4, 0.5), "b": _engine(5, 0.5, peak_gb=1), "c": _engine(3, 0.5)}
    return OnDemandPlan(
        max_awake=max_awake, room_bytes=int(room_gb * GB), engines=engines, worst_awake_set=[], planned_bytes=0
    )


def test_fits_awake_counts_the_sleeping_engines_and_the_limit():
    plan = _plan()
    assert fits_awake(plan, ["a", "b"])  # 4 + 5 + 0.5 = 9.5 GB of 10
    assert not fits_awake(plan, ["a", "b", "c"])  # over max_awake (and the room)
    assert not fits_awake(_plan(room_gb=9.4), ["a", "b"])
    with pytest.raises(KeyError):
        fits_awake(plan, ["nope"])


def test_a_wake_needs_its_peak_beside_the_others():
    plan = _plan()
    assert can_wake(plan, ["c"], "b")  # 3 + 5 + 1 peak + 0.5 (a asleep) = 9.5
    assert not can_wake(plan, ["a"], "b")  # 4 + 5 + 1 + 0.5 = 10.5
    assert can_wake(plan, [], "b")


def test_the_least_recently_used_idle_engine_sleeps_first():
    plan = _plan(max_awake=3, room_gb=11.0)
    activity = {
        "a": EngineActivity(awake=True, last_used=5.0),
        "c": EngineActivity(awake=True, last_used=1.0),
        "b": EngineActivity(awake=False),
    }
    # a + c awake leave 11 - 7 = 4 GB, b's wake needs 6; c is the older: 4 (a) + 0.5 (c asleep) + 6 = 10.5
    assert engines_to_sleep(plan, activity, "b") == ["c"]
    assert engines_to_sleep(plan, {**activity, "b": EngineActivity(awake=True)}, "b") == []


def test_an_engine_with_requests_in_flight_is_not_idle():
    plan = _plan(max_awake=3, room_gb=10.0)
    activity = {
        "a": EngineActivity(awake=True, in_flight=2, last_used=0.0),
        "c": EngineActivity(awake=True, last_used=1.0),
    }
    # only c may sleep, and a (busy) + b's wake still do not fit: no way to make room
    assert engines_to_sleep(plan, activity, "b") is None
    idle = {**activity, "a": EngineActivity(awake=True, last_used=9.0)}
    assert engines_to_sleep(plan, idle, "b") == ["c", "a"]


def test_nothing_sleeps_when_the_wake_fits():
    plan = _plan(max_awake=3, room_gb=20.0)
    activity = {"a": EngineActivity(awake=True, last_used=5.0), "c": EngineActivity(awake=True, last_used=1.0)}
    assert engines_to_sleep(plan, activity, "b") == []


def test_engines_sleep_in_lru_order_until_the_wake_fits():
    plan = _plan(max_awake=3, room_gb=8.0)
    activity = {"a": EngineActivity(awake=True, last_used=1.0), "c": EngineActivity(awake=True, last_used=2.0)}
    # b needs 6 GB free beside the others asleep (1 GB): both must go, a first
    assert engines_to_sleep(plan, activity, "b") == ["a", "c"]


def test_idle_engines_past_their_time():
    plan = _plan()
    activity = {
        "a": EngineActivity(awake=True, last_used=0.0),
        "b": EngineActivity(awake=True, in_flight=1),
        "c": EngineActivity(awake=True, last_used=50.0),
    }
    assert idle_past_their_time(plan, activity, now=70.0) == ["a"]


def test_the_worst_awake_set_and_what_is_short():
    plan = _plan(max_awake=2, room_gb=9.0)
    assert worst_awake_set(plan, 2) == ["b", "a"]
    short = shortfall(plan)
    assert short["awake set"] == int(0.5 * GB)  # 5 + 4 + 0.5 asleep = 9.5 of 9
    assert "wake b" in short and "wake c" not in short
    assert shortfall(plan.model_copy(update={"max_awake": 1})) == {}
