"""Several nodes: the head's fixed Ray ports and how a node joins it (stackctl/join.py runs the join).

A profile with several `pools:` is one Ray cluster. The first pool is the head: `poolserve up` there starts
Ray (GCS, Serve controller, the gateway) on the pool's `address` and its fixed `ray_ports`, then `serve
run`. Every other pool joins with `poolserve up --join HEAD:PORT --node NAME`: its own memory cgroup, its
own preflight against its own plan, a raylet that advertises the node's placement resource (planner/
nodes.py) so exactly the replicas planned there land on it, and Ray's token (the head's, copied over).
Each node's processes carry the stack marker of its own state dir, so `poolserve down` on a node ends
that node's processes and nobody else's.
"""

from __future__ import annotations

import json

from planner.plan import Plan, PoolPlan
from planner.profile import PoolSpec, Profile

# What `ray start` calls each port of RayPortsSpec; the first three are the head's alone.
HEAD_ONLY_PORT_FLAGS = {
    "gcs": "--port",
    "ray_client_server": "--ray-client-server-port",
    "dashboard": "--dashboard-port",
}
NODE_PORT_FLAGS = {
    "dashboard_agent_listen": "--dashboard-agent-listen-port",
    "dashboard_agent_grpc": "--dashboard-agent-grpc-port",
    "metrics_export": "--metrics-export-port",
    "runtime_env_agent": "--runtime-env-agent-port",
    "node_manager": "--node-manager-port",
    "object_manager": "--object-manager-port",
    "min_worker": "--min-worker-port",
    "max_worker": "--max-worker-port",
}


def is_cluster(profile: Profile) -> bool:
    return len(profile.pools) > 1


def pool_spec(profile: Profile, node: str) -> PoolSpec:
    for spec in profile.pools:
        if spec.name == node:
            return spec
    raise ValueError(f"node {node!r} is not in the profile; nodes: {', '.join(p.name for p in profile.pools)}")


def node_plan(plan: Plan, node: str) -> Plan:
    """The plan as one node's preflight reads it: that node's pool, replicas (and engine shares) and start
    order."""
    pool: PoolPlan | None = next((p for p in plan.pools if p.name == node), None)
    if pool is None:
        raise ValueError(f"node {node!r} is not in the plan; nodes: {', '.join(p.name for p in plan.pools)}")
    if len(plan.pools) == 1:
        return plan
    here = [r for r in [*plan.replicas, *plan.shares] if r.name in pool.replicas]
    return plan.model_copy(update={"pool": pool, "admission": pool.admission, "replicas": here})


def ray_port_flags(spec: PoolSpec, head: bool) -> list[str]:
    """`ray start` flags for a node's fixed ports (RayPortsSpec)."""
    flags = {**(HEAD_ONLY_PORT_FLAGS if head else {}), **NODE_PORT_FLAGS}
    return [f"{flag}={getattr(spec.ray_ports, field)}" for field, flag in flags.items()]


def gcs_address(profile: Profile) -> str:
    head = profile.pools[0]
    return f"{head.address}:{head.ray_ports.gcs}"


def split_refusal(profile: Profile) -> str | None:
    """Why `poolserve up` does not start a profile, when one of its engines spans GPU nodes. CPU pools run
    a split engine (vllm_bridge/engine_ranks.py); on GPU pools the plan names vLLM's Ray executor, whose ranks'
    bundles per node are not handed to ray.serve.llm yet, and that path never ran (no two GPU nodes)."""
    pools = {pool.name: pool for pool in profile.pools}
    split = [
        name
        for name, spec in profile.chat_engines()
        if len(set(spec.nodes)) > 1 and any(pools[node].gpu for node in spec.nodes)
    ]
    if not split:
        return None
    return (
        f"chat engine {', '.join(split)} is split over GPU nodes: planned, but poolserve does not start it "
        "yet (its Ray executor's placement bundles per node are not wired; docs/SPARK.md section 12 step "
        "10). Place the engine on one node (`node:`), or split it over CPU pools"
    )


def next_node_manager_port(spec: PoolSpec, last: int | None) -> int:
    """The raylet port of a node's next join: the one after `last` in its span (wrapping), the first when
    it never joined. A raylet back on its previous port meets the head's channel to the dead one, still in
    gRPC reconnect back-off: the head then failed to place bundles there and did not retry for minutes."""
    ports = spec.ray_ports
    if last is None or not ports.node_manager <= last < ports.node_manager + ports.node_manager_span:
        return ports.node_manager
    return ports.node_manager + (last - ports.node_manager + 1) % ports.node_manager_span


def join_command(
    ray_bin: str, plan: Plan, spec: PoolSpec, head_address: str, node_manager_port: int | None = None
) -> list[str]:
    """`ray start` for a node that joins the head: its address, CPUs, object store, placement resource and
    fixed ports. No dashboard, client server or GCS of its own (those are the head's)."""
    pool = next(p for p in plan.pools if p.name == spec.name)
    command = [
        ray_bin,
        "start",
        f"--address={head_address}",
        f"--node-ip-address={spec.address}",
        f"--num-cpus={pool.cpus:g}",
        f"--object-store-memory={plan.ray.object_store_memory}",
        "--disable-usage-stats",
    ]
    if pool.ray_resources:
        command.append(f"--resources={json.dumps(pool.ray_resources, sort_keys=True)}")
    flags = ray_port_flags(spec, head=False)
    if node_manager_port is not None:
        flags = [
            f"--node-manager-port={node_manager_port}" if f.startswith("--node-manager-port=") else f for f in flags
        ]
    return command + flags
