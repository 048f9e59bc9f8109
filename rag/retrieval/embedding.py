"""The sentence-transformers embedder and its tokenizer-aware chunker, in-process.

deployments/embedder.py serves it as a Ray replica; bench/bench_rag_quality.py and
bench/bench_ingest.py use it directly.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from rag.documents.chunking import Chunk, Chunker, fast_tokenizer_spans

# Runs one forward pass (a no-argument callable) and returns its result.
ForwardRunner = Callable[[Callable[[], Any]], Any]
# Entered around each forward pass of at most batch_size texts; it yields the runner of that pass. The
# replica takes its turn there (one batch's activations at a time) and runs the pass on its one forward
# thread with the batch's thread count.
BatchGuard = Callable[[int], AbstractContextManager[ForwardRunner]]


@contextmanager
def no_guard(_texts: int) -> Iterator[ForwardRunner]:
    yield lambda forward: forward()


class SentenceTransformerEmbedder:
    def __init__(
        self,
        model_path: str,
        batch_size: int = 32,
        chunk_tokens: int = 200,
        chunk_overlap: int = 30,
        device: str = "cpu",
        query_prefix: str = "",
    ):
        from sentence_transformers import SentenceTransformer

        self.batch_size = batch_size
        self.query_prefix = query_prefix
        self.device = device
        self.model = SentenceTransformer(model_path, device=device, local_files_only=True)
        self.dimension = int(self.model.get_sentence_embedding_dimension())
        self.max_seq_length = int(self.model.max_seq_length)
        tokenizer = self.model.tokenizer
        self.count_tokens = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
        self.token_spans = fast_tokenizer_spans(tokenizer)  # one tokenization per document, with offsets
        self.chunker = self.make_chunker(chunk_tokens, chunk_overlap)
        self._tokens_in_batches = 0
        self._count_what_encode_reads()

    def _count_what_encode_reads(self) -> None:
        """Counts the tokens of every batch encode tokenizes (its attention mask), so usage is the tokens the
        model read without tokenizing the texts a second time: that second pass cost 0.45 ms a chunk on a
        2-core host, more than a GPU's whole forward pass of a chunk (0.34 ms on an H100). encode calls the
        model's `preprocess` once a batch (sentence-transformers 6.2; tests/unit/test_rag_embedding.py holds
        it to tokens_read)."""
        preprocess = self.model.preprocess

        def counting(inputs, *args, **kwargs):
            features = preprocess(inputs, *args, **kwargs)
            mask = features.get("attention_mask") if hasattr(features, "get") else None  # a BatchEncoding too
            if mask is not None:
                self._tokens_in_batches += int(mask.sum())
            return features

        self.model.preprocess = counting

    def release_device_cache(self) -> None:
        """On a GPU, hand the caching allocator's free blocks back to the device: batches of varied shapes
        leave blocks that fit no later batch, and the replica's device memory crept 0.5% over its plan after
        2,967 chunks on an H100 (docs/GPU.md). At rest it then holds weights, context and one batch's peak."""
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def make_chunker(self, chunk_tokens: int, chunk_overlap: int) -> Chunker:
        # Chunks must fit what the model reads (max_seq_length includes [CLS]/[SEP]).
        limit = max(16, self.max_seq_length - 2)
        return Chunker(self.token_spans, min(chunk_tokens, limit), min(chunk_overlap, limit // 4))

    def embed(
        self, texts: list[str], guard: BatchGuard = no_guard, batch_size: Callable[[], int] | None = None
    ) -> dict:
        """Unit-length float32 vectors and the tokens the model actually read.

        Longest first, batch_size at a time (the model's, or less where the caller's `batch_size()` says so
        before each batch; what encode does inside one call, so padding stays as small), each batch its own
        encode under `guard`: between two batches another caller (a question) can take its turn instead of
        waiting for the whole list."""
        vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        start, tokens = 0, 0
        while start < len(order):
            size = max(1, min(batch_size(), self.batch_size)) if batch_size else self.batch_size
            rows = order[start : start + size]
            start += len(rows)
            batch = [texts[i] for i in rows]
            with guard(len(rows)) as run:  # one batch in the model at a time: the count is this batch's
                vectors[rows], read = run(lambda: self._encode_counting(batch, size))
            tokens += read
        return {"vectors": vectors, "tokens": tokens}

    def _encode_counting(self, batch: list[str], size: int) -> tuple[np.ndarray, int]:
        before = self._tokens_in_batches
        vectors = self.model.encode(
            batch, batch_size=size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return vectors, self._tokens_in_batches - before

    def tokens_read(self, texts: list[str]) -> int:
        """Tokens as the model reads them: with its special tokens, cut at max_seq_length, by tokenizing
        them again (embed counts them from its own batches; benches and tests use this)."""
        if not texts:
            return 0
        return sum(
            len(ids)
            for ids in self.model.tokenizer(
                texts,
                truncation=True,
                max_length=self.max_seq_length,
                return_attention_mask=False,
                return_token_type_ids=False,
            )["input_ids"]
        )

    def embed_query(self, text: str, guard: BatchGuard = no_guard) -> np.ndarray:
        """A question's vector: with the model's query instruction in front (bge-*-v1.5 wants one;
        documents are embedded as they are)."""
        return self.embed([self.query_prefix + text], guard)["vectors"][0]

    def chunk(self, text: str) -> list[Chunk]:
        """The document's chunks, each with its character offsets in `text`."""
        return self.chunker.split(text)

    def chunk_documents(self, texts: list[str]) -> list[list[Chunk]]:
        """chunk() of each document, tokenized in one batch over the tokenizer's threads."""
        return self.chunker.split_many(texts)
