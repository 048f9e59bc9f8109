"""When retrieval finds nothing related to a question: say so, without asking the model.

A small chat model given unrelated passages answers anyway, from the passages or from its weights;
"the knowledge base does not contain this" is the honest reply, and it costs no generation. The
gate reads the best cosine similarity of the question with any chunk the filters allow (see
rag/retrieval/search.py for why not the fused score); its default, `rag.min_score`, was chosen by
measurement (docs/BENCHMARKS.md section 7.2: the refusal table of bench/bench_rag_quality.py).

The reply is shaped like the chat engine's (an OpenAI chat completion, or its stream chunks, with
`refused: true` added), so the gateway returns it through the same paths as a generated answer.
"""

from __future__ import annotations

import time
import uuid

from rag.retrieval.search import SearchResult

NO_ANSWER = "The knowledge base does not contain an answer to this question."
NO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def is_answerable(result: SearchResult, min_score: float) -> bool:
    """Whether the retrieved passages are worth answering from: something was found and, when the
    search measured similarity (dense or hybrid; lexical does not), the best is at least min_score."""
    if not result.hits:
        return False
    return result.best_similarity is None or result.best_similarity >= min_score


def no_answer_completion(model: str, choices: int = 1) -> dict:
    """An OpenAI chat completion whose every choice is NO_ANSWER."""
    return {
        "id": f"chatcmpl-noanswer-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "refused": True,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": NO_ANSWER},
                "logprobs": None,
                "finish_reason": "stop",
            }
            for i in range(choices)
        ],
        "usage": dict(NO_USAGE),
    }


def no_answer_chunks(model: str, choices: int = 1) -> list[dict]:
    """The same as a stream: the text, each choice's finish, then the usage-only chunk."""
    head = {
        "id": f"chatcmpl-noanswer-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }
    text = [
        {
            **head,
            "refused": True,
            "choices": [
                {
                    "index": i,
                    "delta": {"role": "assistant", "content": NO_ANSWER},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        for i in range(choices)
    ]
    finish = [
        {**head, "choices": [{"index": i, "delta": {}, "logprobs": None, "finish_reason": "stop"}]}
        for i in range(choices)
    ]
    return [*text, *finish, {**head, "choices": [], "usage": dict(NO_USAGE)}]
