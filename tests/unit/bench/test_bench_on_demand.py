"""bench/bench_on_demand.py's pure parts: the gateway's on-demand counters read from /metrics, percentiles of
swaps, memory against the plan, which GPU process is which engine's, and the endurance verdict."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from bench.bench_on_demand import (
    PSS_PARTS,
    alternation,
    attribute_new_pids,
    cold_start_section,
    endurance,
    engine_gpu_bytes,
    metrics_delta,
    parse_on_demand_metrics,
    plan_engines,
    growth_per_cycle,
    planned_for,
    pss_parts,
    ratio_check,
    summary,
    swap_summary,
    wakes_over_budget,
)
from planner.plan import build_plan
from planner.profile import load_profile

MIB = 2**20
GIB = 2**30


def _metrics_text(wakes: dict, sleeps: dict, seconds: dict) -> str:
    """/metrics as the wake coordinator writes it (deployments/wake_coordinator.py), plus an unrelated line."""
    registry = CollectorRegistry()
    w = Counter("on_demand_wakes", "", ["model"], namespace="poolserve", registry=registry)
    s = Counter("on_demand_sleeps", "", ["model", "reason"], namespace="poolserve", registry=registry)
    ws = Counter("on_demand_wake_seconds", "", ["model"], namespace="poolserve", registry=registry)
    other = Counter("requests", "", ["route"], namespace="poolserve", registry=registry)
    other.labels(route="/v1/chat/completions").inc(7)
    for model, n in wakes.items():
        w.labels(model=model).inc(n)
    for (model, reason), n in sleeps.items():
        s.labels(model=model, reason=reason).inc(n)
    for model, v in seconds.items():
        ws.labels(model=model).inc(v)
    return generate_latest(registry).decode()


def test_the_on_demand_counters_are_read_from_metrics_and_their_change_between_two_readings():
    before = parse_on_demand_metrics(_metrics_text({"a": 1}, {("b", "room"): 1}, {"a": 30.5}))
    assert before == {"wakes": {"a": 1.0}, "sleeps": {"b": {"room": 1.0}}, "wake_seconds": {"a": 30.5}}
    after = parse_on_demand_metrics(
        _metrics_text({"a": 1, "b": 1}, {("b", "room"): 1, ("a", "room"): 1, ("a", "idle"): 0}, {"a": 30.5, "b": 41.25})
    )
    assert metrics_delta(before, after) == {
        "wakes": {"b": 1.0},
        "sleeps": {"a": {"room": 1.0}},
        "wake_seconds": {"b": 41.25},
    }
    assert parse_on_demand_metrics("") == {"wakes": {}, "sleeps": {}, "wake_seconds": {}}


def test_summary_gives_p50_and_p95_as_the_harness_percentile_does():
    assert summary([]) is None
    s = summary([1.0, 2.0, 3.0, 4.0, 10.0])
    assert s == {"n": 5, "p50": 3.0, "p95": 8.8, "min": 1.0, "max": 10.0}


def test_memory_is_checked_against_its_plan_within_a_tolerance():
    assert ratio_check(1_010, 1_000) == {"measured_bytes": 1_010, "planned_bytes": 1_000, "ratio": 1.01, "within": True}
    assert not ratio_check(1_030, 1_000)["within"]
    assert ratio_check(1_030, 1_000, tolerance=0.05)["within"]
    assert ratio_check(None, 1_000)["within"] is False
    # a stopped CPU engine is planned at 0: only nothing measured is within, and there is no ratio
    assert ratio_check(0, 0)["within"] and ratio_check(0, 0)["ratio"] is None
    assert not ratio_check(640 * MIB, 0)["within"]


def test_the_plan_of_an_engine_at_rest_leaves_out_its_growth_awake_and_asleep():
    engine = {"awake_bytes": 10_000, "asleep_bytes": 2_000, "asleep_at_rest_bytes": 1_600, "growth": 1_500}
    assert planned_for(engine, "asleep") == {"planned_bytes": 2_000, "planned_at_rest_bytes": 1_600}
    assert planned_for(engine, "awake") == {"planned_bytes": 10_000, "planned_at_rest_bytes": 8_500}


def test_a_stopped_cpu_engine_at_rest_is_planned_as_its_driver_without_traffic_growth():
    engine = plan_engines(build_plan(load_profile("configs/cpu-on-demand.yaml")))["chat"]
    # runtime.driver 680 MB + runtime.driver_wake_residue 40 MB + runtime.traffic_growth 160 MB
    assert engine["asleep_bytes"] == 880_000_000
    assert engine["asleep_at_rest_bytes"] == 720_000_000


def test_plan_engines_reads_the_gpu_swap_profile():
    plan = build_plan(load_profile("configs/gpu-on-demand.yaml"))
    engines = plan_engines(plan)
    assert len(engines) == 2
    for name, e in engines.items():
        assert e["awake_bytes"] == plan.replica(name).planned_bytes > e["asleep_bytes"] > 0
        assert e["growth"] == plan.replica(name).growth_bytes and e["wake"] == "copy_from_host"


def test_gpu_processes_go_to_the_engine_that_woke_when_they_appeared():
    owner: dict[int, str] = {}
    # at start: engine a awake (its worker and EngineCore), the embedder beside it; b's replica holds a context
    roles = {10: "vllm_worker", 11: "engine_core", 12: "embedder", 13: "chat_replica"}
    assert attribute_new_pids(owner, roles, "a", replica_of={13: "b"}) == [10, 11]
    assert owner == {10: "a", 11: "a", 13: "b"}
    # b's first wake: its new worker is b's; a's processes stay a's (asleep, they live on)
    roles |= {20: "vllm_worker"}
    assert attribute_new_pids(owner, roles, "b") == [20]
    processes = {10: 4_000, 11: 500, 12: 900, 13: 100, 20: 13_000}
    assert engine_gpu_bytes(owner, processes, "a") == 4_500
    assert engine_gpu_bytes(owner, processes, "b") == 13_100
    assert engine_gpu_bytes(owner, {12: 900}, "a") == 0  # exited processes hold nothing


def test_requests_alternate_from_the_asleep_model():
    assert alternation("b", "a", 5) == ["b", "a", "b", "a", "b"]
    assert alternation("b", "a", 0) == []


def _swap(ok=True, swap=True, ttft=1.0, wake=0.8, kind="copy_from_host", model="b"):
    return {
        "ok": ok,
        "swap": swap,
        "ttft_s": ttft,
        "total_s": ttft + 0.1,
        "wake_s": wake,
        "wake_kind": kind,
        "model": model,
    }


def test_swap_summary_splits_cold_starts_from_wake_ups_and_counts_failures():
    records = [
        {"swap": _swap(ttft=30.0, wake=29.0, kind="cold_start"), "no_swap": _swap(swap=False, ttft=0.1, wake=None)},
        {"swap": _swap(ttft=2.0, model="a"), "no_swap": _swap(swap=False, ttft=0.2, wake=None)},
        {"swap": _swap(ttft=3.0), "no_swap": _swap(ok=False, swap=False)},
        {"swap": _swap(swap=False, ttft=0.1), "no_swap": _swap(swap=False, ttft=0.1, wake=None)},
    ]
    s = swap_summary(records)
    assert s["swap_ttft_s"]["n"] == 3 and s["swap_ttft_s"]["max"] == 30.0
    assert s["swap_ttft_s_by_wake_kind"]["cold_start"]["n"] == 1
    assert s["swap_ttft_s_by_wake_kind"]["copy_from_host"] == summary([2.0, 3.0])
    assert s["no_swap_ttft_s"]["n"] == 3 and s["requests_failed"] == 1
    assert s["swaps_that_found_the_engine_awake"] == 1
    gpu = cold_start_section({"requests": records}, gpu=True)
    assert gpu["cold_starts"] == [{"model": "b", "ttft_s": 30.0, "wake_s": 29.0}]
    assert gpu["wake_up_wake_s"]["n"] == 2 and "wake_up" in gpu["note"]
    assert "every wake is a cold start" in cold_start_section({"requests": records}, gpu=False)["note"]


@pytest.mark.parametrize(
    "asleep, awake, back_to_plan, asleep_first, awake_first",
    [
        ([4_000, 4_010, 3_990], [13_000, 13_100, 12_950], True, True, True),
        ([4_000, 4_200, 4_400], [13_000, 13_000, 13_000], True, False, True),  # drift while asleep
    ],
)
def test_endurance_checks_memory_each_cycle_against_the_plan_and_cycle_1(
    asleep, awake, back_to_plan, asleep_first, awake_first
):
    cycles = [
        {
            "requests_failed": 0,
            "restarted": False,
            "asleep": s,
            "awake": w,
            "asleep_check": {"within": back_to_plan},
            "awake_check": {"within": True},
            "seconds": seconds,
        }
        for s, w, seconds in zip(asleep, awake, (1.3, 1.5, 1.4))
    ]
    verdict = endurance(cycles)
    assert verdict == {
        "cycles": 3,
        "requests_failed": 0,
        "restarts": 0,
        "back_to_plan_every_cycle": back_to_plan,
        "asleep_back_to_cycle_1": asleep_first,
        "awake_back_to_cycle_1": awake_first,
        "asleep_growth_per_cycle_bytes": growth_per_cycle(asleep),
        "awake_growth_per_cycle_bytes": growth_per_cycle(awake),
        "cycle_seconds": summary([1.3, 1.5, 1.4]),
    }


def test_growth_per_cycle_is_the_slope_that_tells_a_leak_from_noise():
    leak = [778, 819, 860, 901, 942]  # +41 a cycle, the CPU wake leak's shape
    noise = [665, 673, 671, 674, 677, 676, 686, 729, 683, 682]  # after the fix: one high reading, no trend
    assert growth_per_cycle(leak) == 41
    assert 0 < growth_per_cycle(noise) < 5
    assert growth_per_cycle([None, 700, None, 700]) == 0 and growth_per_cycle([700]) is None


def test_endurance_counts_failed_requests_restarts_and_missing_readings():
    cycles = [
        {"requests_failed": 1, "restarted": True, "asleep": None, "awake": 5, "asleep_check": {"within": False}},
        {"requests_failed": 0, "restarted": False, "asleep": 0, "awake": 5},
    ]
    verdict = endurance(cycles)
    assert (verdict["requests_failed"], verdict["restarts"]) == (1, 1)
    assert not verdict["back_to_plan_every_cycle"] and not verdict["asleep_back_to_cycle_1"]
    assert verdict["awake_back_to_cycle_1"]
    assert endurance([])["back_to_plan_every_cycle"] is False
    assert verdict["cycle_seconds"] is None  # cycles recorded before their wall time was


def test_a_run_with_more_wakes_than_the_tenant_may_cause_is_warned_of():
    engines = {"a": {"tenant_wakes_per_hour": 30}, "b": {"tenant_wakes_per_hour": 1000}}
    assert wakes_over_budget(engines, swaps=20, cycles=0) == []
    assert wakes_over_budget(engines, swaps=20, cycles=21) == ["a"]  # 10 + 21 wakes of the engine cycled


def test_an_asleep_gpu_engine_at_rest_is_planned_without_its_activation_cache():
    # vLLM's sleep empties torch's cache: on the H200 the asleep 4-layer cut held its CUDA context and graphs only
    engine = plan_engines(build_plan(load_profile("configs/gpu-on-demand.yaml")))["chat"]
    plan = build_plan(load_profile("configs/gpu-on-demand.yaml")).on_demand.engines["chat"]
    assert plan.asleep_breakdown["activations"] > 0
    assert engine["asleep_at_rest_bytes"] == engine["asleep_bytes"] - plan.asleep_breakdown["activations"]
    assert (
        engine["asleep_at_rest_bytes"]
        == plan.asleep_breakdown["cuda_context.worker"] + plan.asleep_breakdown["cuda_graphs"]
    )


def test_a_level_1_wake_is_read_against_the_copy_of_the_weights_it_brings_back():
    """Issue 48's goal: a wake at most 1.5x the time to copy its weights host to device on the same machine. The
    weights are the planned host lines level 1 keeps; the copy's bandwidth comes from a smaller pinned buffer."""
    from bench.bench_on_demand import copy_seconds_for, level_1_weight_bytes, wake_against_copy

    host = {
        "weights.target (on host, level 1)": 50 * GIB,
        "drafter.weights (on host, level 1)": 2 * GIB,
        "process": GIB,
    }
    assert level_1_weight_bytes(host) == 52 * GIB
    assert level_1_weight_bytes({"process": GIB}) == 0
    copy = copy_seconds_for(52 * GIB, {"bytes": 8 * GIB, "seconds": [0.40, 0.20, 0.25]})
    assert copy["copy_s"] == 1.3 and copy["bandwidth_gb_per_s"] == round(8 * GIB / 0.2 / 1e9, 2)
    assert wake_against_copy({"p50": 1.95}, copy) == 1.5
    assert wake_against_copy(None, copy) is None and wake_against_copy({"p50": 1.0}, None) is None


