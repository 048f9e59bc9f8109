"""A process's CPU priority (Linux nice), for every thread it has and will have.

Linux keeps nice per thread and a new thread inherits its creator's: setpriority on the process id alone
changes only the main thread of a process that already runs threads (a Ray replica: its core worker's,
its event loop's, its thread pool's), so every thread listed in /proc/self/task is changed.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def lower_cpu_priority(nice: int) -> int:
    """Raise every thread of this process to at least `nice` (never lowers one); returns the threads
    changed. Threads that end while this runs are skipped."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return 0
    changed = 0
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except (ProcessLookupError, PermissionError) as exc:
            logger.debug("nice %d for thread %d: %r", nice, tid, exc)
    return changed
