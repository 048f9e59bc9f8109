"""Metadata filters on retrieval: which documents a search may return, by their metadata.

The shape a client sends (HTTP bodies, chat's `rag` field, the search route's `filters` parameter):

    {"source": "hr", "year": {"in": [2024, 2025]}}

Every key names a top-level key of a document's metadata (a dotted key is a literal key, not a
path). A plain value means equality, {"in": [...]} any of the values; all keys must match (AND).
Values are strings, numbers or booleans, compared by type and value: "2024" does not match 2024,
true does not match 1. A metadata value that is a list matches when one of its items does
({"tags": "policy"} matches tags ["hr", "policy"]).

`normalize_filters` validates and returns the canonical form {key: {"in": [values]}}, which it
accepts again unchanged; `metadata_condition` turns it into SQL over a JSON metadata column
(SQLite's json_each): the reference for these semantics. The store filters through an indexed
table instead (rag/store/metadata_index.py), which the tests check against this condition case by case.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_FILTER_KEYS = 16
MAX_IN_VALUES = 64
MAX_VALUE_CHARS = 512
MAX_KEY_CHARS = 64
_KEY = re.compile(r"[^\x00-\x1f\x7f]+")  # any key a client could have stored, without control characters
_INT_RANGE = (-(2**63), 2**63 - 1)  # what SQLite binds

Scalar = str | int | float | bool


class InvalidFilter(ValueError):
    """A filter the store cannot apply; the message names the field (filters.<key>...)."""


def _scalar(field: str, value: Any) -> Scalar:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise InvalidFilter(f"{field}: the integer {value} is outside the 64-bit range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidFilter(f"{field}: {value} is not a finite number")
        return value
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS:
            raise InvalidFilter(
                f"{field}: the string is {len(value)} characters; at most {MAX_VALUE_CHARS} are allowed"
            )
        return value
    if isinstance(value, list):
        raise InvalidFilter(f'{field}: a list is not a filter value; for any of several values use {{"in": [...]}}')
    kind = "null" if value is None else "an object" if isinstance(value, dict) else type(value).__name__
    raise InvalidFilter(f"{field}: {kind} is not a filter value; use a string, a number or a boolean")


def _key(key: Any) -> str:
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS or not _KEY.fullmatch(key):
        raise InvalidFilter(
            f"filters: the key {str(key)[:40]!r} is invalid: 1-{MAX_KEY_CHARS} characters, no control characters"
        )
    return key


def normalize_filters(raw: Any) -> dict[str, dict[str, list[Scalar]]]:
    """The canonical {key: {"in": [values]}} of a client's filters; {} for none. Raises InvalidFilter."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidFilter('filters must be an object: {"metadata key": value or {"in": [values]}}')
    if len(raw) > MAX_FILTER_KEYS:
        raise InvalidFilter(f"filters has {len(raw)} keys; at most {MAX_FILTER_KEYS} are allowed")
    canonical = {}
    for key, condition in raw.items():
        field = f"filters.{_key(key)}"
        if not isinstance(condition, dict):
            canonical[key] = {"in": [_scalar(field, condition)]}
            continue
        unknown = sorted(set(condition) - {"in"})
        if unknown:
            raise InvalidFilter(
                f'{field}: unknown operator {unknown[0]!r}; use a value (equality) or {{"in": [values]}}'
            )
        values = condition.get("in")
        if not isinstance(values, list) or not values:
            raise InvalidFilter(f"{field}.in must be a non-empty list of values")
        if len(values) > MAX_IN_VALUES:
            raise InvalidFilter(f"{field}.in has {len(values)} values; at most {MAX_IN_VALUES} are allowed")
        canonical[key] = {"in": [_scalar(f"{field}.in[{i}]", v) for i, v in enumerate(values)]}
    return canonical


def partition_values(values: list[Scalar]) -> tuple[list[str], list[int | float], list[str]]:
    """A filter's values by type, as both SQL forms compare them: texts, numbers, and booleans as
    SQLite's JSON type names ('true' / 'false')."""
    texts = [v for v in values if isinstance(v, str)]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    booleans = sorted({"true" if v else "false" for v in values if isinstance(v, bool)})
    return texts, numbers, booleans


def _value_match(alias: str, values: list[Scalar]) -> tuple[str, list]:
    """SQL true when json_each row `alias` is a scalar equal to one of the values (same JSON type)."""
    texts, numbers, booleans = partition_values(values)
    clauses, params = [], []
    if texts:
        clauses.append(f"({alias}.type = 'text' AND {alias}.value IN ({','.join('?' * len(texts))}))")
        params += texts
    if numbers:
        clauses.append(f"({alias}.type IN ('integer', 'real') AND {alias}.value IN ({','.join('?' * len(numbers))}))")
        params += numbers
    if booleans:
        clauses.append(f"{alias}.type IN ({','.join('?' * len(booleans))})")
        params += booleans
    return "(" + " OR ".join(clauses) + ")", params


def metadata_condition(filters: Any, column: str) -> tuple[str, list]:
    """SQL that is true for the rows whose JSON object `column` matches every filter, and its
    parameters; ("1", []) without filters. `column` is the caller's own SQL, never client text;
    keys and values only ever travel as parameters."""
    clauses, params = [], []
    for key, condition in normalize_filters(filters).items():
        scalar, scalar_params = _value_match("k", condition["in"])
        item, item_params = _value_match("i", condition["in"])
        # Top-level keys through json_each (it decodes escaped keys, which a JSON path would not match);
        # a list value matches through its items; an object value never matches.
        clauses.append(
            f"EXISTS (SELECT 1 FROM json_each({column}) AS k WHERE k.key = ? AND ({scalar} OR "
            f"(k.type = 'array' AND EXISTS (SELECT 1 FROM json_each(k.value) AS i WHERE {item}))))"
        )
        params += [key, *scalar_params, *item_params]
    return (" AND ".join(clauses) or "1"), params
