"""Several nodes: which pool each replica lives on, how Ray is told so, and Ray's own processes per node.

Placement is never left to Ray's scheduler: every node advertises a custom resource of its own
(`ray start --resources`, the plan's pool.ray_resources: stackctl/launcher.py node_resources_flag for
the head, stackctl/cluster.py join_command for the others) and every replica actor, and every rank of
a split engine (its placement bundle), asks a sliver of its node's resource. One node keeps its plan
as it was: no resources at all.
"""

from __future__ import annotations

from planner import runtime

NODE_RESOURCE_PREFIX = "poolserve_node_"
# What one actor or bundle asks of its node's resource; the node advertises 1 (room for 1,000 of them,
# so a rolling restart's second copy still places).
NODE_RESOURCE_SHARE = 0.001
NODE_RESOURCE_TOTAL = 1.0


def node_resource(node: str) -> str:
    """The custom resource naming a node: poolserve_node_<name>."""
    return f"{NODE_RESOURCE_PREFIX}{node}"


def placement_resources(node: str) -> dict[str, float]:
    """What a replica actor or an engine rank's bundle asks to land on `node`."""
    return {node_resource(node): NODE_RESOURCE_SHARE}


def advertised_resources(node: str) -> dict[str, float]:
    """What the node's `ray start` advertises so that exactly its replicas land on it."""
    return {node_resource(node): NODE_RESOURCE_TOTAL}


def ray_system_lines(head: bool) -> dict[str, int]:
    """Ray's own processes on one node: all of runtime.RAY_SYSTEM on the head, the per-node ones elsewhere."""
    if head:
        return dict(runtime.RAY_SYSTEM)
    return {name: v for name, v in runtime.RAY_SYSTEM.items() if name not in runtime.RAY_HEAD_ONLY}
