"""The extension mixed into vLLM's Worker class (engine argument `worker_extension_cls`): methods the chat replica
runs inside its Workers by name through collective_rpc. vLLM's IPC refuses to carry a function unless pickle is
allowed (VLLM_ALLOW_INSECURE_SERIALIZATION), which stays off.

- poolserve_release_heap: hand the Worker's freed heap back to the pool (system/process_memory.py
  release_freed_heap), every `heap_trim_interval_s`;
- poolserve_exact_sleep_backups: level-1 sleep keeps the weights on the host at their exact size, in copies mapped
  and pinned once, at an on-demand engine's start on a GPU (vllm_bridge/sleep_backups.py)."""

from __future__ import annotations

from planner.worker_extension import WORKER_EXTENSION_CLS
from system.process_memory import release_freed_heap
from vllm_bridge.sleep_backups import install_in_this_worker


class PoolserveWorkerExtension:
    """Mixed into vLLM's Worker class; each method is called by name through collective_rpc."""

    def poolserve_release_heap(self) -> None:
        # No gc pass: the Worker's objects are its model's, and a full collection would stall its steps.
        release_freed_heap(collect=False)

    def poolserve_exact_sleep_backups(self) -> bool:
        """True once this Worker's level-1 sleep keeps exact host copies; False where vLLM's is left as it is."""
        return install_in_this_worker()


WORKER_EXTENSION = f"{__name__}.{PoolserveWorkerExtension.__qualname__}"
WORKER_TRIM_METHOD = "poolserve_release_heap"
EXACT_SLEEP_BACKUPS_METHOD = "poolserve_exact_sleep_backups"

# The planner names this class by string for vLLM (planner/worker_extension.py): a rename must move both together.
if WORKER_EXTENSION != WORKER_EXTENSION_CLS:
    raise ImportError(
        f"planner.worker_extension.WORKER_EXTENSION_CLS names {WORKER_EXTENSION_CLS!r}, not this class "
        f"({WORKER_EXTENSION})"
    )
