"""The extension the planner mixes into a chat engine's vLLM Workers (engine argument `worker_extension_cls`), by
name: vLLM imports it in the Worker's process, and the planner cannot import the class (it lives with the rest of
the code that reaches into vLLM, vllm_bridge/, a layer above). vllm_bridge/worker_extension.py imports this module
and refuses to load unless WORKER_EXTENSION_CLS names its class, so the link is a real import the layers contract
checks (as planner/step_worker.py does for the CPU worker)."""

from __future__ import annotations

# The methods the chat replica calls in its Workers (deployments/chat.py): the heap trim, and the exact host copies of
# an on-demand engine's level-1 sleep. vllm_bridge/worker_extension.py checks at import that this names its class.
WORKER_EXTENSION_CLS = "vllm_bridge.worker_extension.PoolserveWorkerExtension"
