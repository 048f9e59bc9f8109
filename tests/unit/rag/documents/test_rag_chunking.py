import copy
from pathlib import Path

import pytest

from rag.documents.chunking import (
    CLAUSE,
    INSIDE_WORD,
    LINE,
    PARAGRAPH,
    PUNCTUATION,
    SENTENCE,
    WORD,
    Chunk,
    Chunker,
    break_level,
    fast_tokenizer_spans,
    word_spans,
)

MODEL_DIR = Path(__file__).resolve().parents[4] / "models" / "all-MiniLM-L6-v2"

PARAGRAPHS = [
    "Retrieval augmented generation grounds a chat model in documents it has never seen. "
    "The documents are split into chunks, every chunk is embedded, and the vectors go into an index. "
    "At question time the question is embedded too, and the nearest chunks become the context!",
    "Why count tokens instead of characters? Because the embedder reads at most 256 tokens, "
    "and anything after that is silently dropped; a chunk measured in characters can easily overflow, "
    "especially with numbers like 3.14159, identifiers like user_id_42, or words such as antidisestablishmentarianism.",
    "Short paragraph.",
    "Lines matter as well:\nfirst line of a list,\nsecond line of a list,\nthird line, with a comma, and more words after it.",
    "FAISS keeps the vectors in memory while SQLite keeps the source of truth on disk. "
    "On restart every index is rebuilt from the rows, so a crash between the two writes loses nothing. "
    "Tenants never see each other's collections, because every lookup is keyed by the tenant first. "
    "Naïve café owners in Zürich also deserve good retrieval, don't they?",
]
TEXT = "\n\n".join(PARAGRAPHS)


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    assert (MODEL_DIR / "tokenizer_config.json").exists(), f"no embedder at {MODEL_DIR}: run `make models`"
    return transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))


@pytest.fixture(scope="module")
def count_tokens(tokenizer):
    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


@pytest.fixture(scope="module")
def spans(tokenizer):
    return fast_tokenizer_spans(tokenizer)


def word_count(text: str) -> int:
    return len(text.split())


def assert_covers_in_order(text: str, chunks: list[Chunk]) -> None:
    """Chunks, read in order and allowing each to overlap the previous ones, spell out every word of text."""
    words = text.split()
    covered = 0  # words[:covered] have been produced so far
    prev_start = 0
    for chunk in chunks:
        cw = chunk.text.split()
        assert cw, f"chunk {chunk.index} is empty"
        # The chunk must be a contiguous run of the text starting no later than what is covered (overlap allowed,
        # gaps not) and no earlier than the previous chunk's start; it must add at least one new word.
        starts = [s for s in range(prev_start, covered + 1) if words[s : s + len(cw)] == cw]
        assert starts, f"chunk {chunk.index} {chunk.text[:60]!r} does not continue the text at word {covered}"
        start = max(starts, key=lambda s: s + len(cw))
        assert start + len(cw) > covered, f"chunk {chunk.index} adds no new words"
        prev_start, covered = start, start + len(cw)
    assert covered == len(words), f"only {covered} of {len(words)} words covered"


# ---- real tokenizer ----------------------------------------------------------------------


def test_the_text_is_longer_than_the_chunks(count_tokens):
    assert count_tokens(TEXT) > 200  # the largest chunk size used below
    # The real tokenizer is not a word counter: sub-words and punctuation add tokens.
    assert count_tokens(TEXT) > word_count(TEXT)


@pytest.mark.parametrize("chunk_tokens,overlap", [(200, 30), (64, 16), (40, 8), (24, 0), (16, 4), (20, 19)])
def test_chunks_fit_and_cover_every_word_in_order(count_tokens, spans, chunk_tokens, overlap):
    chunks = Chunker(spans, chunk_tokens, overlap).split(TEXT)
    assert len(chunks) >= 2
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for chunk in chunks:
        assert 0 < count_tokens(chunk.text) <= chunk_tokens, chunk.text
        assert chunk.text == chunk.text.strip()
    assert_covers_in_order(TEXT, chunks)


def test_smaller_chunks_give_more_chunks(spans):
    sizes = [len(Chunker(spans, size, 0).split(TEXT)) for size in (200, 64, 24)]
    assert sizes[0] < sizes[1] < sizes[2]


