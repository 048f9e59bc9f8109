"""The Spark path's engine switches: the PLE disk switch per vLLM build, the speculator's CUDA graphs and
the GB10 start figures, as the plan hands them to the engine (engine arguments and environment)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner import runtime
from planner.gb10 import OVERHEAD_LINE
from planner.plan import PlanError, build_plan
from planner.ple_switch import PLE_DISK_SWITCHES
from planner.profile import load_profile

ROOT = Path(__file__).resolve().parents[3]


def _spark_128(tmp_path: Path, **chat) -> Path:
    data = yaml.safe_load((ROOT / "configs/dgx-spark-128.yaml").read_text())
    data["chat"].update(chat)
    data["embedder"]["model"] = str(ROOT / data["embedder"]["model"])
    data.pop("tenants_file")
    path = tmp_path / "spark-128.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_ple_on_disk_sets_the_builds_switch_in_the_engines_env():
    plan = build_plan(load_profile(ROOT / "configs/dgx-spark-128.yaml"))
    chat = plan.replica("chat")
    assert chat.env["VLLM_PLE_TABLE_MEMORY"] == "disk"
    assert chat.env["VLLM_KV_CACHE_LAYOUT"] == "BLHNC"  # the rest of the env is kept
    assert not any(k.startswith("weights.ple") for k in chat.breakdown)


@pytest.mark.parametrize("build", sorted(PLE_DISK_SWITCHES))
def test_each_build_gets_its_own_switch(tmp_path, build):
    chat = build_plan(load_profile(_spark_128(tmp_path, vllm_build=build))).replica("chat")
    for name, value in PLE_DISK_SWITCHES[build].env.items():
        assert chat.env[name] == value
    others = {k for b, s in PLE_DISK_SWITCHES.items() if b != build for k in s.env}
    assert not others & set(chat.env)


@pytest.mark.parametrize("build", ["0.32.0", "0.31.0"])
def test_a_vllm_without_a_disk_switch_is_refused_with_the_builds_that_have_one(tmp_path, build):
    with pytest.raises(PlanError) as err:
        build_plan(load_profile(_spark_128(tmp_path, vllm_build=build)))
    text = str(err.value)
    assert f"chat.vllm_build {build} cannot put the PLE on disk" in text
    assert "b12x" in text and "VLLM_PLE_TABLE_MEMORY=disk" in text and "VLLM_PLE_MMAP=1" in text


def test_ple_in_the_pool_needs_no_switch(tmp_path):
    # The 186 GB profile keeps the table resident: the pinned vLLM plans it, and no disk variable is set.
    chat = build_plan(load_profile(ROOT / "configs/dgx-spark.yaml")).replica("chat")
    assert chat.breakdown["weights.ple (fp8)"] > 0
    assert not {k for s in PLE_DISK_SWITCHES.values() for k in s.env} & set(chat.env)


def test_mtp_graphs_are_full_decode_only_at_the_verify_widths(tmp_path):
    pinned = build_plan(load_profile(ROOT / "configs/dgx-spark-128.yaml")).replica("chat").vllm
    assert pinned.compilation_config == {
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "cudagraph_capture_sizes": [4, 8, 12, 16],
    }
    # Unpinned: every (1 + k) x n for n = 1..max_num_seqs (k = 3 on the 186 GB profile's 8 streams).
    derived = build_plan(load_profile(ROOT / "configs/dgx-spark.yaml")).replica("chat").vllm
    assert derived.compilation_config["cudagraph_capture_sizes"] == [4 * n for n in range(1, 9)]
    eager = build_plan(load_profile(_spark_128(tmp_path, enforce_eager=True))).replica("chat").vllm
    assert eager.compilation_config is None


def test_gb10_start_figures_are_planned_on_a_unified_gpu_pool():
    plan = build_plan(load_profile(ROOT / "configs/dgx-spark-128.yaml"))
    lines = plan.replica("chat").breakdown
    worker = sum(lines[k] for k in ("activations", "runtime.worker", "cuda_context.worker", "cuda_graphs"))
    assert worker + lines[OVERHEAD_LINE] == runtime.GB10_VLLM_OVERHEAD
    assert plan.start_peak["start.chat.speculator_graph_capture (GB10)"] == runtime.GB10_SPECULATOR_GRAPH_CAPTURE
    # The 27B's DSpark drafter is a speculator too: its capture is planned at the GB10 figure.
    p27 = build_plan(load_profile(ROOT / "configs/dgx-spark-27b.yaml"))
    assert p27.start_peak["start.chat.speculator_graph_capture (GB10)"] == runtime.GB10_SPECULATOR_GRAPH_CAPTURE


def test_spark_profiles_plan_one_pool_size():
    """One Spark, one size: MemTotal 121.7 GiB and the 11.7 GiB reserve (110 GiB of idle MemAvailable)."""
    for name in ("dgx-spark-128", "dgx-spark-27b", "dgx-spark-27b-plus-small"):
        pool = build_plan(load_profile(ROOT / f"configs/{name}.yaml")).pool
        assert (pool.total_bytes, pool.reserve_bytes) == (int(121.7 * 2**30), int(11.7 * 2**30)), name


def test_plain_decoding_compiles_before_capturing_and_the_other_drafters_do_not_until_measured():
    """Issue 45: the 27B decoded one stream at 0.81 of the H100's roofline compiled, 0.68 not (docs/GPU.md);
    DSpark and ngram keep the uncompiled graphs until compiling them is measured; the profile pins either way."""
    from planner.graphs import NO_TORCH_COMPILE, TORCH_COMPILE, compilation_config
    from planner.profile import ChatSpec
    from planner.speculative import Drafter

    def drafter(method, k=0):
        return Drafter(method=method, k=k, weight_bytes=0, kv_bytes_per_token=0, state_blocks=0, vllm_config=None)

    chat = ChatSpec(model="m", model_id="m")
    plain = compilation_config(chat, drafter("none"), 4)
    assert plain == {
        "mode": TORCH_COMPILE,
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "cudagraph_capture_sizes": [1, 2, 3, 4],
    }
    assert compilation_config(chat, drafter("dspark", 7), 2)["mode"] == NO_TORCH_COMPILE
    assert compilation_config(chat, drafter("ngram", 3), 2)["mode"] == NO_TORCH_COMPILE
    assert "mode" not in compilation_config(chat, drafter("mtp", 3), 2)  # vLLM's default: compiled
    off = chat.model_copy(update={"torch_compile": False})
    assert compilation_config(off, drafter("none"), 4)["mode"] == NO_TORCH_COMPILE
    assert compilation_config(off, drafter("mtp", 3), 2)["mode"] == NO_TORCH_COMPILE
    on = chat.model_copy(update={"torch_compile": True})
    assert compilation_config(on, drafter("dspark", 7), 2)["mode"] == TORCH_COMPILE
    assert compilation_config(chat.model_copy(update={"enforce_eager": True}), drafter("none"), 4) is None
