"""The retriever's resident memory against what it holds: bytes per stored chunk.

One process holds a KnowledgeStore (SQLite + FAISS + FTS5, as the retriever replica does) and fills it
with chunks of real text (the documents of tests/data, cut into ~800-character chunks and repeated
with a serial so every chunk is distinct) and random unit vectors of MiniLM's dimension, in batches of
20 documents of 25 chunks. After each step it runs a round of searches (dense, lexical and filtered,
so SQLite's page cache and FTS5 are warm as in use) and reads its own unique memory (PSS, after
malloc_trim: system/process_memory.py). The slope of memory over chunks is what the plan's
`retriever.per_chunk` line must cover.

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_retriever_memory.py --kinds flat hnsw
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.results import RESULTS_DIR, new_result, write_result  # noqa: E402

NAME = "retriever_memory"
DIM = 384
CHUNK_CHARS = 800
DOCS_PER_BATCH, CHUNKS_PER_DOC = 20, 25
DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def corpus_chunks() -> list[str]:
    """~800-character pieces of the real documents the tests carry (text, Markdown and HTML as text)."""
    text = "\n".join(
        p.read_text(errors="replace")
        for p in sorted(DATA.rglob("*"))
        if p.is_file() and p.suffix in (".txt", ".md", ".html", ".htm", ".xhtml")
    )
    words, pieces, current = text.split(), [], []
    for word in words:
        current.append(word)
        if sum(len(w) + 1 for w in current) >= CHUNK_CHARS:
            pieces.append(" ".join(current))
            current = []
    return pieces or ["empty corpus"]


def measure(kind: str, steps: list[int], sqlite_cache_bytes: int | None, seed: int = 0) -> list[dict]:
    from rag.store.knowledge_store import KnowledgeStore
    from system.process_memory import process_tree_memory

    rng = np.random.default_rng(seed)
    pieces = corpus_chunks()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "k.sqlite3"
        store = KnowledgeStore(db, dim=DIM, index_kind=kind, sqlite_cache_bytes=sqlite_cache_bytes)
        stored, doc = 0, 0
        for target in steps:
            while stored < target:
                batch = []
                for _ in range(DOCS_PER_BATCH):
                    chunks = [
                        f"[{doc}.{i}] {pieces[(doc * CHUNKS_PER_DOC + i) % len(pieces)]}" for i in range(CHUNKS_PER_DOC)
                    ]
                    vectors = rng.standard_normal((CHUNKS_PER_DOC, DIM)).astype(np.float32)
                    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                    batch.append(
                        (
                            f"d{doc}",
                            chunks,
                            vectors,
                            {"source": f"doc-{doc % 50}", "year": 2000 + doc % 25},
                            sum(map(len, chunks)),
                        )
                    )
                    doc += 1
                store.upsert_documents("bench", "c", batch)
                stored += DOCS_PER_BATCH * CHUNKS_PER_DOC
            for q in range(20):  # in use: dense, lexical and filtered searches warm SQLite's cache and FTS5
                vector = rng.standard_normal(DIM).astype(np.float32)
                store.search("bench", "c", vector, 8)
                store.search_lexical("bench", "c", pieces[q % len(pieces)][:60], 8)
                store.search("bench", "c", vector, 8, filters={"source": f"doc-{q}"})
            memory = process_tree_memory()
            db_bytes = sum(p.stat().st_size for p in Path(tmp).glob("k.sqlite3*"))
            rows.append(
                {
                    "kind": kind,
                    "chunks": stored,
                    "pss_bytes": memory["measured_bytes"],
                    "db_bytes": db_bytes,
                    "anon_bytes": memory.get("anon_bytes"),
                    "file_bytes": memory.get("file_bytes"),
                }
            )
            print(
                f"[bench] {kind} {stored:>7,} chunks: {memory['measured_bytes'] / 2**20:7.1f} MiB PSS, "
                f"database {db_bytes / 2**20:6.1f} MiB",
                flush=True,
            )
        store.close()
    return rows


def slope(rows: list[dict]) -> float:
    """Bytes per chunk: least squares over the steps after the first (the first also pays one-time costs)."""
    xs = np.array([r["chunks"] for r in rows[1:]], dtype=float)
    ys = np.array([r["pss_bytes"] for r in rows[1:]], dtype=float)
    return float(np.polyfit(xs, ys, 1)[0]) if len(xs) >= 2 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["flat", "hnsw"])
    parser.add_argument("--steps", nargs="+", type=int, default=[500, 5_000, 10_000, 20_000, 40_000])
    parser.add_argument(
        "--sqlite-cache-mib",
        type=int,
        default=None,
        help="SQLite's page cache (retriever.sqlite_cache_bytes); default SQLite's own 2 MiB",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where the result goes")
    args = parser.parse_args()
    rows = []
    for kind in args.kinds:
        rows += measure(kind, args.steps, args.sqlite_cache_mib and args.sqlite_cache_mib * 2**20)
    slopes = {kind: slope([r for r in rows if r["kind"] == kind]) for kind in args.kinds}
    for kind, value in slopes.items():
        print(f"[bench] {kind}: {value:,.0f} bytes per chunk")
    path = write_result(
        new_result(
            NAME,
            {
                "kinds": args.kinds,
                "steps": args.steps,
                "dim": DIM,
                "sqlite_cache_mib": args.sqlite_cache_mib,
                "chunk_chars": CHUNK_CHARS,
            },
            {f"bytes_per_chunk_{k}": v for k, v in slopes.items()},
            rows,
        ),
        args.out_dir,
    )
    print(f"[bench] wrote {path}")


if __name__ == "__main__":
    main()
