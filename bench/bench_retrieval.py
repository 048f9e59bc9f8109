"""Retrieval: poolserve's KnowledgeStore (SQLite + FAISS) against brute-force numpy.

For N random 384-d unit vectors (MiniLM's dimension) stored as documents of 100 chunks:
  - ingest time through KnowledgeStore.upsert_document (SQLite rows + FAISS add)
  - query latency p50/p95 for top_k=4, one query at a time, each path in its own loop:
      numpy   normalized matrix @ query, argpartition (the baseline every ratio is against)
      faiss   the FAISS index the store keeps for the collection, alone (IndexIDMap2.search)
      store   KnowledgeStore.search: normalize + index search + the SQLite fetch of the chunks
  - recall@4 against the exact numpy answer, and how often the exact top-1 is the answer's top-1
for the store's index kinds "flat" (IndexFlatIP under IndexIDMap2) and "hnsw" (IndexHNSWFlat,
M=32, as the store builds it), searched with FAISS's default efSearch=16 and with efSearch=128
(the store itself now sets max(64, 2*M)).

Two query sets: "random" (fresh random vectors: no near neighbour, the hardest case for HNSW)
and "near" (a stored vector plus noise, like a question close to one passage).

Run it under the shared lock (writes bench/results/retrieval.json):
    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_retrieval.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.timing import Stopwatch, percentile, time_each  # noqa: E402

NAME = "retrieval"
DIM = 384
TOP_K = 4
PER_DOC = 100
HNSW_EF = (16, 128)
WARMUP_QUERIES = 10


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def pct(seconds: list[float], q: float) -> float:
    return percentile([t * 1e3 for t in seconds], q)  # ms


def brute_force(matrix: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    q = query / np.linalg.norm(query)
    scores = matrix @ q
    top = np.argpartition(-scores, k)[:k]
    return top[np.argsort(-scores[top])]


def bench(n: int, kind: str, queries: dict[str, np.ndarray], data: np.ndarray, tmp: Path) -> list[dict]:
    import faiss

    from rag.store.knowledge_store import KnowledgeStore

    # Recall compares against every row of data, so every row must be stored.
    assert n % PER_DOC == 0 and len(data) == n, f"n={n} must be a multiple of {PER_DOC} and len(data)"
    store = KnowledgeStore(tmp / f"{kind}-{n}.sqlite", dim=DIM, index_kind=kind)
    with Stopwatch() as ingest_watch:
        for doc in range(n // PER_DOC):
            rows = data[doc * PER_DOC : (doc + 1) * PER_DOC]
            store.upsert_document("bench", "c", f"d{doc}", [f"chunk {doc}-{i}" for i in range(len(rows))], rows)
    ingest = ingest_watch.seconds
    index = store._indexes[("bench", "c")].index  # the FAISS index itself (IndexIDMap2), no tombstone filter
    # SQLite ids are 1..n in insert order; keep the mapping explicit anyway.
    id_of_row = np.array([r[0] for r in store._db.execute("SELECT id FROM chunks ORDER BY id")], dtype=np.int64)

    inner = faiss.downcast_index(index.index)  # IndexIDMap2's inner Flat or HNSW
    settings = [("flat", None)] if kind == "flat" else [(f"hnsw ef{ef}", ef) for ef in HNSW_EF]
    out = []
    for label, ef in settings:
        if ef is not None:
            inner.hnsw.efSearch = ef  # override the store's own setting for this measurement
        for qname, qs in queries.items():
            # Each path in its own loop (a few untimed warm-up queries first): interleaving them
            # lets numpy's BLAS threads and FAISS's OpenMP threads disturb each other's timings.
            lat = {}

            def timed(fn):
                return time_each(fn, qs, warmup=WARMUP_QUERIES)

            lat["numpy"], truth = timed(lambda q: brute_force(data, q, TOP_K))  # exact: the truth too
            lat["faiss"], faiss_ids = timed(lambda q: index.search(unit(q[None, :]), TOP_K)[1][0])
            lat["store"], store_hits = timed(lambda q: store.search("bench", "c", q, TOP_K))
            recall_faiss = [len(set(id_of_row[e].tolist()) & set(f.tolist())) / TOP_K for e, f in zip(truth, faiss_ids)]
            recall_store = [
                len(set(e.tolist()) & {int(h.document_id[1:]) * PER_DOC + int(h.chunk_id.split("#")[1]) for h in hits})
                / TOP_K
                for e, hits in zip(truth, store_hits)
            ]
            top1_faiss = [float(id_of_row[e[0]] == f[0]) for e, f in zip(truth, faiss_ids)]
            top1_store = [
                float(
                    bool(hits)
                    and int(e[0]) == int(hits[0].document_id[1:]) * PER_DOC + int(hits[0].chunk_id.split("#")[1])
                )
                for e, hits in zip(truth, store_hits)
            ]
            base50, base95 = pct(lat["numpy"], 50), pct(lat["numpy"], 95)
            for path in ("numpy", "faiss", "store"):
                p50, p95 = pct(lat[path], 50), pct(lat[path], 95)
                out.append(
                    {
                        "n": n,
                        "kind": label if path != "numpy" else f"(baseline for {label})",
                        "queries": qname,
                        "path": path,
                        "p50": p50,
                        "p95": p95,
                        "p50_ratio": p50 / base50,
                        "p95_ratio": p95 / base95,
                        "recall": 1.0
                        if path == "numpy"
                        else float(np.mean(recall_faiss if path == "faiss" else recall_store)),
                        "recall1": 1.0
                        if path == "numpy"
                        else float(np.mean(top1_faiss if path == "faiss" else top1_store)),
                        "ingest": ingest if path == "store" else None,
                    }
                )
    store.close()
    return out


def run(sizes: list[int], kinds: list[str], n_queries: int, seed: int) -> BenchResult:
    import faiss

    print(f"faiss {faiss.__version__}, omp threads {faiss.omp_get_max_threads()}, numpy {np.__version__}")
    rng = np.random.default_rng(seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            data = unit(rng.standard_normal((n, DIM)))
            near_src = data[rng.integers(0, n, n_queries)]
            queries = {
                "random": rng.standard_normal((n_queries, DIM)).astype(np.float32),
                # noise of norm ~0.3: cosine ~0.95 with the stored vector it was made from
                "near": unit(near_src + (0.3 / np.sqrt(DIM)) * rng.standard_normal((n_queries, DIM))),
            }
            for kind in kinds:
                rows += bench(n, kind, queries, data, Path(tmp))
                print(f"[bench] N={n} {kind} done", flush=True)
    config = {
        "sizes": sizes,
        "kinds": kinds,
        "queries": n_queries,
        "seed": seed,
        "dim": DIM,
        "top_k": TOP_K,
        "per_doc": PER_DOC,
        "hnsw_ef": list(HNSW_EF),
        "faiss_omp_threads": faiss.omp_get_max_threads(),
    }
    store_rows = [r for r in rows if r["path"] == "store"]
    metrics = {f"store_p50_ms_{r['n']}_{r['queries']}_{r['kind'].replace(' ', '_')}": r["p50"] for r in store_rows}
    return new_result(NAME, config, metrics, rows)


def tables(result: BenchResult) -> str:
    lines = [
        "| N | queries | path | index | p50 ms | p95 ms | p50 vs numpy | p95 vs numpy | recall@4 | top-1 found | ingest s |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(result.rows, key=lambda r: (r["n"], r["queries"] != "near")):
        ingest = f"{r['ingest']:.1f}" if r["ingest"] is not None else ""
        lines.append(
            f"| {r['n']} | {r['queries']} | {r['path']} | {r['kind']} | {r['p50']:.3f} | {r['p95']:.3f} | "
            f"{r['p50_ratio']:.2f}x | {r['p95_ratio']:.2f}x | {r['recall']:.3f} | {r['recall1']:.3f} | {ingest} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--kinds", default="flat,hnsw")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    result = run([int(s) for s in args.sizes.split(",")], args.kinds.split(","), args.queries, args.seed)
    print()
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)}")


if __name__ == "__main__":
    main()
