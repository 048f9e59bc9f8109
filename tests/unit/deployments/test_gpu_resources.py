"""GPU resources Ray will actually grant: each profile's deployments as app.py builds them with
ray.serve.llm's builder, read back without starting Ray.

A Spark profile must give every vLLM engine a GPU share in the bundle its worker is placed in, with
VLLM_RAY_PER_WORKER_GPUS equal to that share in the replica's env (where vLLM's executor reads it), and the
embedder a GPU share and device `cuda`; all shares on the one GPU sum to <= 1. cpu-tiny asks no GPU anywhere.
"""

from __future__ import annotations

import random
import types
from pathlib import Path

import pytest
import ray

from planner.gpu import GPU_UNITS, gpu_fraction, torch_device
from planner.plan import build_plan
from planner.profile import load_profile
from planner.units import GiB

ROOT = Path(__file__).resolve().parents[3]
SPARKS = sorted(p.name for p in (ROOT / "configs").glob("dgx-spark*.yaml"))


@pytest.fixture(scope="module")
def no_ray():
    """Building a deployment reads ray.get_runtime_context(), which would start Ray: answer it here, and
    fail the test if anything still tries to start Ray."""

    def refuse(*args, **kwargs):
        raise AssertionError("the deployment builder tried to start Ray")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray, "init", refuse)
        mp.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(runtime_env={}))
        yield
    assert not ray.is_initialized()


def _built(config: str, pool_total_bytes: int | None = None):
    from deployments.app import embedder_deployment, engine_deployments

    profile = load_profile(ROOT / "configs" / config)
    plan = build_plan(profile, pool_total_bytes)
    engines, _, after = engine_deployments(profile, plan)
    return plan, [app._bound_deployment for app in engines.values()], embedder_deployment(plan, after)


def _units(share: float) -> int:
    """A share in Ray's units: what Ray sums (ray/_private/ray_constants.py MIN_RESOURCE_GRANULARITY)."""
    units = round(share * GPU_UNITS)
    assert units == pytest.approx(share * GPU_UNITS, abs=1e-6), f"{share} is finer than Ray's unit"
    return units


def _vllm_gpu_bundle(bundles: list[dict]) -> tuple[int, dict]:
    """The bundle vLLM's Ray executor places its (only) worker in: the first with a GPU key
    (vllm/v1/executor/ray_executor.py _init_workers_ray, without VLLM_RAY_BUNDLE_INDICES)."""
    return next((i, b) for i, b in enumerate(bundles) if b.get("GPU", 0))


@pytest.mark.parametrize("config", SPARKS)
def test_spark_gpu_shares_are_granted(config, no_ray):
    from ray.llm._internal.serve.engines.vllm.vllm_models import VLLMEngineConfig

    plan, engines, embedder = _built(config)
    assert plan.pool.gpu
    on_gpu = []
    for deployment in engines:
        llm_config = deployment._replica_config.init_kwargs["llm_config"]
        replica = plan.replica(deployment.name.split(":", 1)[1])
        share = replica.ray_actor_options.num_gpus
        assert share and 0 < share < 1, deployment.name
        bundles, actor = deployment._replica_config.placement_group_bundles, deployment.ray_actor_options
        # The engine's share is in its bundle; the replica actor, placed in bundle 0, asks none of it.
        assert llm_config.placement_group_config["bundles"][0]["GPU"] == share
        assert not actor.get("num_gpus")
        index, bundle = _vllm_gpu_bundle(bundles)
        assert index == 0 and bundle["GPU"] == share
        # A GPU bundle makes ray.serve.llm run vLLM with the Ray executor (a Ray actor asking the share).
        engine_config = llm_config.get_engine_config()
        assert engine_config.get_initialization_kwargs()["distributed_executor_backend"] == "ray"
        # The worker asks VLLM_RAY_PER_WORKER_GPUS: in the replica's env, as ray.serve.llm derives it.
        env = actor["runtime_env"]["env_vars"]
        detected = VLLMEngineConfig._detect_fractional_gpu_from_pg(llm_config.placement_group_config)
        assert env["VLLM_RAY_PER_WORKER_GPUS"] == str(detected) == str(share)
        assert "VLLM_RAY_BUNDLE_INDICES" not in env and "CUDA_VISIBLE_DEVICES" not in env
        # A scheduling share, never more than the memory the engine is allowed.
        assert share <= replica.vllm.gpu_memory_utilization
        on_gpu += [share] * deployment._deployment_config.num_replicas

    emb = embedder._bound_deployment
    assert emb._replica_config.init_args[0].device == "cuda"
    assert emb.ray_actor_options["num_gpus"] == plan.replica("embedder").ray_actor_options.num_gpus
    on_gpu += [emb.ray_actor_options["num_gpus"]] * emb._deployment_config.num_replicas
    for name in ("retriever", "gateway"):
        assert not plan.replica(name).ray_actor_options.num_gpus
    # One GPU on a Spark: every share on it, summed as Ray sums them, fits.
    assert sum(_units(s) for s in on_gpu) <= GPU_UNITS


