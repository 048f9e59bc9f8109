"""rag.retrieval.embedding.SentenceTransformerEmbedder on the real all-MiniLM-L6-v2: batch by batch under a guard,
the same vectors as one encode call, and the query prefix."""

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from rag.retrieval.embedding import SentenceTransformerEmbedder, use_attention_without_shape_plans

MODEL_DIR = Path(__file__).resolve().parents[4] / "models" / "all-MiniLM-L6-v2"
TEXTS = [
    "A pump moves water.",
    "Short.",
    "The valve opens when the pressure rises above two bar, and closes again.",
    "Tenants never see each other's collections.",
    "Widgets spin.",
]


@pytest.fixture(scope="module")
def embedder():
    assert (MODEL_DIR / "config.json").exists(), f"no embedder at {MODEL_DIR}: run `make models`"
    return SentenceTransformerEmbedder(str(MODEL_DIR), batch_size=2, query_prefix="query: ")


def test_batches_go_through_the_guard_one_at_a_time_longest_first(embedder):
    seen = []

    ran = []

    def run(forward):
        ran.append(len(seen))
        return forward()

    @contextmanager
    def guard(texts):
        seen.append(texts)
        yield run

    result = embedder.embed(TEXTS, guard)
    assert seen == [2, 2, 1] and ran == [1, 2, 3]  # each pass ran through its guard's runner
    expected = embedder.model.encode(TEXTS, batch_size=2, normalize_embeddings=True)
    np.testing.assert_allclose(result["vectors"], expected, atol=1e-5)  # rows stay in the caller's order
    assert result["vectors"].dtype == np.float32
    assert result["tokens"] == sum(len(ids) for ids in embedder.model.tokenizer(TEXTS)["input_ids"])


def test_the_caller_may_shrink_each_batch_never_grow_it(embedder):
    seen, sizes = [], iter([1, 9, 0, 5])  # asked before each batch: 1, more than the model's 2, 0, then 5

    @contextmanager
    def guard(texts):
        seen.append(texts)
        yield lambda forward: forward()

    result = embedder.embed(TEXTS, guard, batch_size=lambda: next(sizes))
    assert seen == [1, 2, 1, 1]  # 9 is cut to the model's batch_size, 0 is one text, 5 what is left
    expected = embedder.model.encode(TEXTS, batch_size=2, normalize_embeddings=True)
    np.testing.assert_allclose(result["vectors"], expected, atol=1e-5)


def test_nothing_to_embed_is_no_batch(embedder):
    result = embedder.embed([], lambda texts: pytest.fail("no batch expected"))
    assert result["vectors"].shape == (0, embedder.dimension) and result["tokens"] == 0


def test_a_question_is_embedded_with_the_query_prefix(embedder):
    np.testing.assert_allclose(
        embedder.embed_query("what moves water?"), embedder.embed(["query: what moves water?"])["vectors"][0], atol=1e-6
    )


def test_usage_is_the_tokens_each_batch_read_counted_without_tokenizing_twice(embedder, monkeypatch):
    """Issue 45: the tokens charged are counted from encode's own batches (cut at max_seq_length, special
    tokens in), equal to tokenizing the texts again, which embed no longer does."""
    long = " ".join(["pressure valve pump"] * 200)  # past max_seq_length: read only up to it
    texts = TEXTS + [long, long[:700], "é" * 300]
    expected = embedder.tokens_read(texts)
    assert expected < sum(len(ids) for ids in embedder.model.tokenizer(texts)["input_ids"])  # truncation counted
    monkeypatch.setattr(embedder, "tokens_read", lambda _texts: pytest.fail("tokenized a second time"))
    assert embedder.embed(texts)["tokens"] == expected
    assert embedder.embed([])["tokens"] == 0


def test_a_gpu_embedder_takes_cudnn_out_of_attention_and_a_cpu_one_leaves_it():
    # The flag is process-wide and exists in CPU builds of torch too (read at every attention dispatch).
    import torch

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert use_attention_without_shape_plans("cpu") is False
        assert torch.backends.cuda.cudnn_sdp_enabled() is True
        assert use_attention_without_shape_plans("cuda:0") is True
        assert torch.backends.cuda.cudnn_sdp_enabled() is False
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
