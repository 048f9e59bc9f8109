"""Test doubles shared by the unit tests (no test_ files here: pytest collects nothing from this package).

- clock: FakeClock, for the code that takes a `clock=`.
- rag: fakes of the RAG pipeline's protocols (rag/retrieval/interfaces.py).
- handles: Ray Serve handle stand-ins (`handle.method.remote(...)` run in-process).
- engine: a ray.serve.llm engine (the LLMEngine protocol) with deterministic OpenAI answers and streams, and
  ray.serve.llm's own ingress over it without Ray.
- tokenizer: a word-per-token tokenizer.
- settings: the gateway's settings for an app built without a plan.
"""