def test_the_bench_s_private_stack_lets_its_one_tenant_make_the_run_s_wakes(tmp_path):
    import yaml

    from bench.bench_on_demand import wakes_in_run
    from bench.harness.stack import write_private_stack

    engines = plan_engines(build_plan(load_profile("configs/cpu-on-demand.yaml")))
    assert wakes_over_budget(engines, swaps=2, cycles=100) == list(engines)  # 30 an hour in the shipped profile
    wakes = wakes_in_run(swaps=2, cycles=100)
    stack = write_private_stack(
        tmp_path, Path("configs/cpu-on-demand.yaml"), 8123, on_demand_overrides={"tenant_wakes_per_hour": wakes}
    )
    written = yaml.safe_load(stack.profile_path.read_text())
    sections = [written["chat"]["on_demand"], *(e["on_demand"] for e in written["engines"])]
    assert [s["tenant_wakes_per_hour"] for s in sections] == [101, 101]
    assert all(s["idle_sleep_s"] > 0 for s in sections)  # the rest of each section as the profile wrote it
    assert wakes_over_budget(plan_engines(build_plan(load_profile(stack.profile_path))), 2, 100) == []


def test_resident_bytes_counts_running_processes_and_skips_ended_ones():
    import os

    import psutil

    from bench.bench_on_demand import resident_bytes

    me = psutil.Process(os.getpid()).memory_info().rss
    assert resident_bytes([]) == 0
    assert 0.5 * me < resident_bytes([os.getpid(), 2**22 + 12345]) < 2 * me  # the second pid runs nowhere


