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

from rag.documents.binary_files import TITLE_MAX_CHARS

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


class FastTokenizerSpans:
    """The token spans of a Hugging Face fast tokenizer (no special tokens), read from its Rust tokenizer directly:
    transformers' own call turns the offsets into an array through a recursive Python flatten that took 2/3 of an
    ingest's chunking (1.7 of 2.6 s for 120 pydoc pages). A private copy, so no truncation or padding the
    embedder's encode sets on the shared one ever applies to a whole document.

    `many` tokenizes a list in one `encode_batch`, which the tokenizer spreads over its threads without the GIL
    (where TOKENIZERS_PARALLELISM allows). For a tokenizer that splits words on whitespace before anything else
    (BERT's: MiniLM, mpnet, bge, e5), a long document is cut at spaces and line ends into pieces that tokenize
    exactly as the whole does, so one long page is spread over the threads too."""

    def __init__(self, backend):
        self._own = copy.deepcopy(backend)
        self._own.no_truncation()
        self._own.no_padding()
        self._splits_on_whitespace = (
            type(self._own.pre_tokenizer).__name__ in _WHITESPACE_PRE_TOKENIZERS
            and type(self._own.normalizer).__name__ in _PER_CHARACTER_NORMALIZERS
        )

    def __call__(self, text: str) -> np.ndarray:
        return self.many([text])[0]

    def many(self, texts: Sequence[str]) -> list[np.ndarray]:
        pieces, owner = [], []  # (text, offset in its document); which document each piece is of
        for doc, text in enumerate(texts):
            for start, end in self._pieces(text):
                pieces.append(text[start:end] if (start, end) != (0, len(text)) else text)
                owner.append((doc, start))
        spans: list[list[np.ndarray]] = [[] for _ in texts]
        for i in range(0, len(pieces), _PIECES_PER_CALL):
            encoded = self._own.encode_batch(pieces[i : i + _PIECES_PER_CALL], add_special_tokens=False)
            for (doc, start), encoding in zip(owner[i : i + _PIECES_PER_CALL], encoded):
                spans[doc].append(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2) + start)
        return [
            np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros((0, 2), np.int64)
            for parts in spans
        ]

    def _pieces(self, text: str) -> list[tuple[int, int]]:
        """Where a document is cut for tokenizing in parallel: at a space or line end (both whitespace to BERT's
        normalizer, so no token spans one) about every PIECE_CHARS characters; whole when the tokenizer
        could merge across whitespace, or no such character is near."""
        if not self._splits_on_whitespace or len(text) <= PIECE_CHARS:
            return [(0, len(text))]
        cuts, start = [], 0
        while len(text) - start > PIECE_CHARS:
            target = start + PIECE_CHARS
            cut = text.rfind("\n", start + PIECE_CHARS // 2, target)
            if cut < 0:
                cut = text.rfind(" ", start + PIECE_CHARS // 2, target)
            if cut < 0:
                break  # no break within reach (one enormous word): the rest stays whole
            cuts.append((start, cut))
            start = cut
        cuts.append((start, len(text)))
        return cuts


# A piece of a long document tokenized on its own: small enough to spread a page over threads, large enough
# that each encode call is worth its overhead.
PIECE_CHARS = 8192
# Pieces per encode_batch call: bounds the Encoding objects alive at once (about 200 bytes a token with their
# strings and Python offsets: some 6 MiB for 16 pieces), enough to keep several threads busy.
_PIECES_PER_CALL = 16
_WHITESPACE_PRE_TOKENIZERS = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
_PER_CHARACTER_NORMALIZERS = frozenset(
    {"BertNormalizer", "NoneType", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"}
)


def fast_tokenizer_spans(tokenizer) -> TokenSpans:
    """A tokenizer's TokenSpans: FastTokenizerSpans for a fast one; transformers' call for a slow (Python) one,
    which it alone answers."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return FastTokenizerSpans(backend)

    def spans_slow(text: str) -> np.ndarray:
        encoded = tokenizer(
            text,
            add_special_tokens=False,
            return_offsets_mapping=True,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,
        )
        return np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)

    return spans_slow


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


# Every code point Python calls whitespace (all are below U+3001), and the ASCII letters and digits: what the
# vectorised break levels read, to the same answer as break_level's str methods.
_SPACE_CODES = np.array([c for c in range(0x3001) if chr(c).isspace()], dtype=np.uint32)
_ASCII_ALNUM = np.array([chr(c).isalnum() for c in range(128)])
_SENTENCE_CODES = np.array([ord(c) for c in _SENTENCE_END], dtype=np.uint32)
_CLAUSE_CODES = np.array([ord(c) for c in _CLAUSE_END], dtype=np.uint32)


def _is_alnum(codes: np.ndarray) -> np.ndarray:
    """str.isalnum of each code point: a table for ASCII, Python's answer once per distinct other one."""
    result = np.zeros(len(codes), dtype=bool)
    ascii_ = codes < 128
    result[ascii_] = _ASCII_ALNUM[codes[ascii_]]
    if not ascii_.all():
        others, where = np.unique(codes[~ascii_], return_inverse=True)
        result[~ascii_] = np.array([chr(c).isalnum() for c in others.tolist()])[where]
    return result


def break_levels(text: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """break_level of every gap between neighbouring tokens at once (element i: between token i and i + 1),
    in numpy: the per-gap Python calls were a third of chunking's time. Equal to break_level everywhere
    (tests/unit/rag/documents/test_rag_chunking.py checks it on every gap of real and random texts)."""
    if len(starts) < 2:
        return np.zeros(0, dtype=np.int8)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    previous_end, next_start = ends[:-1], starts[1:]
    spaces = np.concatenate(([0], np.cumsum(np.isin(codes, _SPACE_CODES))))
    newlines = np.concatenate(([0], np.cumsum(codes == 10)))
    # An empty or reversed gap (overlapping offsets) has no whitespace, as text[a:b] is then empty.
    has_space = spaces[next_start] - spaces[previous_end] > 0
    newline_count = np.where(has_space, newlines[next_start] - newlines[previous_end], 0)
    last = codes[previous_end - 1]  # as text[previous_end - 1], a token ending at 0 reads the text's last
    levels = np.where(
        np.isin(last, _SENTENCE_CODES), SENTENCE, np.where(np.isin(last, _CLAUSE_CODES), CLAUSE, WORD)
    ).astype(np.int8)
    levels[newline_count > 0] = LINE
    for i in np.flatnonzero(newline_count > 1).tolist():  # two line ends: a blank line between them?
        if _BLANK_LINE.search(text, int(previous_end[i]), int(next_start[i])):
            levels[i] = PARAGRAPH
    joined = ~has_space
    if joined.any():
        inside = _is_alnum(last[joined]) & _is_alnum(codes[np.minimum(next_start[joined], len(codes) - 1)])
        levels[joined] = np.where(inside, INSIDE_WORD, PUNCTUATION)
    return levels


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
        return self._windows(text, np.asarray(self._token_spans(text), dtype=np.int64).reshape(-1, 2))

    def split_many(self, texts: Sequence[str]) -> list[list[Chunk]]:
        """split() of each text, the tokenizing done in one batch where the token spans allow it (spread
        over the tokenizer's threads)."""
        many = getattr(self._token_spans, "many", None)
        spans = many(list(texts)) if many is not None else [self._token_spans(text) for text in texts]
        return [self._windows(text, np.asarray(s, dtype=np.int64).reshape(-1, 2)) for text, s in zip(texts, spans)]

    def _windows(self, text: str, spans: np.ndarray) -> list[Chunk]:
        starts, ends = spans[:, 0], spans[:, 1]
        levels = break_levels(text, starts, ends)
        count = len(starts)
        chunks: list[Chunk] = []
        first, stop = 0, 0  # the next chunk's first token; the previous chunk's end (exclusive)
        while first < count:
            if count - first <= self.chunk_tokens:
                stop, level = count, PARAGRAPH
            else:
                stop, level = self._cut(levels, first, stop)
            start, end = int(starts[first]), int(ends[stop - 1])
            chunks.append(Chunk(index=len(chunks), text=text[start:end], start=start, end=end))
            if stop == count:
                break
            first = self._next_first(levels, first, stop, level)
        return chunks

    def _cut(self, levels: np.ndarray, first: int, previous_stop: int) -> tuple[int, int]:
        """(end token, exclusive; its break level): the best break in the window's second half, the
        latest of equals. At least half full, so a heading does not become a chunk of its own, and
        past the previous chunk's end, so every chunk adds text. (A cut before token `stop` is gap
        stop - 1 of `levels`.)"""
        lowest = max(first + max(1, self.chunk_tokens // 2), previous_stop + 1)
        highest = first + self.chunk_tokens
        if lowest > highest:
            return highest, INSIDE_WORD + 1
        window = levels[lowest - 1 : highest]
        best = int(window.min())
        return lowest + int(np.flatnonzero(window == best)[-1]), best

    def _next_first(self, levels: np.ndarray, first: int, stop: int, level: int) -> int:
        """Where the next chunk begins: up to `overlap_tokens` back from the cut, at a break at least
        as good as the cut's (a cut between paragraphs overlaps by whole paragraphs or not at all)."""
        lowest = max(first + 1, stop - self.overlap_tokens)
        good = np.flatnonzero(levels[lowest - 1 : stop - 1] <= level)
        return lowest + int(good[0]) if len(good) else stop


def word_windows(text: str, words: int, overlap: int = 0) -> list[str]:
    """Plain windows of `words` whitespace-separated words, `overlap` shared by neighbours: the
    simplest chunking, kept as the baseline the token-aware Chunker is measured against."""
    if not 0 <= overlap < words:
        raise ValueError(f"overlap ({overlap}) must be at least 0 and smaller than the window ({words})")
    tokens = text.split()
    step = words - overlap
    return [
        " ".join(tokens[i : i + words]) for i in range(0, max(1, len(tokens) - overlap), step) if tokens[i : i + words]
    ]


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
