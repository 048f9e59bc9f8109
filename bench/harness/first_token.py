"""Where one stream's first token goes: sequential streamed chats, each timed by the client to its first
content chunk, with the gateway's `Server-Timing` parts beside (gateway/middleware/request_timing.py).

Raw vLLM's server sends no such header, so its row has the client's time only; the stack's time to first
token less raw vLLM's is then split into the gateway's own parts (admit, prepare, wake), what the chat
replica's call took beyond raw vLLM's whole time (engine), and the rest (HTTP, Ray Serve's proxy).
"""

from __future__ import annotations

import json
import random
import statistics
import time

WORDS = "river stone lamp orchard copper meadow signal harbor lantern violet thunder canvas ember".split()


def probe_prompts(n: int, words: int = 200, seed: int = 7) -> list[str]:
    """`n` prompts of `words` random words, different from their first word on (no shared prefix to cache)."""
    rng = random.Random(seed)
    return [f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


def server_timing(header: str) -> dict[str, float]:
    """A Server-Timing header's parts (`name;dur=ms, ...`) as {name: milliseconds}."""
    parts = {}
    for entry in filter(None, (e.strip() for e in header.split(","))):
        name, _, params = entry.partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur":
                parts[name.strip()] = float(value)
    return parts


def _first_content(lines) -> bool:
    """Reads SSE lines until a chunk carrying generated text (the first token); False if the stream ends."""
    for line in lines:
        if not line.startswith("data:") or line.strip() == "data: [DONE]":
            continue
        for choice in json.loads(line[5:]).get("choices", []):
            if (choice.get("delta") or {}).get("content"):
                return True
    return False


def first_token_times(
    base_url: str, api_key: str | None, model: str, prompts: list[str], max_tokens: int = 8, timeout_s: float = 120
) -> list[dict]:
    """Each prompt once, one at a time: the client's time to first token (ms) and the Server-Timing parts."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    samples = []
    with httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s) as client:
        for prompt in prompts:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "stream": True,
                "temperature": 0,
                "ignore_eos": True,  # vLLM's: an end-of-text first token would leave nothing to time
            }
            started = time.perf_counter()
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                lines = response.iter_lines()  # one iterator: a stream's body can be read once
                if not _first_content(lines):
                    raise RuntimeError("a probe stream ended without generated text")
                ttft_ms = (time.perf_counter() - started) * 1000
                parts = server_timing(response.headers.get("server-timing", ""))
                for _ in lines:  # read it to its end, as a client does
                    pass
            samples.append({"ttft_ms": ttft_ms, "server_timing_ms": parts})
    return samples


def summarise(samples: list[dict]) -> dict:
    """Medians over the samples (the first one, a warm-up, left out when there are more)."""
    timed = samples[1:] if len(samples) > 1 else samples
    names = [name for name in timed[0]["server_timing_ms"]] if timed else []
    parts = {name: statistics.median(s["server_timing_ms"].get(name, 0.0) for s in timed) for name in names}
    rest = [s["ttft_ms"] - sum(s["server_timing_ms"].values()) for s in timed] if names else []
    return {
        "n": len(timed),
        "ttft_ms_p50": statistics.median(s["ttft_ms"] for s in timed),
        "ttft_ms_min": min(s["ttft_ms"] for s in timed),
        "server_timing_ms_p50": parts,
        "beyond_server_timing_ms_p50": statistics.median(rest) if rest else None,
    }


def split_against_raw(stack: dict, raw: dict) -> dict:
    """The stack's extra time to first token (p50 against p50), in the parts the header names."""
    parts = stack["server_timing_ms_p50"]
    return {
        "extra_ms": stack["ttft_ms_p50"] - raw["ttft_ms_p50"],
        "gateway_ms": sum(ms for name, ms in parts.items() if name != "engine"),
        "engine_beyond_raw_ms": parts.get("engine", 0.0) - raw["ttft_ms_p50"],
        "http_and_proxy_ms": stack["beyond_server_timing_ms_p50"],
    }
