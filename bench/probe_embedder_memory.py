"""What the embedder's heap holds after real documents: the replica's work (chunk, then embed in batches, then
hand freed heap back), in one process without Ray, with its memory read per kind of mapping after each round.

It runs rag.retrieval.embedding.SentenceTransformerEmbedder as deployments/embedder.py does: chunk() on the threads of a pool
(Ray Serve runs a replica's sync methods on its event loop's thread pool), each batch's forward pass on one
forward thread (rag.retrieval.embed_turns.OneForwardThread) at 1 or 2 torch threads, release_freed_heap(collect=False)
after each embed call, then samples /proc/self/smaps by kind ([heap], other anonymous, file-backed), glibc's
mallinfo2 (bytes in use, free chunks, mmapped blocks) and Python's gc-tracked objects. Documents: the
outside corpora of bench/make_outside_corpora.py (bench/data/*.jsonl.gz) in a seeded shuffle.

    .venv/bin/python bench/probe_embedder_memory.py --docs 300 --out bench/results/embedder-heap-probe.json [--variant NAME]

Variants change one thing: `default`; `one-thread` (every chunk() on one thread); `fixed-threads` (the
forward pass always at 1 torch thread); `arena1` / `arena2` (MALLOC_ARENA_MAX=1 or 2, set before glibc starts:
the script re-executes itself).

Not yet run to the end: on 2026-12-06 three variants side by side at nice 10 got about 4% of a core each on a
machine at load 10-50 (other sessions' stacks and tests) and were stopped after their warm-up samples; the
measurement of issue 46 was made on the stack instead (docs/STRESS.md, "The embedder's heap after real
documents"). Run it alone on a quiet machine for the per-variant table.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import gzip
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.mappings import read_smaps  # noqa: E402

MIB = 2**20
CORPORA = ("sqlite-doc", "apache-doc", "git-doc", "rsyslog-doc", "stdlib-pydoc", "texlive-pdf")


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def mallinfo() -> dict:
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return {
        "glibc_arena_mib": info.arena / MIB,
        "glibc_in_use_mib": info.uordblks / MIB,
        "glibc_free_mib": info.fordblks / MIB,
        "glibc_mmapped_mib": info.hblkhd / MIB,
    }


def smaps_by_kind() -> dict:
    """Resident anonymous and file-backed MiB per kind of mapping, from /proc/self/smaps."""
    kinds = {"heap": 0, "anon_other": 0, "file": 0, "stack": 0}
    for mapping in read_smaps("self"):
        name = mapping["name"]
        if name == "[heap]":
            kind = "heap"
        elif name.startswith("[stack"):
            kind = "stack"
        elif name.startswith("/"):
            kind = "file"
        else:
            kind = "anon_other"
        kinds[kind] += mapping.get("rss", 0)
    return {f"{k}_mib": v / 1024 for k, v in kinds.items()}


def rollup() -> dict:
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Pss", "Pss_Anon", "Pss_File", "Rss"):
                out[key.lower() + "_mib"] = int(rest.split()[0]) / 1024
    return out


def load_documents(count: int, seed: int) -> list[str]:
    texts = []
    for corpus in CORPORA:
        path = ROOT / "bench" / "data" / f"{corpus}.jsonl.gz"
        with gzip.open(path, "rt") as lines:
            texts += [json.loads(line)["text"] for line in lines]
    random.Random(seed).shuffle(texts)
    return texts[:count]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--per-call", type=int, default=8, help="documents per ingest call (chunked in parallel)")
    ap.add_argument("--embed-call", type=int, default=64, help="chunks per embed call (the gateway's step)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument(
        "--variant", default="default", choices=("default", "one-thread", "fixed-threads", "arena1", "arena2")
    )
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--sample-every", type=int, default=8, help="documents between samples")
    ap.add_argument("--model", default=str(ROOT / "models" / "all-MiniLM-L6-v2"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    arenas = {"arena1": "1", "arena2": "2"}.get(args.variant)
    if arenas and os.environ.get("MALLOC_ARENA_MAX") != arenas:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_ARENA_MAX": arenas})

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rag.retrieval.embed_turns import OneForwardThread
    from rag.retrieval.embedding import SentenceTransformerEmbedder
    from system.process_memory import release_freed_heap

    embedder = SentenceTransformerEmbedder(args.model, args.batch_size, 200, 30)
    forward = OneForwardThread()
    pool = ThreadPoolExecutor(1 if args.variant == "one-thread" else 8)
    rng = random.Random(args.seed)

    def guard_for():
        from contextlib import contextmanager

        @contextmanager
        def guard(_n):
            threads = 1 if args.variant == "fixed-threads" else rng.choice((1, 2))
            yield forward.runner(threads)

        return guard

    def embed(texts):
        result = embedder.embed(texts, guard_for())
        release_freed_heap(collect=False)
        return result

    def sample(label, docs_done, chunks_done):
        gc.collect()
        release_freed_heap(collect=False)
        point = {
            "label": label,
            "t": round(time.time() - t0, 1),
            "docs": docs_done,
            "chunks": chunks_done,
            **rollup(),
            **smaps_by_kind(),
            **mallinfo(),
            "gc_objects": len(gc.get_objects()),
        }
        samples.append(point)
        print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in point.items()}), flush=True)

    t0 = time.time()
    samples: list[dict] = []
    sample("loaded", 0, 0)
    pool.submit(embed, [" ".join(["warm"] * embedder.max_seq_length)] * args.batch_size).result()
    sample("warm", 0, 0)
    documents = load_documents(args.docs, args.seed)
    chunks_done = 0
    for start in range(0, len(documents), args.per_call):
        call = documents[start : start + args.per_call]
        chunked = list(pool.map(embedder.chunk, call))
        texts = [c.text for chunks in chunked for c in chunks]
        for i in range(0, len(texts), args.embed_call):
            pool.submit(embed, texts[i : i + args.embed_call]).result()
        chunks_done += len(texts)
        done = start + len(call)
        if done % args.sample_every == 0 or done == len(documents):
            sample("docs", done, chunks_done)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        runs = json.loads(args.out.read_text()) if args.out.exists() else {}
        runs[args.variant] = {"args": {k: str(v) for k, v in vars(args).items()}, "samples": samples}
        args.out.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
