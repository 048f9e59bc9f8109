"""Retrieval at scale on real embeddings: every index kind the profile offers, at 10k, 100k and 1M chunks.

Vectors: bench/retrieval_corpus.py (MiniLM embeddings of the chunked pydoc corpus and of text-perturbed
copies of it, the first --real-chunks of them embedded for real and cached under var/bench-cache/; past
those, gaussian perturbations of the real vectors). Queries: the 160 questions of
bench/data/rag-questions.json, embedded one at a time as the stack embeds a question; none is in the
corpus.

Per size and index kind, the index built as rag/store/knowledge_store.py builds it (KnowledgeStore's own factory:
`IndexIDMap2(IndexFlatIP)` or `IndexIDMap2(IndexHNSWFlat(M=retriever.hnsw_m))` with the store's
efSearch), with FAISS's OpenMP threads at the profile's retriever.faiss_threads, as the replica sets them:
  build s       index.add_with_ids of all n vectors
  memory MiB    the process's RSS growth over the build (the index's own copy of the vectors + graph)
  search        p50/p95 of index.search(query, k=10), one question at a time, after 10 untimed ones
  recall@10     overlap with the exact top 10 (numpy inner product over all n vectors)
  recall@10 ties  the share of results scoring at least the exact 10th score (a near-duplicate that
                ties with an exact result is not a miss)
  embed+search  p50/p95 of embed the question text (torch threads = embedder.torch_threads) + search:
                what a query costs the retriever and the embedder (no Ray hops, no SQLite fetch); with
                each part's p50 from the same loop, and the CPU time p50 of the pair (process_time:
                what it costs when it has a core to itself; the wall time on this shared machine is
                that plus the wait for a core; `load` is the 1-minute load average when measured)
  embed         one question with torch threads 1 and 2, interleaved question by question
HNSW is also searched at other efSearch values, to show what recall each costs.

The same questions through a real stack: bench/rag_latency.py.

    PYTHONPATH=. .venv/bin/python bench/bench_retrieval_scale.py            # writes bench/results/retrieval-scale.json
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import tempfile
import time
import typing
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.engine import DEFAULT_PROFILE  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.timing import Stopwatch, percentile, time_each  # noqa: E402

NAME = "retrieval-scale"
TOP_K = 10
WARMUP = 10
EMPTY_ROW = {
    "n": 0,
    "real": 0,
    "build_s": None,
    "memory_mib": None,
    "index_mib": None,
    "recall": None,
    "recall_ties": None,
    "top1": None,
    "embed_search_p50": None,
    "embed_search_p95": None,
    "embed_part_p50": None,
    "search_part_p50": None,
    "cpu_p50": None,
}
HNSW_EF_SWEEP = (16, 32, 128, 256)  # besides the store's own efSearch
MIN_REAL_CHUNKS = 4096  # the corpus itself (4705 chunks) is most of it; ~20 min on 2 busy cores


def profile_kinds() -> list[str]:
    """The index kinds the profile schema offers (planner/profile.py RetrieverSpec.index)."""
    from planner.profile import RetrieverSpec

    return list(typing.get_args(RetrieverSpec.model_fields["index"].annotation))


def ms(seconds: list[float], q: float) -> float:
    return percentile([s * 1e3 for s in seconds], q)


def exact_top(data: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k ids and scores of every query (inner product of unit vectors), in blocks of rows."""
    best_ids = np.zeros((len(queries), 0), dtype=np.int64)
    best_scores = np.zeros((len(queries), 0), dtype=np.float32)
    for start in range(0, len(data), 200_000):
        scores = queries @ data[start : start + 200_000].T
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        best_ids = np.hstack([best_ids, top + start])
        best_scores = np.hstack([best_scores, np.take_along_axis(scores, top, axis=1)])
        keep = np.argsort(-best_scores, axis=1)[:, :k]
        best_ids, best_scores = np.take_along_axis(best_ids, keep, 1), np.take_along_axis(best_scores, keep, 1)
    return best_ids, best_scores


