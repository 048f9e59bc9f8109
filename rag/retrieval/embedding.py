"""The sentence-transformers embedder and its tokenizer-aware chunker, in-process.

deployments/embedder.py serves it as a Ray replica; bench/bench_rag_quality.py and
bench/bench_ingest.py use it directly.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import numpy as np

from rag.documents.chunking import Chunk, Chunker, fast_tokenizer_spans
from rag.retrieval.batch_features import fast_batch_features


def use_attention_without_shape_plans(device: str) -> bool:
    """On a GPU, take cuDNN out of torch's attention choices for this process; True where it did.

    torch 2.11 (the GPU bundle's) sends attention with a padding mask to cuDNN first on sm90 and newer, and
    cuDNN builds an execution plan for each new (batch, padded length) it meets, per thread, with no bound:
    tens to hundreds of ms each (modelscope/FunASR#3704). An ingest's batches come in many lengths, so the
    replica paid a plan build for most of them; memory-efficient attention runs any shape at once. The
    replica's embed calls of 2,967 chunks: 0.70 s with it off on an H100, 5.33 s there before (docs/GPU.md)."""
    if not device.startswith("cuda"):
        return False
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)
    return True


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
        use_attention_without_shape_plans(device)
        self.model = SentenceTransformer(model_path, device=device, local_files_only=True)
        self.dimension = int(self.model.get_sentence_embedding_dimension())
        self.max_seq_length = int(self.model.max_seq_length)
        tokenizer = self.model.tokenizer
        self.count_tokens = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
        self.token_spans = fast_tokenizer_spans(tokenizer)  # one tokenization per document, with offsets
        self.chunker = self.make_chunker(chunk_tokens, chunk_overlap)
        self.model.eval()
        # What encode would prepend (a model's default prompt); the fast batch features are checked without one.
        name = getattr(self.model, "default_prompt_name", None)
        self._prompt = self.model.prompts.get(name) if name else None
        self._batch_features = None if self._prompt else fast_batch_features(self.model)
        # On a GPU the next batch is tokenized on this thread while the current one runs on the device: the
        # tokenizer is the CPU's part of an embed call, and the device waits for it otherwise.
        self._tokenize_ahead = (
            ThreadPoolExecutor(1, thread_name_prefix="embedder-tokenize") if device.startswith("cuda") else None
        )

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
        before each batch; what encode does inside one call, so padding stays as small), each batch's forward
        pass under `guard`: between two batches another caller (a question) can take its turn instead of
        waiting for the whole list. A batch is tokenized before its turn, so the turn holds only the pass."""
        vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        batches = self._rows_in_batches(order, batch_size)
        rows, tokens = next(batches, None), 0
        prepared = self._prepare_soon([texts[i] for i in rows]) if rows else None
        while rows:
            following = next(batches, None)
            features, read = prepared()
            # Tokenizing the following batch starts before this one's turn (on a GPU: beside its forward pass).
            prepared = self._prepare_soon([texts[i] for i in following]) if following else None
            with guard(len(rows)) as run:  # one batch in the model at a time: the count is this batch's
                vectors[rows] = run(lambda: self._forward(features))
            tokens += read
            rows = following
        return {"vectors": vectors, "tokens": tokens}

    def _rows_in_batches(self, order: list[int], batch_size: Callable[[], int] | None) -> Iterator[list[int]]:
        start = 0
        while start < len(order):
            size = max(1, min(batch_size(), self.batch_size)) if batch_size else self.batch_size
            rows = order[start : start + size]
            start += len(rows)
            yield rows

    def _prepare_soon(self, batch: list[str]) -> Callable[[], tuple[Any, int]]:
        """The batch's input features and the tokens the model reads of it, when called: on a GPU computed on
        the tokenizer thread from now on, on a CPU (whose cores the forward pass uses) then, on the caller's."""
        if self._tokenize_ahead is None:
            return lambda: self._prepare(batch)
        return self._tokenize_ahead.submit(self._prepare, batch).result

    def _prepare(self, batch: list[str]) -> tuple[Any, int]:
        if self._batch_features is not None:
            features = self._batch_features(batch)
        elif self._prompt:
            features = self.model.preprocess(batch, prompt=self._prompt)
        else:
            features = self.model.preprocess(batch)
        mask = features.get("attention_mask") if hasattr(features, "get") else None  # a BatchEncoding too
        # Usage is the tokens the model reads (cut at max_seq_length, special tokens in), from the mask.
        return features, int(mask.sum()) if mask is not None else self.tokens_read(batch)

    def _forward(self, features) -> np.ndarray:
        """Unit-length float32 vectors of one prepared batch: encode's forward pass without its tokenizing."""
        import torch

        device = self.model.device
        with torch.inference_mode():
            on_device = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
            vectors = self.model(on_device)["sentence_embedding"]
            return torch.nn.functional.normalize(vectors.float(), p=2, dim=1).cpu().numpy()

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
