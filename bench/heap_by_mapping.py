"""Where a process's resident memory lives, by kind of mapping: the main glibc heap ([heap]), glibc's other
arenas (anonymous mappings that start on a 64 MiB boundary: each thread arena's heap is one), other anonymous
mappings (Python's object arenas, mmapped blocks, thread stacks), and mapped files, with each file's PSS.

Reads /proc/PID/smaps only (the replica is not touched: no debugger, no signal). Two snapshots of one process
(`--save` then `--diff`) show which arenas grew between them, by start address.

    .venv/bin/python bench/heap_by_mapping.py PID [--save snap.json]
    .venv/bin/python bench/heap_by_mapping.py --diff before.json after.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.mappings import diff, read_smaps, summary  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pid", nargs="?", type=int)
    ap.add_argument("--save")
    ap.add_argument("--diff", nargs=2)
    args = ap.parse_args()
    if args.diff:
        before, after = (json.load(open(path)) for path in args.diff)
        print(json.dumps({"before": summary(before), "after": summary(after)}))
        for row in diff(before, after):
            print(row)
        return
    if args.pid is None:
        sys.exit("a PID, or --diff BEFORE AFTER")
    maps = read_smaps(args.pid)
    if args.save:
        with open(args.save, "w") as out:
            json.dump(maps, out)
    print(json.dumps(summary(maps)))


if __name__ == "__main__":
    main()
