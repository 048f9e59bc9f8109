"""A CPU chat engine split over nodes, its ranks on one further node: vLLM's headless multi-node executor
(what `vllm serve --headless --nnodes N --node-rank K` runs, vllm/entrypoints/cli/serve.py run_headless),
built from the same engine arguments as node 0's replica with this node's `node_rank`.

Run as `python -m vllm_bridge.headless [FILE]` with the engine arguments as one JSON object in FILE (else
on stdin), in a process
group of its own: when its parent (vllm_bridge/engine_ranks.py's actor) goes, it ends that group, its vLLM
workers included, so no rank outlives the replica that owns it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time

logger = logging.getLogger("poolserve.headless")

PARENT_POLL_S = 1.0


def _end_group_when_orphaned(parent: int) -> None:
    """A SIGKILLed parent runs no cleanup: the group (this process and its workers) ends itself."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    logger.error("the rank host (pid %d) is gone; ending this node's ranks", parent)
    os.killpg(0, signal.SIGKILL)


def run(engine_kwargs: dict) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    config = AsyncEngineArgs(**engine_kwargs).create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER, headless=True
    )
    if config.parallel_config.node_rank_within_dp == 0:
        raise SystemExit("node_rank 0 runs in the chat replica, not headless")
    executor = MultiprocExecutor(config, monitor_workers=False)
    try:
        executor.start_worker_monitor(inline=True)  # returns when a worker of this node has died
    finally:
        executor.shutdown()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    threading.Thread(target=_end_group_when_orphaned, args=(os.getppid(),), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # finally: the executor's shutdown ends the workers
    with open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin as source:
        run(json.loads(source.read()))


if __name__ == "__main__":
    main()