def recalls(
    found: list[np.ndarray], truth: np.ndarray, truth_scores: np.ndarray, data: np.ndarray, queries: np.ndarray
) -> dict[str, float]:
    """recall@10 by id, recall@10 counting ties with the exact 10th score as found, and how often the
    exact best chunk is among the results."""
    by_id = np.mean([len(set(f.tolist()) & set(t.tolist())) / TOP_K for f, t in zip(found, truth)])
    ties = []
    for f, q, kth in zip(found, queries, truth_scores[:, -1]):
        f = f[f >= 0]
        ties.append(float(np.sum(data[f] @ q >= kth - 1e-5)) / TOP_K)
    top1 = np.mean([float(t[0] in set(f.tolist())) for f, t in zip(found, truth)])
    return {"recall": float(by_id), "recall_ties": float(np.mean(ties)), "top1": float(top1)}


def embed_then_search(embed, search, questions: list[str]) -> dict[str, float]:
    """Per question, embed it then search with its vector (each part timed too): p50/p95 of the sum and
    p50 of each part, from the same loop, so the parts see the same moment of a shared machine."""
    for text in questions[:WARMUP]:
        search(embed(text))
    total, embed_s, search_s, cpu = [], [], [], []
    for text in questions:
        cpu_started, started = time.process_time(), time.perf_counter()
        vector = embed(text)
        embedded = time.perf_counter()
        search(vector)
        ended, cpu_ended = time.perf_counter(), time.process_time()
        total.append(ended - started)
        embed_s.append(embedded - started)
        search_s.append(ended - embedded)
        cpu.append(cpu_ended - cpu_started)
    return {
        "embed_search_p50": ms(total, 50),
        "embed_search_p95": ms(total, 95),
        "embed_part_p50": ms(embed_s, 50),
        "search_part_p50": ms(search_s, 50),
        "cpu_p50": ms(cpu, 50),
    }


def embed_threads_rows(embed, questions: list[str], thread_counts: list[int]) -> list[dict]:
    """One question at a time with each torch thread count, interleaved question by question (a shared
    machine's load then weighs on every count alike)."""
    import torch

    seconds = {t: [] for t in thread_counts}
    cpu = {t: [] for t in thread_counts}
    for i, text in enumerate(questions):
        for threads in thread_counts:
            torch.set_num_threads(threads)
            cpu_started, started = time.process_time(), time.perf_counter()
            embed(text)
            if i >= WARMUP:
                seconds[threads].append(time.perf_counter() - started)
                cpu[threads].append(time.process_time() - cpu_started)
    return [
        {
            **EMPTY_ROW,
            "kind": "embed",
            "setting": f"embed one question (torch threads {t})",
            "store_default": t == thread_counts[0],
            "p50": ms(seconds[t], 50),
            "p95": ms(seconds[t], 95),
            "cpu_p50": ms(cpu[t], 50),
            "load": os.getloadavg()[0],
        }
        for t in thread_counts
    ]


def trimmed_rss() -> int:
    """RSS after handing freed heap back to the OS, so the next growth is not hidden by reused free blocks."""
    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim:
        trim(0)
    return psutil.Process().memory_info().rss


def index_bytes(index) -> int:
    """What the index holds, counted from its arrays: vectors, HNSW graph, the id map (not its hash map)."""
    import faiss

    inner = faiss.downcast_index(index.index)
    total = index.id_map.size() * 8
    if isinstance(inner, faiss.IndexHNSW):
        hnsw = inner.hnsw
        total += faiss.downcast_index(inner.storage).codes.size()
        total += hnsw.neighbors.size() * 4 + hnsw.levels.size() * 4 + hnsw.offsets.size() * 8
    else:
        total += inner.codes.size()
    return total


def build(kind: str, hnsw_m: int, data: np.ndarray, tmp: Path):
    """The store's own index (KnowledgeStore._new_index) with all of data added; seconds, RSS growth."""
    from rag.store.knowledge_store import KnowledgeStore

    store = KnowledgeStore(tmp / f"{kind}.sqlite3", dim=data.shape[1], index_kind=kind, hnsw_m=hnsw_m)
    index = store._new_index()
    store.close()
    rss = trimmed_rss()
    with Stopwatch() as watch:
        index.add_with_ids(data, np.arange(len(data), dtype=np.int64))
    return index, watch.seconds, (psutil.Process().memory_info().rss - rss) / 2**20


