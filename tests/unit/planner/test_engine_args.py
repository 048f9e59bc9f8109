"""planner/engine_args.py: an engine's vLLM arguments and environment are complete when the planner returns them;
deployments/chat.py binds them as they are, and nothing edits a planned engine afterwards."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from planner.engine import plan_engine
from planner.gb10 import OVERHEAD_LINE
from planner.plan import build_plan
from planner.profile import load_profile
from planner.step_worker import STEP_THREADS_WORKER, StepWorkerSettings

ROOT = Path(__file__).resolve().parents[3]
GiB = 2**30


def _chat_config(profile, plan, name="chat"):
    from deployments.chat import llm_config_from_plan

    spec = dict(profile.chat_engines())[name]
    shares = sorted(
        (r for r in plan.shares if r.name.startswith(f"{name}@") and r.engine_node_rank is not None),
        key=lambda r: r.engine_node_rank,
    )
    return llm_config_from_plan(spec, plan.replica(name), [], shares)


@pytest.mark.parametrize(
    "name, pool",
    [("cpu-tiny", 24), ("cpu-two-nodes-split", 24), ("dgx-spark-27b", None), ("gh200-two-engines", 139), ("h100", 79)],
)
def test_the_chat_replica_is_bound_with_exactly_the_planned_arguments_and_environment(name, pool):
    profile = load_profile(ROOT / f"configs/{name}.yaml")
    plan = build_plan(profile, pool * GiB if pool else None, cpu_native_bf16=True)
    for engine, _ in profile.chat_engines():
        replica = plan.replica(engine)
        config = _chat_config(profile, plan, engine)
        assert config.engine_kwargs == replica.vllm.as_dict()
        assert config.runtime_env["env_vars"] == replica.env  # the installed vLLM (0.32) accepts it as planned


def test_a_gpu_engine_is_told_its_share_of_the_gpu_in_its_environment():
    plan = build_plan(load_profile(ROOT / "configs/gh200-two-engines.yaml"), 139 * GiB)
    for replica in (r for r in plan.replicas if r.kind == "chat"):
        assert replica.env["VLLM_RAY_PER_WORKER_GPUS"] == str(replica.ray_actor_options.num_gpus)
        assert replica.vllm.worker_cls is None  # vLLM's own GPU worker


def test_a_cpu_engine_gets_the_step_threads_worker_and_its_settings_typed():
    plan = build_plan(load_profile(ROOT / "configs/cpu-tiny.yaml"), 24 * GiB)
    chat = plan.replica("chat")
    assert chat.vllm.worker_cls == STEP_THREADS_WORKER
    assert chat.vllm.worker_extension_cls == "vllm_bridge.worker_extension.PoolserveWorkerExtension"
    settings = StepWorkerSettings.from_env(chat.env)
    assert settings.wide_step_tokens == 128 and settings.idle_spin_s == 0.05
    assert not [k for k in chat.env if k.startswith("POOLSERVE_") and k != "POOLSERVE_STEP_WORKER"]


def test_planned_arguments_cannot_be_edited_in_place():
    chat = build_plan(load_profile(ROOT / "configs/cpu-tiny.yaml"), 24 * GiB).replica("chat")
    with pytest.raises(ValidationError):
        chat.vllm.max_num_seqs = 1


@pytest.mark.parametrize("name, pool", [("dgx-spark-27b", None), ("cpu-two-nodes-split", 24)])
def test_building_the_replicas_leaves_the_engine_plan_as_planned(name, pool, monkeypatch):
    """The GB10 overhead line (unified GPU) and a split's per-node lines are new lines, not edits of the engine."""
    import planner.plan as plan_module

    seen = []

    def recording(*args, **kwargs):
        eng = plan_engine(*args, **kwargs)
        seen.append((eng, copy.deepcopy(eng.breakdown), eng.notes))
        return eng

    monkeypatch.setattr(plan_module, "plan_engine", recording)
    plan = build_plan(load_profile(ROOT / f"configs/{name}.yaml"), pool * GiB if pool else None, cpu_native_bf16=True)
    assert seen
    for eng, breakdown, notes in seen:
        assert eng.breakdown == breakdown and eng.notes == notes
    if name == "dgx-spark-27b":
        assert OVERHEAD_LINE in plan.replica("chat").breakdown and OVERHEAD_LINE not in seen[0][0].breakdown
    else:
        assert any("pipeline x" in n for n in plan.notes)  # the split's note reaches the plan


def test_only_an_on_demand_cpu_engine_runs_its_replica_on_glibcs_malloc():
    """A CPU engine that sleeps by stopping starts again in the same replica: its interpreter takes glibc's malloc
    (trimmed at each stop) instead of pymalloc's arenas, which each start's tokenizer copies leave pinned."""
    from planner.engine_args import REPLICA_ONLY_ENV, SYSTEM_MALLOC_ENV

    assert SYSTEM_MALLOC_ENV in REPLICA_ONLY_ENV
    on_demand = build_plan(load_profile(ROOT / "configs/cpu-on-demand.yaml"), 24 * GiB)
    chats = [r for r in on_demand.replicas if r.kind == "chat"]
    assert len(chats) == 2 and all(r.env[SYSTEM_MALLOC_ENV] == "malloc" for r in chats)
    always_on = build_plan(load_profile(ROOT / "configs/cpu-tiny.yaml"), 24 * GiB).replica("chat")
    assert SYSTEM_MALLOC_ENV not in always_on.env
    gpu = build_plan(load_profile(ROOT / "configs/gpu-on-demand.yaml"), 80 * GiB)
    assert all(SYSTEM_MALLOC_ENV not in r.env for r in gpu.replicas if r.kind == "chat")  # it sleeps in place


def test_the_chat_replica_drops_the_replica_only_variables_before_its_engine_starts(monkeypatch):
    """The engine's processes inherit the replica's environment; the allocator is the replica's alone."""
    from deployments.chat import drop_replica_only_env
    from planner.engine_args import SYSTEM_MALLOC_ENV

    monkeypatch.setenv(SYSTEM_MALLOC_ENV, "malloc")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert drop_replica_only_env() == {SYSTEM_MALLOC_ENV: "malloc"}
    assert SYSTEM_MALLOC_ENV not in os.environ and os.environ["OMP_NUM_THREADS"] == "2"
    assert drop_replica_only_env() == {}
