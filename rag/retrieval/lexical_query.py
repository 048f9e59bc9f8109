"""User text -> an FTS5 MATCH expression that can never be a syntax error.

FTS5's query language gives meaning to quotes, AND/OR/NOT/NEAR, `*`, `^`, `:` (column filters),
`+`, `-` and parentheses. A question such as `what does --flag do?`, `os.path.join`, `NEAR(a b)`
or `E1101:` must neither raise nor be read as an operator, so no user character reaches FTS5
outside a double-quoted string: every term is a quoted phrase, and the phrases are OR-ed (bm25
then ranks chunks that match more, rarer terms higher).

A dotted or underscored identifier (`os.path.join`, `dirs_exist_ok`) becomes both the phrase of
its parts, which matches them adjacent and in order (FTS5's tokenizer splits on the punctuation
the same way), and each part alone, so a chunk that documents `join(a, *p)` still matches.
"""

from __future__ import annotations

import re

# Runs of letters and digits: what FTS5's unicode61 tokenizer keeps as tokens ('_' separates).
_TOKEN = re.compile(r"[^\W_]+")
_QUOTED = re.compile(r'"([^"]*)"')
# Bounds the OR-ed terms of one query, so a pasted page cannot make one MATCH arbitrarily costly.
MAX_TERMS = 48

# Question words and glue that match most chunks: dropped as single terms (bm25 would give them
# almost no weight anyway, but each one widens the candidate scan). Kept inside phrases.
STOPWORDS = frozenset(
    """
a about above after again against all am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers
him his how i if in into is it its itself just me more most my no nor not of off on once only or other our ours
out over own same she should so some such than that the their theirs them then there these they this those
through to too under until up very was we were what when where which while who whom why will with would you your
yours
""".split()
)


def quote(phrase: str) -> str:
    """An FTS5 string: the only escape inside double quotes is doubling the quote."""
    return '"' + phrase.replace('"', '""') + '"'


def _terms(text: str) -> list[str]:
    """Phrases and single terms, in order of appearance, without repeats."""
    terms: list[str] = []
    for quoted in _QUOTED.findall(text):  # the user's own "exact phrase" (or "AND"): kept as asked
        tokens = _TOKEN.findall(quoted)
        if tokens:
            terms.append(" ".join(tokens))
    singles: list[str] = []
    for word in _QUOTED.sub(" ", text).split() + [w for q in _QUOTED.findall(text) for w in q.split()]:
        tokens = _TOKEN.findall(word)
        if len(tokens) > 1:  # an identifier such as os.path.join, dirs_exist_ok or a hyphenated word
            terms.append(" ".join(tokens))
        singles.extend(tokens)
    content = [t for t in singles if t.lower() not in STOPWORDS]
    terms.extend(content or singles)  # a question made only of stopwords still searches for them
    seen: set[str] = set()
    unique = []
    for term in terms:
        key = term.lower()
        if key not in seen:
            seen.add(key)
            unique.append(term)
    return unique[:MAX_TERMS]


def fts5_match(text: str) -> str | None:
    """The MATCH expression for a question, or None when it has no searchable token at all."""
    terms = _terms(text)
    return " OR ".join(quote(term) for term in terms) if terms else None
