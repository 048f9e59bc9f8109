"""What every benchmark shares: engine arguments from the plan (engine.py), server processes (procs.py,
stack.py), the serving load generator (serving.py), timers and percentiles (timing.py) and one JSON
result format (results.py); for the RAG and memory studies, the rank of the first right document (ranking.py)
and a process's memory by kind of mapping (mappings.py)."""
