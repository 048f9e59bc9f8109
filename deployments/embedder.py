"""Embedder replica: thin Ray glue around rag.embedding.SentenceTransformerEmbedder (sentence-transformers,
plus chunking with the same model's tokenizer)."""

from __future__ import annotations

import threading

from ray import serve

from deployments.process_memory import process_tree_memory, release_freed_heap
from deployments.start_order import wait_for_predecessors
from rag.chunking import Chunk
from rag.embedding import SentenceTransformerEmbedder


@serve.deployment(name="embedder", max_ongoing_requests=64)
class Embedder:
    async def __init__(self, model_path: str, model_id: str, batch_size: int, chunk_tokens: int,
                       chunk_overlap: int, torch_threads: int, start_after: list[tuple[str, str]],
                       device: str):
        import torch

        await wait_for_predecessors("embedder", start_after, serve.get_replica_context().app_name)

        torch.set_num_threads(torch_threads)
        self.model_id = model_id
        # One batch in flight: the plan budgets one batch's activations, and concurrent encodes on the
        # same cores only share them (measured: four at once held 4x the activations, 0.5 GiB over budget).
        self._one_batch = threading.Lock()
        # `cuda` only when the plan gave this replica a GPU share: Ray then sets CUDA_VISIBLE_DEVICES to it.
        self.embedder = SentenceTransformerEmbedder(model_path, batch_size, chunk_tokens, chunk_overlap, device)
        self.dimension = self.embedder.dimension
        self._warm_up()

    def _warm_up(self) -> None:
        # One full batch at the longest input: the first user request is not the one that pays for
        # oneDNN's kernel selection, and the resident footprint is the steady one from the start.
        longest = " ".join(["warm"] * self.embedder.max_seq_length)
        self.embed([longest] * self.embedder.batch_size)

    def embed(self, texts: list[str]) -> dict:
        """Unit-length float32 vectors and the tokens the model actually read."""
        with self._one_batch:
            result = self.embedder.embed(texts)
            # torch frees a batch's activations to glibc, which keeps them; hand them back to the pool
            # (a few ms) so a replica at rest holds weights + runtime, as planned.
            release_freed_heap(collect=False)
        return result

    def chunk(self, text: str) -> list[Chunk]:
        return self.embedder.chunk(text)

    def memory(self) -> dict:
        return process_tree_memory()

    def ready(self) -> bool:
        return True
