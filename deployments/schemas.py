"""Request bodies of poolserve's own routes (the OpenAI routes reuse vLLM's protocol models)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DocumentIn(_Body):
    id: str = Field(..., description="Document id, unique within the collection; posting it again replaces it.")
    text: str = Field(..., min_length=1, description="The document's text.")
    metadata: dict = Field(default_factory=dict, description="Returned with citations.")


class AddDocumentsRequest(_Body):
    documents: list[DocumentIn] = Field(..., min_length=1)


class RagOptions(_Body):
    """The `rag` field accepted on /v1/chat/completions (OpenAI clients send it in extra_body)."""

    collection: str
    top_k: int | None = Field(None, ge=1)


class RagQueryRequest(_Body):
    collection: str
    question: str = Field(..., min_length=1)
    top_k: int | None = Field(None, ge=1)
    stream: bool = False
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(0.0, ge=0.0, le=2.0)
