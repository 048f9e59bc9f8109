"""Everything that reaches into vLLM's or ray.serve.llm's internals, in one place:

- compat.py: the names that differ between the engine pairs (vLLM 0.26 + Ray 2.58.1, vLLM 0.32 + Ray 2.60) and
  the ray.serve.llm internals the stack uses;
- cpu_worker.py: the CPU engine's vLLM Worker (threads per step, a shorter idle busy-wait);
- worker_extension.py: the extension mixed into a chat engine's vLLM Workers: it hands their freed heap back
  to the pool, and (sleep_backups.py) keeps a level-1 sleep's weights on the host at their exact size;
- engine_ranks.py and headless.py: a CPU engine split over nodes (a Ray actor per further node, hosting a
  headless vLLM).

When vLLM or Ray is upgraded, this package is what to read first.
"""
