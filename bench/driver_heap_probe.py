"""What an on-demand CPU replica's own heap keeps from each engine it stopped: vLLM's AsyncLLM (the driver's part of
an engine) started, asked for a few tokens and shut down N times in one process, as deployments/chat.py does on
each wake and sleep (release_engine_caches, then gc and malloc_trim), with the process's anonymous memory and PSS
after each stop. Run it once as is (pymalloc) and once with PYTHONMALLOC=malloc to compare the allocators
(docs/results/on-demand-cpu-endurance-2026-12-06.md). --memray PATH traces native allocations from the third stop
on, when memray is importable (not a dependency: `pip install --target DIR memray`, then MEMRAY_PATH=DIR).

    PYTHONPATH=$PWD .venv/bin/python bench/driver_heap_probe.py --cycles 8
    PYTHONMALLOC=malloc PYTHONPATH=$PWD .venv/bin/python bench/driver_heap_probe.py --cycles 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness.engine import DEFAULT_PROFILE, engine_setup  # noqa: E402
from system.process_memory import processes_memory, release_freed_heap  # noqa: E402
from vllm_bridge.compat import release_engine_caches  # noqa: E402

MiB = 2**20
TRACE_FROM_CYCLE = 3  # the first stops fill caches every engine refills anyway


def own_memory() -> dict[str, float]:
    """This process's anonymous and whole PSS, MiB (smaps_rollup, as /status reads a replica)."""
    measured = processes_memory([os.getpid()])
    return {"anon_mib": round(measured["anon_bytes"] / MiB, 1), "pss_mib": round(measured["measured_bytes"] / MiB, 1)}


async def one_engine(llm_kwargs: dict, index: int) -> None:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**llm_kwargs))
    async for _ in llm.generate("What does a memory pool hold?", SamplingParams(max_tokens=8), request_id=str(index)):
        pass
    llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=str(DEFAULT_PROFILE))
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--memray", help="write memray's native trace here (from stop 3 on)")
    args = parser.parse_args()
    setup = engine_setup(args.profile)
    os.environ.update({k: v for k, v in setup.env.items() if k not in os.environ})
    tracker = None
    readings = []
    for index in range(args.cycles):
        if args.memray and index == TRACE_FROM_CYCLE - 1:
            if os.environ.get("MEMRAY_PATH"):
                sys.path.append(os.environ["MEMRAY_PATH"])
            import memray

            tracker = memray.Tracker(args.memray, native_traces=True)
            tracker.__enter__()
        asyncio.run(one_engine(setup.llm_kwargs(), index))
        release_engine_caches()
        release_freed_heap()
        readings.append({"stop": index + 1, **own_memory()})
        print(f"stop {index + 1}: {readings[-1]}", flush=True)
    if tracker is not None:
        tracker.__exit__(None, None, None)
    allocator = os.environ.get("PYTHONMALLOC", "pymalloc (default)")
    print("RESULT " + json.dumps({"allocator": allocator, "profile": args.profile, "stops": readings}))


if __name__ == "__main__":
    main()
