"""Request bodies of poolserve's own routes (the OpenAI routes reuse vLLM's protocol models)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from vllm_bridge.compat import ModelCard, ModelList
from rag.retrieval.filters import MAX_FILTER_KEYS, MAX_IN_VALUES, MAX_VALUE_CHARS, normalize_filters

from rag.documents.extract import CONTENT_TYPES, PLAIN, TEXT_TYPES, normalize_content_type

# Documented bounds on DocumentIn.metadata: it is stored with every document and returned with
# every citation, so it stays small. Keys are strings; values are any JSON.
METADATA_MAX_KEYS = 64  # keys at the top level
METADATA_MAX_BYTES = 8 * 1024  # serialized as compact UTF-8 JSON
METADATA_MAX_DEPTH = 4  # nested objects/arrays, counting metadata itself: {"a": {"b": {"c": {}}}} is 4


def _json_depth(value: Any) -> int:
    """How many containers deep `value` nests (a scalar is 0). Iterative, so any depth is safe."""
    deepest, stack = 0, [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        for kid in node.values() if isinstance(node, dict) else node:
            if isinstance(kid, (dict, list)):
                stack.append((kid, depth + 1))
    return deepest


def check_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    if len(metadata) > METADATA_MAX_KEYS:
        raise ValueError(
            f"metadata has {len(metadata)} keys; at most {METADATA_MAX_KEYS} are allowed (METADATA_MAX_KEYS)"
        )
    if (depth := _json_depth(metadata)) > METADATA_MAX_DEPTH:
        raise ValueError(
            f"metadata nests {depth} levels deep; at most {METADATA_MAX_DEPTH} are allowed (METADATA_MAX_DEPTH)"
        )
    try:
        size = len(json.dumps(metadata, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8"))
    except (ValueError, TypeError) as exc:  # NaN/inf, a lone surrogate, or a non-JSON Python value
        raise ValueError(f"metadata is not valid JSON: {exc}") from None
    if size > METADATA_MAX_BYTES:
        raise ValueError(
            f"metadata is {size} bytes as JSON; at most {METADATA_MAX_BYTES} are allowed (METADATA_MAX_BYTES)"
        )
    return metadata


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DocumentIn(_Body):
    id: str = Field(..., description="Document id, unique within the collection; posting it again replaces it.")
    text: str | None = Field(None, min_length=1, description="The document's text (or data_base64).")
    data_base64: str | None = Field(
        None,
        min_length=1,
        description="The file's bytes, base64: required for "
        "application/pdf, DOCX and PPTX; for text/html the charset the file declares "
        "(BOM, XML declaration, <meta charset>) is honoured. Exactly one of text and "
        "data_base64.",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description=f"Returned with citations. At most {METADATA_MAX_KEYS} top-level keys, "
        f"{METADATA_MAX_BYTES} bytes as JSON and {METADATA_MAX_DEPTH} levels of nesting.",
    )

    content_type: str = Field(
        PLAIN,
        description=f"How `text` is written: {', '.join(CONTENT_TYPES)} (parameters such as "
        "'; charset=utf-8' are ignored). Markdown and HTML are reduced to the text a reader sees before chunking "
        "(rag/documents/extract.py); an HTML <title> or first heading becomes metadata.title unless it is set.",
    )

    @field_validator("metadata")
    @classmethod
    def bounded_metadata(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_metadata(value)

    @field_validator("content_type")
    @classmethod
    def known_content_type(cls, value: str) -> str:
        return normalize_content_type(value)  # UnsupportedContentType is a ValueError: a 422 naming the types

    @model_validator(mode="after")
    def text_or_data(self) -> "DocumentIn":
        if (self.text is None) == (self.data_base64 is None):
            raise ValueError("give exactly one of text and data_base64")
        if self.text is not None and self.content_type not in TEXT_TYPES:
            raise ValueError(
                f"a {self.content_type} document is a file: send its bytes as data_base64 (or as a "
                "multipart/form-data upload), not as text"
            )
        return self


class AddDocumentsRequest(_Body):
    documents: list[DocumentIn] = Field(..., min_length=1)
    stream: bool = Field(
        False,
        description="Answer with NDJSON progress events (gateway/routes/ingestion.py) instead "
        "of one JSON body at the end.",
    )
    run_async: bool = Field(
        False,
        alias="async",
        description="Answer 202 with an ingest job at once and ingest "
        "in the background; GET /v1/ingest/jobs/{id} tells its state (gateway/routes/ingest_jobs.py).",
    )

    @model_validator(mode="after")
    def _one_answer_shape(self):
        if self.stream and self.run_async:
            raise ValueError("stream and async are two ways to follow an ingest; ask for one")
        return self


_FILTER_VALUE = {"anyOf": [{"type": "string", "maxLength": MAX_VALUE_CHARS}, {"type": "number"}, {"type": "boolean"}]}
FILTERS_JSON_SCHEMA = {
    "type": "object",
    "maxProperties": MAX_FILTER_KEYS,
    "additionalProperties": {
        "anyOf": [
            *_FILTER_VALUE["anyOf"],
            {
                "type": "object",
                "required": ["in"],
                "additionalProperties": False,
                "properties": {
                    "in": {"type": "array", "items": _FILTER_VALUE, "minItems": 1, "maxItems": MAX_IN_VALUES}
                },
            },
        ]
    },
    "description": 'Only documents whose metadata matches every key: a value means equality, {"in": [...]} any '
    "of the values; strings, numbers or booleans, compared by type (rag/retrieval/filters.py).",
    "examples": [{"source": "hr", "year": {"in": [2024, 2025]}}],
}


def _validated_filters(value: Any) -> dict | None:
    return normalize_filters(value) or None  # rag.retrieval.filters.InvalidFilter is a ValueError: a 422 naming the key


# Metadata filters as a request field: the JSON shape above, validated (unknown operators, non-scalar
# values, too many keys or values are a 422 naming filters.<key>) and kept in canonical form.
MetadataFilters = Annotated[
    dict[str, Any] | None,
    BeforeValidator(_validated_filters),
    WithJsonSchema({"anyOf": [FILTERS_JSON_SCHEMA, {"type": "null"}]}),
]
MinScore = Annotated[
    float | None,
    Field(
        None,
        ge=-1.0,
        le=1.0,
        description="Answer only if the question's best cosine similarity with a chunk the "
        "filters allow is at least this; otherwise reply that the knowledge base does not contain the answer, "
        "without generating. Default: the profile's rag.min_score; -1 answers whenever anything was retrieved.",
    ),
]


ContextTokens = Annotated[
    int | None,
    Field(
        None,
        ge=1,
        description="Most tokens of retrieved passages in the prompt, best first (at most the "
        "profile's rag.context_tokens; default that). Fewer passages answer sooner on a CPU.",
    ),
]


class RagOptions(_Body):
    """The `rag` field accepted on /v1/chat/completions (OpenAI clients send it in extra_body)."""

    model_config = ConfigDict(extra="forbid", title="rag")  # errors read "invalid rag: <field>: ..."

    collection: str
    top_k: int | None = Field(None, ge=1)
    filters: MetadataFilters = None
    min_score: MinScore = None
    context_tokens: ContextTokens = None


class RagQueryRequest(_Body):
    collection: str
    question: str = Field(..., min_length=1)
    top_k: int | None = Field(None, ge=1)
    stream: bool = False
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(0.0, ge=0.0, le=2.0)
    filters: MetadataFilters = None
    min_score: MinScore = None
    context_tokens: ContextTokens = None


class SearchRequest(_Body):
    """POST /v1/collections/{c}/search: the same parameters as its GET, with filters as JSON."""

    q: str = Field(..., min_length=1, description="The question or search text.")
    top_k: int | None = Field(None, ge=1)
    filters: MetadataFilters = None


class ServedModelCard(ModelCard):
    """An OpenAI model card, plus an on-demand engine's state (issue 48); absent when no engine is on demand."""

    status: Literal["awake", "asleep", "waking", "sleeping"] | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="With on-demand engines: whether this model's engine is "
        "awake (answers at once), asleep (the request wakes it: a CPU cold start), or changing; always-on models "
        "and the embedder are awake.",
    )


class ServedModelList(ModelList):
    """GET /v1/models: OpenAI's list shape, each card a ServedModelCard."""

    data: list[ServedModelCard]
