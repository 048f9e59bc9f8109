"""Store costs in-process (no stack): a document listing, a metadata filter, an HNSW replace.

    PYTHONPATH=$PWD python -m bench.bench_store [--docs 10000] [--filter-chunks 20000] [--hnsw-chunks 100000]
        [--out-dir bench/results]

Uses only calls the store had before the paged listing too (upsert_documents, search, collection_info),
plus list_documents when it exists, so the same script measures an older checkout (PYTHONPATH=that checkout).
Prints one JSON object per measurement; with --out-dir (as `bench/run.py all` runs it) it also writes them as
the result `store` (bench/harness/results.py, imported only then, so an older checkout needs none of it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from rag.store.knowledge_store import KnowledgeStore

DIM = 384  # all-MiniLM-L6-v2
NAME = "store"


def _vectors(rng, n: int) -> np.ndarray:
    return rng.normal(size=(n, DIM)).astype(np.float32)


def _measured(call):
    """(result, seconds, peak Python bytes allocated during the call): timed once untraced, then traced."""
    started = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - started
    tracemalloc.start()
    call()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result, seconds, peak


def listing(workdir: Path, documents: int, rng) -> dict:
    store = KnowledgeStore(workdir / "listing.sqlite3", dim=DIM)
    # ~8 KB of nested metadata per document
    metadata = {"sections": [{"title": f"section {i}", "words": ["lorem"] * 20, "n": i} for i in range(36)]}
    for start in range(0, documents, 500):
        store.upsert_documents(
            "t",
            "c",
            [
                (f"doc-{i:06d}", ["text"], _vectors(rng, 1), metadata, 4)
                for i in range(start, min(documents, start + 500))
            ],
        )
    meta_bytes = len(json.dumps(metadata))
    info, info_s, info_peak = _measured(lambda: store.collection_info("t", "c"))
    out = {
        "bench": "listing",
        "documents": documents,
        "metadata_bytes": meta_bytes,
        "collection_info_s": round(info_s, 4),
        "collection_info_peak_mib": round(info_peak / 2**20, 2),
    }
    if hasattr(store, "list_documents"):
        _, page_s, page_peak = _measured(lambda: store.list_documents("t", "c", limit=100, after="doc-005000"))
        out |= {"page_of_100_s": round(page_s, 4), "page_of_100_peak_mib": round(page_peak / 2**20, 2)}
    store.close()
    return out


def filtering(workdir: Path, chunks: int, rng) -> dict:
    store = KnowledgeStore(workdir / "filter.sqlite3", dim=DIM)
    per_doc = 100
    tags = [f"tag-{i}" for i in range(1500)]
    for d in range(chunks // per_doc):
        store.upsert_documents(
            "t", "c", [(f"doc-{d}", ["text"] * per_doc, _vectors(rng, per_doc), {"tags": tags, "group": d % 10}, 4)]
        )
    query = _vectors(rng, 1)[0]
    timings = []
    for filters in ({"tags": "tag-1499"}, {"tags": "absent"}, {"group": 3, "tags": {"in": ["tag-7", "x"]}}):
        started = time.perf_counter()
        found = store.search("t", "c", query, top_k=4, filters=filters)
        timings.append(time.perf_counter() - started)
        assert found or filters["tags"] == "absent"
    store.close()
    return {"bench": "filter", "chunks": chunks, "array_items": len(tags), "search_s": [round(t, 4) for t in timings]}


def hnsw_replace(workdir: Path, chunks: int, rng) -> dict:
    store = KnowledgeStore(workdir / "hnsw.sqlite3", dim=DIM, index_kind="hnsw")
    per_doc = 100
    started = time.perf_counter()
    for d in range(0, chunks // per_doc, 10):
        store.upsert_documents(
            "t", "c", [(f"doc-{i}", ["text"] * per_doc, _vectors(rng, per_doc), {}, 4) for i in range(d, d + 10)]
        )
    build_s = time.perf_counter() - started
    started = time.perf_counter()
    # One batch: replace one document, add another.
    store.upsert_documents(
        "t",
        "c",
        [
            ("doc-7", ["new"] * per_doc, _vectors(rng, per_doc), {}, 3),
            ("added", ["text"] * per_doc, _vectors(rng, per_doc), {}, 4),
        ],
    )
    replace_s = time.perf_counter() - started
    info = store.collection_info("t", "c")
    ntotal = sum(index.ntotal if hasattr(index, "ntotal") else index.index.ntotal for index in store._indexes.values())
    started = time.perf_counter()
    store.close()
    close_s = time.perf_counter() - started
    out = {
        "bench": "hnsw_replace",
        "chunks": chunks,
        "build_s": round(build_s, 1),
        "replace_batch_s": round(replace_s, 3),
        "chunk_count": info["chunk_count"],
        "indexed_vectors": info["indexed_vectors"],
        "faiss_ntotal": ntotal,
        "close_s": round(close_s, 2),
    }
    started = time.perf_counter()
    reopened = KnowledgeStore(workdir / "hnsw.sqlite3", dim=DIM, index_kind="hnsw")
    out["reopen_s"] = round(time.perf_counter() - started, 2)
    out["reopen"] = str(getattr(reopened, "opened", {}).get(("t", "c"), "rebuilt from SQLite"))
    reopened.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--filter-chunks", type=int, default=20_000)
    parser.add_argument("--hnsw-chunks", type=int, default=100_000)
    parser.add_argument("--only", choices=["listing", "filter", "hnsw"])
    parser.add_argument("--out-dir", type=Path, default=None, help="also write the result `store` here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    measured = {}
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        workdir = Path(tmp)
        for part, measure in (
            ("listing", lambda: listing(workdir, args.docs, rng)),
            ("filter", lambda: filtering(workdir, args.filter_chunks, rng)),
            ("hnsw", lambda: hnsw_replace(workdir, args.hnsw_chunks, rng)),
        ):
            if args.only in (None, part):
                measured[part] = measure()
                print(json.dumps(measured[part]), flush=True)
    if args.out_dir is not None:
        from bench.harness.results import new_result, write_result

        config = {"docs": args.docs, "filter_chunks": args.filter_chunks, "hnsw_chunks": args.hnsw_chunks, "dim": DIM}
        rows = [{"part": part, **values} for part, values in measured.items()]
        print(write_result(new_result(NAME, config, {}, rows), args.out_dir))


if __name__ == "__main__":
    main()
