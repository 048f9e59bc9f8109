"""rag.retrieval.batch_features on the real all-MiniLM-L6-v2: the fast batch features are the model's own
preprocess, tensor for tensor, on chunks of four documentation corpora we did not write; a model they do not
reproduce keeps its own path; and the embedder's tokenize-ahead (its GPU path) gives the same vectors."""

import gzip
import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from rag.retrieval.batch_features import PROBE_TEXTS, fast_batch_features
from rag.retrieval.embedding import SentenceTransformerEmbedder

ROOT = Path(__file__).resolve().parents[4]
MODEL_DIR = ROOT / "models" / "all-MiniLM-L6-v2"
CORPORA = ["stdlib-pydoc", "apache-doc", "git-doc", "rsyslog-doc"]


@pytest.fixture(scope="module")
def embedder():
    assert (MODEL_DIR / "config.json").exists(), f"no embedder at {MODEL_DIR}: run `make models`"
    return SentenceTransformerEmbedder(str(MODEL_DIR), batch_size=16)


def _chunks(embedder, corpus: str, documents: int = 6) -> list[str]:
    with gzip.open(ROOT / "bench" / "data" / f"{corpus}.jsonl.gz", "rt") as handle:
        texts = [json.loads(line)["text"] for line, _ in zip(handle, range(documents))]
    return [c.text for chunks in embedder.chunk_documents(texts) for c in chunks]


def _same(fast: dict, expected: dict) -> None:
    assert set(fast) == set(expected)
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert fast[name].dtype == torch.int64 and torch.equal(fast[name], value.long()), name
        else:
            assert fast[name] == value, name


@pytest.mark.parametrize("corpus", CORPORA)
def test_the_fast_features_are_the_models_own_on_real_chunks(embedder, corpus):
    fast = fast_batch_features(embedder.model)
    assert fast is not None  # MiniLM's fast tokenizer reproduces preprocess, so the embedder uses it
    chunks = _chunks(embedder, corpus)
    assert len(chunks) > 20
    for start in range(0, len(chunks), 16):  # batches of mixed lengths: padding to each batch's longest
        batch = chunks[start : start + 16]
        _same(fast(batch), embedder.model.preprocess(batch))


def test_the_fast_features_agree_on_odd_text(embedder):
    rng = random.Random(7)
    alphabet = "aZ09 \t\n\r.,;:!?-_/\\'\"()[]{}<>éüßøÆ漢字かなДжΩ🙂\u00a0\u200b\u0301\x00\x07"
    odd = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 900))) for _ in range(40)]
    fast = fast_batch_features(embedder.model)
    for batch in (odd[:20], odd[20:], PROBE_TEXTS, ["", " ", "\n"]):
        _same(fast(batch), embedder.model.preprocess(batch))


def test_a_model_the_fast_features_do_not_reproduce_keeps_its_own_preprocess(embedder):
    class Stripping:  # a model whose preprocess edits the text first: what the check must catch
        tokenizer = embedder.model.tokenizer
        max_seq_length = embedder.model.max_seq_length

        def preprocess(self, texts):
            return embedder.model.preprocess([t.upper() + " extra" for t in texts])

    class NoFastTokenizer:
        tokenizer = object()

    class MoreInputs(Stripping):
        def preprocess(self, texts):
            return {**embedder.model.preprocess(texts), "pixel_values": torch.zeros(1)}

    assert fast_batch_features(Stripping()) is None
    assert fast_batch_features(NoFastTokenizer()) is None
    assert fast_batch_features(MoreInputs()) is None


def test_tokenizing_ahead_gives_the_same_vectors_and_starts_before_the_turn_ends(embedder, monkeypatch):
    """The GPU path (tokenize the next batch on its own thread while this one is in the model), run here on
    CPU: the same vectors and token counts as one encode, and batch k+1 is tokenized before batch k's turn
    ends (each turn waits, bounded, for it: without tokenizing ahead the waits run out and the order differs)."""
    texts = _chunks(embedder, "git-doc", 3)[:40]
    expected = embedder.model.encode(texts, batch_size=16, normalize_embeddings=True)
    serial = embedder.embed(texts)
    monkeypatch.setattr(embedder, "_tokenize_ahead", ThreadPoolExecutor(1, thread_name_prefix="test-tokenize"))
    events: list[str] = []
    real_prepare = embedder._prepare

    def prepare(batch):
        events.append(f"tokenize {len(batch)}")
        return real_prepare(batch)

    monkeypatch.setattr(embedder, "_prepare", prepare)
    turns = 0

    @contextmanager
    def guard(_texts):
        nonlocal turns
        turns += 1
        try:
            yield lambda forward: forward()
        finally:
            for _ in range(200):
                if turns == 3 or sum(e.startswith("tokenize") for e in events) > turns:
                    break
                threading.Event().wait(0.01)
            events.append(f"turn {turns} ends")

    ahead = embedder.embed(texts, guard)
    np.testing.assert_allclose(ahead["vectors"], expected, atol=1e-5)
    np.testing.assert_array_equal(ahead["vectors"], serial["vectors"])
    assert ahead["tokens"] == serial["tokens"] == embedder.tokens_read(texts)
    assert events == ["tokenize 16", "tokenize 16", "turn 1 ends", "tokenize 8", "turn 2 ends", "turn 3 ends"]
