"""vLLM's KV-cache groups for hybrid models, and the padding they cost.

vLLM (v1/core/kv_cache_utils.py `_get_kv_cache_groups_uniform_page_size`) buckets layers by KV
spec (layers with equal specs share a bucket: a drafter or MTP layer shaped like the target's
attention joins the target's attention bucket), then cuts every bucket into groups of one size:
the smallest bucket, or the largest when it is under 1.5x the smallest. Each group holds
`group_size` layer slots per block whatever it fills, so a short group pads. A block is one page
per slot: attention groups use a block per `block_size` tokens, state (Mamba/GDN) groups a block
per sequence (and per speculative slot).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.units import cdiv


@dataclass(frozen=True)
class Group:
    kind: str  # bucket name: "attention", "sliding", "state", "drafter"
    layers: int  # real layers in this group


@dataclass(frozen=True)
class KVGroups:
    group_size: int
    groups: tuple[Group, ...]

    def slots(self, kind: str) -> int:
        """Layer slots (real + padding) the groups of one bucket take per block."""
        return self.group_size * sum(1 for g in self.groups if g.kind == kind)

    def padding(self, kind: str) -> int:
        return self.slots(kind) - sum(g.layers for g in self.groups if g.kind == kind)


def kv_cache_groups(buckets: dict[str, int]) -> KVGroups:
    """`buckets`: layer count per distinct KV spec (empty buckets ignored)."""
    sizes = {k: n for k, n in buckets.items() if n}
    if not sizes:
        return KVGroups(0, ())
    smallest, largest = min(sizes.values()), max(sizes.values())
    # vLLM's heuristic: pad up to the largest bucket when buckets are close in size.
    group_size = largest if largest < smallest * 1.5 else smallest
    groups = []
    for kind, n in sizes.items():
        count = cdiv(n, group_size)
        # vLLM deals layers round-robin (layers[i::count]), so groups differ by at most one layer.
        groups += [Group(kind, len(range(i, n, count))) for i in range(count)]
    return KVGroups(group_size, tuple(groups))
