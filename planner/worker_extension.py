"""The extension the planner mixes into a chat engine's vLLM Workers (engine argument `worker_extension_cls`), by
name: vLLM imports it in the Worker's process, and the planner cannot import the class (it lives with the rest of
the code that reaches into vLLM, vllm_bridge/, a layer above). vllm_bridge/worker_heap_trim.py imports this module
and refuses to load unless HEAP_TRIM_EXTENSION names its class, so the link is a real import the layers contract
checks (as planner/step_worker.py does for the CPU worker)."""

from __future__ import annotations

# The heap-trim method the chat replica calls in its Workers (deployments/chat.py); vllm_bridge/worker_heap_trim.py
# checks at import that this names its class.
HEAP_TRIM_EXTENSION = "vllm_bridge.worker_heap_trim.HeapTrimWorkerExtension"
