"""llama.cpp's own OpenAI server (`llama-server`, what Ollama wraps), for the serving comparison.

Built from the llama.cpp that llama-cpp-python vendors (its PyPI sdist; `make llama-cpp`, or
`scripts/build_llama_cpp.sh`): the C++ server, with continuous batching and one slot per concurrent
stream. The model is the same weights vLLM serves: the embedded default's HF folder converted to a bf16
GGUF by llama.cpp's own convert_hf_to_gguf.py (the Q4_1 GGUF the model package ships is listed beside it,
being what a llama.cpp user would download).

    with llama_server(gguf, workdir, alias="smollm2-135m-instruct", slots=16) as server: ...

When the build is missing, `llama_cpp_unavailable()` says why and how to build it; the benchmark skips
llama.cpp with that message rather than failing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.harness.cpu_accounting import process_tree
from bench.harness.procs import ProcessGroup, RunningServer, child_env, free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
LLAMA_DIR = ROOT / "var" / "llama-cpp"
SERVER_BIN = LLAMA_DIR / "build" / "bin" / "llama-server"
BF16_GGUF = LLAMA_DIR / "smollm2-135m-instruct-bf16.gguf"
CONTEXT_PER_SLOT = 4096  # the plan's max_model_len, per concurrent stream
BUILD_HINT = "build it with `make llama-cpp` (scripts/build_llama_cpp.sh; ~10 minutes on 2 cores)"


def llama_cpp_unavailable() -> str | None:
    """None when the server and the bf16 GGUF are built, else what is missing."""
    missing = [str(path.relative_to(ROOT)) for path in (SERVER_BIN, BF16_GGUF) if not path.exists()]
    return f"llama.cpp skipped: {', '.join(missing)} not built; {BUILD_HINT}" if missing else None


def llama_server_command(gguf: Path, port: int, alias: str, slots: int) -> list[str]:
    """llama-server on loopback: the GGUF's own chat template (--jinja), `slots` parallel sequences with
    continuous batching, each with the plan's context length; its default thread count (the cores)."""
    return [
        str(SERVER_BIN),
        "--model",
        str(gguf),
        "--alias",
        alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--jinja",
        "--parallel",
        str(slots),
        "--ctx-size",
        str(CONTEXT_PER_SLOT * slots),
        "--cont-batching",
        "--no-webui",
        "--metrics",
    ]


@contextmanager
def llama_server(
    gguf: Path, workdir: Path, alias: str, slots: int = 16, timeout_s: float = 300
) -> Iterator[RunningServer]:
    """llama-server serving gguf as `alias`, healthy, stopped on exit."""
    port = free_port()
    group = ProcessGroup.start(llama_server_command(gguf, port, alias, slots), child_env(), workdir / "llama.log")
    try:
        start_s = wait_healthy(f"http://127.0.0.1:{port}/health", group, timeout_s)
        yield RunningServer(f"http://127.0.0.1:{port}", None, start_s, lambda: process_tree(group.process.pid))
    finally:
        group.stop()
