"""On-demand chat engines in the plan (issue 48): the pool holds the always-on replicas, every engine asleep
and the worst awake set; a set that does not fit is refused with the set that would."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.advice import apply
from planner.awake_sets import can_wake, fits_awake
from planner.on_demand_spec import OnDemandSpec
from planner.plan import PlanError, build_plan
from planner.profile import Profile, load_profile

ROOT = Path(__file__).resolve().parents[3]
GiB = 2**30


def _with_pool(profile: Profile, **pool) -> Profile:
    return profile.model_copy(update={"pools": [profile.pools[0].model_copy(update=pool)]})


def _on_demand(profile: Profile, level: int = 1, engines: tuple[int, ...] = (0,)) -> Profile:
    """The first engine and the listed ones of profile.engines marked on demand."""
    spec = OnDemandSpec(idle_sleep_s=30, level=level)
    marked = [e.model_copy(update={"on_demand": spec}) if i in engines else e for i, e in enumerate(profile.engines)]
    return apply(profile, {"chat.on_demand": spec}).model_copy(update={"engines": marked})


def test_the_cpu_example_holds_one_engine_awake():
    profile = load_profile(ROOT / "configs" / "cpu-on-demand.yaml")
    plan = build_plan(profile)
    od = plan.on_demand
    assert od.max_awake == 1 and list(od.engines) == ["chat", "chat-smollm2-135m-draft6"]
    chat, small = od.engines.values()
    assert chat.awake_bytes == plan.replica("chat").planned_bytes > small.awake_bytes
    assert od.worst_awake_set == ["chat"]
    # CPU: no sleep mode; a sleeping engine is stopped, and only its Serve replica (the driver) stays
    assert {e.sleep for e in od.engines.values()} == {"stop"} and {e.wake for e in od.engines.values()} == {
        "cold_start"
    }
    assert set(small.asleep_breakdown) == {
        "runtime.driver (LLMServer replica)",
        "runtime.driver_wake_residue",  # what the replica keeps of the engines it stopped, awake and asleep
        "runtime.traffic_growth",
    }
    assert small.asleep_at_rest_bytes == 720 * 10**6  # measured at 711-721 MB asleep, cycles 56-100
    assert small.asleep_bytes < small.awake_bytes / 4
    always_on_replica = build_plan(load_profile(ROOT / "configs" / "cpu-two-engines.yaml")).replica("chat")
    assert "runtime.driver_wake_residue" not in always_on_replica.breakdown  # it starts once
    always_on = sum(r.pool_bytes for r in plan.replicas if r.name not in od.engines)
    assert plan.pool.planned_bytes == always_on + chat.awake_bytes + small.asleep_bytes
    assert od.room_bytes == plan.pool.free_bytes - plan.pool.ray_bytes - plan.pool.page_cache_bytes - always_on
    assert fits_awake(od, ["chat"]) and not fits_awake(od, ["chat", "chat-smollm2-135m-draft6"])
    assert can_wake(od, [], "chat-smollm2-135m-draft6")
    wakes = {a.name: a for a in plan.admission if a.check.startswith("wake")}
    assert set(wakes) == set(od.engines) and wakes["chat"].start_peak_bytes == chat.wake_peak_bytes > 0
    assert any("no vLLM sleep mode" in n for n in plan.notes)
    # the smallest pool covers the tightest wake
    assert plan.pool.needed_bytes >= plan.pool.total_bytes - plan.pool.start_headroom_bytes


def test_both_awake_is_refused_with_the_set_that_fits():
    profile = _with_pool(load_profile(ROOT / "configs" / "cpu-on-demand.yaml"), max_awake_on_demand=2)
    with pytest.raises(PlanError) as refused:
        build_plan(profile)
    text = str(refused.value)
    assert "awake set does not fit" in text
    assert "At most 1 of these on-demand engines awake at once fit: set pools[0].max_awake_on_demand: 1" in text


def test_an_engine_too_big_to_wake_alone_is_named():
    profile = _with_pool(load_profile(ROOT / "configs" / "cpu-on-demand.yaml"), max_awake_on_demand=1)
    plan = build_plan(profile)
    room = plan.on_demand.room_bytes
    chat, small = plan.on_demand.engines["chat"], plan.on_demand.engines["chat-smollm2-135m-draft6"]
    # one byte short of chat's wake beside the other engine asleep (its Serve replica stays)
    tight = plan.pool.total_bytes - (room - chat.wake_check_bytes - small.asleep_bytes) - 1
    with pytest.raises(PlanError, match="only chat-smollm2-135m-draft6 can wake alone"):
        build_plan(profile, tight)


def test_max_awake_beyond_the_engines_is_refused():
    profile = _with_pool(load_profile(ROOT / "configs" / "cpu-on-demand.yaml"), max_awake_on_demand=3)
    with pytest.raises(PlanError, match="has 2 on-demand engines"):
        build_plan(profile)


def test_a_profile_without_on_demand_engines_is_unchanged():
    profile = load_profile(ROOT / "configs" / "cpu-two-engines.yaml")
    plan = build_plan(profile, 24 * GiB)
    assert plan.on_demand is None and "on_demand" not in plan.model_dump()
    # the profile's identity (its digest) and the plan's JSON carry no new keys
    assert "on_demand" not in profile.model_dump_json() and "max_awake" not in profile.model_dump_json()


def test_a_discrete_gpu_keeps_the_context_and_level_1_weights_on_the_host():
    profile = load_profile(ROOT / "configs" / "gh200-two-engines.yaml")
    profile = _on_demand(profile, level=1)
    profile = profile.model_copy(
        update={"engines": [profile.engines[0].model_copy(update={"on_demand": OnDemandSpec(level=2)})]}
    )
    plan = build_plan(_with_pool(profile, max_awake_on_demand=1), 139 * GiB)
    first, second = plan.on_demand.engines.values()
    assert (first.sleep, first.wake, second.sleep, second.wake) == (
        "level_1",
        "copy_from_host",
        "level_2",
        "reload_from_disk",
    )
    for e in (first, second):
        assert "cuda_context.worker" in e.asleep_breakdown
        assert not any(
            k.startswith(("weights.", "kv_pool.", "drafter.kv", "recurrent_state")) for k in e.asleep_breakdown
        )
    weights = sum(v for k, v in plan.replica("chat").breakdown.items() if k.startswith(("weights.", "drafter.weights")))
    on_host = sum(v for k, v in first.asleep_host_breakdown.items() if k.endswith("(on host, level 1)"))
    assert on_host == weights > 0
    assert not any(k.endswith("(on host, level 1)") for k in second.asleep_host_breakdown)
    assert plan.on_demand.asleep_host_bytes_most == first.asleep_host_bytes + second.asleep_host_bytes


def test_unified_memory_plans_level_2_and_a_reload_through_the_page_cache():
    profile = load_profile(ROOT / "configs" / "dgx-spark-27b-plus-small.yaml")
    profile = profile.model_copy(
        update={"engines": [profile.engines[0].model_copy(update={"on_demand": OnDemandSpec(level=1)})]}
    )
    plan = build_plan(profile)
    engine = plan.on_demand.engines["chat-smollm2-135m-instruct"]
    assert (engine.level_asked, engine.sleep, engine.wake) == (1, "level_2", "reload_from_disk")
    assert engine.asleep_host_bytes == 0 and "runtime.engine_core" in engine.asleep_breakdown
    wake = next(a for a in plan.admission if a.name == "chat-smollm2-135m-instruct")
    assert wake.check.startswith("wake") and wake.start_peak_bytes == engine.wake_peak_bytes
    assert any("level 1 frees nothing" in n and "page cache" in n for n in plan.notes)
    # the always-on 27B keeps its own admission row
    assert [a.name for a in plan.admission].count("chat") == 1


def test_several_nodes_are_refused():
    profile = _on_demand(load_profile(ROOT / "configs" / "cpu-two-nodes.yaml"), engines=())
    with pytest.raises(PlanError, match="one pool only"):
        build_plan(profile)


H100_BYTES = 81_559 * 2**20  # NVML's total of the lent H100 80GB HBM3 (docs/GPU.md)


def _max_awake(profile: Profile, count: int) -> Profile:
    return _with_pool(profile, max_awake_on_demand=count)


def test_gpu_on_demand_engines_are_started_with_vllms_sleep_mode_and_others_are_not():
    """vLLM's sleep frees only what its CuMemAllocator holds, which it uses only with enable_sleep_mode."""
    plan = build_plan(load_profile(ROOT / "configs" / "gpu-on-demand.yaml"))
    for name in plan.on_demand.engines:
        assert plan.replica(name).vllm.as_dict()["enable_sleep_mode"] is True
    always_on = build_plan(load_profile(ROOT / "configs" / "h100.yaml"), H100_BYTES).replica("chat").vllm
    assert "enable_sleep_mode" not in always_on.as_dict() and "enable_sleep_mode" not in always_on.model_dump()
    cpu = build_plan(load_profile(ROOT / "configs" / "cpu-on-demand.yaml"))
    assert all("enable_sleep_mode" not in cpu.replica(n).vllm.as_dict() for n in cpu.on_demand.engines)


