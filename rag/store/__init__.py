"""The knowledge store: SQLite (the truth, with its schema), FAISS, FTS5, the metadata index, capacity, refusals."""