def test_a_cpu_replica_s_pss_is_kept_by_kind_of_page():
    status_entry = {"measured_bytes": 700, "anon_bytes": 400, "file_bytes": 250, "shmem_bytes": 50, "rss_bytes": 900}
    assert pss_parts(status_entry) == {"anon_bytes": 400, "file_bytes": 250, "shmem_bytes": 50}
    assert pss_parts({"measured_bytes": 700}) == dict.fromkeys(PSS_PARTS)


def test_a_light_gpu_reading_takes_states_from_v1_models_and_pids_from_the_last_status(monkeypatch):
    """Between two /status calls (each measures every replica on the host) a GPU cycle reads NVML's bytes, the
    engines' states from /v1/models and the pids /status gave last; a CPU reading always asks /status (PSS)."""
    from types import SimpleNamespace

    from bench.bench_on_demand import Probe, replicas_from_states

    engines = {"chat": {"model_id": "a", "awake_bytes": 100}, "chat-b": {"model_id": "b", "awake_bytes": 100}}
    known = {
        "chat": {"name": "chat", "pids": [7], "engine_state": "awake"},
        "chat-b": {"name": "chat-b", "pids": [8], "engine_state": "asleep"},
        "embedder": {"name": "embedder", "pids": [9]},
    }
    swapped = replicas_from_states(known, engines, {"a": "asleep", "b": "awake"})
    assert swapped["chat"] == {"name": "chat", "pids": [7], "engine_state": "asleep"}
    assert swapped["chat-b"]["engine_state"] == "awake" and swapped["embedder"] == known["embedder"]
    assert known["chat"]["engine_state"] == "awake"  # the last /status is kept as it was

    sampler = SimpleNamespace(read=lambda: SimpleNamespace(processes={70: 3_000, 80: 9_000}, used=12_000, free=1))
    probe = Probe("http://stack", "key", engines, sampler)
    probe.owner, probe.known = {70: "chat", 80: "chat-b"}, known
    calls = []
    monkeypatch.setattr(probe, "status", lambda: calls.append("status") or known)
    monkeypatch.setattr("bench.bench_on_demand.resident_bytes", lambda pids: 0)
    monkeypatch.setattr(
        "bench.bench_on_demand.planned_for", lambda engine, state: {"planned_bytes": 100, "planned_at_rest_bytes": 100}
    )
    light = probe.read({"a": "asleep", "b": "awake"})
    assert calls == [] and light["chat"]["state"] == "asleep" and light["chat-b"]["measured_bytes"] == 9_000
    assert light["chat"]["replica_pid"] == 7
    probe.read()  # no states: a full reading
    assert calls == ["status"]
    cpu = Probe("http://stack", "key", engines, sampler=None)
    cpu.known = known
    monkeypatch.setattr(cpu, "status", lambda: calls.append("cpu status") or known)
    cpu.read({"a": "asleep", "b": "awake"})
    assert calls[-1] == "cpu status"


