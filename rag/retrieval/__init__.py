"""What a question gets: embedding, search (dense, lexical, fused, filtered), the pipeline, the prompt and the answer."""
