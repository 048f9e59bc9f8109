"""Tokenizer-aware chunking in one pass: a chunk is a window over the document's own tokens.

The embedder reads at most `max_seq_length` tokens (256 for MiniLM) and silently drops the rest, so
chunk sizes are counted in its tokens. The document is tokenized once (a fast tokenizer's offset
mapping gives every token's character span) and chunks are windows of at most `chunk_tokens` of
those tokens, cut where the text breaks best: a blank line, then a line end, a sentence end, a
clause, a space. Re-tokenizing every candidate piece, as a recursive character splitter does, costs
many tokenizer calls per chunk; this costs one per document.

A chunk's text is the document's own characters from its first token's start to its last token's
end, so `document[chunk.start:chunk.end] == chunk.text` always holds (citations rely on it).
"""

from __future__ import annotations

import copy

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from rag.documents import TITLE_MAX_CHARS

# Character spans (start, end) of a text's tokens, in order: what a chunker needs from a tokenizer.
TokenSpans = Callable[[str], Sequence[tuple[int, int]]]

# Where a cut between two tokens falls, best first: the chunker cuts at the best one in reach.
PARAGRAPH, LINE, SENTENCE, CLAUSE, WORD, PUNCTUATION, INSIDE_WORD = range(7)
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")
_SENTENCE_END = frozenset(".?!")
_CLAUSE_END = frozenset(";:,")


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    # Character offsets in the document (text == document[start:end]); None when a chunker
    # rewrites the text (word_windows joins words with single spaces) and no span is exact.
    start: int | None = None
    end: int | None = None


def fast_tokenizer_spans(tokenizer) -> TokenSpans:
    """The token spans of a Hugging Face fast tokenizer (one call per text, no special tokens), read from its
    Rust tokenizer directly: transformers' own call turns the offsets into an array through a recursive Python
    flatten that took 2/3 of an ingest's chunking (1.7 of 2.6 s for 120 pydoc pages). A private copy, so no
    truncation or padding the embedder's encode sets on the shared one ever applies to a whole document."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer: transformers' call, which it alone answers
        def spans_slow(text: str) -> np.ndarray:
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                return_attention_mask=False, return_token_type_ids=False, verbose=False)
            return np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        return spans_slow
    own = copy.deepcopy(backend)
    own.no_truncation()
    own.no_padding()

    def spans(text: str) -> np.ndarray:
        return np.asarray(own.encode(text, add_special_tokens=False).offsets, dtype=np.int64).reshape(-1, 2)
    return spans


def word_spans(text: str) -> list[tuple[int, int]]:
    """Whitespace-separated words as tokens: the simplest TokenSpans (tests, tokenizer-free tools)."""
    return [match.span() for match in re.finditer(r"\S+", text)]


def break_level(text: str, previous_end: int, next_start: int) -> int:
    """How good a cut between a token ending at `previous_end` and one starting at `next_start` is."""
    gap = text[previous_end:next_start]
    if not any(c.isspace() for c in gap):
        gap = ""  # characters the tokenizer dropped (accents, control codes) inside a word: no break
    if gap:
        if "\n" in gap:
            return PARAGRAPH if _BLANK_LINE.search(gap) else LINE
        last = text[previous_end - 1]
        return SENTENCE if last in _SENTENCE_END else CLAUSE if last in _CLAUSE_END else WORD
    return INSIDE_WORD if text[previous_end - 1].isalnum() and text[next_start].isalnum() else PUNCTUATION


class Chunker:
    def __init__(self, token_spans: TokenSpans, chunk_tokens: int, overlap_tokens: int):
        if overlap_tokens >= chunk_tokens:
            raise ValueError(f"chunk overlap ({overlap_tokens}) must be smaller than chunk size ({chunk_tokens})")
        if overlap_tokens < 0 or chunk_tokens < 1:
            raise ValueError("chunk size must be positive and overlap not negative")
        self._token_spans = token_spans
        self.chunk_tokens = chunk_tokens
        self.overlap_tokens = overlap_tokens

    def split(self, text: str) -> list[Chunk]:
        spans = np.asarray(self._token_spans(text), dtype=np.int64).reshape(-1, 2)
        starts, ends = spans[:, 0].tolist(), spans[:, 1].tolist()
        count = len(starts)
        chunks: list[Chunk] = []
        first, stop = 0, 0  # the next chunk's first token; the previous chunk's end (exclusive)
        while first < count:
            if count - first <= self.chunk_tokens:
                stop, level = count, PARAGRAPH
            else:
                stop, level = self._cut(text, starts, ends, first, stop)
            start, end = starts[first], ends[stop - 1]
            chunks.append(Chunk(index=len(chunks), text=text[start:end], start=start, end=end))
            if stop == count:
                break
            first = self._next_first(text, starts, ends, first, stop, level)
        return chunks

    def _cut(self, text: str, starts: list[int], ends: list[int], first: int, previous_stop: int) -> tuple[int, int]:
        """(end token, exclusive; its break level): the best break in the window's second half, the
        latest of equals. At least half full, so a heading does not become a chunk of its own, and
        past the previous chunk's end, so every chunk adds text."""
        lowest = max(first + max(1, self.chunk_tokens // 2), previous_stop + 1)
        best_stop, best_level = first + self.chunk_tokens, INSIDE_WORD + 1
        for stop in range(first + self.chunk_tokens, lowest - 1, -1):
            level = break_level(text, ends[stop - 1], starts[stop])
            if level < best_level:
                best_stop, best_level = stop, level
                if level == PARAGRAPH:
                    break
        return best_stop, best_level

    def _next_first(self, text: str, starts: list[int], ends: list[int], first: int, stop: int, level: int) -> int:
        """Where the next chunk begins: up to `overlap_tokens` back from the cut, at a break at least
        as good as the cut's (a cut between paragraphs overlaps by whole paragraphs or not at all)."""
        for candidate in range(max(first + 1, stop - self.overlap_tokens), stop):
            if break_level(text, ends[candidate - 1], starts[candidate]) <= level:
                return candidate
        return stop


def word_windows(text: str, words: int, overlap: int = 0) -> list[str]:
    """Plain windows of `words` whitespace-separated words, `overlap` shared by neighbours: the
    simplest chunking, kept as the baseline the token-aware Chunker is measured against."""
    if not 0 <= overlap < words:
        raise ValueError(f"overlap ({overlap}) must be at least 0 and smaller than the window ({words})")
    tokens = text.split()
    step = words - overlap
    return [" ".join(tokens[i:i + words]) for i in range(0, max(1, len(tokens) - overlap), step) if tokens[i:i + words]]


def document_title(text: str, metadata: dict | None = None) -> str | None:
    """What a document is called: its metadata's "title", else its first line when that line is
    short enough to be a heading (a long one is prose, not a title)."""
    title = (metadata or {}).get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()[:TITLE_MAX_CHARS]
    first = text.strip().split("\n", 1)[0].strip()
    return first if first and len(first) <= TITLE_MAX_CHARS else None


def with_title(title: str | None, chunk: str) -> str:
    """The text to embed for a chunk: its document's title in front, unless the chunk starts with it."""
    return chunk if not title or chunk.startswith(title) else f"{title}\n{chunk}"
