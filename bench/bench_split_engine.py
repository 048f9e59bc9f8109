"""What splitting the chat engine over two nodes costs: the same model whole on one node against split in
two pipeline ranks, as configs/cpu-two-nodes-split.yaml runs it (vLLM's multi-node mp executor: node 0's
OpenAI server with rank 0, a headless vLLM with rank 1, meeting over TCP), without Ray or the gateway.

Variants, each a fresh set of processes with the split profile's planned engine (float32, torch.compile,
no speculation):
  - whole: one vLLM server, pipeline_parallel_size 1, the two ranks' KV in its one worker, bound to core 0;
  - split-same-core: the two ranks on 127.0.0.3 and 127.0.0.2, both bound to core 0, as the two "nodes" of
    `make test-cluster` share this machine's cores (what the link costs with no core gained);
  - split-own-cores: rank 0 on core 0, rank 1 on core 1, as two machines would have them.
Load: bench/harness/serving.py (vLLM's serving benchmark), random prompts of 128 tokens, 64 output
tokens, at concurrency 1 and 8.

    .venv/bin/python bench/bench_split_engine.py [--prompts 16] [--concurrency 1,8] [--variants ...] [--name ...]

Writes bench/results/split-engine.json (or --name).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.engine import ROOT, engine_setup, raw_vllm_command  # noqa: E402
from bench.harness.procs import ProcessGroup, child_env, free_port, wait_healthy  # noqa: E402
from bench.harness.results import RESULTS_DIR, new_result, write_result  # noqa: E402
from bench.harness.serving import ServingLoad, run_serving_load  # noqa: E402

NAME = "split-engine"
PROFILE = ROOT / "configs" / "cpu-two-nodes-split.yaml"
START_TIMEOUT_S = 600
SPLIT_ONLY = (
    "pipeline_parallel_size",
    "distributed_executor_backend",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
)
# variant -> (split?, core of rank 0, core of rank 1)
VARIANTS = {"whole": (False, "0", None), "split-same-core": (True, "0", "0"), "split-own-cores": (True, "0", "1")}


def _servers(variant: str, workdir: Path) -> tuple[list[ProcessGroup], str, str]:
    """The variant's processes (node 0's server first), its base URL and served model name."""
    split, core0, core1 = VARIANTS[variant]
    setup = engine_setup(PROFILE)
    env = {k: v for k, v in setup.env.items() if k not in ("VLLM_HOST_IP", "VLLM_PORT")}
    if not split:
        whole = setup.args.model_copy(
            update={**{k: None for k in SPLIT_ONLY}, "kv_cache_memory_bytes": 2 * setup.args.kv_cache_memory_bytes}
        )
        setup = type(setup)(setup.profile_path, setup.model, setup.served_model_name, whole, env)
    else:
        master = free_port()
        args = setup.args.model_copy(update={"master_addr": "127.0.0.3", "master_port": master})
        setup = type(setup)(setup.profile_path, setup.model, setup.served_model_name, args, env)
    port = free_port()
    command = raw_vllm_command(setup, port)
    groups = [
        ProcessGroup.start(
            command,
            child_env({**env, "VLLM_CPU_OMP_THREADS_BIND": core0, **({"VLLM_HOST_IP": "127.0.0.3"} if split else {})}),
            workdir / f"{variant}-node0.log",
        )
    ]
    if split:
        rank1 = workdir / f"{variant}-rank1.json"
        rank1.write_text(json.dumps({**setup.args.as_dict(), "model": setup.model, "node_rank": 1}))
        groups.append(
            ProcessGroup.start(
                [sys.executable, "-m", "vllm_bridge.headless", str(rank1)],
                child_env({**env, "VLLM_CPU_OMP_THREADS_BIND": core1, "VLLM_HOST_IP": "127.0.0.2"}),
                workdir / f"{variant}-node1.log",
            )
        )
    return groups, f"http://127.0.0.1:{port}", setup.served_model_name


def _node_memory(pid: int) -> dict:
    """PSS of the headless vLLM alone and of its tree (its worker included)."""
    import psutil

    from system.process_memory import process_tree_memory

    return {
        "headless_executor_pss": psutil.Process(pid).memory_full_info().pss,
        "tree_pss": process_tree_memory(pid)["measured_bytes"],
    }


def run_variant(variant: str, loads: list[ServingLoad], workdir: Path) -> dict:
    groups, url, served = _servers(variant, workdir)
    try:
        start_s = wait_healthy(f"{url}/health", groups[0], START_TIMEOUT_S)
        rows = {"start_s": round(start_s, 1)}
        for load in loads:
            metrics = run_serving_load(
                url, served, engine_setup(PROFILE).model, load, workdir / f"{variant}-c{load.concurrency}.log"
            )
            rows[f"c{load.concurrency}"] = {
                k: metrics[k]
                for k in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms")
            }
        if len(groups) > 1:  # what node 1's processes hold after the load (the plan's headless_executor line)
            rows["node1_memory"] = _node_memory(groups[1].process.pid)
        return rows
    finally:
        for group in reversed(groups):
            group.stop()


def ratios(raw: dict, concurrencies: list[int]) -> dict[str, float]:
    """Each split variant's output tokens/s over the whole engine's, per concurrency (none without a whole run)."""
    if "whole" not in raw:
        return {}
    return {
        f"{variant}_c{c}_over_whole": round(
            rows[f"c{c}"]["output_throughput"] / raw["whole"][f"c{c}"]["output_throughput"], 3
        )
        for variant, rows in raw.items()
        if variant != "whole"
        for c in concurrencies
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--name", default=NAME, help="result file name (a run of some variants only)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where the result goes")
    args = parser.parse_args()
    loads = [ServingLoad(num_prompts=args.prompts, concurrency=int(c)) for c in args.concurrency.split(",")]
    raw = {}
    with tempfile.TemporaryDirectory(prefix="split-engine-") as tmp:
        for variant in args.variants.split(","):
            raw[variant] = run_variant(variant, loads, Path(tmp))
            print(variant, json.dumps(raw[variant]), flush=True)
    metrics = ratios(raw, [load.concurrency for load in loads])
    result = new_result(
        args.name,
        {"profile": str(PROFILE.relative_to(ROOT)), "loads": [load.describe() for load in loads]},
        metrics,
        [{"variant": v, **r} for v, r in raw.items()],
        command=sys.argv,
    )
    print(json.dumps(metrics, indent=1))
    print(write_result(result, args.out_dir))


if __name__ == "__main__":
    main()
