"""Embedding: raw sentence-transformers `encode` against poolserve's chunk + embed path.

Corpus: 50 generated documents (about 200-900 words each, seeded), all-MiniLM-L6-v2 from
models/all-MiniLM-L6-v2, batch_size 32, normalized float32 vectors. Three paths per torch
thread count:
  raw-docs      model.encode(documents): the baseline. MiniLM reads at most 256 tokens, so
                long documents are silently cut: fast, but most of the text is never embedded.
  raw-chunks    model.encode(chunks) of the same chunks poolserve makes, chunked beforehand
                (the encode cost of the whole text, without the chunking cost)
  poolserve     what deployments/embedder.py does for an ingest: Chunker (the model's own
                tokenizer, 200-token chunks, 30 overlap, as configs/cpu-tiny.yaml) + encode +
                the count of tokens read
Each path is run `--repeats` times after one warm-up; the best wall time is reported.

Run it under the shared lock (writes bench/results/embedding.json):
    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_embedding.py
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, when run as a script

from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.timing import best_of  # noqa: E402

NAME = "embedding"
MODEL = ROOT / "models" / "all-MiniLM-L6-v2"

SUBJECTS = [
    "The harbour authority",
    "The city library",
    "Our support team",
    "The research group",
    "The regional railway",
    "The water board",
    "The hospital's night shift",
    "The school council",
    "The cooperative bakery",
    "The museum's archive",
    "The cloud platform team",
    "The wind farm",
]
VERBS = [
    "introduced",
    "reviewed",
    "postponed",
    "expanded",
    "replaced",
    "documented",
    "measured",
    "simplified",
    "audited",
    "automated",
    "relocated",
    "published",
]
OBJECTS = [
    "its maintenance schedule",
    "the annual budget",
    "a new ticketing system",
    "the backup procedure",
    "the visitor guidelines",
    "its data retention policy",
    "the emergency plan",
    "the onboarding course",
    "the inventory of spare parts",
    "the public opening hours",
    "the energy report",
    "the safety checklist",
]
REASONS = [
    "after complaints from residents",
    "because the old process took too long",
    "to meet the new regulation",
    "following an internal audit",
    "when two senior staff members retired",
    "to reduce costs by a tenth",
    "after a storm damaged the east building",
    "because demand doubled over the winter",
]
DETAILS = [
    "The change took effect on {d} {m} and affected about {n} people.",
    "A report of {n} pages describes the results in detail.",
    "Staff received {n} hours of training before the {m} deadline.",
    "The cost was estimated at {n} thousand crowns, paid from the reserve fund.",
    "Questions can be sent to the front desk, which answers within {d} working days.",
    "An evaluation is planned for {m}, when the first full year of figures is available.",
]
MONTHS = ["January", "March", "April", "June", "September", "November"]


def corpus(n_docs: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        paragraphs = []
        for _ in range(rng.randint(3, 10)):
            sentences = []
            for _ in range(rng.randint(3, 7)):
                if rng.random() < 0.6:
                    sentences.append(
                        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(REASONS)}."
                    )
                else:
                    sentences.append(
                        rng.choice(DETAILS).format(d=rng.randint(1, 28), m=rng.choice(MONTHS), n=rng.randint(3, 900))
                    )
            paragraphs.append(" ".join(sentences))
        docs.append("\n\n".join(paragraphs))
    return docs


def run(n_docs: int, threads_list: list[int], repeats: int, batch_size: int, seed: int) -> BenchResult:
    import numpy as np
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    from rag.documents.chunking import Chunker, fast_tokenizer_spans

    model = SentenceTransformer(str(MODEL), device="cpu", local_files_only=True)
    tokenizer = model.tokenizer
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    limit = max(16, int(model.max_seq_length) - 2)
    chunker = Chunker(fast_tokenizer_spans(tokenizer), *chunker_setting(limit))
    docs = corpus(n_docs, seed)
    words = sum(len(d.split()) for d in docs)
    doc_tokens = [count(d) for d in docs]
    print(
        f"torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}; "
        f"{len(docs)} docs, {words} words, {sum(doc_tokens)} tokens "
        f"(max_seq_length {model.max_seq_length}: {sum(t > limit for t in doc_tokens)} docs are cut by raw encode)"
    )

    def encode(texts):
        return model.encode(
            texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        ).astype(np.float32)

    def poolserve():
        chunks = [c.text for d in docs for c in chunker.split(d)]
        vectors = encode(chunks)
        read = sum(min(count(t) + 2, model.max_seq_length) for t in chunks)
        return chunks, vectors, read

    chunks = [c.text for d in docs for c in chunker.split(d)]
    read_raw = sum(min(t + 2, model.max_seq_length) for t in doc_tokens)
    read_chunks = sum(min(count(t) + 2, model.max_seq_length) for t in chunks)

    rows = []
    for threads in threads_list:
        torch.set_num_threads(threads)
        t_raw, _ = best_of(lambda: encode(docs), repeats)
        t_chunks, _ = best_of(lambda: encode(chunks), repeats)
        t_pool, (pool_chunks, _, _) = best_of(poolserve, repeats)
        t_chunk_only, _ = best_of(lambda: [chunker.split(d) for d in docs], repeats)
        for path, n_in, n_out, tokens, t in (
            ("raw-docs", len(docs), len(docs), read_raw, t_raw),
            ("raw-chunks", len(chunks), len(chunks), read_chunks, t_chunks),
            ("poolserve", len(docs), len(pool_chunks), read_chunks, t_pool),
            ("chunking only", len(docs), len(pool_chunks), 0, t_chunk_only),
        ):
            rows.append(
                {
                    "threads": threads,
                    "path": path,
                    "texts_in": n_in,
                    "vectors_out": n_out,
                    "tokens_embedded": tokens,
                    "best_wall_s": t,
                    "docs_s": len(docs) / t,
                    "vectors_s": n_out / t,
                    "docs_s_vs_raw_docs": t_raw / t,
                }
            )
    config = {
        "docs": n_docs,
        "words": words,
        "doc_tokens": sum(doc_tokens),
        "threads": threads_list,
        "repeats": repeats,
        "batch_size": batch_size,
        "seed": seed,
        "model": str(MODEL),
        "chunk_tokens": chunker_setting(limit)[0],
        "chunk_overlap": chunker_setting(limit)[1],
    }
    metrics = {f"poolserve_docs_s_{r['threads']}t": r["docs_s"] for r in rows if r["path"] == "poolserve"}
    return new_result(NAME, config, metrics, rows)


def chunker_setting(limit: int) -> tuple[int, int]:
    """Chunk size and overlap as configs/cpu-tiny.yaml sets them, within the model's window."""
    return min(200, limit), min(30, limit // 4)


def tables(result: BenchResult) -> str:
    lines = [
        "| torch threads | path | texts in | vectors out | tokens embedded | best wall s | docs/s | vectors/s | "
        "docs/s vs raw-docs |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result.rows:
        lines.append(
            f"| {r['threads']} | {r['path']} | {r['texts_in']} | {r['vectors_out']} | {r['tokens_embedded']} | "
            f"{r['best_wall_s']:.2f} | {r['docs_s']:.1f} | {r['vectors_s']:.1f} | {r['docs_s_vs_raw_docs']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=50)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    result = run(args.docs, [int(t) for t in args.threads.split(",")], args.repeats, args.batch_size, args.seed)
    print()
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)}")


if __name__ == "__main__":
    main()
