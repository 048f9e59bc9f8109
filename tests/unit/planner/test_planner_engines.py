"""Several chat engines in one pool: each planned with its own lines and admission step, in start order."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.plan import PlanError, build_plan
from planner.profile import load_profile

ROOT = Path(__file__).resolve().parents[3]
GiB = 2**30


def _two_engines(tmp_path: Path, **second) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "cpu-two-engines.yaml").read_text())
    for section in (data["chat"], *data["engines"], data["embedder"]):
        section["model"] = str(ROOT / section["model"])
    data["engines"][0].update(second)
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_each_engine_has_its_own_budget_and_admission_step(tmp_path):
    plan = build_plan(load_profile(_two_engines(tmp_path)), 24 * GiB)
    names = [r.name for r in sorted(plan.replicas, key=lambda r: r.start_order)]
    assert names == ["chat", "chat-smollm2-135m-plain", "embedder", "retriever", "gateway"]
    first, second = plan.replica("chat"), plan.replica("chat-smollm2-135m-plain")
    assert second.vllm.kv_cache_memory_bytes == 512 * 2**20 and second.vllm.max_model_len == 2048
    assert second.vllm.speculative_config is None and first.vllm.speculative_config is not None
    assert second.planned_bytes < first.planned_bytes
    steps = {a.name: a for a in plan.admission}
    # On a CPU the engines start together (PoolSpec.engines_start): each is admitted with the other's budget
    # already taken, and both before the other replicas.
    assert first.start_order == second.start_order == 0 and plan.replica("embedder").start_order == 1
    assert (
        steps["chat-smollm2-135m-plain"].free_before_bytes + first.pool_bytes
        == steps["chat"].free_before_bytes + second.pool_bytes
    )
    assert steps["embedder"].free_before_bytes == steps["chat"].free_before_bytes - first.pool_bytes
    assert set(plan.engines) == {"chat", "chat-smollm2-135m-plain"}
    assert plan.engines["chat-smollm2-135m-plain"].kv_pool_tokens == 512 * 2**20 // 23_040 // 128 * 128
    planned = sum(r.pool_bytes for r in plan.replicas)
    assert plan.pool.planned_bytes == planned


def test_a_pool_too_small_for_the_second_engine_is_refused(tmp_path):
    one = build_plan(load_profile(ROOT / "configs" / "cpu-tiny.yaml"), 11 * GiB)
    assert one.pool.headroom_bytes >= 0
    with pytest.raises(PlanError):
        build_plan(load_profile(_two_engines(tmp_path)), 11 * GiB)


def test_engine_model_ids_must_differ(tmp_path):
    with pytest.raises(ValueError, match="used twice"):
        load_profile(_two_engines(tmp_path, model_id="smollm2-135m-instruct"))


def test_gpu_admission_counts_vllm_start_overhead():
    """vLLM samples free memory after its own processes and CUDA context exist (runtime.VLLM_GPU_START_OVERHEAD):
    the second engine is checked against what is free then, not before it started."""
    from planner import runtime
    from planner.plan import _admission

    profile = load_profile(ROOT / "configs/dgx-spark-27b-plus-small.yaml")
    plan = build_plan(profile)
    small = next(a for a in plan.admission if a.name == "chat-smollm2-135m-instruct")
    assert small.start_order == 1 and small.overhead_bytes == runtime.VLLM_GPU_START_OVERHEAD
    assert small.requested_bytes <= small.free_before_bytes - small.overhead_bytes
    assert all(a.overhead_bytes == 0 for a in plan.admission if not a.name.startswith("chat"))
    # Take away all but 1 GiB of the small engine's margin: it would pass a check that ignored the overhead.
    margin = small.free_before_bytes - small.requested_bytes
    spec = profile.pools[0].model_copy(update={"reserve": profile.pools[0].reserve + margin - GiB})
    outside = plan.pool.ray_bytes + plan.pool.page_cache_bytes
    with pytest.raises(PlanError, match="chat-smollm2-135m-instruct would be refused at start.*when vLLM looks"):
        _admission(plan.replicas, plan.pool.total_bytes, spec, outside, [])


def test_engines_one_at_a_time_are_admitted_in_turn(tmp_path):
    profile = load_profile(_two_engines(tmp_path))
    profile = profile.model_copy(
        update={"pools": [profile.pools[0].model_copy(update={"engines_start": "one_at_a_time"})]}
    )
    plan = build_plan(profile, 24 * GiB)
    first, second = plan.replica("chat"), plan.replica("chat-smollm2-135m-plain")
    assert (first.start_order, second.start_order, plan.replica("embedder").start_order) == (0, 1, 2)
    steps = {a.name: a for a in plan.admission}
    # The second engine is admitted against what is free after the first one took its budget.
    assert steps["chat-smollm2-135m-plain"].free_before_bytes == steps["chat"].free_before_bytes - first.planned_bytes


def test_engines_starting_together_count_each_others_start_peak(tmp_path):
    from planner.plan import _admission

    plan = build_plan(load_profile(_two_engines(tmp_path)), 24 * GiB)
    spec = load_profile(_two_engines(tmp_path)).pools[0]
    outside = plan.pool.ray_bytes + plan.pool.page_cache_bytes
    rows = {a.name: a for a in _admission(plan.replicas, plan.pool.total_bytes, spec, outside, [], {})}
    peaks = {"chat": {"load": 2 * GiB}, "chat-smollm2-135m-plain": {"load": GiB}}
    together = {a.name: a for a in _admission(plan.replicas, plan.pool.total_bytes, spec, outside, [], peaks)}
    assert together["chat"].start_headroom_bytes == rows["chat"].start_headroom_bytes - 3 * GiB
    # A pool with room for either start peak alone, but not for both at once, is refused.
    tight = spec.model_copy(update={"reserve": spec.reserve + together["chat"].start_headroom_bytes + GiB // 2})
    with pytest.raises(PlanError, match="of the engines starting beside it"):
        _admission(plan.replicas, plan.pool.total_bytes, tight, outside, [], peaks)
