"""A word per token: the gateway's prompt-length and context-budget arithmetic, readable in a test."""

from __future__ import annotations


class WordTokenizer:
    """The two calls the gateway makes of a Hugging Face tokenizer, counting words."""

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=True):
        return [0] * sum(len(str(m.get("content") or "").split()) for m in messages)

    def encode(self, text, add_special_tokens=True):
        return text.split()
