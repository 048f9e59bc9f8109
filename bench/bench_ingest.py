"""Ingestion speed: raw sentence-transformers encoding against poolserve's ingest, side by side.

Corpus: the first --documents documents of bench/data/stdlib-pydoc.jsonl.gz (long pydoc reference
pages; the corpus of bench/bench_rag_quality.py). They are chunked once with the embedder's own
chunker (rag.retrieval.embedding, 200 tokens / 30 overlap as configs/cpu-tiny.yaml) and each chunk gets its
document's title in front, exactly as rag.retrieval.pipeline embeds them. Then, in one run, on the same
chunks:

  raw          SentenceTransformer.encode(the embedded texts), batch 32, normalized: the encoder's
               own speed, nothing else (the chunks were made beforehand)
  pipeline     rag.retrieval.pipeline.RagPipeline.ingest in-process (rag/local.py: the real embedder and a real
               KnowledgeStore in a temporary directory), --docs-per-request documents per call, as a
               client posts them: chunking + embedding + storing
  stack        (with --stack-url) POST /v1/collections/{c}/documents to a running stack, the same
               requests: the gateway, the embedder and the retriever replicas, over Ray

Every path runs once per round (--rounds), raw and pipeline once per torch thread count of
--threads, each after one warm-up batch; the fastest round counts (others' work on a shared machine
only slows a run down) and every round's chunks/s is listed beside it. The stack's embedder uses
its profile's threads (embedder.torch_threads, and up to embedder.ingest_threads of idle cores for
document batches), whatever --threads says. "vs raw" divides chunks/s by raw's at the same thread
count; "vs raw-best" by the fastest raw row: what a user of sentence-transformers gets here.
--chat also measures the chat engine's decode speed alone and while the stack ingests (64-token
completions one after another), and the ingest's speed beside it.

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_ingest.py                 # in-process only
    # and through a private stack it starts and stops (bench/harness/stack.py), chat beside it:
    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_ingest.py --profile configs/cpu-tiny.yaml --chat
    # or through a stack that is already running:
    .venv/bin/python bench/bench_ingest.py --stack-url http://127.0.0.1:PORT --api-key "$KEY" --chat

The result goes to bench/results/ingest.json (bench/harness/results.py's format; `bench/run.py all`
runs it with --profile and --chat).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.stack import poolserve_stack  # noqa: E402
from rag.retrieval.embedding import SentenceTransformerEmbedder  # noqa: E402
from rag.local import LocalEmbedder, LocalIndex  # noqa: E402
from rag.retrieval.pipeline import DocumentInput, PipelineSettings, RagPipeline  # noqa: E402
from rag.store.knowledge_store import KnowledgeStore  # noqa: E402

CORPUS = ROOT / "bench" / "data" / "stdlib-pydoc.jsonl.gz"
MODEL = ROOT / "models" / "all-MiniLM-L6-v2"
TENANT, COLLECTION = "bench", "bench-ingest"
NAME = "ingest"  # bench/results/ingest.json


def load_documents(count: int) -> list[DocumentInput]:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as lines:
        docs = [DocumentInput(id=d["id"], text=d["text"]) for d in map(json.loads, lines)]
    return docs[:count]


def requests_of(docs: list, size: int) -> list[list]:
    return [docs[i : i + size] for i in range(0, len(docs), size)]


def row(path: str, threads, chunks: int, tokens: int, seconds: float, **extra) -> dict:
    return {
        "path": path,
        "threads": threads,
        "chunks": chunks,
        "tokens": tokens,
        "wall_s": round(seconds, 2),
        "chunks_per_s": round(chunks / seconds, 1),
        "tokens_per_s": round(tokens / seconds),
        **extra,
    }


def run_raw(embedder: SentenceTransformerEmbedder, texts: list[str], tokens: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    embedder.model.encode(texts[: embedder.batch_size], batch_size=embedder.batch_size)  # warm-up
    start = time.perf_counter()
    embedder.model.encode(
        texts, batch_size=embedder.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    return row("raw", threads, len(texts), tokens, time.perf_counter() - start)


class Timed:
    """Wraps the pipeline's embedder and index and adds up where the time goes."""

    def __init__(self, embedder, index):
        self._embedder, self._index = embedder, index
        self.seconds = {"chunk": 0.0, "embed": 0.0, "store": 0.0}

    async def _timed(self, part: str, call):
        start = time.perf_counter()
        try:
            return await call
        finally:
            self.seconds[part] += time.perf_counter() - start

    async def chunk_documents(self, texts):
        return await self._timed("chunk", self._embedder.chunk_documents(texts))

    async def embed_documents(self, texts):
        return await self._timed("embed", self._embedder.embed_documents(texts))

    async def embed_query(self, text):
        return await self._embedder.embed_query(text)

    async def upsert_documents(self, tenant, collection, documents):
        return await self._timed("store", self._index.upsert_documents(tenant, collection, documents))

    async def search(self, tenant, collection, query):
        return await self._index.search(tenant, collection, query)


