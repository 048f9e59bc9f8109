"""The pool guard's marks come from the plan (planner/guard.py): a GPU as full at rest as its plan reads `ok`,
and sheds only once memory rises past what the plan holds; a CPU plan that leaves room keeps the fixed marks."""

from __future__ import annotations

import pytest

from gateway.middleware.pool_guard import PoolGuard, PoolReading
from planner.guard import guard_plan, unplanned_guard
from planner.plan import build_plan
from planner.profile import PoolSpec, load_profile
from tests.fakes.clock import FakeClock

GIB = 2**30
H100 = 81_559 * 2**20  # NVML's size of the lent H100 80GB HBM3


def _guard_on(marks, used_bytes: list[int]) -> tuple[PoolGuard, FakeClock]:
    clock = FakeClock(0.0)
    guard = PoolGuard(
        marks.shed_ingest_at,
        marks.shed_all_at,
        hysteresis=marks.hysteresis,
        sample_interval_s=marks.sample_interval_s,
        clock=clock,
        reader=lambda: PoolReading(used_bytes[0], marks.limit_bytes, "fake gpu"),
    )
    return guard, clock


def _state(guard: PoolGuard, clock: FakeClock, used: list[int], value: int) -> str:
    used[0] = value
    clock.now += 1
    return guard.sample()[0]


def test_a_gpu_plan_that_fills_92_percent_reads_ok_at_rest_and_sheds_past_its_plan():
    # The 2026-12-06 H100 run: 78.5 of 85.5 GB in use at rest (0.918), against the fixed 0.90 mark.
    planned = int(0.918 * H100)
    marks = guard_plan(PoolSpec(gpu=True, unified=False), H100, planned, discrete=True)
    assert marks.reader == "gpu" and marks.planned_bytes == planned
    assert marks.shed_ingest_at == pytest.approx(0.918 + 0.5 * 0.082, abs=1e-3)
    assert marks.shed_all_at == pytest.approx(0.918 + 0.75 * 0.082, abs=1e-3)
    assert "headroom" in marks.basis
    used = [planned]
    guard, clock = _guard_on(marks, used)
    assert _state(guard, clock, used, planned) == "ok"  # at rest: exactly what the plan holds
    assert _state(guard, clock, used, planned + int(0.5 * (H100 - planned)) + GIB // 4) == "shedding_ingest"
    assert _state(guard, clock, used, planned + int(0.8 * (H100 - planned))) == "shedding_all"
    # The squeeze lets go: back at the plan's size the band never keeps it shedding.
    assert _state(guard, clock, used, planned + GIB // 2) == "ok"


@pytest.mark.parametrize("planned_fraction", [0.5, 0.9, 0.959, 0.99])
def test_back_at_the_plan_the_guard_always_recovers(planned_fraction):
    total = 140 * GIB
    marks = guard_plan(PoolSpec(gpu=True, unified=False), total, int(planned_fraction * total), discrete=True)
    assert planned_fraction < marks.shed_ingest_at <= marks.shed_all_at < 1
    assert marks.shed_ingest_at - marks.hysteresis > planned_fraction


def test_a_small_plan_keeps_the_profiles_fixed_marks():
    spec = PoolSpec(shed_ingest_at=0.9, shed_all_at=0.95)
    marks = guard_plan(spec, 24 * GIB, 6 * GIB, discrete=False)
    assert (marks.shed_ingest_at, marks.shed_all_at, marks.hysteresis) == (0.9, 0.95, 0.03)
    assert marks.reader == "pool" and "fixed marks" in marks.basis


def test_the_headroom_shares_are_checked_in_order():
    with pytest.raises(ValueError, match="shed_ingest_headroom_share"):
        PoolSpec(shed_ingest_headroom_share=0.8, shed_all_headroom_share=0.5)


def test_unplanned_guard_is_the_schemas_defaults():
    marks = unplanned_guard()
    defaults = PoolSpec()
    assert (marks.shed_ingest_at, marks.shed_all_at) == (defaults.shed_ingest_at, defaults.shed_all_at)


def test_the_cpu_default_plan_carries_the_fixed_marks():
    plan = build_plan(load_profile("configs/cpu-tiny.yaml"), pool_total_bytes=24 * GIB)
    assert plan.edge.guard.reader == "pool"
    assert plan.edge.guard.shed_ingest_at >= 0.9 and plan.edge.guard.shed_all_at >= 0.95
    assert plan.edge.guard.planned_bytes == plan.pool.free_bytes - plan.pool.headroom_bytes
