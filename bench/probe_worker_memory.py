"""What grows in vLLM's CPU Worker process under varied concurrent load (issue 23, item 7).

No poolserve stack: vLLM's AsyncLLM in this process, with the chat engine's arguments and env from
configs/cpu-tiny.yaml's plan (float32, max_model_len 4096, max_num_seqs 16, max_num_batched_tokens
2048, 1 GiB KV cache, prefix caching, eager, ngram speculation 4, OMP_NUM_THREADS=1). On CPU vLLM V1
runs EngineCore in a child process and the model in a grandchild (MultiprocExecutor, title
"VLLM::Worker"); that process's /proc/<pid>/smaps_rollup is sampled every --interval-s and its
/proc/<pid>/smaps (per mapping) every 60 s, with glibc's mallinfo2() read inside it (collective_rpc).
At the end malloc_trim(0) runs inside the Worker, to see how much of its anon memory was free heap.

Workload (same seed, same requests in the same order for every variant): --clients concurrent
clients take requests from one queue; 60% short chat (20-60 tokens), 30% RAG-sized (300-600), 10%
long (1,000-3,000); prompts are natural text (bench/data/stdlib-pydoc) behind a unique first line
(no shared cached prefix); max_tokens 16-64, greedy, ignore_eos (identical work per variant).

Each variant is a fresh process (commands as run, 2026-12-03):

    for v in default tcmalloc onednn16 arena2; do  # (jemalloc and mmap1m: defined, not run)
      flock /tmp/poolserve-heavy.lock nice -n 5 timeout 660 \
        .venv/bin/python bench/probe_worker_memory.py --variant $v --requests 400 --max-seconds 420
    done
    .venv/bin/python bench/probe_worker_memory.py --summarize

With the stack's trim every 60 s and glibc's in-use heap read after each (2026-12-04, one after the
other, each alone on the machine):

    for v in default onednn0; do
      nice -n 5 timeout 1800 .venv/bin/python bench/probe_worker_memory.py --variant $v --requests 5000 \
        --max-seconds 1500 --trim-every-s 60 --out bench/results/worker-memory-2026-12-04.json
    done

The plan's env now carries ONEDNN_PRIMITIVE_CACHE_CAPACITY (chat.onednn_primitive_cache); "default"
here is oneDNN's own default (1,024), as vLLM runs without poolserve.

Results: bench/results/worker-memory-<date>.json (one entry per variant, updated in place).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gzip
import json
import os
import random
import re
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
VARIANTS = {
    "default": {},
    "onednn16": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16"},
    "onednn0": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"},
    "arena2": {"MALLOC_ARENA_MAX": "2"},
    "trim": {"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": str(64 * MIB), "MALLOC_MMAP_THRESHOLD_": str(1 * MIB)},
    "mmap1m": {"MALLOC_MMAP_THRESHOLD_": str(1 * MIB)},
    "tcmalloc": {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"},
    "jemalloc": {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
}
# The plan's env for the chat engine on this 2-core host (planner/engine_args.py, cpu-tiny).
STACK_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "VLLM_USE_AOT_COMPILE": "0",
}
HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ (\d+)\s*(.*)$")


def rollup(pid: int) -> dict:
    out = {}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        parts = line.split()
        if parts[0] in ("Rss:", "Pss_Anon:", "Anonymous:", "Pss_File:"):
            out[parts[0][:-1].lower()] = int(parts[1]) * 1024
    return out


def smaps(pid: int) -> list[dict]:
    maps, cur = [], None
    for line in open(f"/proc/{pid}/smaps"):
        m = HEADER.match(line)
        if m:
            cur = {
                "start": int(m[1], 16),
                "end": int(m[2], 16),
                "perms": m[3],
                "inode": int(m[4]),
                "name": m[5].strip(),
                "anon": 0,
            }
            maps.append(cur)
        elif line.startswith("Anonymous:"):
            cur["anon"] = int(line.split()[1]) * 1024
    return maps


def classify(maps: list[dict]) -> dict[str, int]:
    """Anonymous bytes per kind of mapping: [heap] (main arena, brk), glibc arena heaps (64 MiB-aligned
    rw-p head of a 64 MiB reservation), executable anon (JIT code), other anon by size, file-backed."""
    cats: dict[str, int] = {}
    for i, m in enumerate(maps):
        size, nxt = m["end"] - m["start"], maps[i + 1] if i + 1 < len(maps) else None
        if m["name"] == "[heap]":
            cat = "[heap]"
        elif m["inode"] or m["name"].startswith("/"):
            cat = "file-backed"
        elif "x" in m["perms"]:
            cat = "anon exec"
        elif m["name"]:
            cat = m["name"]
        elif (
            m["start"] % (64 * MIB) == 0
            and size <= 64 * MIB
            and (
                size == 64 * MIB
                or (
                    nxt
                    and nxt["start"] == m["end"]
                    and nxt["perms"].startswith("---")
                    and nxt["end"] - m["start"] == 64 * MIB
                )
            )
        ):
            cat = "glibc arena heaps (64 MiB)"
        elif size >= 512 * MIB:
            cat = "anon >= 512 MiB (KV cache)"
        elif size >= 64 * MIB:
            cat = "anon 64-512 MiB"
        elif size >= 8 * MIB:
            cat = "anon 8-64 MiB"
        elif size >= 1 * MIB:
            cat = "anon 1-8 MiB"
        else:
            cat = "anon < 1 MiB"
        cats[cat] = cats.get(cat, 0) + m["anon"]
    return cats


def worker_stats(worker, trim: bool = False, trim_first: bool = False, types: bool = False):
    """Runs inside the Worker (collective_rpc): glibc mallinfo2 (all arenas), gc objects, optional trim
    (after the reading, or before it with trim_first: what the heap holds once the stack's trim has run),
    optionally the 15 most common gc-tracked types."""
    import collections
    import ctypes
    import gc
    import os as _os

    libc = ctypes.CDLL("libc.so.6")
    if trim_first:
        libc.malloc_trim(0)
    names = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    cls = type("Mallinfo2", (ctypes.Structure,), {"_fields_": [(n, ctypes.c_size_t) for n in names]})
    libc.mallinfo2.restype = cls
    info = {n: getattr(libc.mallinfo2(), n) for n in names}
    out = {
        "pid": _os.getpid(),
        "mallinfo2": info,
        "gc_objects": len(gc.get_objects()),
        "threads": len(_os.listdir("/proc/self/task")),
    }
    if types:
        out["types"] = dict(collections.Counter(type(o).__name__ for o in gc.get_objects()).most_common(15))
    if trim:
        out["trim_returned"] = libc.malloc_trim(0)
    return out


def build_requests(n: int, seed: int, tokenizer) -> list[tuple[list[int], int]]:
    docs = [json.loads(line)["text"] for line in gzip.open(ROOT / "bench/data/stdlib-pydoc.jsonl.gz", "rt")]
    stream = tokenizer("\n\n".join(docs)[:1_500_000], add_special_tokens=False)["input_ids"]
    tail = tokenizer("\nQuestion: what does this describe? Answer briefly.", add_special_tokens=False)["input_ids"]
    rng, reqs = random.Random(seed), []
    for i in range(n):
        r = rng.random()
        length = rng.randint(20, 60) if r < 0.6 else rng.randint(300, 600) if r < 0.9 else rng.randint(1000, 3000)
        head = tokenizer(f"Request {i} ({rng.random():.6f}). Notes:\n", add_special_tokens=False)["input_ids"]
        start = rng.randrange(0, len(stream) - length)
        body = stream[start : start + max(0, length - len(head) - len(tail))]
        reqs.append((head + body + tail, rng.randint(16, 64)))
    return reqs


async def run_variant(args) -> dict:
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    model = str(ROOT / "models/SmolLM2-135M-Instruct")
    reqs = build_requests(args.requests, args.seed, AutoTokenizer.from_pretrained(model))
    t0 = time.time()
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=model,
            dtype="float32",
            max_model_len=4096,
            max_num_seqs=16,
            max_num_batched_tokens=2048,
            kv_cache_memory_bytes=1 << 30,
            enable_prefix_caching=True,
            enforce_eager=True,
            seed=args.seed,
            speculative_config={
                "method": "ngram",
                "num_speculative_tokens": 4,
                "prompt_lookup_min": 2,
                "prompt_lookup_max": 4,
            },
        )
    )
    init_s = time.time() - t0
    info = (await engine.collective_rpc(worker_stats))[0]
    pid = info["pid"]
    state = {"done": 0, "ptok": 0, "otok": 0, "stop": False}
    series, snaps, mall = [], {}, []

    def sample():
        while not state["stop"]:
            try:
                series.append(
                    {
                        "t": round(time.time() - t0, 1),
                        "done": state["done"],
                        "ptok": state["ptok"],
                        "otok": state["otok"],
                        **rollup(pid),
                    }
                )
            except OSError:
                return
            time.sleep(args.interval_s)

    snaps["idle"] = classify(smaps(pid))
    mall.append({"done": 0, **info})
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    queue, warm_n, deadline = list(enumerate(reqs)), max(1, args.requests // 10), t0 + args.max_seconds
    marks, warm_maps = {}, {}

    async def client():
        while queue and time.time() < deadline:
            i, (ids, max_tokens) = queue.pop(0)
            sp = SamplingParams(
                max_tokens=max_tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
            )
            async for out in engine.generate({"prompt_token_ids": ids}, sp, f"r{i}"):
                final = out
            state["done"] += 1
            state["ptok"] += len(ids)
            state["otok"] += len(final.outputs[0].token_ids)
            if state["done"] == warm_n:
                marks["warm"] = (time.time(), state["ptok"], state["otok"])

    async def snapshotter():
        last = time.time()
        while not state["stop"]:
            await asyncio.sleep(2)
            periodic = {"trim_first": True} if args.trim_every_s else {}
            if "warm" in marks and "warm" not in snaps:
                maps = smaps(pid)
                snaps["warm"] = classify(maps)
                warm_maps.update({m["start"]: m["anon"] for m in maps})
                mall.append(
                    {
                        "done": state["done"],
                        "t": round(time.time() - t0, 1),
                        **(await engine.collective_rpc(worker_stats, kwargs={**periodic, "types": True}))[0],
                    }
                )
            elif time.time() - last >= (args.trim_every_s or 60):
                last = time.time()
                mall.append(
                    {
                        "done": state["done"],
                        "t": round(time.time() - t0, 1),
                        **(await engine.collective_rpc(worker_stats, kwargs=periodic))[0],
                    }
                )
                if periodic:  # the Worker's anon right after the stack's trim: the floor it comes back to
                    mall[-1]["anon_after_trim"] = rollup(pid)["anonymous"]

    snap_task = asyncio.create_task(snapshotter())
    start = time.time()
    await asyncio.gather(*(client() for _ in range(args.clients)))
    end = (time.time(), state["ptok"], state["otok"])
    state["stop"] = True
    await snap_task
    sampler.join()
    end_maps = smaps(pid)
    snaps["end"] = classify(end_maps)
    grown = sorted(
        (
            {
                "addr": hex(m["start"]),
                "size_mib": round((m["end"] - m["start"]) / MIB, 2),
                "perms": m["perms"],
                "name": m["name"],
                "anon_mib": round(m["anon"] / MIB, 1),
                "grew_mib": round((m["anon"] - warm_maps.get(m["start"], 0)) / MIB, 1),
            }
            for m in end_maps
        ),
        key=lambda x: -x["grew_mib"],
    )[:20]
    before = rollup(pid)
    mall.append(
        {"done": state["done"], **(await engine.collective_rpc(worker_stats, kwargs={"trim": True, "types": True}))[0]}
    )
    await asyncio.sleep(1)
    after = rollup(pid)
    snaps["after_trim"] = classify(smaps(pid))
    engine.shutdown()
    engine.__del__ = lambda: None
    w = marks.get("warm", (start, 0, 0))
    post_s = end[0] - w[0]
    return {
        "env": {k: os.environ.get(k) for k in sorted(set(STACK_ENV) | {k for v in VARIANTS.values() for k in v})},
        "init_s": round(init_s, 1),
        "served": state["done"],
        "planned": args.requests,
        "warm_n": warm_n,
        "wall_s": round(end[0] - start, 1),
        "post_warm_s": round(post_s, 1),
        "post_warm_tok_s": round((end[1] - w[1] + end[2] - w[2]) / post_s, 1) if post_s > 0 else None,
        "post_warm_out_tok_s": round((end[2] - w[2]) / post_s, 2) if post_s > 0 else None,
        "trim": {"anon_before": before["anonymous"], "anon_after": after["anonymous"]},
        "smaps_categories": snaps,
        "top_grown_mappings": grown,
        "mallinfo": mall,
        "series": series,
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }


def summarize(path: Path) -> None:
    data = json.loads(path.read_text())
    base = data["variants"].get("default", {}).get("post_warm_tok_s")
    print(
        "| variant | served | anon idle | anon at 10% | at 55% | at end | growth after warm-up | 10-55% | 55-100%"
        " | freed by malloc_trim | tok/s after warm-up | vs default |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    n = min(v["served"] for v in data["variants"].values())  # compared at the same request counts
    for name, v in data["variants"].items():
        s = v["series"]

        def at(frac, width=0.05):
            vals = [x["anonymous"] for x in s if frac * n <= x["done"] <= (frac + width) * n] or [s[-1]["anonymous"]]
            return statistics.median(vals) / MIB

        idle, w, mid, e = s[0]["anonymous"] / MIB, at(0.10), at(0.55), at(0.95)
        trim = (v["trim"]["anon_before"] - v["trim"]["anon_after"]) / MIB
        rel = f"{v['post_warm_tok_s'] / base:.2f}x" if base and v.get("post_warm_tok_s") else "-"
        print(
            f"| {name} | {v['served']} | {idle:,.0f} | {w:,.0f} | {mid:,.0f} | {e:,.0f} | {e - w:+,.0f} | {mid - w:+,.0f} |"
            f" {e - mid:+,.0f} | {trim:,.0f} | {v['post_warm_tok_s']} | {rel} |"
        )
    print("\nanon MiB by mapping kind (warm -> end, end - warm; after malloc_trim):")
    for name, v in data["variants"].items():
        c = v["smaps_categories"]
        if "warm" not in c:
            continue
        keys = sorted(set(c["warm"]) | set(c["end"]), key=lambda k: -(c["end"].get(k, 0) - c["warm"].get(k, 0)))
        parts = [
            f"{k} {c['warm'].get(k, 0) / MIB:,.0f}->{c['end'].get(k, 0) / MIB:,.0f} "
            f"({(c['end'].get(k, 0) - c['warm'].get(k, 0)) / MIB:+,.0f}; trim {c['after_trim'].get(k, 0) / MIB:,.0f})"
            for k in keys
            if c["end"].get(k, 0) or c["warm"].get(k, 0)
        ]
        print(f"- {name}: " + "; ".join(parts))
        m = v["mallinfo"]

        def fmt(x):
            return (
                f"arena {x['mallinfo2']['arena'] / MIB:,.0f} in-use {x['mallinfo2']['uordblks'] / MIB:,.0f} "
                f"free {x['mallinfo2']['fordblks'] / MIB:,.0f} mmapped {x['mallinfo2']['hblkhd'] / MIB:,.0f}"
            )

        print(
            f"  mallinfo2 at warm: {fmt(m[1])}; at end: {fmt(m[-1])}; gc objects {m[1]['gc_objects']:,} -> "
            f"{m[-1]['gc_objects']:,}; threads {m[1]['threads']} -> {m[-1]['threads']}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS))
    ap.add_argument("--requests", type=int, default=1200)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--max-seconds", type=float, default=540)
    ap.add_argument("--interval-s", type=float, default=5)
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument(
        "--trim-every-s",
        type=float,
        default=0,
        help="run malloc_trim(0) in the Worker this often, as the stack's heap_trim_interval_s does",
    )
    ap.add_argument("--out", type=Path, default=ROOT / f"bench/results/worker-memory-{dt.date.today()}.json")
    ap.add_argument("--summarize", action="store_true")
    args = ap.parse_args()
    if args.summarize:
        return summarize(args.out)
    if not args.variant:
        ap.error("--variant or --summarize")
    wanted = {**STACK_ENV, **VARIANTS[args.variant], "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    if any(os.environ.get(k) != v for k, v in wanted.items()):  # allocator env must be there from exec
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **wanted})
    result = asyncio.run(run_variant(args))
    data = json.loads(args.out.read_text()) if args.out.exists() else {"variants": {}}
    data["variants"][args.variant] = {**result, "args": {k: str(v) for k, v in vars(args).items()}}
    args.out.write_text(json.dumps(data, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("series", "smaps_categories", "mallinfo")}))


if __name__ == "__main__":
    main()
