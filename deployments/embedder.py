"""Embedder replica: sentence-transformers, plus chunking with the same model's tokenizer."""

from __future__ import annotations

import threading

import numpy as np
from ray import serve

from deployments.process_memory import process_tree_memory, release_freed_heap
from deployments.start_order import wait_for_predecessors
from rag.chunking import Chunker


@serve.deployment(name="embedder", max_ongoing_requests=64)
class Embedder:
    async def __init__(self, model_path: str, model_id: str, batch_size: int, chunk_tokens: int,
                       chunk_overlap: int, torch_threads: int, start_after: list[tuple[str, str]],
                       device: str):
        import torch
        from sentence_transformers import SentenceTransformer

        await wait_for_predecessors("embedder", start_after, serve.get_replica_context().app_name)

        torch.set_num_threads(torch_threads)
        self.model_id = model_id
        self.batch_size = batch_size
        # One batch in flight: the plan budgets one batch's activations, and concurrent encodes on the
        # same cores only share them (measured: four at once held 4x the activations, 0.5 GiB over budget).
        self._one_batch = threading.Lock()
        # `cuda` only when the plan gave this replica a GPU share: Ray then sets CUDA_VISIBLE_DEVICES to it.
        self.model = SentenceTransformer(model_path, device=device, local_files_only=True)
        self.dimension = int(self.model.get_sentence_embedding_dimension())
        tokenizer = self.model.tokenizer
        self._count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
        # Chunks must fit what the model reads (max_seq_length includes [CLS]/[SEP]).
        limit = max(16, int(self.model.max_seq_length) - 2)
        self.chunker = Chunker(self._count, min(chunk_tokens, limit), min(chunk_overlap, limit // 4))
        self._warm_up()

    def _warm_up(self) -> None:
        # One full batch at the longest input: the first user request is not the one that pays for
        # oneDNN's kernel selection, and the resident footprint is the steady one from the start.
        longest = " ".join(["warm"] * int(self.model.max_seq_length))
        self.embed([longest] * self.batch_size)

    def embed(self, texts: list[str]) -> dict:
        """Unit-length float32 vectors and the tokens the model actually read."""
        with self._one_batch:
            vectors = self.model.encode(
                texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True,
                show_progress_bar=False,
            ).astype(np.float32)
            # torch frees a batch's activations to glibc, which keeps them; hand them back to the pool
            # (a few ms) so a replica at rest holds weights + runtime, as planned.
            release_freed_heap(collect=False)
        # One batched call (the fast tokenizer's Rust loop), as the model reads them: with its special
        # tokens, cut at max_seq_length.
        read = sum(len(ids) for ids in self.model.tokenizer(
            texts, truncation=True, max_length=int(self.model.max_seq_length),
            return_attention_mask=False, return_token_type_ids=False)["input_ids"])
        return {"vectors": vectors, "tokens": read}

    def chunk(self, text: str) -> list[str]:
        return [chunk.text for chunk in self.chunker.split(text)]

    def memory(self) -> dict:
        return process_tree_memory()

    def ready(self) -> bool:
        return True
