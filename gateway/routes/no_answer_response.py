"""rag.retrieval.no_answer's reply as the HTTP response the chat engine would have sent, so the gateway's
usual paths (usage, citations, /v1/rag/query's own stream events) handle it unchanged."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse, Response, StreamingResponse

from rag.retrieval.no_answer import no_answer_chunks, no_answer_completion


def no_answer_response(model: str, stream: bool, choices: int = 1) -> Response:
    if not stream:
        return JSONResponse(no_answer_completion(model, choices))
    events = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in no_answer_chunks(model, choices))

    async def body():
        yield events + "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")