async def run_pipeline(
    embedder: SentenceTransformerEmbedder, docs: list[DocumentInput], per_request: int, threads: int, workdir: Path
) -> dict:
    import torch

    torch.set_num_threads(threads)
    embedder.embed(["warm up"] * embedder.batch_size)
    store = KnowledgeStore(workdir / f"pipeline-{threads}.sqlite3", dim=embedder.dimension)
    local = LocalEmbedder(embedder)
    timed = Timed(local, LocalIndex(store))
    pipeline = RagPipeline(timed, timed, PipelineSettings())
    start = time.perf_counter()
    chunks = 0
    for batch in requests_of(docs, per_request):
        chunks += sum(await pipeline.ingest(TENANT, COLLECTION, batch))
    seconds = time.perf_counter() - start
    store.close()
    parts = {f"{k}_s": round(v, 2) for k, v in timed.seconds.items()}
    return row("pipeline", threads, chunks, local.tokens, seconds, **parts)


CHAT_PROMPT = "Explain in three sentences what a hash table is."


def chat_loop(http, model: str, until, least: int) -> dict:
    """Chat completions one after another (64 tokens each) until `until()` says stop, at least `least`:
    the engine's decode speed while the ingest runs beside it (or alone)."""
    tokens, seconds, count = 0, 0.0, 0
    while count < least or not until():
        start = time.perf_counter()
        response = http.post(
            "/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": CHAT_PROMPT}],
                "max_tokens": 64,
                "temperature": 0.0,
                "ignore_eos": True,
            },
        )
        response.raise_for_status()
        seconds += time.perf_counter() - start
        tokens += response.json()["usage"]["completion_tokens"]
        count += 1
    return {"chat_requests": count, "chat_tokens_per_s": round(tokens / seconds, 1)}


def run_stack(url: str, api_key: str, docs: list[DocumentInput], per_request: int, with_chat: bool) -> list[dict]:
    """The ingest through the stack; with_chat: also chat alone, then chat and the ingest at once."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=600) as http:
        http.delete(f"/v1/collections/{COLLECTION}")
        warm = http.post(
            f"/v1/collections/{COLLECTION}-warm/documents",
            json={"documents": [{"id": "w", "text": docs[0].text[:2000]}]},
        )
        warm.raise_for_status()
        http.delete(f"/v1/collections/{COLLECTION}-warm")
        model = next(m["id"] for m in http.get("/v1/models").json()["data"] if "minilm" not in m["id"])

        def ingest(path: str, **extra) -> dict:
            start = time.perf_counter()
            chunks = tokens = 0
            for batch in requests_of(docs, per_request):
                response = http.post(
                    f"/v1/collections/{COLLECTION}/documents",
                    json={"documents": [{"id": d.id, "text": d.text} for d in batch]},
                )
                response.raise_for_status()
                chunks += response.json()["chunks"]
                tokens += response.json().get("tokens", 0)
            seconds = time.perf_counter() - start
            http.delete(f"/v1/collections/{COLLECTION}")
            return row(path, "profile", chunks, tokens, seconds, **extra)

        rows = [ingest("stack")]
        if with_chat:
            import threading

            alone = chat_loop(http, model, lambda: True, 4)
            done = threading.Event()
            beside: dict = {}
            chatting = threading.Thread(target=lambda: beside.update(chat_loop(http, model, done.is_set, 1)))
            chatting.start()
            try:
                busy = ingest("stack+chat")
            finally:
                done.set()
                chatting.join()
            rows.append(busy | {"chat_alone_tokens_per_s": alone["chat_tokens_per_s"], **beside})
    return rows


def best_rows(runs: list[dict]) -> list[dict]:
    """Per (path, threads): the fastest of the rounds (others' work on a shared machine only ever slows
    a run down), with every round's chunks/s beside it."""
    best: dict[tuple, dict] = {}
    for run in runs:
        key = (run["path"], run["threads"])
        seen = best.setdefault(key, {**run, "rounds_chunks_per_s": []})
        seen["rounds_chunks_per_s"].append(run["chunks_per_s"])
        if run["wall_s"] < seen["wall_s"]:
            best[key] = {**run, "rounds_chunks_per_s": seen["rounds_chunks_per_s"]}
    return list(best.values())