def measure(
    n: int,
    real: int,
    kind: str,
    hnsw_m: int,
    data: np.ndarray,
    questions: list[str],
    queries: np.ndarray,
    truth: tuple[np.ndarray, np.ndarray],
    embed,
    tmp: Path,
) -> list[dict]:
    import faiss

    index, build_s, memory_mib = build(kind, hnsw_m, data, tmp)
    inner = faiss.downcast_index(index.index)
    store_ef = inner.hnsw.efSearch if kind == "hnsw" else None
    settings = [store_ef] + ([ef for ef in HNSW_EF_SWEEP if ef != store_ef] if kind == "hnsw" else [])
    rows = []
    for ef in settings:
        if ef is not None:
            inner.hnsw.efSearch = ef
        seconds, found = time_each(lambda q: index.search(q[None, :], TOP_K)[1][0], queries, warmup=WARMUP)
        row = {
            **EMPTY_ROW,
            "n": n,
            "real": min(n, real),
            "kind": kind,
            "setting": kind if ef is None else f"hnsw M{hnsw_m} ef{ef}",
            "store_default": ef == store_ef,
            "build_s": build_s,
            "memory_mib": memory_mib,
            "index_mib": index_bytes(index) / 2**20,
            "p50": ms(seconds, 50),
            "p95": ms(seconds, 95),
            **recalls(found, *truth, data, queries),
        }
        if ef == store_ef:
            row.update(embed_then_search(embed, lambda v: index.search(v[None, :], TOP_K), questions))
        row["load"] = os.getloadavg()[0]
        rows.append(row)
        print(
            f"[scale] n={n} {row['setting']}: search p50 {row['p50']:.3f} ms, recall@10 {row['recall']:.3f} "
            f"(ties {row['recall_ties']:.3f}, top-1 {row['top1']:.3f}), build {build_s:.1f} s, "
            f"+{memory_mib:.0f} MiB"
            + (
                f", embed+search p50 {row['embed_search_p50']:.1f} ms (embed "
                f"{row['embed_part_p50']:.1f}, search {row['search_part_p50']:.1f})"
                f", CPU {row['cpu_p50']:.1f}"
                if row["embed_search_p50"]
                else ""
            )
            + f", load {row['load']:.1f}",
            flush=True,
        )
    return rows  # the index goes with this frame


