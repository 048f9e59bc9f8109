"""Preflight: the live pool against the plan, step by start step (pure check; no side effects)."""

from __future__ import annotations

from pathlib import Path

from planner.plan import build_plan
from planner.profile import load_profile
from stackctl import preflight
from stackctl.launcher import RAY_MEMORY_USAGE_THRESHOLD, StackLayout, stack_env
from stackctl.preflight import LiveMemory, check, needed_bytes, start_steps

ROOT = Path(__file__).resolve().parents[3]
GiB = 2**30


def _plan(pool: int = 24 * GiB):
    return build_plan(load_profile(ROOT / "configs" / "cpu-tiny.yaml"), pool)


def _live(available: float, free: float | None = None, pool_limit: float | None = None, pool_usage: float = 0):
    return LiveMemory(
        total=24 * GiB,
        available=int(available * GiB),
        free=int((free or available) * GiB),
        page_cache=2 * GiB,
        pool_limit=int(pool_limit * GiB) if pool_limit else None,
        pool_usage=int(pool_usage * GiB),
    )


def test_start_steps_grow_to_what_the_plan_needs():
    plan = _plan()
    steps = start_steps(plan)
    assert [name for name, _, _ in steps] == ["chat", "embedder", "retriever", "gateway"]
    assert [b for _, _, b in steps] == sorted(b for _, _, b in steps)
    assert steps[-1][2] == needed_bytes(plan)
    # The engine's step peaks above its steady state by its planned start peak (checkpoint in the cache).
    chat_peak = next(a.start_peak_bytes for a in plan.admission if a.name == "chat")
    assert chat_peak > 0 and steps[0][1] == steps[0][2] + chat_peak


def test_on_demand_engines_beyond_the_awake_set_start_asleep_and_add_no_start_step():
    plan = build_plan(load_profile(ROOT / "configs" / "cpu-on-demand.yaml"))
    assert plan.on_demand.worst_awake_set == ["chat"]
    steps = {name: (peak, started) for name, peak, started in start_steps(plan)}
    asleep = plan.on_demand.engines["chat-smollm2-135m-draft6"].asleep_bytes  # on a CPU: its Serve replica, not started
    assert steps["chat-smollm2-135m-draft6"] == (steps["chat"][1] + asleep,) * 2
    assert max(started for _, started in steps.values()) == needed_bytes(plan)  # at rest: what the plan says


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


def test_page_cache_does_not_refuse_a_gpu_start_vllm_reads_memavailable(monkeypatch):
    """Right after `poolserve fetch` MemFree is low and the page cache full: vLLM's start check on an
    integrated GPU reads MemAvailable (vllm#48140, retracted), so preflight passes on MemAvailable alone."""
    monkeypatch.setattr(preflight, "shm_free_bytes", lambda: 8 * GiB)
    plan = build_plan(load_profile(ROOT / "configs" / "dgx-spark-128.yaml"))
    needed = preflight.needed_bytes(plan) + max(s[1] - s[2] for s in preflight.start_steps(plan))
    live = LiveMemory(total=int(121.7 * GiB), available=needed + GiB, free=2 * GiB, page_cache=60 * GiB)
    result = check(plan, live)
    assert result.ok, result.lines
    assert not any("MemFree" in line for line in result.lines[1:])


def test_vllm_start_check_on_memavailable_is_refused_when_short(monkeypatch):
    monkeypatch.setattr(preflight, "shm_free_bytes", lambda: 8 * GiB)
    plan = build_plan(load_profile(ROOT / "configs" / "dgx-spark-128.yaml"))
    chat = plan.replica("chat")
    requested = int(chat.vllm.gpu_memory_utilization * 121.7 * GiB)
    overhead = next(a.overhead_bytes for a in plan.admission if a.name == "chat")
    live = LiveMemory(total=int(121.7 * GiB), available=requested + overhead - GiB, free=100 * GiB, page_cache=0)
    result = check(plan, live)
    assert not result.ok
    assert any("chat: vLLM's start check would refuse" in line and "MemAvailable" in line for line in result.lines)


def test_vllm_start_check_skips_engines_that_start_asleep(monkeypatch):
    """Two 27Bs on demand on the lent H100 (2026-12-07): only one is awake at start; the other's vLLM start check
    runs at its first wake, with the first asleep, so preflight must not ask for both engines' shares at once."""
    monkeypatch.setattr(preflight, "shm_free_bytes", lambda: 8 * GiB)
    plan = build_plan(load_profile(ROOT / "configs" / "h100-on-demand.yaml"), 81_559 * 2**20)
    assert plan.on_demand.worst_awake_set == ["chat"]
    live = LiveMemory(total=int(79.65 * GiB), available=int(79.18 * GiB), free=int(79.18 * GiB), page_cache=0)
    result = check(plan, live)
    assert result.ok, result.lines
    assert not any("start check would refuse" in line for line in result.lines)
    # the engine awake at start is still checked: with too little available it is refused
    short = LiveMemory(total=int(79.65 * GiB), available=40 * GiB, free=40 * GiB, page_cache=0)
    lines = check(plan, short).lines
    assert any(line.strip().startswith("chat: vLLM's start check would refuse") for line in lines)
    assert not any("chat-qwen3.8-27b-b: vLLM's start check" in line for line in lines)


def test_unified_gpu_pool_drops_clean_page_cache_before_the_check(monkeypatch):
    from stackctl import launcher

    monkeypatch.setattr(preflight, "shm_free_bytes", lambda: 8 * GiB)
    plan = build_plan(load_profile(ROOT / "configs" / "dgx-spark-128.yaml"))
    roomy = LiveMemory(total=int(121.7 * GiB), available=int(121 * GiB), free=int(60 * GiB), page_cache=60 * GiB)
    dropped, logged = [], []
    monkeypatch.setattr(launcher, "read_live", lambda pool=None: roomy)
    monkeypatch.setattr(launcher, "can_drop_page_cache", lambda: True)
    monkeypatch.setattr(launcher, "drop_clean_page_cache", lambda: dropped.append(True))
    assert launcher.run_preflight(plan, pool=None, log=logged.append)
    assert dropped == [True] and any("hygiene" in line for line in logged)


def test_rays_memory_monitor_leaves_shedding_to_the_pool_guard(tmp_path):
    env = stack_env(StackLayout(tmp_path), base={})
    assert float(env["RAY_memory_usage_threshold"]) == RAY_MEMORY_USAGE_THRESHOLD > 0.95
