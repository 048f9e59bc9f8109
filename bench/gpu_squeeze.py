"""Two measurements against a running GPU stack (bench/bench_gpu_plan.py --squeeze / --ingest).

- squeeze: a helper process takes GPU memory 256 MiB at a time (plain cudaMalloc through torch) until the
  pool guard sheds; every step sends one embeddings request and one ingest. Expected: ingest refused
  first (503 + Retry-After at shed_ingest_at), then all new work (at shed_all_at), no replica lost
  (/healthz 200 throughout), and 200s again once the helper lets go. The helper never takes the last
  512 MiB, so nothing already admitted can run out. The marks come from the plan (planner/guard.py): on an
  H100 running the 27B the last one sits about 1.4 GiB below the card's size, hence the small steps.
- ingest_ratio: the pydoc corpus ingested through the stack (20 documents per request, as clients send
  them) against raw sentence-transformers encoding the same chunks on the same GPU; and the same requests
  through rag.retrieval.pipeline in one process, timed by part (chunk, embed, store), for where the stack's time goes.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
from bench.harness.first_token import server_timing

GIB = 2**30
STEP = 256 * 2**20
HELPER = f"""
import sys, torch
held = []
for line in sys.stdin:
    held.append(torch.empty({STEP}, dtype=torch.uint8, device="cuda"))
    print(len(held), flush=True)
