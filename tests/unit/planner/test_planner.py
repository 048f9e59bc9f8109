"""Planner unit tests: hand-computed golden values, refusal with advice, admission, pins, PLE placement."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from planner.profile_file import read_profile_data
from planner.architecture import read_architecture
from planner.plan import PlanError, build_plan
from planner.profile import load_profile
from planner.step_worker import StepWorkerSettings
from planner.weights import component_params

ROOT = Path(__file__).resolve().parents[3]
GiB = 2**30


def _profile(tmp_path: Path, name: str, **changes) -> Path:
    data = read_profile_data(ROOT / "configs" / f"{name}.yaml")
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    data["embedder"]["model"] = str(ROOT / data["embedder"]["model"])
    data["chat"]["model"] = (
        str(ROOT / data["chat"]["model"]) if data["chat"]["model"].startswith("models/") else data["chat"]["model"]
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ---- golden architectures ------------------------------------------------------------------------
def test_smollm2_golden():
    a = read_architecture(str(ROOT / "models/SmolLM2-135M-Instruct"))
    assert a.kv_bytes_per_token(2) == 2 * 30 * 3 * 64 * 2 == 23_040
    assert sum(component_params(a).values()) == 134_515_008  # tied embeddings
    assert a.state_bytes_per_sequence(2, 4) == 0


def test_flash_next_golden():
    a = read_architecture("/absent/Qwen3.8-Flash-Next-NVFP4", "qwen3.8-flash-next")
    assert (a.full_layers, a.linear_layers, a.moe_layers) == (12, 36, 48)
    assert a.kv_bytes_per_token(2) + a.mtp_kv_bytes_per_token(2) == 13 * 2 * 2 * 256 * 2 == 26_624  # ~26.6 KB
    assert a.kv_bytes_per_token(2) + a.indexer_bytes_per_token() + a.mtp_kv_bytes_per_token(2) == 31_232  # ~31 KB
    assert a.kv_bytes_per_token(1) + a.indexer_bytes_per_token() + a.mtp_kv_bytes_per_token(1) == 17_920  # ~17.8 KB
    # GDN: conv 3 x (2*16*128 + 48*128) bf16 + ssm 48*128*128 fp32, x 36 layers = ~115 MB
    assert a.state_bytes_per_sequence(2, 4) == 36 * (3 * 10_240 * 2 + 786_432 * 4) == 115_458_048
    assert a.hybrid_attention_block(2, 2, 4, 16) == 1568  # "about 1600 tokens"
    params = component_params(a)
    main = sum(v for k, v in params.items() if k not in ("mtp", "ple", "vision"))
    assert main == 125_050_767_744  # "125B"
    assert params["ple"] == 51_200_000_000


def test_qwen27b_golden():
    a = read_architecture("/absent", "qwen3.8-27b")
    assert (a.full_layers, a.linear_layers) == (16, 48)
    assert a.kv_bytes_per_token(2) == 16 * 2 * 4 * 256 * 2 == 65_536  # 64 KiB/token
    assert a.state_bytes_per_sequence(2, 4) == 48 * 3_207_168 == 153_944_064  # ~0.15 GB


# ---- cpu-tiny --------------------------------------------------------------------------------------
def test_cpu_tiny_kv_tokens_match_vllm():
    plan = build_plan(load_profile(ROOT / "configs/cpu-tiny.yaml"), 24 * GiB)
    assert plan.chat.kv_bytes_per_token == 23_040
    assert plan.chat.block_size == 128
    assert plan.chat.kv_pool_tokens == 46_592  # vLLM logged "CPU KV cache size: 46,592 tokens" for 1 GiB
    chat = plan.replica("chat")
    assert chat.vllm.kv_cache_memory_bytes == GiB
    assert "gpu_memory_utilization" not in chat.vllm
    assert chat.planned_bytes == sum(chat.breakdown.values())
    assert {r.kind for r in plan.replicas} == {"chat", "embedder", "retriever", "gateway"}
    assert plan.ray.include_dashboard is False and plan.ray.object_store_memory == 256 * 2**20


def test_cpu_tiny_refused_at_2gib():
    with pytest.raises(PlanError) as err:
        build_plan(load_profile(ROOT / "configs/cpu-tiny.yaml"), 2 * GiB)
    assert "Biggest items" in str(err.value) and "--pool" in str(err.value)


def test_speculative_mapping(tmp_path):
    ngram = build_plan(
        load_profile(
            _profile(
                tmp_path,
                "cpu-tiny",
                **{
                    "chat.speculative": {
                        "method": "ngram",
                        "num_speculative_tokens": 4,
                        "prompt_lookup_min": 2,
                        "prompt_lookup_max": 4,
                    }
                },
            )
        ),
        24 * GiB,
    )
    assert ngram.replica("chat").vllm.speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    draft = str(ROOT / "models/SmolLM2-135M-Instruct-draft6")
    plan = build_plan(
        load_profile(
            _profile(
                tmp_path,
                "cpu-tiny",
                **{"chat.speculative": {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}},
            )
        ),
        24 * GiB,
    )
    assert plan.chat.kv_bytes_per_token == 23_040 + 2 * 6 * 3 * 64 * 2
    assert plan.replica("chat").breakdown["drafter.weights (draft_model)"] > 0
    with pytest.raises(PlanError, match="missing"):
        build_plan(
            load_profile(
                _profile(
                    tmp_path,
                    "cpu-tiny",
                    **{"chat.speculative": {"method": "draft_model", "model": str(tmp_path / "nope")}},
                )
            ),
            24 * GiB,
        )
    with pytest.raises(PlanError, match="no MTP head"):
        build_plan(load_profile(_profile(tmp_path, "cpu-tiny", **{"chat.speculative": {"method": "mtp"}})), 24 * GiB)


def test_vocab_mismatch(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    cfg = json.loads((ROOT / "models/SmolLM2-135M-Instruct-draft6/config.json").read_text())
    cfg["vocab_size"] = 32_000
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PlanError, match="vocabulary"):
        build_plan(
            load_profile(
                _profile(tmp_path, "cpu-tiny", **{"chat.speculative": {"method": "draft_model", "model": str(draft)}})
            ),
            24 * GiB,
        )


def test_pinned_values(tmp_path):
    with pytest.raises(PlanError, match="max_num_seqs 64 is pinned"):
        build_plan(load_profile(_profile(tmp_path, "cpu-tiny", **{"chat.max_num_seqs": 64})), 24 * GiB)
    with pytest.raises(PlanError, match="omp_threads"):
        build_plan(load_profile(_profile(tmp_path, "cpu-tiny", **{"chat.omp_threads": 8})), 24 * GiB)
    plan = build_plan(load_profile(_profile(tmp_path, "cpu-tiny", **{"chat.block_size": 32})), 24 * GiB)
    assert plan.replica("chat").vllm.block_size == 32
    with pytest.raises(PlanError, match="gpu_memory_utilization"):
        build_plan(load_profile(_profile(tmp_path, "dgx-spark", **{"chat.gpu_memory_utilization": 0.5})))


# ---- Spark profiles ----------------------------------------------------------------------------------
def test_spark_186_fits_with_ple_resident():
    plan = build_plan(load_profile(ROOT / "configs/dgx-spark.yaml"))
    chat = plan.replica("chat")
    assert chat.breakdown["weights.ple (fp8)"] == 51_200_000_000
    assert plan.pool.headroom_bytes >= 0
    assert chat.vllm.speculative_config == {"method": "mtp", "num_speculative_tokens": 3}
    assert chat.vllm.mamba_cache_mode == "align"
    assert all(a.requested_bytes <= a.free_before_bytes - a.overhead_bytes for a in plan.admission)
    assert chat.vllm.gpu_memory_utilization * plan.pool.total_bytes >= chat.planned_bytes


def test_spark_128_needs_ple_on_disk(tmp_path):
    plan = build_plan(load_profile(ROOT / "configs/dgx-spark-128.yaml"))
    # Honest 128 GB: idle MemAvailable (110 GiB of 121.7) as the pool, >= 4 GiB left at steady state; with the
    # GB10 start figures the engine's start peak still fits, with less to spare (docs/SPARK.md section 3).
    assert plan.pool.free_bytes == 110 * GiB
    assert plan.pool.headroom_bytes >= 4 * GiB and plan.pool.start_headroom_bytes >= 0
    assert set(plan.start_peak) == {
        "start.chat.weights_page_cache",
        "start.chat.compile",
        "start.chat.speculator_graph_capture (GB10)",
    }
    assert plan.replica("chat").vllm.kv_cache_dtype == "fp8"
    assert not any(k.startswith("weights.ple") for k in plan.replica("chat").breakdown)
    assert plan.page_cache  # headroom for the mmap'd table is planned
    with pytest.raises(PlanError) as err:
        build_plan(load_profile(_profile(tmp_path, "dgx-spark-128", **{"chat.placement": {"ple": "pool"}})))
    assert "PLE on disk" in str(err.value) and "GiB" in str(err.value)


def test_spark_27b_dspark():
    plan = build_plan(load_profile(ROOT / "configs/dgx-spark-27b.yaml"))
    assert plan.chat.drafter_kv_bytes_per_token == 5 * 2 * 4 * 256 * 2
    assert plan.replica("chat").vllm.speculative_config["method"] == "dspark"
    assert plan.pool.headroom_bytes >= 0


def test_dspark_needs_bf16_kv(tmp_path):
    with pytest.raises(PlanError, match="bf16 KV"):
        build_plan(load_profile(_profile(tmp_path, "dgx-spark-27b", **{"chat.kv_cache_dtype": "fp8"})))


def test_advice_is_replanned(tmp_path):
    """Every suggestion shows the plan it gives; one that fits (alone or combined) is offered."""
    import re

    from planner.advice import apply

    changes = {"chat.max_num_seqs": 40, "chat.expected_concurrency": 40, "chat.kv_cache_bytes": "40GiB"}
    profile = load_profile(_profile(tmp_path, "dgx-spark-27b", **changes))
    pool = 124 * GiB  # neither lever alone fits this pool, both together do
    with pytest.raises(PlanError) as err:
        build_plan(profile, pool_total_bytes=pool)
    text = str(err.value)
    suggestions = [line for line in text.splitlines() if line.startswith("  - ") and "bigger pool" not in line]
    assert suggestions and all(
        re.search(r"frees [\d.]+ [MG]iB: (fits|needs)", s) for s in suggestions if not s.startswith("  - together")
    )
    assert "frees 0 B" not in text and "[fits]" in text
    together = next(s for s in suggestions if s.startswith("  - together"))
    assert "max_num_seqs 40 -> 20" in together and "speculative dspark -> ngram" in together
    # The combination is what it says: re-planning it by hand gives the same headroom.
    spec = profile.chat.speculative.model_copy(update={"method": "ngram", "model": None, "architecture": None})
    plan = build_plan(
        apply(profile, {"chat.max_num_seqs": 20, "chat.expected_concurrency": 20, "chat.speculative": spec}),
        pool_total_bytes=pool,
    )
    assert f"headroom {plan.pool.headroom_bytes / GiB:.2f} GiB" in together
    assert plan.replica("chat").vllm.max_num_seqs == 20


def test_omp_bind_binds_as_many_cores_as_threads():
    """vLLM's 'auto' binds one core whatever OMP_NUM_THREADS says: more threads need a core list."""
    from planner.engine_threads import omp_bind
    from planner.errors import EngineError

    assert omp_bind("auto", 1, [0, 1]) == "auto"
    assert omp_bind("auto", 2, [3, 1, 2]) == "1,2"
    assert omp_bind("0-3", 2, [0, 1]) == "0-3" and omp_bind("nobind", 4, [0]) == "nobind"
    with pytest.raises(EngineError, match="2 OpenMP threads planned"):
        omp_bind("auto", 2, [5])