def test_whole_text_that_fits_is_one_chunk(spans):
    padded = "\n  " + TEXT + "  \n"
    chunks = Chunker(spans, 1000, 50).split(padded)
    assert chunks == [Chunk(index=0, text=TEXT, start=3, end=3 + len(TEXT))]


def test_paragraph_boundaries_are_preferred(count_tokens, spans):
    first = (
        "The embedder measures every chunk with its own tokenizer, "
        "so the limits it enforces are the ones the model really has."
    )
    second = (
        "Paragraph boundaries are the best place to cut a document, "
        "because a paragraph usually holds one complete idea."
    )
    a, b = count_tokens(first), count_tokens(second)
    size = max(a, b) + 2  # each paragraph fits on its own ...
    assert a + b > size  # ... but both together do not
    text = f"{first}\n\n{second}"

    chunks = Chunker(spans, size, 0).split(text)
    # A greedy word packer would move the start of the second paragraph into the first chunk.
    assert [c.text for c in chunks] == [first, second]

    # Overlap does not drag half of the first paragraph into the second chunk either.
    chunks = Chunker(spans, size, 5).split(text)
    assert [c.text for c in chunks] == [first, second]

    # With room for both, they stay together.
    assert [c.text for c in Chunker(spans, a + b + 5, 0).split(text)] == [text]


def test_sentence_boundaries_are_preferred_inside_a_paragraph(count_tokens, spans):
    sentences = [
        "The first sentence talks about vectors and indexes.",
        "The second sentence talks about tenants and isolation.",
        "The third sentence talks about restarts and persistence.",
    ]
    text = " ".join(sentences)
    size = max(count_tokens(s) for s in sentences) + 1
    assert count_tokens(sentences[0] + " " + sentences[1]) > size
    assert [c.text for c in Chunker(spans, size, 0).split(text)] == sentences


def test_unbroken_long_token_run_is_cut_to_fit(count_tokens, spans):
    url = "https://example.com/a/very/long/path?with=query&and=more&x=1"
    text = f"See {url} for details, then stop."
    assert count_tokens(url) > 10
    chunks = Chunker(spans, 10, 0).split(text)
    assert all(count_tokens(c.text) <= 10 for c in chunks)
    # Without overlap, the characters come back in order (only whitespace is lost at the cuts).
    assert "".join(c.text for c in chunks).replace(" ", "") == text.replace(" ", "")


@pytest.mark.parametrize("text", ["", " ", "\n\n", " \t\n \n\n  "])
def test_empty_or_whitespace_text_gives_no_chunks(spans, text):
    assert Chunker(spans, 32, 4).split(text) == []


# ---- pure logic with a fake word counter ---------------------------------------------------


@pytest.mark.parametrize("chunk_tokens,overlap", [(10, 10), (10, 11), (1, 1), (5, 100)])
def test_overlap_not_smaller_than_chunk_size_raises(chunk_tokens, overlap):
    with pytest.raises(ValueError, match=r"overlap .* must be smaller than chunk size"):
        Chunker(word_spans, chunk_tokens, overlap)


@pytest.mark.parametrize(
    "text, previous_end, next_start, level",
    [
        ("one.\n\ntwo", 4, 6, PARAGRAPH),
        ("one.\n \t\ntwo", 4, 8, PARAGRAPH),
        ("one\ntwo", 3, 4, LINE),
        ("one. two", 4, 5, SENTENCE),
        ("one? two", 4, 5, SENTENCE),
        ("one, two", 4, 5, CLAUSE),
        ("one two", 3, 4, WORD),
        ("os.path", 3, 4, PUNCTUATION),
        ("walking", 4, 4, INSIDE_WORD),
        ("x\u0301y", 1, 2, INSIDE_WORD),  # a combining accent the tokenizer dropped is not a space
    ],
)
def test_break_levels(text, previous_end, next_start, level):
    assert break_level(text, previous_end, next_start) == level


def test_break_levels_go_from_paragraphs_to_inside_words():
    assert PARAGRAPH < LINE < SENTENCE < CLAUSE < WORD < PUNCTUATION < INSIDE_WORD