def run(
    sizes: list[int],
    real_chunks: int,
    profile_path: Path = DEFAULT_PROFILE,
    kinds: list[str] | None = None,
    seed: int = 0,
) -> BenchResult:
    import faiss
    import torch

    from bench.retrieval_corpus import (
        CorpusEmbedder,
        cached_real_chunks,
        chunk_vectors,
        load_questions,
        noise_norm,
        real_chunk_vectors,
        settings_from_profile,
    )
    from planner.profile import load_profile

    profile = load_profile(profile_path)
    retriever = profile.retriever
    kinds = kinds or profile_kinds()
    settings = settings_from_profile(profile_path)
    embedder = CorpusEmbedder(settings)
    real_chunks = real_chunks or cached_real_chunks(settings, MIN_REAL_CHUNKS)
    real, copies = real_chunk_vectors(settings, real_chunks, embedder)
    norm, median_cos = noise_norm(real, copies)
    print(
        f"[scale] {len(real)} real chunk vectors ({int(np.sum(copies == 0))} of the corpus itself, copies up to "
        f"{int(copies.max())}); synthetic noise norm {norm:.3f} (text-perturbed chunk to its nearest original: "
        f"median cosine {median_cos:.3f})",
        flush=True,
    )

    torch.set_num_threads(profile.embedder.torch_threads)  # a question's batch, as the replica runs it
    faiss.omp_set_num_threads(retriever.faiss_threads)  # as deployments/retriever.py sets it
    questions = load_questions()
    queries = np.ascontiguousarray(np.stack([embedder.embed_query(q) for q in questions]), dtype=np.float32)
    threads = profile.embedder.torch_threads
    rows = embed_threads_rows(embedder.embed_query, questions, [threads, 2 if threads == 1 else 1])
    torch.set_num_threads(threads)
    for r in rows:
        print(
            f"[scale] {r['setting']}: p50 {r['p50']:.1f} ms, p95 {r['p95']:.1f} ms, CPU p50 {r['cpu_p50']:.1f} ms, "
            f"load {r['load']:.1f}",
            flush=True,
        )
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            data = chunk_vectors(real, n, norm, seed)
            truth = exact_top(data, queries, TOP_K)
            for kind in kinds:
                rows += measure(
                    n,
                    len(real),
                    kind,
                    retriever.hnsw_m,
                    data,
                    questions,
                    queries,
                    truth,
                    embedder.embed_query,
                    Path(tmp),
                )
            del data
            gc.collect()
    config = {
        "sizes": sizes,
        "kinds": kinds,
        "real_chunks": len(real),
        "corpus_chunks": int(np.sum(copies == 0)),
        "noise_norm": norm,
        "median_copy_cosine": median_cos,
        "seed": seed,
        "top_k": TOP_K,
        "questions": len(questions),
        "profile": str(profile_path),
        "hnsw_m": retriever.hnsw_m,
        "faiss_threads": retriever.faiss_threads,
        "torch_threads": profile.embedder.torch_threads,
        "embedder": Path(settings.model).name,
        "chunk_tokens": settings.chunk_tokens,
        "chunk_overlap": settings.chunk_overlap,
        "embed_title": settings.embed_title,
        "faiss": faiss.__version__,
    }
    metrics = {
        f"embed_search_p50_ms_{r['n']}_{r['kind']}": r["embed_search_p50"]
        for r in rows
        if r.get("embed_search_p50") is not None
    }
    return new_result(NAME, config, metrics, rows)


def tables(result: BenchResult) -> str:
    lines = [
        "| chunks | real text | index | build s | RSS growth MiB | index MiB | search p50 ms | search p95 ms | "
        "recall@10 | recall@10 (ties) | top-1 found | embed+search p50 ms | embed+search p95 ms | "
        "(embed / search p50 ms) | CPU ms p50 | load |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]

    def num(value, fmt):
        return "" if value is None else format(value, fmt)

    for r in result.rows:
        name = r["setting"] + (" (store)" if r["kind"] == "hnsw" and r["store_default"] else "")
        parts = f"{r['embed_part_p50']:.1f} / {r['search_part_p50']:.2f}" if r["embed_part_p50"] is not None else ""
        lines.append(
            f"| {r['n'] or ''} | {r['real'] or ''} | {name} | {num(r['build_s'], '.1f')} | "
            f"{num(r['memory_mib'], '.0f')} | {num(r['index_mib'], '.0f')} | {r['p50']:.2f} | {r['p95']:.2f} | {num(r['recall'], '.3f')} | "
            f"{num(r['recall_ties'], '.3f')} | {num(r['top1'], '.3f')} | {num(r['embed_search_p50'], '.1f')} | "
            f"{num(r['embed_search_p95'], '.1f')} | {parts} | {num(r['cpu_p50'], '.1f')} | {r['load']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument(
        "--real-chunks",
        type=int,
        default=0,
        help="chunks embedded from real text (cached); the rest are perturbed real vectors. "
        f"0 = all that are cached, at least {MIN_REAL_CHUNKS} (embedded here if missing)",
    )
    parser.add_argument("--kinds", default="", help="comma-separated; default: every kind the profile offers")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    result = run(
        [int(s) for s in args.sizes.split(",")],
        args.real_chunks,
        args.profile,
        [k for k in args.kinds.split(",") if k] or None,
        args.seed,
    )
    print()
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)}")


if __name__ == "__main__":
    main()