def test_light_requests_reuse_the_readings_after_one_as_the_next_ones_before(monkeypatch):
    """A GPU cycle's second request starts from the states and counters read after its first (nothing runs
    between them), and its memory reading gets those states instead of a new /status."""
    from types import SimpleNamespace

    from bench import bench_on_demand

    plan = build_plan(load_profile("configs/gpu-on-demand.yaml"))
    server = SimpleNamespace(base_url="http://stack", api_key="key")
    bench = bench_on_demand.Bench(server, "admin", plan, sampler=SimpleNamespace(), log=lambda _line: None)
    names = list(bench.engines)
    a, b = (bench.engines[n]["model_id"] for n in names)
    awake = {"now": a}
    calls = {"states": 0, "metrics": 0}

    def states():
        calls["states"] += 1
        return {a: "awake" if awake["now"] == a else "asleep", b: "awake" if awake["now"] == b else "asleep"}

    def metrics():
        calls["metrics"] += 1
        return {"wakes": {}, "sleeps": {}, "wake_seconds": {awake["now"]: float(calls["metrics"])}}

    def ask(_client, model):
        awake["now"] = model
        return {"ttft_s": 0.1, "total_s": 0.2}

    readings = []
    monkeypatch.setattr(bench, "states", states)
    monkeypatch.setattr(bench, "metrics", metrics)
    monkeypatch.setattr(bench_on_demand, "ask", ask)
    monkeypatch.setattr(bench.probe, "read", lambda given=None: readings.append(given) or {})
    bench.woken = set(names)  # both have been awake: no first-wake claim
    slept = bench.request(b, light_reading=True)
    woke = bench.request(a, light_reading=True)
    assert slept["swap"] and woke["swap"] and slept["ok"] and woke["ok"]
    assert calls == {"states": 3, "metrics": 3}  # 4 and 4 when each request reads its own before
    assert readings == [{a: "asleep", b: "awake"}, {a: "awake", b: "asleep"}]
    full = bench.request(b)  # a full request reads its own before, and /status for its memory
    assert full["swap"] and readings[-1] is None and bench.read_after is None
