"""rag.retrieval.filters: the metadata filter shape, its validation, and the SQL it becomes (run on SQLite)."""

import json
import sqlite3

import pytest

from rag.retrieval.filters import MAX_FILTER_KEYS, MAX_IN_VALUES, InvalidFilter, metadata_condition, normalize_filters

DOCS = {
    "a": {"source": "hr", "year": 2024, "draft": False, "tags": ["policy", "travel"]},
    "b": {"source": "hr", "year": 2025.0, "draft": True},
    "c": {"source": "it", "year": "2024", "nested": {"source": "hr"}},
    "d": {"source": ["hr", "it"], "a.b": "dotted", "sp ace[0]": "odd", "ünï": "cödé", 'q"uo\\te': 1},
    "e": {},
}


def matching(filters) -> set[str]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE docs (id TEXT, metadata TEXT)")
    db.executemany("INSERT INTO docs VALUES (?, ?)", [(k, json.dumps(v)) for k, v in DOCS.items()])
    condition, params = metadata_condition(filters, "metadata")
    return {row[0] for row in db.execute(f"SELECT id FROM docs WHERE {condition}", params)}


@pytest.mark.parametrize(
    "filters, expected",
    [
        (None, {"a", "b", "c", "d", "e"}),
        ({}, {"a", "b", "c", "d", "e"}),
        ({"source": "hr"}, {"a", "b", "d"}),  # d's list contains "hr"; c's nested object does not count
        ({"source": "hr", "year": 2024}, {"a"}),
        ({"year": 2025}, {"b"}),  # 2025 == 2025.0: numbers compare as numbers
        ({"year": "2024"}, {"c"}),  # ... but a string is not a number
        ({"year": {"in": [2024, "2024"]}}, {"a", "c"}),
        ({"draft": False}, {"a"}),  # booleans are not 0/1
        ({"draft": {"in": [True, False]}}, {"a", "b"}),
        ({"tags": "travel"}, {"a"}),
        ({"tags": {"in": ["x", "policy"]}, "source": {"in": ["hr"]}}, {"a"}),
        ({"nested": "hr"}, set()),  # an object's members never match
        ({"a.b": "dotted"}, {"d"}),  # dotted keys are literal keys, not paths
        ({"sp ace[0]": "odd", "ünï": "cödé", 'q"uo\\te': 1}, {"d"}),  # stored ASCII-escaped by json.dumps
        ({"missing": "x"}, set()),
        ({"source": "HR"}, set()),  # case-sensitive
    ],
)
def test_matches(filters, expected):
    assert matching(filters) == expected


def test_canonical_form_and_its_idempotence():
    canonical = normalize_filters({"source": "hr", "year": {"in": [2024, 2025]}})
    assert canonical == {"source": {"in": ["hr"]}, "year": {"in": [2024, 2025]}}
    assert normalize_filters(canonical) == canonical
    assert normalize_filters(None) == {} == normalize_filters({})


@pytest.mark.parametrize(
    "filters, message",
    [
        ([("source", "hr")], "filters must be an object"),
        ({"year": {"gt": 2020}}, "filters.year: unknown operator 'gt'"),
        ({"year": {"in": 2020}}, "filters.year.in must be a non-empty list"),
        ({"year": {"in": []}}, "filters.year.in must be a non-empty list"),
        ({"year": {}}, "filters.year.in must be a non-empty list"),
        ({"year": [2024]}, 'filters.year: a list is not a filter value; for any of several values use {"in"'),
        ({"year": {"in": [[2024]]}}, "filters.year.in[0]: a list is not a filter value"),
        ({"year": {"in": [1, {"x": 1}]}}, "filters.year.in[1]: an object is not a filter value"),
        ({"year": None}, "filters.year: null is not a filter value"),
        ({"year": float("nan")}, "not a finite number"),
        ({"year": 2**70}, "outside the 64-bit range"),
        ({"s": "x" * 513}, "at most 512"),
        ({"a\nb": 1}, "is invalid"),
        ({"": 1}, "is invalid"),
        ({"k" * 65: 1}, "is invalid"),
        ({f"k{i}": 1 for i in range(MAX_FILTER_KEYS + 1)}, f"at most {MAX_FILTER_KEYS} are allowed"),
        ({"k": {"in": list(range(MAX_IN_VALUES + 1))}}, f"at most {MAX_IN_VALUES} are allowed"),
    ],
)
def test_invalid_filters_name_the_field(filters, message):
    with pytest.raises(InvalidFilter) as raised:
        normalize_filters(filters)
    assert message in str(raised.value)


def test_client_text_only_ever_reaches_sql_as_parameters():
    condition, params = metadata_condition({"x') OR 1=1 --": "'; DROP TABLE docs; --"}, "metadata")
    assert "DROP" not in condition and "OR 1=1" not in condition
    assert matching({"x') OR 1=1 --": "'; DROP TABLE docs; --"}) == set()
