"""Benchmarks of poolserve: the scripts, their shared harness (bench/harness/) and their results (bench/results/)."""
