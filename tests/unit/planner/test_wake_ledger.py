"""The wake coordinator's decisions (planner/wake_ledger.py) on a hand-made plan section: which engines to put
to sleep for a wake (least recently used idle first; one with a request in flight is not idle), when nothing
can make room (the 503), the per-tenant wake budget (the 429), and which engines are idle past their time."""

from planner.on_demand_plan import OnDemandEngine, OnDemandPlan
from planner.wake_ledger import WAKE_BUDGET_WINDOW_S, WakeLedger

GB = 10**9


def _engine(model: str, awake_gb: float, idle_s: float = 60.0, wakes: int = 2) -> OnDemandEngine:
    awake = int(awake_gb * GB)
    return OnDemandEngine(
        model_id=model,
        idle_sleep_s=idle_s,
        wake_timeout_s=30.0,
        tenant_wakes_per_hour=wakes,
        level_asked=1,
        sleep="stop",
        wake="cold_start",
        awake_bytes=awake,
        asleep_bytes=0,
        asleep_breakdown={},
        wake_peak_bytes=0,
        wake_request_bytes=0,
        wake_check_bytes=awake,
    )


def _ledger(max_awake: int = 2, room_gb: float = 10.0, awake=("ra", "rb")) -> WakeLedger:
    # by replica name ra, rb, rc; clients send a, b, c. Awake: a 4 GB, b 5 GB, c 3 GB.
    engines = {"ra": _engine("a", 4), "rb": _engine("b", 5, idle_s=120), "rc": _engine("c", 3)}
    plan = OnDemandPlan(
        max_awake=max_awake, room_bytes=int(room_gb * GB), engines=engines, worst_awake_set=list(awake), planned_bytes=0
    )
    return WakeLedger(plan, list(awake), now=100.0)


def test_it_starts_with_the_plans_awake_set_awake_and_the_rest_asleep():
    ledger = _ledger()
    assert ledger.state == {"a": "awake", "b": "awake", "c": "asleep"}


def test_a_wake_that_does_not_fit_puts_the_least_recently_used_idle_engine_to_sleep():
    ledger = _ledger()
    ledger.request_began("a", 110.0)
    ledger.request_ended("a", 120.0)  # a used at 120, b last at the start (100): b is the LRU
    assert ledger.to_sleep_for("c") == ["b"]  # 4 + 5 + 3 > 10, and max_awake 2


def test_an_engine_with_a_request_in_flight_is_not_idle_however_old():
    ledger = _ledger()
    ledger.request_began("b", 101.0)  # b: in flight since 101, the oldest use
    ledger.request_ended("a", 150.0)
    assert ledger.to_sleep_for("c") == ["a"]
    ledger.request_began("a", 151.0)  # both busy now: no room can be made yet
    assert ledger.to_sleep_for("c") is None


def test_no_decision_while_another_engine_is_waking_or_going_to_sleep():
    ledger = _ledger()
    ledger.state["b"] = "sleeping"
    assert ledger.to_sleep_for("c") is None


def test_a_wake_that_fits_puts_nothing_to_sleep():
    ledger = _ledger(max_awake=2, room_gb=20, awake=("ra",))
    assert ledger.to_sleep_for("c") == []


def test_busy_answers_503_material_naming_the_model_and_the_busy_engines():
    ledger = _ledger()
    ledger.request_began("a", 101.0)
    answer = ledger.busy("c", 30.0)
    assert answer.outcome == "busy" and answer.retry_after_s >= 1
    assert "'c'" in answer.message and "a busy" in answer.message and "30s" in answer.message


def test_each_tenant_is_charged_its_own_wakes_within_the_hour():
    ledger = _ledger()  # tenant_wakes_per_hour = 2
    for at in (0.0, 10.0):
        assert ledger.within_budget("t1", "c", at)
        ledger.charge_wake("t1", "c", at)
    assert not ledger.within_budget("t1", "c", 20.0)
    assert ledger.within_budget("t2", "c", 20.0)  # another tenant's requests pay for their own wakes
    assert ledger.within_budget("t1", "a", 20.0)  # and per engine
    assert ledger.within_budget("t1", "c", WAKE_BUDGET_WINDOW_S + 0.1)  # the first one left the hour
    refusal = ledger.over_budget("t1", "c")
    assert refusal.outcome == "over_budget" and "2 wakes" in refusal.message and "'c'" in refusal.message


def test_idle_past_their_time_counts_from_the_last_use_and_skips_busy_engines():
    ledger = _ledger()  # a: idle_sleep_s 60, b: 120; both last used at the start (100)
    assert ledger.idle_due(159.0) == []
    assert ledger.idle_due(160.0) == ["a"]
    ledger.request_began("b", 150.0)
    assert ledger.idle_due(1000.0) == ["a"]  # b has a request in flight
    ledger.request_ended("b", 1000.0)
    assert ledger.idle_due(1119.0) == ["a"] and ledger.idle_due(1120.0) == ["a", "b"]


def test_request_ended_never_goes_below_zero():
    ledger = _ledger()
    ledger.request_ended("a", 101.0)
    assert ledger.in_flight["a"] == 0


def test_reconcile_adopts_a_settled_state_the_engine_reports_and_ignores_changes_under_way():
    ledger = _ledger(awake=("ra",))
    ledger.state["b"] = "waking"
    assert ledger.reconcile({"a": "asleep", "b": "asleep", "c": "waking"}) == ["a"]
    assert ledger.state == {"a": "asleep", "b": "waking", "c": "asleep"}


def test_over_the_awake_set_chooses_idle_engines_until_it_fits_again():
    ledger = _ledger(max_awake=2, awake=("ra", "rb"))
    assert ledger.over_the_awake_set() == []
    ledger.state["c"] = "awake"  # three awake: over max_awake 2 and the room
    ledger.request_ended("c", 300.0)
    ledger.request_ended("b", 200.0)
    assert ledger.over_the_awake_set() == ["a"]  # a: last used at the start, the least recently
    ledger.request_began("a", 400.0)
    assert ledger.over_the_awake_set() == ["b"]
    ledger.request_began("b", 401.0)
    ledger.request_began("c", 402.0)
    assert ledger.over_the_awake_set() is None  # all busy: wait
