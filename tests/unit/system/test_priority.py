"""system/priority.py: every thread of the process gets the nice, and so do threads started after."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# In a child process: this one's threads keep their priority.
CHILD = """
import json, os, threading
from system.priority import lower_cpu_priority
started, stop = threading.Event(), threading.Event()
def waiting():
    started.set()
    stop.wait(10)
before = threading.Thread(target=waiting)
before.start()
started.wait(10)
changed = lower_cpu_priority(7)
again = lower_cpu_priority(3)  # never lowers a nice already higher
nice_of = {}
def later():
    nice_of["later"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
after = threading.Thread(target=later)
after.start()
after.join(10)
nice_of["main"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
nice_of["before"] = os.getpriority(os.PRIO_PROCESS, before.native_id)
stop.set()
before.join(10)
print(json.dumps({"changed": changed, "again": again, **nice_of}))
"""


def test_every_thread_now_and_later_gets_the_nice_and_none_is_lowered():
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["changed"] >= 2 and result["again"] == 0, result
    assert result["main"] == result["before"] == result["later"] == 7, result


def test_nice_zero_changes_nothing():
    from system.priority import lower_cpu_priority

    assert lower_cpu_priority(0) == 0