def test_cpu_tiny_asks_no_gpu(no_ray):
    plan, engines, embedder = _built("cpu-tiny.yaml", 24 * GiB)
    assert not any(r.ray_actor_options.num_gpus for r in plan.replicas)
    for deployment in engines:
        llm_config = deployment._replica_config.init_kwargs["llm_config"]
        assert not any(b.get("GPU") for b in deployment._replica_config.placement_group_bundles)
        assert not deployment.ray_actor_options.get("num_gpus")
        assert "VLLM_RAY_PER_WORKER_GPUS" not in deployment.ray_actor_options["runtime_env"]["env_vars"]
        assert llm_config.get_engine_config().get_initialization_kwargs()["distributed_executor_backend"] == "mp"
    emb = embedder._bound_deployment
    assert emb._replica_config.init_args[0].device == "cpu"
    assert not emb.ray_actor_options.get("num_gpus")


def test_fraction_is_the_planned_share_rounded_down_to_rays_unit():
    assert gpu_fraction(1, 4) == 0.25
    assert gpu_fraction(2, 3) == 0.6666  # down, not 0.6667: a third replica of 1/3 still fits
    assert gpu_fraction(1, 3) + gpu_fraction(1, 3) + gpu_fraction(1, 3) <= 1
    assert gpu_fraction(120 * GiB, 120 * GiB) == 1.0
    assert gpu_fraction(3 * GiB, 2 * GiB) == 1.0  # overcommit is build_plan's to refuse; the share is capped
    assert gpu_fraction(10_000, 10_000 * 10_000) == 0.0001
    with pytest.raises(ValueError, match="smallest GPU share"):
        gpu_fraction(9_999, 10_000 * 10_000)
    for bad in ((0, 10), (-1, 10), (5, 0)):
        with pytest.raises(ValueError):
            gpu_fraction(*bad)


def test_fractions_of_any_split_of_the_pool_sum_to_at_most_one():
    rng = random.Random(15)
    for _ in range(2000):
        pool = rng.randrange(10**6, 200 * GiB)
        cuts = sorted(rng.randrange(pool // 100, pool) for _ in range(rng.randrange(1, 6)))
        parts = [b - a for a, b in zip([0, *cuts], cuts) if b - a >= pool // GPU_UNITS + 1]
        assert sum(_units(gpu_fraction(p, pool)) for p in parts) <= GPU_UNITS


def test_device_follows_the_plans_gpu_share():
    assert torch_device(0.0172) == "cuda"
    assert torch_device(None) == "cpu"
    assert torch_device(0.0) == "cpu"


@pytest.mark.parametrize("config", [*SPARKS, "cpu-tiny.yaml"])
def test_render_shows_the_chat_deployments_as_built(config, no_ray):
    """`poolserve render` is a review copy: its chat entries carry the bundles and env the app deploys."""
    from cli.main import serve_config

    plan, engines, _ = _built(config)
    rendered = {d["name"]: d for d in serve_config(plan, ROOT / "configs" / config)["applications"][0]["deployments"]}
    for deployment in engines:
        review = rendered[deployment.name]
        assert review["placement_group_bundles"] == deployment._replica_config.placement_group_bundles
        assert review["placement_group_strategy"] == deployment._replica_config.placement_group_strategy
        built_env = deployment.ray_actor_options["runtime_env"]["env_vars"]
        assert review["ray_actor_options"]["runtime_env"]["env_vars"].items() <= built_env.items()
        assert review["ray_actor_options"]["num_cpus"] == deployment.ray_actor_options["num_cpus"]


def test_cpu_engines_start_together_and_the_rest_waits_for_all_of_them(no_ray):
    from deployments.app import engine_deployments

    profile = load_profile(ROOT / "configs" / "cpu-two-engines.yaml")
    _, _, after = engine_deployments(profile, build_plan(profile, 24 * GiB))
    assert [a[0] for a in after] == ["PoolserveLLMServer:chat", "PoolserveLLMServer:chat-smollm2-135m-plain"]