def test_word_counter_packs_words_without_overlap():
    chunks = Chunker(word_spans, 5, 0).split("one two three four five six seven eight nine ten eleven")
    assert chunks == [
        Chunk(0, "one two three four five", 0, 23),
        Chunk(1, "six seven eight nine ten", 24, 48),
        Chunk(2, "eleven", 49, 55),
    ]


def test_word_counter_overlap_repeats_the_tail_of_the_previous_chunk():
    text = "one two three four five six seven eight nine ten eleven"
    chunks = Chunker(word_spans, 5, 2).split(text)
    assert [c.text for c in chunks] == [
        "one two three four five",
        "four five six seven eight",
        "seven eight nine ten eleven",
    ]
    assert_covers_in_order(text, chunks)


def test_word_counter_prefers_paragraphs_then_sentences():
    text = "alpha beta gamma. delta epsilon.\n\nzeta eta theta iota."
    assert [c.text for c in Chunker(word_spans, 5, 0).split(text)] == [
        "alpha beta gamma. delta epsilon.",
        "zeta eta theta iota.",
    ]
    # A smaller size has to cut the first paragraph, and does so at the sentence end.
    assert [c.text for c in Chunker(word_spans, 3, 0).split(text)] == [
        "alpha beta gamma.",
        "delta epsilon.",
        "zeta eta theta",
        "iota.",
    ]


def test_word_counter_respects_the_size_on_long_random_text():
    import random

    rng = random.Random(7)
    vocab = ["w%d" % i for i in range(40)]
    paragraphs = []
    for _ in range(12):
        sentences = [
            " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 15))) + rng.choice([".", "?", "!"])
            for _ in range(rng.randint(1, 5))
        ]
        paragraphs.append(" ".join(sentences))
    text = "\n\n".join(paragraphs)
    for size, overlap in [(7, 2), (12, 0), (30, 10)]:
        chunks = Chunker(word_spans, size, overlap).split(text)
        assert all(0 < word_count(c.text) <= size for c in chunks)
        assert_covers_in_order(text, chunks)


def test_chunks_are_frozen():
    chunk = Chunker(word_spans, 5, 0).split("hello world")[0]
    assert chunk == Chunk(index=0, text="hello world", start=0, end=11)
    with pytest.raises(AttributeError):
        chunk.text = "changed"


# ---- offsets -------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_tokens,overlap", [(200, 30), (40, 8), (16, 4)])
def test_offsets_point_at_the_chunk_in_the_document(spans, chunk_tokens, overlap):
    text = "  \n" + TEXT + "\n\nNaïve x\u0301y 😀 end.  "  # accents, a dropped combining mark, an emoji ([UNK])
    chunks = Chunker(spans, chunk_tokens, overlap).split(text)
    for chunk in chunks:
        assert text[chunk.start : chunk.end] == chunk.text
    assert chunks[0].start == 3 and chunks[-1].text.endswith("end.") and chunks[-1].end == len(text) - 2
    assert [c.start for c in chunks] == sorted(c.start for c in chunks)


def test_word_spans_offsets_and_overlap():
    text = "one two  three\nfour five six seven eight"
    chunks = Chunker(word_spans, 4, 1).split(text)
    # The line end is the best cut; a cut there overlaps only by whole lines, so not at all here.
    assert [(c.text, c.start, c.end) for c in chunks] == [
        ("one two  three", 0, 14),
        ("four five six seven", 15, 34),
        ("seven eight", 29, 40),
    ]
    assert all(text[c.start : c.end] == c.text for c in chunks)


def test_a_document_is_tokenized_once():
    calls = []

    def counting_spans(text):
        calls.append(text)
        return word_spans(text)

    Chunker(counting_spans, 8, 2).split(" ".join(f"w{i}" for i in range(500)))
    assert len(calls) == 1


def test_chunks_are_at_least_half_full_unless_last():
    text = "Title\n\n" + " ".join(f"w{i}" for i in range(40))
    chunks = Chunker(word_spans, 10, 0).split(text)
    assert chunks[0].text.startswith("Title\n\nw0")  # the heading is not a chunk of its own
    assert all(len(c.text.split()) >= 5 for c in chunks[:-1])


