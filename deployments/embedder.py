"""Embedder replica: thin Ray glue around rag.retrieval.embedding.SentenceTransformerEmbedder (sentence-transformers,
plus chunking with the same model's tokenizer)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

from ray import serve

from deployments.start_order import StartOrder
from planner.outputs import EmbedderSettings
from rag.documents.chunking import Chunk
from rag.retrieval.embed_turns import BatchTurns, IdleCores, OneForwardThread, WhenIdle, threads_for
from rag.retrieval.embedding import SentenceTransformerEmbedder
from system.priority import lower_cpu_priority
from system.process_memory import process_tree_memory, release_freed_heap


# On a GPU, how long the replica waits without a call before it trims its heap and hands torch's cached device
# blocks back. A trim of a heap of a GPU process's size (about 1 GB, glibc's default arenas) took 21-138 ms on
# this project's CPU host (2026-12-06, bench/results/heap-trim-cost-2026-12-06.json), and an emptied device cache
# makes the next call allocate its blocks again: per call both sat on the way of every embed call of an ingest.
GPU_CLEANUP_IDLE_S = 1.0


@serve.deployment(name="embedder")  # its options: the plan's (deployments/app.py)
class Embedder:
    async def __init__(self, settings: EmbedderSettings, start: StartOrder):
        await start.wait("embedder", serve.get_replica_context().app_name)
        # Before torch starts its OpenMP threads, which inherit it from the thread that starts them.
        lower_cpu_priority(settings.cpu_nice)

        self.model_id = settings.model_id
        self._torch_threads = settings.torch_threads
        self._ingest_threads = max(settings.torch_threads, settings.ingest_threads)
        # One batch in flight: the plan budgets one batch's activations, and concurrent encodes on the
        # same cores only share them (measured: four at once held 4x the activations, 0.5 GiB over budget).
        self._turns = BatchTurns()
        self._question_window_s = settings.question_window_s
        self._forward = OneForwardThread()
        self._idle_cores = IdleCores(len(os.sched_getaffinity(0)))
        # On a GPU a pass's activations live on the device: the host heap does not grow per pass, and a trim
        # per pass would only add its milliseconds to passes of well under one.
        self._release_heap_per_pass = not settings.device.startswith("cuda")
        # After a call, its heap: on CPU at once (the next call's passes run in it); on a GPU, with torch's cached
        # device blocks, once the replica is idle, so a run of calls (an ingest's) pays for the clean-up once.
        self._when_idle = (
            WhenIdle(self._release_at_rest, GPU_CLEANUP_IDLE_S) if not self._release_heap_per_pass else None
        )
        # `cuda` only when the plan gave this replica a GPU share: Ray then sets CUDA_VISIBLE_DEVICES to it.
        self.embedder = SentenceTransformerEmbedder(
            settings.model_path,
            settings.batch_size,
            settings.chunk_tokens,
            settings.chunk_overlap,
            settings.device,
            query_prefix=settings.query_prefix,
        )
        self.dimension = self.embedder.dimension
        self._warm_up()

    def _warm_up(self) -> None:
        # One full batch at the longest input: the first user request is not the one that pays for
        # oneDNN's kernel selection, and the resident footprint is the steady one from the start.
        longest = " ".join(["warm"] * self.embedder.max_seq_length)
        self.embed([longest] * self.embedder.batch_size)
        if self._when_idle is not None:
            # A GPU replica at rest from its first healthy answer on: the stack may report healthy within the idle
            # wait (an H200 measured it 1 s after the warm-up, 1.26x its plan, docs/GPU.md).
            self._release_at_rest()

    def _batches(self, tenant: str, question: bool):
        """The guard of each forward pass: `tenant`'s turn, then the pass on the forward thread, a question's
        on the planned threads, a document batch's on the cores the rest of the machine leaves idle."""

        @contextmanager
        def batch(_texts: int):
            with self._turns.turn(question=question, tenant=tenant):
                threads = (
                    self._torch_threads
                    if question
                    else threads_for(self._idle_cores(), self._torch_threads, self._ingest_threads)
                )
                try:
                    yield self._forward.runner(threads)
                finally:
                    if self._release_heap_per_pass:
                        # Each pass's activations back to the pool before the next: a call of many batches
                        # then peaks at one batch's working set, as planned, where glibc kept the fragments of
                        # all of them (+48-55 MiB over 16 batches of 4 against +32-34, same speed; STRESS.md).
                        release_freed_heap(collect=False)

        return batch

    def embed(self, texts: list[str], tenant: str = "") -> dict:
        """Unit-length float32 vectors of documents (or /v1/embeddings inputs) and the tokens read; each batch
        waits for `tenant`'s turn among the tenants with batches waiting."""
        started = time.perf_counter()
        with self._after_call() as cleanup:
            result = self.embedder.embed(texts, self._batches(tenant, question=False), self._document_batch_size)
        # the caller's timing of where an ingest goes: the whole call, and of it the clean-up after the passes
        return {**result, "busy_s": time.perf_counter() - started, "cleanup_s": cleanup["seconds"]}

    @staticmethod
    def _trim_heap() -> None:
        # torch frees a batch's activations to glibc, which keeps them; hand them back to the pool
        # so a replica at rest holds weights + runtime, as planned.
        release_freed_heap(collect=False)

    def _release_at_rest(self) -> None:
        # a GPU replica idle: its heap, and torch's cached device blocks (batches of varied shapes leave blocks
        # no later batch fits: its device memory crept over its plan without), so at rest it holds its plan
        self._trim_heap()
        self.embedder.release_device_cache()

    @contextmanager
    def _after_call(self):
        """A call's clean-up, its seconds in the dict it yields: on CPU the heap at once; on a GPU nothing per
        call, the heap and device cache once the replica is idle (`GPU_CLEANUP_IDLE_S`)."""
        timing, idle = {"seconds": 0.0}, self._when_idle
        if idle is not None:
            with idle.call():
                yield timing
            return
        yield timing
        cleaning = time.perf_counter()
        self._trim_heap()
        timing["seconds"] = time.perf_counter() - cleaning

    def _document_batch_size(self) -> int:
        """Half a batch while questions come in (each waits for the document batch in progress: 0.06-0.15 s
        instead of 0.12-0.29 on CPU), the whole one otherwise (batches of 2 cost 3-7% of the encoder's speed on
        two threads, docs/BENCHMARKS.md section 8.3)."""
        whole = self.embedder.batch_size
        if self._question_window_s and self._turns.question_within(self._question_window_s):
            return max(1, whole // 2)
        return whole

    def embed_query(self, text: str, tenant: str = ""):
        """A question's vector (with the profile's query prefix), ahead of waiting document batches."""
        with self._after_call():  # as after documents: the replica at rest stays as planned
            return self.embedder.embed_query(text, self._batches(tenant, question=True))

    def chunk_documents(self, texts: list[str]) -> list[list[Chunk]]:
        """Each document's chunks: one call an ingest, tokenized over the planned ingest threads
        (RAYON_NUM_THREADS, planner/plan.py)."""
        with self._after_call():  # the tokenizer's encodings of whole pages, before the embed calls
            return self.embedder.chunk_documents(texts)

    def memory(self) -> dict:
        """The process tree's host memory; on a GPU also what torch's caching allocator holds there (the
        CUDA context is outside it: nvidia-smi's per-process figure counts both)."""
        tree = process_tree_memory()
        if self.embedder.device.startswith("cuda"):
            import torch

            tree["cuda"] = {
                "allocated_bytes": torch.cuda.memory_allocated(),
                "reserved_bytes": torch.cuda.memory_reserved(),
                "max_reserved_bytes": torch.cuda.max_memory_reserved(),
            }
        return tree

    def ready(self) -> bool:
        return True