def table(rows: list[dict]) -> str:
    best_raw = max(r["chunks_per_s"] for r in rows if r["path"] == "raw")
    raw_at = {r["threads"]: r["chunks_per_s"] for r in rows if r["path"] == "raw"}
    lines = [
        "| path | torch threads | chunks | tokens | best wall s | chunks/s | tokens/s | vs raw | vs raw-best "
        "| chunk s | embed s | store s | chunks/s each round | chat tok/s alone, beside |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        same = raw_at.get(r["threads"])
        vs_same = f"{r['chunks_per_s'] / same:.2f}x" if same else "-"
        chat = f"{r['chat_alone_tokens_per_s']}, {r['chat_tokens_per_s']}" if "chat_tokens_per_s" in r else "-"
        lines.append(
            f"| {r['path']} | {r['threads']} | {r['chunks']} | {r['tokens']} | {r['wall_s']} "
            f"| {r['chunks_per_s']} | {r['tokens_per_s']} | {vs_same} | {r['chunks_per_s'] / best_raw:.2f}x "
            f"| {r.get('chunk_s', '-')} | {r.get('embed_s', '-')} | {r.get('store_s', '-')} "
            f"| {', '.join(map(str, r['rounds_chunks_per_s']))} | {chat} |"
        )
    return "\n".join(lines)


async def measure(args, stack_url: str | None, api_key: str | None) -> BenchResult:
    docs = load_documents(args.documents)
    embedder = SentenceTransformerEmbedder(str(MODEL))
    start = time.perf_counter()
    chunked = [embedder.chunk(doc.text) for doc in docs]
    chunk_s = time.perf_counter() - start
    pipeline = RagPipeline(None, None, PipelineSettings())
    texts = [t for doc, chunks in zip(docs, chunked) for t in pipeline.texts_to_embed(doc, chunks)]
    start = time.perf_counter()
    tokens = embedder.tokens_read(texts)
    count_s = time.perf_counter() - start
    print(
        f"{len(docs)} documents, {sum(len(d.text) for d in docs):,} characters -> {len(texts)} chunks, "
        f"{tokens:,} tokens read; chunking alone {chunk_s:.2f} s, counting the tokens read {count_s:.2f} s",
        flush=True,
    )

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for threads in [int(t) for t in args.threads.split(",")]:
                runs.append(run_raw(embedder, texts, tokens, threads))
                print(runs[-1], flush=True)
                runs.append(await run_pipeline(embedder, docs, args.docs_per_request, threads, Path(tmp)))
                print(runs[-1], flush=True)
            if stack_url:
                runs += run_stack(stack_url, api_key, docs, args.docs_per_request, args.chat)
                print(runs[-2:], flush=True)
    rows = best_rows(runs)
    print(table(rows))
    config = {
        "documents": len(docs),
        "characters": sum(len(d.text) for d in docs),
        "chunks": len(texts),
        "tokens": tokens,
        "docs_per_request": args.docs_per_request,
        "rounds": args.rounds,
        "threads": args.threads,
        "stack": stack_url is not None,
        "chat": args.chat,
    }
    metrics = {
        "chunking_s": round(chunk_s, 3),
        "count_tokens_s": round(count_s, 3),
        **{f"{r['path']}@{r['threads']}_chunks_per_s": r["chunks_per_s"] for r in rows},
    }
    return new_result(NAME, config, metrics, rows)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=8, help="the first N documents of the corpus")
    parser.add_argument("--docs-per-request", type=int, default=4)
    parser.add_argument("--threads", default="1,2", help="torch thread counts for raw and pipeline")
    parser.add_argument("--rounds", type=int, default=3, help="every path once per round; the best round counts")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="start a private stack from this profile (bench/harness/stack.py) and ingest through it",
    )
    parser.add_argument("--stack-url", default=None, help="or a running stack's URL (with --api-key)")
    parser.add_argument("--api-key", default=os.environ.get("POOLSERVE_API_KEY"))
    parser.add_argument(
        "--chat",
        action="store_true",
        help="with a stack: also ingest while chatting, and report the chat's decode speed alone and beside the ingest",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help=f"where {NAME}.json goes")
    args = parser.parse_args()

    if args.profile:
        with (
            tempfile.TemporaryDirectory(prefix="bench-ingest-") as workdir,
            poolserve_stack(args.profile, Path(workdir)) as server,
        ):
            result = await measure(args, server.base_url, server.api_key)
    else:
        result = await measure(args, args.stack_url, args.api_key)
    print(f"wrote {write_result(result, args.out_dir)}")


if __name__ == "__main__":
    asyncio.run(main())