def test_onednn_primitive_cache_reaches_the_cpu_engine_env(tmp_path):
    # The default bounds oneDNN's global primitive cache in the Worker; None leaves oneDNN's own default.
    env = build_plan(load_profile(_profile(tmp_path, "cpu-tiny")), 24 * GiB).replica("chat").env
    assert env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "0"
    plan = build_plan(load_profile(_profile(tmp_path, "cpu-tiny", **{"chat.onednn_primitive_cache": None})), 24 * GiB)
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in plan.replica("chat").env
    plan = build_plan(load_profile(_profile(tmp_path, "cpu-tiny", **{"chat.onednn_primitive_cache": 64})), 24 * GiB)
    assert plan.replica("chat").env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64"


def test_chat_omp_threads_reach_the_engine_env(tmp_path):
    plan = build_plan(load_profile(_profile(tmp_path, "cpu-tiny", **{"chat.omp_threads": 1})), 24 * GiB)
    assert plan.replica("chat").env["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    assert "NUMBA_THREADING_LAYER" not in plan.replica("chat").env
    # One thread for every step: no step threads, but the CPU worker still limits its busy-wait between steps.
    assert plan.replica("chat").vllm.worker_cls == "vllm_bridge.cpu_worker.StepThreadsCPUWorker"
    worker = StepWorkerSettings.from_env(plan.replica("chat").env)
    assert worker.narrow_step_threads is None and worker.idle_spin_s == 0.05
    if len(os.sched_getaffinity(0)) >= 2:
        plan = build_plan(load_profile(_profile(tmp_path, "cpu-tiny", **{"chat.omp_threads": 2})), 24 * GiB)
        bind = plan.replica("chat").env["VLLM_CPU_OMP_THREADS_BIND"]
        assert len(bind.split(",")) == 2 and plan.replica("chat").env["OMP_NUM_THREADS"] == "2"
        assert plan.replica("chat").env["NUMBA_THREADING_LAYER"] == "workqueue"


def test_cpu_threads_prefill_on_every_cpu_and_decode_on_what_the_embedder_leaves():
    from planner.engine_threads import cpu_threads
    from planner.profile import ChatSpec

    chat = ChatSpec(model_id="m", model="m")
    assert cpu_threads(chat, 2, 1, step_threads=True) == (2, 1)
    assert cpu_threads(chat, 8, 1, step_threads=True) == (8, 7)
    assert cpu_threads(chat, 1, 1, step_threads=True) == (1, 1)
    assert cpu_threads(chat, 2, 1, step_threads=False) == (1, 1)  # GPU or several ranks: one number
    pinned = chat.model_copy(update={"omp_threads": 2, "decode_omp_threads": 2})
    assert cpu_threads(pinned, 2, 1, step_threads=True) == (2, 2)
    assert cpu_threads(chat.model_copy(update={"decode_omp_threads": 4}), 2, 1, step_threads=True) == (2, 2)


def test_the_default_cpu_engine_gets_the_step_threads_worker_on_two_cpus(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs to plan 2 threads")
    profile = load_profile(
        _profile(tmp_path, "cpu-tiny", **{"pools": [{"name": "local", "total": "auto", "reserve": "3GiB", "cpus": 2}]})
    )
    chat = build_plan(profile, 24 * GiB).replica("chat")
    assert chat.vllm.worker_cls == "vllm_bridge.cpu_worker.StepThreadsCPUWorker"
    worker = StepWorkerSettings.from_env(chat.env)
    assert chat.env["OMP_NUM_THREADS"] == "2" and worker.narrow_step_threads == 1
    assert worker.wide_step_tokens == 128 and chat.env["NUMBA_THREADING_LAYER"] == "workqueue"


def test_the_embedder_process_makes_at_most_two_malloc_arenas(tmp_path):
    """Issue 46: the embedder's growth after real documents was spread over a glibc arena per thread; its
    environment caps them (read when glibc starts, so it must be in the process's environment)."""
    from planner import runtime

    plan = build_plan(load_profile(_profile(tmp_path, "cpu-tiny")), pool_total_bytes=24 * GiB)
    embedder = plan.replica("embedder")
    assert embedder.env["MALLOC_ARENA_MAX"] == str(runtime.EMBEDDER_MALLOC_ARENA_MAX) == "2"
    assert embedder.serve_options()["ray_actor_options"]["runtime_env"]["env_vars"]["MALLOC_ARENA_MAX"] == "2"
    assert embedder.env["OMP_NUM_THREADS"]
    assert "MALLOC_ARENA_MAX" not in plan.replica("retriever").env | plan.replica("gateway").env


def test_the_embedder_tokenizes_documents_over_its_ingest_threads_and_no_other_replica_does(tmp_path):
    """Issue 45: chunking and embedding tokenize an ingest's documents in batches; the tokenizer's pool is the
    embedder's ingest threads (the pool's CPUs; on a GPU half of them), every other replica stays serial."""
    cpu = build_plan(load_profile(_profile(tmp_path, "cpu-tiny")), pool_total_bytes=24 * GiB)
    embedder = cpu.replica("embedder")
    assert embedder.env["TOKENIZERS_PARALLELISM"] == "true"
    assert embedder.env["RAYON_NUM_THREADS"] == str(cpu.embedder.ingest_threads) == str(cpu.threads["cpus"])
    for other in ("chat", "retriever", "gateway"):
        assert cpu.replica(other).env["TOKENIZERS_PARALLELISM"] == "false"
        assert "RAYON_NUM_THREADS" not in cpu.replica(other).env
    pinned = _profile(tmp_path, "cpu-tiny", **{"embedder.ingest_threads": 1})
    assert build_plan(load_profile(pinned), pool_total_bytes=24 * GiB).replica("embedder").env[
        "RAYON_NUM_THREADS"
    ] == str(cpu.embedder.torch_threads)
    gpu = build_plan(load_profile(_profile(tmp_path, "dgx-spark")))
    assert (
        gpu.replica("embedder").env["RAYON_NUM_THREADS"]
        == str(gpu.embedder.ingest_threads)
        == str(max(gpu.embedder.torch_threads, gpu.threads["cpus"] // 2))
    )
