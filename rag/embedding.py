"""The sentence-transformers embedder and its tokenizer-aware chunker, in-process.

deployments/embedder.py serves it as a Ray replica; bench/bench_rag_quality.py uses it directly.
"""

from __future__ import annotations

import numpy as np

from rag.chunking import Chunk, Chunker, fast_tokenizer_spans


class SentenceTransformerEmbedder:
    def __init__(self, model_path: str, batch_size: int = 32, chunk_tokens: int = 200, chunk_overlap: int = 30,
                 device: str = "cpu"):
        from sentence_transformers import SentenceTransformer

        self.batch_size = batch_size
        self.model = SentenceTransformer(model_path, device=device, local_files_only=True)
        self.dimension = int(self.model.get_sentence_embedding_dimension())
        self.max_seq_length = int(self.model.max_seq_length)
        tokenizer = self.model.tokenizer
        self.count_tokens = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
        self.token_spans = fast_tokenizer_spans(tokenizer)  # one tokenization per document, with offsets
        self.chunker = self.make_chunker(chunk_tokens, chunk_overlap)

    def make_chunker(self, chunk_tokens: int, chunk_overlap: int) -> Chunker:
        # Chunks must fit what the model reads (max_seq_length includes [CLS]/[SEP]).
        limit = max(16, self.max_seq_length - 2)
        return Chunker(self.token_spans, min(chunk_tokens, limit), min(chunk_overlap, limit // 4))

    def embed(self, texts: list[str]) -> dict:
        """Unit-length float32 vectors and the tokens the model actually read."""
        vectors = self.model.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=False,
        ).astype(np.float32)
        # One batched call (the fast tokenizer's Rust loop), as the model reads them: with its special
        # tokens, cut at max_seq_length.
        read = sum(len(ids) for ids in self.model.tokenizer(
            texts, truncation=True, max_length=self.max_seq_length,
            return_attention_mask=False, return_token_type_ids=False)["input_ids"])
        return {"vectors": vectors, "tokens": read}

    def chunk(self, text: str) -> list[Chunk]:
        """The document's chunks, each with its character offsets in `text`."""
        return self.chunker.split(text)
