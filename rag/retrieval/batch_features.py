"""A batch of texts as the embedding model's input tensors, from its fast tokenizer called directly.

transformers' tokenizer call turns every token of a batch into Python objects before the tensors are built:
for 2,967 chunks of the pydoc corpus it took 1.8 s on a 2-core host, where the Rust tokenizer's own
`encode_batch` took 0.53 s (2026-12-06). On a GPU that Python work, not the forward pass, was most of an
embed call. This module builds the same tensors from the Rust encodings, and is used only where it gives
exactly what the model's own `preprocess` gives (checked once, at construction, on texts that probe
truncation, padding, whitespace and Unicode).
"""

from __future__ import annotations

import copy
import logging
from typing import Callable

import numpy as np

logger = logging.getLogger(__name__)

# What the check compares: texts past max_seq_length (truncation keeps the special tokens), of different
# lengths in one batch (padding), with edge whitespace, control characters, accents and CJK (normalisation).
PROBE_TEXTS = [
    " ".join(["pressure valve pump"] * 200),
    "A pump moves water.",
    "  leading and trailing whitespace \n",
    "Ünïcödé àccents, ÆØÅ, ß, and 漢字 / かな in one line\twith a tab",
    "x",
    "line one\n\nline two\r\nline three",
]

Features = dict  # input name -> torch.Tensor, as the model's forward reads them


class FastBatchFeatures:
    """Input ids, attention mask (and token type ids where the model reads them) of a batch, truncated at
    `max_length` and padded to the batch's longest, as int64 tensors."""

    def __init__(
        self, backend, max_length: int, pad_id: int, pad_token: str, names: tuple[str, ...], extras: dict | None = None
    ):
        self._tokenizer = copy.deepcopy(backend)  # the model's own tokenizer keeps its settings
        self._tokenizer.enable_truncation(max_length)
        self._tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)  # to the longest of each batch
        self._names = names
        self._extras = dict(extras or {})  # the batch's non-tensor tags (sentence-transformers 6: its modality)

    def __call__(self, texts: list[str]) -> Features:
        import torch

        encodings = self._tokenizer.encode_batch(texts)
        columns = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
        }
        tensors = {name: torch.from_numpy(np.array(columns[name], dtype=np.int64)) for name in self._names}
        return {**tensors, **self._extras}


def fast_batch_features(model) -> Callable[[list[str]], Features] | None:
    """FastBatchFeatures for `model` (a SentenceTransformer) when they equal its `preprocess` on PROBE_TEXTS,
    else None (a slow tokenizer, inputs flattened for flash attention, a prompt, a processor that edits
    the text: the caller then uses `preprocess`)."""
    tokenizer = getattr(model, "tokenizer", None)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or tokenizer.pad_token_id is None:
        return None
    try:
        import torch

        expected = model.preprocess(PROBE_TEXTS)
        tensors = {name for name, value in expected.items() if isinstance(value, torch.Tensor)}
        names = tuple(name for name in ("input_ids", "attention_mask", "token_type_ids") if name in tensors)
        if tensors != set(names) or "input_ids" not in names or "attention_mask" not in names:
            return None
        extras = {name: value for name, value in expected.items() if name not in tensors}
        if not all(isinstance(value, (str, int, float, bool, type(None))) for value in extras.values()):
            return None
        pad = (tokenizer.pad_token_id, tokenizer.pad_token)
        fast = FastBatchFeatures(backend, int(model.max_seq_length), *pad, names, extras)
        got = fast(PROBE_TEXTS)
        same = all(
            tuple(got[n].shape) == tuple(expected[n].shape) and bool((got[n] == expected[n].long()).all())
            for n in names
        )
    except Exception as exc:  # any surprise in a library's internals: the model's own path, which is right
        logger.info("embedder: the model's own preprocess (the fast batch features failed: %s)", exc)
        return None
    if not same:
        logger.info("embedder: the model's own preprocess (the fast batch features differ from it)")
        return None
    return fast
