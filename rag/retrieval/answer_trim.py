"""A RAG answer that hits its token cap ends at its last complete sentence.

The embedded chat model (SmolLM2-135M) rarely stops on its own: with the old 256-token default 19 of 20
man-page questions ran to the cap and were cut mid-sentence. An answer whose generation ended by length
(finish_reason "length") is cut back to its last sentence end; one that stopped on its own is left as it
is, and so is a capped one with no sentence end at all (nothing would be left). finish_reason stays
"length" and usage still counts every generated token: only the unfinished tail is not shown.

A sentence end here is `.`, `!` or `?` (or a run of them, or the CJK full stops), then any closing quotes
or brackets and citation markers ("[1]", "[2][3]", " [4]"), followed by whitespace or the end of the text.
Not an end: the full stop of a numbered list item at the start of a line ("2. ") and of a few common
abbreviations ("e.g.", "i.e.", "etc.", "vs.", "cf."). A decimal point ("3.5") or a file name ("a.txt")
is never followed by whitespace, so never an end.

Streams cannot take back what they sent: `SentenceHoldback` passes a choice's text through up to its last
confirmed sentence end and holds only the partial sentence after it, which is sent when the stream stops
on its own and dropped when it stops by length. Text before the first sentence end is never held: it is
kept either way (it is either part of the first sentence or, with no sentence end at all, the whole
answer), so the first token goes out as soon as it comes.
"""

from __future__ import annotations

import re

_TERMINATOR = r"(?:[.!?]+|[。！？]+)"
_CLOSERS = r"[\"'”’)\]»]*"
_CITATIONS = r"(?:[ \t]?\[\d{1,3}\])*"
# A candidate end: terminator, closers, citation markers; its match's end is where the kept text stops.
_CANDIDATE = re.compile(rf"{_TERMINATOR}{_CLOSERS}{_CITATIONS}")
_ABBREVIATIONS = frozenset({"e.g", "i.e", "etc", "vs", "cf"})
_WORD_BEFORE = re.compile(r"([\w.]+)$")
# Longer than any abbreviation: the word before a full stop is read here first, not from the text's start.
_WORD_WINDOW = 32
# A list number alone on its line up to the full stop (`\n?`: a "$" there matched before a final newline too).
_LIST_MARKER = re.compile(r"[ \t]*\d{1,3}\n?")


def _is_end(text: str, start: int, end: int, final: bool) -> bool:
    """Whether the candidate text[start:end] ends a sentence: followed by whitespace (or, when `final`,
    by the end of the text), and not an abbreviation's or a list number's full stop."""
    if end < len(text):
        if not text[end].isspace():
            return False
    elif not final:
        return False  # what comes next decides ("3." may become "3.5")
    if text[start] == ".":
        before = _word_before(text, start)
        if before and before.group(1).lower().rstrip(".") in _ABBREVIATIONS:
            return False
        # Only its own line is read: searching the whole text per full stop made a long stream quadratic.
        if _LIST_MARKER.fullmatch(text, text.rfind("\n", 0, max(0, start - 1)) + 1, start):
            return False
    return True


def _word_before(text: str, start: int) -> re.Match | None:
    """The run of word characters and dots that ends at `start`, read in a window unless it fills it."""
    window = max(0, start - _WORD_WINDOW)
    before = _WORD_BEFORE.search(text, window, start)
    if before and before.start() == window and window > 0:  # the run may begin before the window
        before = _WORD_BEFORE.search(text, 0, start)
    return before


def sentence_ends(text: str, final: bool = True) -> list[int]:
    """Where each sentence of `text` ends (the offset after its terminator, closers and citations).
    `final`: the text is whole, so a terminator at its very end counts."""
    ends = []
    for match in _CANDIDATE.finditer(text):
        if _is_end(text, match.start(), match.end(), final):
            ends.append(match.end())
    return ends


def last_sentence_end(text: str, final: bool = True) -> int | None:
    ends = sentence_ends(text, final)
    return ends[-1] if ends else None


def trim_to_sentence(text: str) -> str:
    """`text` up to its last sentence end; the whole text, as it is, when it has none."""
    end = last_sentence_end(text)
    return text[:end] if end is not None else text


def finish_answer(text: str, finish_reason: str | None) -> str:
    """An answer as shown: cut to its last sentence end when its generation hit the token cap."""
    return trim_to_sentence(text) if finish_reason == "length" else text


class SentenceHoldback:
    """One streamed choice's text: `feed` each delta and send what it returns; `finish` with the
    finish_reason gives the rest to send (all of it when stopped, the complete sentences when capped)."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0  # characters of self.text already released
        self.confirmed = False  # a sentence end has been seen (followed by more text)
        self.open_candidate: int | None = None  # start of a candidate end that reaches the end of the text

    def feed(self, delta: str) -> str:
        if not delta:
            return ""
        self.text += delta
        # Only the new text (and the few characters before it a terminator may straddle) can hold a new end.
        # New ends lie in the new text, or in a candidate that ran to the end of the text before it (its
        # closers and citation markers may go on in this delta); one at self.sent itself (a terminator that
        # was the last character) is confirmed now.
        scan_from = max(0, self.sent - 64)
        if self.open_candidate is not None:
            scan_from = min(scan_from, self.open_candidate)
        end, self.open_candidate = None, None
        for match in _CANDIDATE.finditer(self.text, scan_from):
            if match.end() >= self.sent and _is_end(self.text, match.start(), match.end(), final=False):
                end = match.end()
            if match.end() == len(self.text):
                self.open_candidate = match.start()
        if end is not None:
            self.confirmed = True
        elif not self.confirmed:
            end = len(self.text)  # the first sentence is kept whatever happens: nothing to hold
        if end is None or end <= self.sent:
            return ""
        released, self.sent = self.text[self.sent : end], end
        return released

    def finish(self, finish_reason: str | None) -> str:
        """The held text to send as the stream ends: none of the partial sentence when capped."""
        final = finish_answer(self.text, finish_reason)
        rest = final[self.sent :] if len(final) > self.sent else ""
        self.sent = max(self.sent, len(final))
        return rest
