"""Test doubles shared by the unit tests (no test_ files here: pytest collects nothing from this package).

- clock: FakeClock, for the code that takes a `clock=`.
- rag: fakes of the RAG pipeline's protocols (rag/retrieval/interfaces.py).
- settings: the gateway's settings for an app built without a plan.
"""