def test_the_gpu_swap_profile_holds_one_4_layer_engine_awake_and_refuses_two():
    """configs/gpu-on-demand.yaml (bench/bench_on_demand.py on a GPU): its pool is stated, so it plans here
    without a device."""
    profile = load_profile(ROOT / "configs" / "gpu-on-demand.yaml")
    plan = build_plan(profile)
    od = plan.on_demand
    assert od.max_awake == 1 and len(od.engines) == 2 and len(od.worst_awake_set) == 1
    for e in od.engines.values():
        assert (e.sleep, e.wake) == ("level_1", "copy_from_host") and 0 < e.asleep_bytes < e.awake_bytes
    assert not fits_awake(od, list(od.engines))
    assert all(can_wake(od, [], name) for name in od.engines)
    with pytest.raises(PlanError) as refused:
        build_plan(_max_awake(profile, 2))
    assert "At most 1 of these on-demand engines awake at once fit: set pools[0].max_awake_on_demand: 1" in str(
        refused.value
    )


def test_the_h100_swap_profile_fits_one_27b_awake_on_an_h100_and_refuses_both():
    profile = load_profile(ROOT / "configs" / "h100-on-demand.yaml")
    plan = build_plan(profile, H100_BYTES)
    od = plan.on_demand
    assert plan.pool.total_bytes == H100_BYTES and plan.pool.needed_bytes <= H100_BYTES
    assert od.max_awake == 1 and len(od.engines) == 2
    chat = plan.replica("chat")
    assert chat.vllm.speculative_config is None and chat.vllm.load_format == "dummy"
    for e in od.engines.values():
        assert e.sleep == "level_1" and e.awake_bytes > H100_BYTES / 2  # two never fit awake
    # both asleep hold their weights in host memory: the preflight's host check counts them
    assert od.asleep_host_bytes_most > 90 * 2**30
    lines = sum(r.host_bytes * r.num_replicas for r in plan.replicas) + sum(plan.ray.breakdown.values())
    assert plan.pool.host_bytes == lines + od.asleep_host_bytes_most
    with pytest.raises(PlanError) as refused:
        build_plan(_max_awake(profile, 2), H100_BYTES)
    assert "At most 1 of these on-demand engines awake at once fit" in str(refused.value)