# ---- the batched, vectorised path is the per-gap definition --------------------------------------------------


def _reference_windows(text: str, spans_of, chunk_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """The chunker as it was, one break_level call per gap considered: what the vectorised one must equal."""
    spans = [tuple(s) for s in spans_of(text)]
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    out, first, stop, count = [], 0, 0, len(spans)
    while first < count:
        if count - first <= chunk_tokens:
            stop, level = count, PARAGRAPH
        else:
            lowest = max(first + max(1, chunk_tokens // 2), stop + 1)
            stop, level = first + chunk_tokens, INSIDE_WORD + 1
            for candidate in range(first + chunk_tokens, lowest - 1, -1):
                here = break_level(text, ends[candidate - 1], starts[candidate])
                if here < level:
                    stop, level = candidate, here
                    if here == PARAGRAPH:
                        break
        out.append((starts[first], ends[stop - 1]))
        if stop == count:
            break
        nxt = stop
        for candidate in range(max(first + 1, stop - overlap), stop):
            if break_level(text, ends[candidate - 1], starts[candidate]) <= level:
                nxt = candidate
                break
        first = nxt
    return out


def _varied_texts() -> list[str]:
    import random

    rng = random.Random(45)
    alphabet = list("abcXYZ019 .,;:!?-'\"()\n\t") + [
        "\n\n",
        " \n \n",
        "\u00a0",
        "é",
        "ß",
        "中文",
        "\u2003",
        "\x1c",
        "\u0301",
        "🙂",
        "\r\n",
        "...",
        "  ",
    ]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 3000))) for _ in range(40)]
    data = Path(__file__).resolve().parents[3] / "data"
    texts += [p.read_text(errors="replace") for p in sorted(data.glob("*")) if p.suffix in {".txt", ".md", ".html"}]
    return texts + [TEXT, "", " ", "\n\n\n", "x"]


def test_every_gaps_vectorised_level_is_break_levels():
    import numpy as np

    from rag.documents.chunking import break_levels

    for text in _varied_texts():
        spans = np.asarray(word_spans(text) + [], dtype=np.int64).reshape(-1, 2)
        # also a tokenizer that drops characters and overlaps spans, as real ones do at odd input
        odd = np.array([(i, min(len(text), i + 2)) for i in range(0, len(text), 3)], dtype=np.int64).reshape(-1, 2)
        for s in (spans, odd):
            expected = [break_level(text, int(s[i - 1, 1]), int(s[i, 0])) for i in range(1, len(s))]
            assert break_levels(text, s[:, 0], s[:, 1]).tolist() == expected


def test_batched_tokenizing_in_pieces_gives_the_whole_documents_spans_and_chunks(tokenizer, spans, monkeypatch):
    """A long document is cut at spaces and line ends into pieces tokenized in one batch; the spans (so the
    chunks) are exactly those of tokenizing it whole."""
    import numpy as np

    from rag.documents import chunking

    monkeypatch.setattr(chunking, "PIECE_CHARS", 700)  # many pieces per document, even for the small ones
    texts = _varied_texts()
    # the reference on a private copy: a tokenizer called with truncation or padding keeps them on its backend
    backend = copy.deepcopy(tokenizer.backend_tokenizer)
    backend.no_truncation()
    backend.no_padding()
    whole = [
        np.asarray(backend.encode(t, add_special_tokens=False).offsets, dtype=np.int64).reshape(-1, 2) for t in texts
    ]
    assert spans._splits_on_whitespace  # BERT's pre-tokenizer: the pieces path is the one tested
    assert any(len(spans._pieces(t)) > 3 for t in texts)
    for got, expected in zip(spans.many(texts), whole):
        assert np.array_equal(got, expected)
    for size, overlap in ((200, 30), (64, 8), (16, 4)):
        chunker = Chunker(spans, size, overlap)
        batched = chunker.split_many(texts)
        for text, chunks in zip(texts, batched):
            assert [(c.start, c.end) for c in chunks] == _reference_windows(text, spans, size, overlap)
            assert all(c.text == text[c.start : c.end] for c in chunks)
