"""The extension mixed into vLLM's Worker class (engine argument `worker_extension_cls`), so the chat replica can
hand its Workers' freed heap back to the pool (system/process_memory.py release_freed_heap) through collective_rpc."""

from __future__ import annotations

from planner.worker_extension import HEAP_TRIM_EXTENSION
from system.process_memory import release_freed_heap


class HeapTrimWorkerExtension:
    """Mixed into vLLM's Worker class (engine argument `worker_extension_cls`), so the chat replica can
    run release_freed_heap inside its Workers by name through collective_rpc: vLLM's IPC refuses to
    carry a function unless pickle is allowed (VLLM_ALLOW_INSECURE_SERIALIZATION), which stays off."""

    def poolserve_release_heap(self) -> None:
        # No gc pass: the Worker's objects are its model's, and a full collection would stall its steps.
        release_freed_heap(collect=False)


WORKER_EXTENSION = f"{__name__}.{HeapTrimWorkerExtension.__qualname__}"
WORKER_TRIM_METHOD = "poolserve_release_heap"

# The planner names this class by string for vLLM (planner/worker_extension.py): a rename must move both together.
if WORKER_EXTENSION != HEAP_TRIM_EXTENSION:
    raise ImportError(
        f"planner.worker_extension.HEAP_TRIM_EXTENSION names {HEAP_TRIM_EXTENSION!r}, not this class "
        f"({WORKER_EXTENSION})"
    )