@pytest.mark.parametrize("path", ["gpu-on-demand.yaml", "h100-on-demand.yaml"])
def test_on_demand_engines_gpu_shares_fit_one_gpu_together(path):
    """Ray places every engine's replica (and its vLLM worker's bundle) at start, asleep or not: each on-demand
    engine's GPU share is its awake share divided by their count, so all of them fit the one GPU."""
    plan = build_plan(load_profile(ROOT / "configs" / path), H100_BYTES)
    shares = {r.name: r.ray_actor_options.num_gpus for r in plan.replicas if r.ray_actor_options.num_gpus}
    assert sum(shares.values()) <= 1
    for name in plan.on_demand.engines:
        replica = plan.replica(name)
        assert shares[name] == pytest.approx(replica.planned_bytes / plan.pool.total_bytes / 2, abs=1e-4)
        assert replica.env["VLLM_RAY_PER_WORKER_GPUS"] == str(shares[name])  # the worker asks the same share
    # always-on engines keep their share of the pool
    two = build_plan(load_profile(ROOT / "configs" / "gh200-two-engines.yaml"), 139 * GiB)
    chat = two.replica("chat")
    assert chat.ray_actor_options.num_gpus == pytest.approx(chat.planned_bytes / two.pool.total_bytes, abs=1e-4)


def test_the_wake_coordinator_is_a_planned_replica_only_where_engines_are_on_demand():
    """Issue 48: the coordinator is a process of the stack: it has its line, its budget and its Serve options
    in the plan (measured by /status like every replica), reserves no CPU, and takes 4096 calls at a time."""
    from planner.plan import WAKE_COORDINATOR

    plan = build_plan(load_profile(ROOT / "configs" / "cpu-on-demand.yaml"))
    coordinator = plan.replica(WAKE_COORDINATOR)
    assert coordinator.kind == WAKE_COORDINATOR and coordinator.planned_bytes == sum(coordinator.breakdown.values())
    assert 100e6 < coordinator.planned_bytes < 150e6  # measured PSS 101.3 MB
    options = coordinator.serve_options()
    assert options["max_ongoing_requests"] == 4096 and options["ray_actor_options"]["num_cpus"] == 0
    assert coordinator.node == plan.replica("gateway").node
    assert WAKE_COORDINATOR not in {
        r.name for r in build_plan(load_profile(ROOT / "configs" / "cpu-tiny.yaml")).replicas
    }


def test_the_gateway_learns_which_engines_are_on_demand_from_its_typed_settings():
    """The gateway's wake gate is built from GatewaySettings.chat_models (deployments/gateway.py), not from a
    list handed beside the plan."""
    on_demand = build_plan(load_profile(ROOT / "configs" / "cpu-on-demand.yaml")).gateway.chat_models
    assert {m: card.on_demand for m, card in on_demand.items()} == {
        "smollm2-135m-instruct": True,
        "smollm2-135m-draft6": True,
    }
    always_on = build_plan(load_profile(ROOT / "configs" / "cpu-two-engines.yaml")).gateway.chat_models
    assert not any(card.on_demand for card in always_on.values())
