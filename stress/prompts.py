"""Prompts of a chosen length in the served model's own tokens, measured through the gateway's usage
counts (so it works against any deployment, with no tokenizer on the client).

A prompt is a run of one plain sentence, padded with single words to the exact count, and a question
about it: a small model answers that (a run of one repeated word makes it stop at once)."""

from __future__ import annotations

import math

import httpx

SENTENCE = " The lighthouse keeper climbed the stairs."
PAD = " sky"
TRIES = 5


def filler_prompt(sentences: int, pad: int = 0, tag: str = "") -> str:
    # The padding goes last: successive sizing probes share the sentences' prefix, which the engine's prefix
    # cache then holds, so sizing a long prompt costs one long prefill, not one per probe.
    return (
        f"{tag}Here are some notes:{SENTENCE * sentences}{PAD * pad}\nWhat did the keeper do? Answer in one sentence."
    )


class PromptSizer:
    """Two probes give the template's overhead and the tokens per sentence; each exact prompt is then
    checked with a 1-token request and its padding corrected until the count is right."""

    def __init__(self, http: httpx.Client, model: str):
        self.http, self.model = http, model
        small, large = self.prompt_tokens(filler_prompt(8)), self.prompt_tokens(filler_prompt(136))
        self.per_unit = (large - small) / 128
        self.overhead = round(small - 8 * self.per_unit)

    def prompt_tokens(self, content: str) -> int:
        response = self.http.post(
            "/v1/chat/completions",
            json={"model": self.model, "messages": [{"role": "user", "content": content}], "max_tokens": 1},
        )
        if response.status_code != 200:
            raise RuntimeError(f"sizing probe answered {response.status_code}: {response.text[:200]}")
        return int(response.json()["usage"]["prompt_tokens"])

    def estimate_units(self, tokens: int) -> int:
        """Sentences for about `tokens` tokens (layer 4's buckets need no exact count)."""
        return max(1, round((tokens - self.overhead) / self.per_unit))

    def exact(self, tokens: int, tag: str = "") -> tuple[str, int]:
        """A prompt of exactly `tokens` tokens where reachable (else the closest found) and its count."""
        sentences = max(1, math.floor((tokens - self.overhead) / self.per_unit) - 1)
        measured = self.prompt_tokens(filler_prompt(sentences, 0, tag))
        while measured > tokens and sentences > 1:
            sentences = max(1, sentences - math.ceil((measured - tokens) / self.per_unit))
            measured = self.prompt_tokens(filler_prompt(sentences, 0, tag))
        pad, best = tokens - measured, (filler_prompt(sentences, 0, tag), measured)
        for _ in range(TRIES):
            if best[1] == tokens or pad < 0:
                break
            content = filler_prompt(sentences, pad, tag)
            measured = self.prompt_tokens(content)
            if abs(measured - tokens) < abs(best[1] - tokens):
                best = (content, measured)
            pad += tokens - measured
        return best
