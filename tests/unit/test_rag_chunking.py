from pathlib import Path

import pytest

from rag.chunking import SEPARATORS, Chunk, Chunker

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "all-MiniLM-L6-v2"

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
def count_tokens():
    import transformers

    assert (MODEL_DIR / "tokenizer_config.json").exists(), f"no embedder at {MODEL_DIR}: run `make models`"
    tok = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    return count


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
        starts = [s for s in range(prev_start, covered + 1) if words[s:s + len(cw)] == cw]
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
def test_chunks_fit_and_cover_every_word_in_order(count_tokens, chunk_tokens, overlap):
    chunks = Chunker(count_tokens, chunk_tokens, overlap).split(TEXT)
    assert len(chunks) >= 2
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for chunk in chunks:
        assert 0 < count_tokens(chunk.text) <= chunk_tokens, chunk.text
        assert chunk.text == chunk.text.strip()
    assert_covers_in_order(TEXT, chunks)


def test_smaller_chunks_give_more_chunks(count_tokens):
    sizes = [len(Chunker(count_tokens, size, 0).split(TEXT)) for size in (200, 64, 24)]
    assert sizes[0] < sizes[1] < sizes[2]


def test_whole_text_that_fits_is_one_chunk(count_tokens):
    chunks = Chunker(count_tokens, 1000, 50).split(TEXT)
    assert len(chunks) == 1
    assert chunks[0] == Chunk(index=0, text=TEXT.strip())


def test_paragraph_boundaries_are_preferred(count_tokens):
    first = ("The embedder measures every chunk with its own tokenizer, "
             "so the limits it enforces are the ones the model really has.")
    second = ("Paragraph boundaries are the best place to cut a document, "
              "because a paragraph usually holds one complete idea.")
    a, b = count_tokens(first), count_tokens(second)
    size = max(a, b) + 2  # each paragraph fits on its own ...
    assert a + b > size  # ... but both together do not
    text = f"{first}\n\n{second}"

    chunks = Chunker(count_tokens, size, 0).split(text)
    # A greedy word packer would move the start of the second paragraph into the first chunk.
    assert [c.text for c in chunks] == [first, second]

    # Overlap does not drag half of the first paragraph into the second chunk either.
    chunks = Chunker(count_tokens, size, 5).split(text)
    assert [c.text for c in chunks] == [first, second]

    # With room for both, they stay together.
    assert [c.text for c in Chunker(count_tokens, a + b + 5, 0).split(text)] == [text]


def test_sentence_boundaries_are_preferred_inside_a_paragraph(count_tokens):
    sentences = ["The first sentence talks about vectors and indexes.",
                 "The second sentence talks about tenants and isolation.",
                 "The third sentence talks about restarts and persistence."]
    text = " ".join(sentences)
    size = max(count_tokens(s) for s in sentences) + 1
    assert count_tokens(sentences[0] + " " + sentences[1]) > size
    assert [c.text for c in Chunker(count_tokens, size, 0).split(text)] == sentences


def test_unbroken_long_token_run_is_cut_to_fit(count_tokens):
    url = "https://example.com/a/very/long/path?with=query&and=more&x=1"
    text = f"See {url} for details, then stop."
    assert count_tokens(url) > 10
    chunks = Chunker(count_tokens, 10, 0).split(text)
    assert all(count_tokens(c.text) <= 10 for c in chunks)
    # Without overlap, the characters come back in order (only whitespace is lost at the cuts).
    assert "".join(c.text for c in chunks).replace(" ", "") == text.replace(" ", "")


@pytest.mark.parametrize("text", ["", " ", "\n\n", " \t\n \n\n  "])
def test_empty_or_whitespace_text_gives_no_chunks(count_tokens, text):
    assert Chunker(count_tokens, 32, 4).split(text) == []


# ---- pure logic with a fake word counter ---------------------------------------------------

@pytest.mark.parametrize("chunk_tokens,overlap", [(10, 10), (10, 11), (1, 1), (5, 100)])
def test_overlap_not_smaller_than_chunk_size_raises(chunk_tokens, overlap):
    with pytest.raises(ValueError, match=r"overlap .* must be smaller than chunk size"):
        Chunker(word_count, chunk_tokens, overlap)


def test_separators_go_from_paragraphs_to_characters():
    assert SEPARATORS[0] == "\n\n" and SEPARATORS[1] == "\n"
    assert SEPARATORS[-2:] == [" ", ""]


def test_word_counter_packs_words_without_overlap():
    chunks = Chunker(word_count, 5, 0).split("one two three four five six seven eight nine ten eleven")
    assert chunks == [
        Chunk(0, "one two three four five"),
        Chunk(1, "six seven eight nine ten"),
        Chunk(2, "eleven"),
    ]


def test_word_counter_overlap_repeats_the_tail_of_the_previous_chunk():
    text = "one two three four five six seven eight nine ten eleven"
    chunks = Chunker(word_count, 5, 2).split(text)
    assert [c.text for c in chunks] == [
        "one two three four five",
        "four five six seven eight",
        "seven eight nine ten eleven",
    ]
    assert_covers_in_order(text, chunks)


def test_word_counter_prefers_paragraphs_then_sentences():
    text = "alpha beta gamma. delta epsilon.\n\nzeta eta theta iota."
    assert [c.text for c in Chunker(word_count, 5, 0).split(text)] == [
        "alpha beta gamma. delta epsilon.",
        "zeta eta theta iota.",
    ]
    # A smaller size has to cut the first paragraph, and does so at the sentence end.
    assert [c.text for c in Chunker(word_count, 3, 0).split(text)] == [
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
        sentences = [" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 15))) + rng.choice([".", "?", "!"])
                     for _ in range(rng.randint(1, 5))]
        paragraphs.append(" ".join(sentences))
    text = "\n\n".join(paragraphs)
    for size, overlap in [(7, 2), (12, 0), (30, 10)]:
        chunks = Chunker(word_count, size, overlap).split(text)
        assert all(0 < word_count(c.text) <= size for c in chunks)
        assert_covers_in_order(text, chunks)


def test_chunks_are_frozen():
    chunk = Chunker(word_count, 5, 0).split("hello world")[0]
    assert chunk == Chunk(index=0, text="hello world")
    with pytest.raises(AttributeError):
        chunk.text = "changed"
