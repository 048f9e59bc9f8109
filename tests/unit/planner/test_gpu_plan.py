"""The GPU code paths that run only on the GPU machine, checked here without one: the discrete-GPU plan
(device lines in the pool, host lines beside it), vLLM's KV-token figure, the GPU profiles, the engine-pair
adapter, and the readers bench/bench_gpu_plan.py uses on the device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu_probe import parse_vllm_log, role_of
from planner import runtime
from planner.engine import vllm_logged_kv_tokens
from planner.gpu import split_device_lines
from planner.kvgroups import KVGroups, kv_cache_groups
from planner.plan import build_plan
from planner.profile import load_profile
from planner.units import GiB

ROOT = Path(__file__).resolve().parents[3]
H200 = int(139.8 * GiB)
GPU_MODELS = ROOT / "models" / "gpu" / "Qwen3.8-27B-dummy" / "config.json"
needs_gpu_models = pytest.mark.skipif(not GPU_MODELS.exists(), reason="models/gpu/ is missing: `make models` writes it")


@pytest.mark.parametrize(
    "groups, block, state_blocks, expected",
    [
        # What vLLM 0.26 logged on an H200 for Qwen3.8-27B at kv_cache_memory_bytes 8 GiB, max_model_len 8192
        # (docs/DESIGN-FACTS.md section 8): 167 blocks / (11 + 3) blocks per request; DSpark k=7: 120 / (10 + 3 x 8).
        ({"attention": 16, "state": 48}, 784, 1, 97_718),
        ({"attention": 21, "state": 48}, 832, 8, 28_912),
    ],
)
def test_vllm_kv_tokens_match_the_h200_logs(groups, block, state_blocks, expected):
    assert vllm_logged_kv_tokens(8 * GiB, 8192, block, kv_cache_groups(groups), 4096, 0, state_blocks) == expected


def test_vllm_kv_tokens_single_spec_model():
    # SmolLM2 (23,040 B/token) with 2 GiB on the H200: "KV cache size: 93,200 tokens" (5,825 blocks of 16).
    assert vllm_logged_kv_tokens(2 * GiB, 4096, 16, KVGroups(0, ()), 0, 23_040, 1) == 93_200


def test_split_device_lines():
    device, host = split_device_lines(
        {
            "weights.mlp (bfloat16)": 10,
            "kv_pool.attention": 5,
            "runtime.worker": 3,
            "cuda_context.worker": 1,
            "drafter.weights (dspark)": 2,
            "mapped_files": 4,
        }
    )
    assert device == {
        "weights.mlp (bfloat16)": 10,
        "kv_pool.attention": 5,
        "cuda_context.worker": 1,
        "drafter.weights (dspark)": 2,
    }
    assert host == {"runtime.worker": 3, "mapped_files": 4}


@needs_gpu_models
def test_discrete_gpu_plan_counts_device_lines_only():
    plan = build_plan(load_profile(ROOT / "configs" / "gh200-two-engines.yaml"), H200)
    assert plan.pool.discrete and plan.pool.ray_bytes == 0 and plan.pool.host_bytes > 0
    by = {r.name: r for r in plan.replicas}
    assert by["retriever"].planned_bytes == 0 and by["gateway"].planned_bytes == 0
    assert by["retriever"].ray_actor_options.num_gpus is None and by["retriever"].host_bytes > 0
    for name in ("chat", "chat-qwen3.8-27b-plain"):
        chat = by[name]
        assert not any(k.startswith("runtime.") for k in chat.breakdown)
        assert set(chat.host_breakdown) >= {"runtime.engine_core", "runtime.worker"}
        assert chat.ray_actor_options.memory == chat.host_bytes
        # utilization covers exactly the device bytes; the GPU share follows them
        assert chat.vllm.gpu_memory_utilization * H200 >= chat.planned_bytes
        assert chat.ray_actor_options.num_gpus == pytest.approx(chat.planned_bytes / H200, abs=1e-4)
        assert chat.vllm.load_format == "dummy" and chat.vllm.limit_mm_per_prompt == {"image": 0, "video": 0}
        assert chat.vllm.additional_config == {"gdn_prefill_backend": "triton"}
        assert not any("vision" in k for k in chat.breakdown)  # a text-only engine loads no vision tower
    assert by["embedder"].ray_actor_options.num_gpus > 0
    # the second engine is admitted against what the first leaves; a discrete GPU's own start-up is one context
    second = next(a for a in plan.admission if a.name == "chat-qwen3.8-27b-plain")
    assert second.overhead_bytes == runtime.CUDA_CONTEXT
    assert second.free_before_bytes == plan.pool.free_bytes - by["chat"].planned_bytes
    assert plan.engines["chat"].vllm_kv_tokens > 0 and plan.engines["chat-qwen3.8-27b-plain"].vllm_kv_tokens > 0


@needs_gpu_models
def test_dspark_drafter_counts_its_markov_head():
    plan = build_plan(load_profile(ROOT / "configs" / "gh200.yaml"), H200)
    facts = plan.engines["chat"]
    # 5 target-width layers + the 5x5120 fc (bundled facts: 3,670,128,640 B in bf16) + the folder's Markov
    # head: markov_rank 256 x (248,320 + 248,320) parameters in bf16
    assert facts.drafter_weight_bytes == 3_670_128_640 + 256 * 2 * 248_320 * 2


def test_adapt_engine_env_for_vllm_026(monkeypatch):
    from vllm_bridge import compat as engine_compat

    env = {"VLLM_KV_CACHE_LAYOUT": "BLHNC", "OMP_NUM_THREADS": "4"}
    monkeypatch.setattr(engine_compat, "installed_pair", lambda: {"vllm": "0.26.0", "ray": "2.58.1"})
    assert engine_compat.adapt_engine_env(env) == {"OMP_NUM_THREADS": "4"}
    monkeypatch.setattr(engine_compat, "installed_pair", lambda: {"vllm": "0.32.0", "ray": "2.60.0"})
    assert engine_compat.adapt_engine_env(env) == env


def test_parse_vllm_log_lines():
    text = "\n".join(
        [
            "INFO 12-01 [gpu_model_runner.py:5348] Model loading took 53.81 GiB memory and 21.5 seconds",
            "INFO [config.py] Setting attention block size to 832 tokens to ensure that attention page size is >= mamba",
            "INFO [kv_cache_utils.py] Add 15 padding layers, may waste at most 31.25% KV cache memory",
            "DEBUG [gpu_worker.py] Initial free memory: 137.21 GiB; Requested memory: 0.552800 (util), 77.28 GiB",
            "DEBUG [gpu_worker.py] Memory profiling takes 3.10 seconds. Total non KV cache memory: 55.9GiB; "
            "torch peak memory increase: 1.77GiB; non-torch forward increase memory: 0.12GiB; weights memory: 53.81GiB.",
            "INFO [gpu_worker.py] Available KV cache memory: 20.8 GiB",
            "INFO [kv_cache_utils.py] GPU KV cache size: 28,912 tokens",
            "INFO [kv_cache_utils.py] Maximum concurrency for 8,192 tokens per request: 3.53x",
        ]
    )
    found = parse_vllm_log(text)
    assert found == {
        "weights_gib": 53.81,
        "available_kv_gib": 20.8,
        "kv_tokens": 28_912,
        "max_concurrency": 3.53,
        "torch_peak_increase_gib": 1.77,
        "non_torch_increase_gib": 0.12,
        "non_kv_cache_gib": 55.9,
        "initial_free_gib": 137.21,
        "attention_block_tokens": 832,
        "padding_layers": 15,
    }


@pytest.mark.parametrize(
    "title, role",
    [
        ("ray::RayWorkerWrapper.execute_method", "vllm_worker"),
        ("ray::RayWorkerProc.run", "vllm_worker"),  # vLLM 0.26's title (an H100, 2026-12-06)
        ("ray::ServeReplica:poolserve:embedder", "embedder"),
        ("ray::ServeReplica:poolserve:PoolserveLLMServer:chat", "chat_replica"),
        ("VLLM::EngineCore", "engine_core"),
        ("python3 -m vllm.entrypoints.openai.api_server --model x", "raw_vllm"),
        ("bash", "other"),
    ],
)
def test_role_of(title, role):
    assert role_of(title) == role


def test_decode_roofline_per_card():
    from bench.gpu_probe import decode_roofline

    weights = int(50.13 * 2**30)  # the 27B's weights as vLLM 0.26 logged them
    assert decode_roofline(weights, "NVIDIA H100 80GB HBM3") == pytest.approx(62.2, abs=0.1)
    assert decode_roofline(weights, "NVIDIA H200") == pytest.approx(89.2, abs=0.1)
    assert decode_roofline(weights, "NVIDIA A10") is None


def test_run_steps_keeps_every_outcome():
    from bench.bench_gpu_plan import run_steps

    def broken() -> dict:
        raise RuntimeError("404: no collection")

    out = run_steps({"chat": lambda: {"tokens": 3}, "rag query": broken, "embeddings": lambda: {"vectors": 2}})
    assert out["chat"]["ok"] and out["embeddings"]["ok"] and out["chat"]["tokens"] == 3
    assert out["rag query"] == {
        "ok": False,
        "error": "RuntimeError: 404: no collection",
        "seconds": out["rag query"]["seconds"],
    }


def test_engine_log_takes_the_kv_line_from_its_engine_core():
    from bench.bench_gpu_plan import engine_log

    # The smoke run on an H100 (2026-12-06): the worker logs weights and graphs, its EngineCore the KV tokens.
    logs = {
        2686: {"weights_gib": 7.6, "cuda_graph_gib": 0.06, "attention_block_tokens": 784},
        1974: {"weights_gib": 7.6, "kv_tokens": 404918, "max_concurrency": 49.43, "attention_block_tokens": 784},
        3000: {"weights_gib": 50.13, "kv_tokens": 97718, "attention_block_tokens": 784},
    }
    merged = engine_log(2686, logs)
    assert merged["kv_tokens"] == 404918 and merged["cuda_graph_gib"] == 0.06


def test_boots_of_separate_runs_are_compared_as_one_series(tmp_path):
    from bench.bench_gpu_plan import boots_agree, earlier_boots

    def rows(kv: int, chat: int) -> list[dict]:
        return [
            {"replica": "chat", "measured_bytes": chat, "kv_tokens_vllm": kv},
            {"replica": "embedder", "measured_bytes": 1000},
        ]

    first = tmp_path / "gpu-plan-h100.json"
    first.write_text(
        json.dumps(
            {"rows": rows(52043, 10_000), "later_boots": [{"rows": rows(52043, 10_050)}, {"error": "start failed"}]}
        )
    )
    earlier = earlier_boots([first])
    assert len(earlier) == 2 and all(b["from"] == str(first) for b in earlier)  # the failed boot has no rows
    agreed = boots_agree(earlier + [{"rows": rows(52043, 10_020)}])
    assert agreed["boots"] == 3 and agreed["kv_tokens_equal"] and agreed["bytes_within"]
    assert agreed["bytes"]["chat"]["max_over_min"] == 1.005
    drifted = boots_agree(earlier + [{"rows": rows(52000, 10_300)}])
    assert not drifted["kv_tokens_equal"] and not drifted["bytes_within"]


def test_gpu_replicas_are_compared_at_rest_without_their_activations_and_at_peak_with_them():
    """The H100 run of 2026-12-06: at rest the 27B's worker and the embedder hold their plan less the
    activations they release; in use they rise towards, and stay under, the whole plan."""
    from bench.bench_gpu_plan import compare, peaks_by_replica
    from bench.gpu_probe import GpuSample

    plan = build_plan(load_profile("configs/h100.yaml"), 81_559 * 2**20)
    chat, embedder = plan.replica("chat"), plan.replica("embedder")
    assert chat.growth_bytes == chat.breakdown["activations"] + chat.breakdown["drafter.activations (dspark)"]
    assert embedder.growth_bytes == embedder.breakdown["activations"]
    measured = {"chat": {"pid": 11, "gpu_bytes": 74_809_606_144}, "embedder": {"pid": 12, "gpu_bytes": 809_500_672}}
    samples = [
        GpuSample(5.0, 0, 0, {11: 99 * 2**30}),  # before the boot: not counted
        GpuSample(10.0, 0, 0, {11: 74_809_606_144, 12: 809_500_672}),
        GpuSample(20.0, 0, 0, {11: 76_954_000_000, 12: 1_020_000_000}),
    ]
    peaks = peaks_by_replica(measured, samples, since=8.0)
    assert peaks == {"chat": 76_954_000_000, "embedder": 1_020_000_000}
    rows = {r["replica"]: r for r in compare(plan, measured, peaks)}
    for name in ("chat", "embedder"):
        assert rows[name]["within_5pct"] and rows[name]["under_budget"] and rows[name]["peak_under_budget"]
    assert 0.99 < rows["chat"]["ratio"] < 1.01


@needs_gpu_models
def test_a_gpu_embedder_has_no_malloc_arena_cap():
    """The cap (a CPU embedder's heap fix) made the same embed calls 4x slower on an H100 (docs/GPU.md,
    2026-12-06): a GPU embedder gets glibc's default arenas, a CPU one keeps two."""
    embedder = build_plan(load_profile(ROOT / "configs" / "gh200.yaml"), H200).replica("embedder")
    assert "MALLOC_ARENA_MAX" not in embedder.env
    assert embedder.env["RAYON_NUM_THREADS"] and embedder.env["TOKENIZERS_PARALLELISM"] == "true"


@needs_gpu_models
def test_a_gpu_embedders_host_lines_hold_the_cuda_runtimes_host_side():
    """Beside a discrete GPU the embedder's process measured 1,205-1,221 MB on the host at rest (three H100
    boots, one H200, 2026-12-06): its host lines hold that, off the device pool."""
    embedder = build_plan(load_profile(ROOT / "configs" / "gh200.yaml"), H200).replica("embedder")
    assert embedder.host_breakdown["cuda_host_runtime"] == runtime.EMBEDDER_CUDA_HOST_RUNTIME
    assert "cuda_host_runtime" not in embedder.breakdown  # the device lines are its share of the pool
    at_rest = embedder.host_bytes - embedder.host_breakdown["traffic_growth"]
    assert 1_221_038_080 <= at_rest <= 1.05 * 1_221_038_080