"""
KEEP_FREE = 512 * 2**20
CORPUS = Path(__file__).resolve().parent / "data" / "stdlib-pydoc.jsonl.gz"


def _probe(base_url: str, headers: dict, profile) -> tuple[int, int, str | None]:
    emb = httpx.post(
        f"{base_url}/v1/embeddings",
        headers=headers,
        timeout=60,
        json={"model": profile.embedder.model_id, "input": ["squeeze"]},
    )
    ing = httpx.post(
        f"{base_url}/v1/collections/squeeze/documents",
        headers=headers,
        timeout=60,
        json={"documents": [{"id": "s", "text": "squeeze test document"}]},
    )
    return emb.status_code, ing.status_code, emb.headers.get("retry-after") or ing.headers.get("retry-after")


def squeeze(base_url: str, key: str, profile, sampler, first_mark: float, max_steps: int = 1200) -> dict:
    """first_mark: the plan's shed_ingest_at (planner/guard.py); below it the helper grows without probing."""
    headers = {"Authorization": f"Bearer {key}"}
    helper = subprocess.Popen(
        [sys.executable, "-c", HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    steps, result = [], {"shed_ingest_at_fraction": None, "shed_all_at_fraction": None, "first_mark": first_mark}
    try:
        for _ in range(max_steps):
            sample = sampler.read()
            if sample.free < KEEP_FREE + STEP:
                result["stopped"] = "kept the last 512 MiB free"
                break
            helper.stdin.write("\n")
            helper.stdin.flush()
            held = int(helper.stdout.readline() or 0)
            sample = sampler.read()
            fraction = sample.used / (sample.used + sample.free)
            if fraction < first_mark - 0.01:
                continue  # well below the first mark: grow without asking
            time.sleep(0.6)  # the guard samples every 0.25 s
            sample = sampler.read()
            fraction = sample.used / (sample.used + sample.free)
            emb, ing, retry = _probe(base_url, headers, profile)
            steps.append(
                {
                    "held_gib": round(held * STEP / GIB, 2),
                    "used_fraction": round(fraction, 4),
                    "embeddings": emb,
                    "ingest": ing,
                    "retry_after": retry,
                }
            )
            if ing == 503 and result["shed_ingest_at_fraction"] is None:
                result["shed_ingest_at_fraction"] = round(fraction, 4)
            if emb == 503:
                result["shed_all_at_fraction"] = round(fraction, 4)
                break
        result["healthz_while_shedding"] = httpx.get(f"{base_url}/healthz", timeout=30).status_code
    finally:
        helper.stdin.close()
        helper.wait(timeout=30)
    released = time.monotonic()
    for _ in range(120):
        emb, ing, _ = _probe(base_url, headers, profile)
        if emb == 200 and ing == 200:
            result["recovered_after_s"] = round(time.monotonic() - released, 1)
            break
        time.sleep(0.5)
    result["healthz_after"] = httpx.get(f"{base_url}/healthz", timeout=30).status_code
    result["steps"] = steps
    return result


def _corpus(limit: int) -> list[dict]:
    with gzip.open(CORPUS, "rt") as handle:
        return [json.loads(line) for line, _ in zip(handle, range(limit))]


RAW_ENCODE = """
import asyncio, json, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from bench.bench_ingest import Timed
from rag.local import LocalEmbedder, LocalIndex
from rag.retrieval.embedding import SentenceTransformerEmbedder
from rag.retrieval.pipeline import DocumentInput, PipelineSettings, RagPipeline
from rag.store.knowledge_store import KnowledgeStore
model, batch, chunk_tokens, overlap, device, corpus, per_request, call_chunks = json.loads(sys.argv[1])
raw = SentenceTransformerEmbedder(model, batch, chunk_tokens, overlap, device)  # on a GPU: cuDNN attention off
docs = [json.loads(line)["text"] for line in open(corpus)]
texts = [c.text for d in docs for c in raw.chunk(d)]

def encode_all(cudnn):  # raw sentence-transformers, each on a thread of its own (cuDNN's plans are per thread)
    import torch
    torch.backends.cuda.enable_cudnn_sdp(cudnn)
    raw.model.encode(texts[:64], batch_size=batch)  # warm-up, as the replica's
    started = time.perf_counter()
    raw.model.encode(texts, batch_size=batch, normalize_embeddings=True)
    return time.perf_counter() - started

cuda = device.startswith("cuda")
with ThreadPoolExecutor(1) as fresh:
    seconds = fresh.submit(encode_all, True).result()  # torch's defaults: what a user's raw encode runs
with ThreadPoolExecutor(1) as fresh:
    seconds_without_cudnn = fresh.submit(encode_all, False).result() if cuda else seconds

async def pipeline_parts():  # the stack's pipeline in this one process: where an ingest's time goes
    with tempfile.TemporaryDirectory() as tmp:
        store = KnowledgeStore(Path(tmp) / "parts.sqlite3", dim=raw.dimension)
        timed = Timed(LocalEmbedder(raw), LocalIndex(store))
        pipeline = RagPipeline(timed, timed, PipelineSettings(embed_batch_chunks=call_chunks))
        started = time.perf_counter()
        for i in range(0, len(docs), per_request):
            await pipeline.ingest("t", "c", [DocumentInput(id=f"d{i + j}", text=t)
                                             for j, t in enumerate(docs[i:i + per_request])])
        store.close()
        return {"wall_s": round(time.perf_counter() - started, 3), **{k: round(v, 3) for k, v in timed.seconds.items()}}

with ThreadPoolExecutor(1) as fresh:  # a thread that has run no shape yet, as the replica's forward thread
    parts = fresh.submit(asyncio.run, pipeline_parts()).result()
print(json.dumps({"chunks": len(texts), "seconds": seconds, "seconds_without_cudnn": seconds_without_cudnn,
                  "in_process": parts}))
"""


def ingest_ratio(
    base_url: str, key: str, profile, documents: int = 120, per_request: int = 20, device: str = "cuda"
) -> dict:
    """The stack's ingest against raw sentence-transformers encoding the same chunks. The raw side runs in a
    child process, so this one never holds a CUDA context (the GPU must be empty once the stack stops)."""
    import tempfile

    docs = _corpus(documents)
    headers = {"Authorization": f"Bearer {key}"}
    started = time.perf_counter()
    chunks_stack, parts_ms, request_s = 0, {}, []
    for i in range(0, len(docs), per_request):
        batch = [{"id": f"d{i + j}", "text": d["text"]} for j, d in enumerate(docs[i : i + per_request])]
        reply = httpx.post(
            f"{base_url}/v1/collections/ingest-ratio/documents", headers=headers, timeout=600, json={"documents": batch}
        )
        reply.raise_for_status()
        request_s.append(round(reply.elapsed.total_seconds(), 3))
        for name, ms in server_timing(reply.headers.get("server-timing", "")).items():
            parts_ms[name] = parts_ms.get(name, 0.0) + ms
        chunks_stack += sum(int(d.get("chunks", 0)) for d in reply.json().get("documents", []))
    stack_s = time.perf_counter() - started
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as corpus:
        corpus.write("".join(json.dumps({"text": d["text"]}) + "\n" for d in docs))
        corpus.flush()
        args = [
            profile.embedder.model,
            profile.embedder.batch_size,
            profile.rag.chunk_tokens,
            profile.rag.chunk_overlap,
            device,
            corpus.name,
            per_request,
            profile.rag.embed_batch_chunks,
        ]
        done = subprocess.run(
            [sys.executable, "-c", RAW_ENCODE, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=Path(__file__).resolve().parents[1],
            check=True,
        )
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "documents": len(docs),
        "per_request": per_request,
        "chunks_stack": chunks_stack,
        "chunks_raw": raw["chunks"],
        "stack_chunks_per_s": round(chunks_stack / stack_s, 1),
        "raw_chunks_per_s": round(raw["chunks"] / raw["seconds"], 1),
        "ratio": round((chunks_stack / stack_s) / (raw["chunks"] / raw["seconds"]), 3),
        # raw encode with cuDNN's attention off too, as the replica runs (rag/retrieval/embedding.py)
        "raw_without_cudnn_chunks_per_s": round(raw["chunks"] / raw["seconds_without_cudnn"], 1),
        "ratio_to_raw_without_cudnn": round(
            (chunks_stack / stack_s) / (raw["chunks"] / raw["seconds_without_cudnn"]), 3
        ),
        "in_process_pipeline_s": raw["in_process"],
        "request_s": request_s,
        "server_timing_s": {name: round(ms / 1000, 3) for name, ms in parts_ms.items()},
    }
