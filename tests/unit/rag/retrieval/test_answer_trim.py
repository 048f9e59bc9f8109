"""rag/retrieval/answer_trim.py: a RAG answer cut at its token cap ends at its last complete sentence."""

from __future__ import annotations

import pytest

from rag.retrieval.answer_trim import (
    SentenceHoldback,
    finish_answer,
    last_sentence_end,
    sentence_ends,
    trim_to_sentence,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("It checks the remote ref [1]. Then it overwr", "It checks the remote ref [1]."),
        ("It checks the remote ref. [1] Then it overwr", "It checks the remote ref. [1]"),
        ("Use --force-with-lease.[1][2] It refuses when", "Use --force-with-lease.[1][2]"),
        ("Is it safe? No! A background fetch upd", "Is it safe? No!"),
        ('He said "stop." Then the', 'He said "stop."'),
        ("Set rerere.enabled (see git-config). The cache liv", "Set rerere.enabled (see git-config)."),
        ("Version 2.39.5 is shipped. It sets core.autocrlf to", "Version 2.39.5 is shipped."),
        ("Some tools, e.g. git gc, prune it. Others, i.e. fsck, do", "Some tools, e.g. git gc, prune it."),
        ("Steps:\n1. Run git bisect start.\n2. Mark the bad", "Steps:\n1. Run git bisect start."),
        ("Wait... then retry. And", "Wait... then retry."),
        ("First line.\nSecond line without", "First line."),
        ("The whole answer ends here.", "The whole answer ends here."),
        ("The whole answer ends here. ", "The whole answer ends here."),
    ],
)
def test_a_capped_answer_ends_at_its_last_sentence(text, expected):
    assert trim_to_sentence(text) == expected
    assert finish_answer(text, "length") == expected


@pytest.mark.parametrize(
    "text",
    [
        "no sentence end in this one",
        "1. a list item without",
        "see e.g. the",
        "",
        "version 3.5 of the",
        "the file a.txt and",
    ],
)
def test_an_answer_without_a_sentence_end_is_kept_as_it_is(text):
    assert trim_to_sentence(text) == text


def test_an_answer_that_stopped_on_its_own_is_never_trimmed():
    text = "Complete sentence. And a fragment the model chose to end with"
    assert finish_answer(text, "stop") == text
    assert finish_answer(text, None) == text


def test_a_terminator_at_the_end_counts_only_when_the_text_is_whole():
    assert last_sentence_end("It is 3.", final=True) == len("It is 3.")
    assert last_sentence_end("It is 3.", final=False) is None
    assert sentence_ends("A. B. C", final=False) == [2, 5]


def _stream(deltas: list[str], reason: str) -> tuple[list[str], str]:
    holdback = SentenceHoldback()
    sent = [holdback.feed(d) for d in deltas]
    return sent, holdback.finish(reason)


STREAMS = [
    ["It ", "checks", " the ref", " [", "1]. ", "Then it", " pushes. And", " the rest"],
    ["One.", " Two", "!", " Three?", " Fo", "ur [2", "] five"],
    ["No", " end", " at", " all"],
    ["Ends", " exactly", " here."],
    ["Version 3", ".", "5 is", " out. Next"],
    ["A", ".", " ", "[", "3", "]", " B", ". C"],
    ["Steps:\n1", ".", " Run it.\n2", ". Mark"],
    ["x" * 50 + ".", "[1]" * 30, " tail"],
]


@pytest.mark.parametrize("deltas", STREAMS)
@pytest.mark.parametrize("reason", ["length", "stop"])
def test_the_stream_sends_what_the_whole_answer_would_be(deltas, reason):
    sent, rest = _stream(deltas, reason)
    assert "".join(sent) + rest == finish_answer("".join(deltas), reason)


def test_the_first_sentence_streams_at_once_and_only_the_partial_sentence_is_held():
    holdback = SentenceHoldback()
    assert holdback.feed("It") == "It"  # nothing sent yet can be dropped: no hold before the first end
    assert holdback.feed(" checks") == " checks"
    assert holdback.feed(" the ref. Th") == " the ref."
    assert holdback.feed("en it") == ""
    assert holdback.feed(" pushes. Partial") == " Then it pushes."
    assert holdback.finish("length") == ""
    assert holdback.finish("length") == ""  # a second finish sends nothing more


def test_a_stopped_stream_gets_its_held_tail():
    holdback = SentenceHoldback()
    assert holdback.feed("Done. And more") == "Done."
    assert holdback.finish("stop") == " And more"


def test_holdback_work_stays_bounded_on_a_long_stream():
    holdback = SentenceHoldback()
    out = [holdback.feed("word. " if i % 7 == 0 else "word ") for i in range(5000)]
    assert "".join(out) + holdback.finish("length") == trim_to_sentence(
        "".join("word. " if i % 7 == 0 else "word " for i in range(5000))
    )


def test_any_split_of_an_answer_streams_what_the_whole_answer_would_be():
    import random

    pieces = [
        "It",
        " checks",
        ".",
        " ",
        "[1]",
        "[2",
        "]",
        "3",
        ".5",
        " e.g",
        ".",
        "\n2",
        "?",
        "!",
        '"',
        ")",
        " word",
        "...",
        " i.e.",
        "。",
        "x",
    ]
    rng = random.Random(46)
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 8))))
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        for reason in ("length", "stop"):
            sent, rest = _stream(deltas, reason)
            assert "".join(sent) + rest == finish_answer(text, reason), (deltas, reason)
