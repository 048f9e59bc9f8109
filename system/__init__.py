"""The floor everything stands on: what the host and its processes hold (cgroup v1/v2 limits and usage,
/proc/meminfo, CPU flags, a process tree's unique memory), owner-only files, and how SQLite databases
are opened and written. Imports nothing of poolserve."""
