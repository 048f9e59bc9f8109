"""Document batch size: the embedder's throughput against the longest wait it makes a question do.

A question's vector waits for the document batch in progress (rag/retrieval/embed_turns.py: one forward pass at a
time, questions before waiting documents), so the wall time of one batch is the most another tenant's RAG
query waits behind a bulk ingest. Smaller batches shorten that wait; this measures what they cost.

Corpora nobody here wrote (bench/data: the SQLite, Apache httpd and TeX Live manuals), chunked as an
ingest chunks them (the profile's chunk_tokens / overlap, the model's tokenizer, titles in front), the
longest first as rag/retrieval/embedding.py orders them. For each corpus, torch thread count and batch size: chunks
per second over `--chunks` chunks (best of `--rounds`), and the p50 / max wall time of one batch.

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_embed_batch.py
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, when run as a script

from bench.harness.results import RESULTS_DIR, new_result, write_result  # noqa: E402
from bench.harness.timing import percentile  # noqa: E402

NAME = "embed-batch"
CORPORA = {"sqlite": "sqlite-doc.jsonl.gz", "apache": "apache-doc.jsonl.gz", "texlive-pdf": "texlive-pdf.jsonl.gz"}


def corpus_chunks(embedder, name: str, count: int, seed: int = 0) -> list[str]:
    """`count` chunk texts (with titles, as an ingest embeds them) drawn from the corpus's documents."""
    from rag.documents.chunking import document_title, with_title

    with gzip.open(ROOT / "bench" / "data" / CORPORA[name], "rt", encoding="utf-8") as lines:
        documents = [json.loads(line) for line in lines]
    random.Random(seed).shuffle(documents)
    texts: list[str] = []
    for doc in documents:
        title = doc.get("title") or document_title(doc["text"], {})
        texts += [with_title(title, chunk.text) for chunk in embedder.chunk(doc["text"])]
        if len(texts) >= count:
            break
    return sorted(texts[:count], key=len, reverse=True)  # the order embed() runs them in


def measure(model, texts: list[str], batch_size: int) -> dict:
    batch_seconds = []
    started = time.perf_counter()
    for start in range(0, len(texts), batch_size):
        t = time.perf_counter()
        model.encode(
            texts[start : start + batch_size],
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        batch_seconds.append(time.perf_counter() - t)
    wall = time.perf_counter() - started
    return {
        "chunks_per_s": len(texts) / wall,
        "batch_p50_s": percentile(batch_seconds, 50),
        "batch_max_s": max(batch_seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpora", default=",".join(CORPORA))
    parser.add_argument("--batch-sizes", default="4,8,16,32")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--chunks", type=int, default=256, help="chunks per corpus")
    parser.add_argument("--rounds", type=int, default=2, help="each setting this often; the best round counts")
    parser.add_argument("--profile", type=Path, default=ROOT / "configs" / "cpu-tiny.yaml")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()

    import torch

    from planner.profile import load_profile
    from rag.retrieval.embedding import SentenceTransformerEmbedder

    profile = load_profile(args.profile)
    model_path = (
        profile.embedder.model if Path(profile.embedder.model).is_absolute() else str(ROOT / profile.embedder.model)
    )
    embedder = SentenceTransformerEmbedder(
        model_path, profile.embedder.batch_size, profile.rag.chunk_tokens, profile.rag.chunk_overlap
    )
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    rows = []
    for corpus in args.corpora.split(","):
        texts = corpus_chunks(embedder, corpus, args.chunks)
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            measure(embedder.model, texts[:64], max(sizes))  # warm-up: oneDNN picks its kernels
            for size in sizes:
                best = max(
                    (measure(embedder.model, texts, size) for _ in range(args.rounds)), key=lambda r: r["chunks_per_s"]
                )
                rows.append(
                    {
                        "corpus": corpus,
                        "threads": threads,
                        "batch_size": size,
                        "chunks": len(texts),
                        **{k: round(v, 4) for k, v in best.items()},
                    }
                )
                print(rows[-1], flush=True)
    for row in rows:  # throughput against the largest batch of the same corpus and threads
        top = next(
            r
            for r in rows
            if r["corpus"] == row["corpus"] and r["threads"] == row["threads"] and r["batch_size"] == max(sizes)
        )
        row["throughput_vs_largest"] = round(row["chunks_per_s"] / top["chunks_per_s"], 3)
    result = new_result(
        NAME,
        config={
            "corpora": args.corpora,
            "batch_sizes": sizes,
            "threads": args.threads,
            "chunks": args.chunks,
            "rounds": args.rounds,
            "profile": str(args.profile.relative_to(ROOT) if args.profile.is_relative_to(ROOT) else args.profile),
        },
        metrics={},
        rows=rows,
    )
    print(write_result(result, args.out_dir))


if __name__ == "__main__":
    main()
