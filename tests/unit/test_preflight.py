"""Preflight: the live pool against the plan, step by start step (pure check; no side effects)."""

from __future__ import annotations

from pathlib import Path

from planner.plan import build_plan
from planner.profile import load_profile
from stackctl import preflight
from stackctl.launcher import RAY_MEMORY_USAGE_THRESHOLD, StackLayout, stack_env
from stackctl.preflight import LiveMemory, check, needed_bytes, start_steps

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30


def _plan(pool: int = 24 * GiB):
    return build_plan(load_profile(ROOT / "configs" / "cpu-tiny.yaml"), pool)


def _live(available: float, free: float | None = None, pool_limit: float | None = None, pool_usage: float = 0):
    return LiveMemory(total=24 * GiB, available=int(available * GiB), free=int((free or available) * GiB),
                      page_cache=2 * GiB, pool_limit=int(pool_limit * GiB) if pool_limit else None,
                      pool_usage=int(pool_usage * GiB))


def test_start_steps_grow_to_what_the_plan_needs():
    plan = _plan()
    steps = start_steps(plan)
    assert [name for name, _, _ in steps] == ["chat", "embedder", "retriever", "gateway"]
    assert [b for _, _, b in steps] == sorted(b for _, _, b in steps)
    assert steps[-1][2] == needed_bytes(plan)
    # The engine's step peaks above its steady state by its planned start peak (checkpoint in the cache).
    chat_peak = next(a.start_peak_bytes for a in plan.admission if a.name == "chat")
    assert chat_peak > 0 and steps[0][1] == steps[0][2] + chat_peak


def test_a_plan_that_fits_passes_and_one_that_does_not_is_refused_with_the_shortfall(monkeypatch):
    monkeypatch.setattr(preflight, "shm_free_bytes", lambda: 8 * GiB)
    plan = _plan()
    assert check(plan, _live(20)).ok
    refused = check(plan, _live(6), others=[("python3[42]", 3 * GiB)])
    assert not refused.ok
    assert any("does NOT fit" in line for line in refused.lines)
    assert any(line.startswith("refused:") and "--pool" in line for line in refused.lines)
    assert any("python3[42] 3.00 GiB" in line for line in refused.lines)


def test_room_left_in_the_pool_binds_even_when_the_host_has_plenty(monkeypatch):
    monkeypatch.setattr(preflight, "shm_free_bytes", lambda: 8 * GiB)
    plan = _plan()
    assert check(plan, _live(20, pool_limit=11)).ok
    assert not check(plan, _live(20, pool_limit=11, pool_usage=5)).ok


def test_a_small_dev_shm_is_refused(monkeypatch):
    monkeypatch.setattr(preflight, "shm_free_bytes", lambda: 64 * 2**20)
    result = check(_plan(), _live(20))
    assert not result.ok and any("/dev/shm" in line for line in result.lines)


def test_vllm_memfree_check_is_flagged_on_a_gpu_pool(monkeypatch):
    monkeypatch.setattr(preflight, "shm_free_bytes", lambda: 8 * GiB)
    plan = build_plan(load_profile(ROOT / "configs" / "dgx-spark-128.yaml"))
    requested = int(plan.replica("chat").vllm.gpu_memory_utilization * 121.7 * GiB)
    live = LiveMemory(total=int(121.7 * GiB), available=requested + 20 * GiB, free=requested - GiB,
                      page_cache=30 * GiB)
    result = check(plan, live)
    assert not result.ok and any("MemFree" in line and "vllm#48140" in line for line in result.lines)


def test_rays_memory_monitor_leaves_shedding_to_the_pool_guard(tmp_path):
    env = stack_env(StackLayout(tmp_path), base={})
    assert float(env["RAY_memory_usage_threshold"]) == RAY_MEMORY_USAGE_THRESHOLD > 0.95
