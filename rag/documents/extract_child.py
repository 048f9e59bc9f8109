"""The extraction worker process (`python -m rag.documents.extract_child`), started by rag/documents/extract_worker.py.

It imports the parsers once, then serves one request at a time from stdin: it forks a child for
the document, the child sets its caps (RLIMIT_CPU counts from the fork: the kernel resets a child's
CPU time; RLIMIT_AS bounds its address space), extracts and writes its answer to a pipe; the worker
reaps it with wait4 (its exact CPU time) and answers on stdout. A child that dies at a cap takes
nothing else with it. Frames are an 8-byte length and JSON (the content follows the request as raw
bytes), so nothing from a child is unpickled.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import sys
import time

import docx  # noqa: F401  (imported once here, inherited by every child)
import inscriptis  # noqa: F401
import lxml.html  # noqa: F401
import markdown_it  # noqa: F401
import pptx  # noqa: F401
import pypdf  # noqa: F401

from rag.documents.binary_files import UnreadableDocument
from rag.documents.extract import extract
from system.priority import lower_cpu_priority

HEADER_BYTES = 8


def write_frame(stream, payload: bytes) -> None:
    stream.write(len(payload).to_bytes(HEADER_BYTES, "big") + payload)
    stream.flush()


def read_frame(stream) -> bytes | None:
    header = stream.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES:
        return None
    size = int.from_bytes(header, "big")
    payload = stream.read(size)
    return payload if len(payload) == size else None


def serve(stdin, stdout) -> None:
    while (request := read_frame(stdin)) is not None:
        job = json.loads(request)
        content = read_frame(stdin)
        if content is None:
            return
        write_frame(stdout, json.dumps(run_one(job, content)).encode())


def run_one(job: dict, content: bytes) -> dict:
    """Extract in a capped child; {"reply": ... or None, "exit": status, "cpu_seconds", "overran"}."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        _child(job, content, write_end)
    os.close(write_end)
    data, overran = _read_all(read_end, job["wall_seconds"])
    os.close(read_end)
    if overran:
        os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    try:
        reply = json.loads(data) if data else None
    except ValueError:
        reply = None
    return {
        "reply": reply,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "overran": overran,
    }


def _read_all(fd: int, wall_seconds: float) -> tuple[bytes, bool]:
    parts, deadline = [], time.monotonic() + wall_seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b"".join(parts), True
        part = os.read(fd, 1 << 20)
        if not part:
            return b"".join(parts), False
        parts.append(part)


def _child(job: dict, content: bytes, write_end: int) -> None:
    """The forked child's whole life: it never returns (a return would go on as a second worker), whatever
    happens, even a MemoryError at a point no handler expects."""
    code = 3  # nothing written: the worker reports the memory cap from the exit status
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # stdout is the worker's answer channel: a library print must not reach it
        # Nor stderr, which is the gateway's log: a child dying at its memory cap could not even print its last
        # words and left "Exception ignored in: <object repr() failed> ... MemoryError" there (issue 46), and a
        # parser's complaints about a client's file are no news to the operator. The child's whole outcome is
        # its answer, its exit status or its signal, which the worker reports.
        os.dup2(devnull, 2)
        # Made before the cap: once the address space is at it, even this small answer might not be.
        over_the_cap = json.dumps(
            {
                "status": 413,
                "error": f"extracting it needs more than the "
                f"{job['memory_bytes'] // 2**20} MiB memory cap (rag.extraction.memory_bytes)",
            }
        ).encode()
        reply = _extract_capped(job, content)
        try:
            payload = over_the_cap if reply is None else json.dumps(reply).encode()
        except MemoryError:  # its text alone is over the memory cap
            payload = over_the_cap
        _write_all(write_end, payload)
        code = 0
    finally:
        os._exit(code)


def _extract_capped(job: dict, content: bytes) -> dict | None:
    """The child's answer, or None when the extraction ran out of memory. Returned, not answered in the
    handler: the failed extraction's memory is held by its exception until the handler ends."""
    try:
        _cap(job)
        data = content if job["binary"] else content.decode("utf-8")
        return {"ok": extract(data, job["content_type"], job["max_locations"]).__dict__}
    except MemoryError:
        return None
    except UnreadableDocument as exc:
        return {"status": 422, "error": str(exc)}
    except RecursionError:
        return {"status": 422, "error": "the document nests too deeply to extract"}
    except BaseException as exc:  # a parser failing on a hostile file is still the file's problem: a 422
        return {"status": 422, "error": f"cannot extract text from it: {type(exc).__name__}: {str(exc)[:200]}"}


def _write_all(fd: int, payload: bytes) -> None:
    """Write all of it; a short answer (the 413 above) in one write that allocates nothing, so that it gets out
    even when the child's address space is at its cap."""
    written = os.write(fd, payload)
    if written < len(payload):
        view = memoryview(payload)[written:]
        while view:
            view = view[os.write(fd, view) :]


def _cap(job: dict) -> None:
    # SIGXCPU at the soft limit ends the child (Python leaves it at its default action); the hard limit
    # a second later is SIGKILL. No core file for either.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (job["cpu_seconds"], job["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (job["memory_bytes"], job["memory_bytes"]))
    lower_cpu_priority(job.get("cpu_nice", 0))  # background work: other tenants' requests come first for the cores


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
