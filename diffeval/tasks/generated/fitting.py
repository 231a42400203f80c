"""What the generated-documents family shares: a model's prompt text and ids from a user message (through a backend,
or through a bare tokenizer before any engine starts), and the most items of a seeded stream (edges, lines) whose
prompt fits a token budget."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Renderer:
    """A model's prompt text and ids from a user message, through a backend or a bare tokenizer (`Running.prepare`
    gets tokenizers, whose `render_prompt` names the model)."""

    def __init__(self, encoder: Any, chat_template: bool, model: str | None = None):
        self.encoder, self.chat_template, self.model = encoder, chat_template, model

    def text(self, user: str) -> str:
        if self.model is None:
            return self.encoder.render_prompt(user, "", self.chat_template)
        return self.encoder.render_prompt(user, "", self.chat_template, self.model)

    def ids(self, user: str) -> list[int]:
        return self.encoder.encode(self.text(user)).ids


def most_items(size: Callable[[int], int], budget: int, probe: int = 32) -> int:
    """The most items of a stream whose prompt (`size(count)` tokens, growing with count) fits `budget` tokens: -1
    when even none fits. Starts near the answer from the tokens `probe` items take, then bisects."""
    empty = size(0)
    if empty > budget:
        return -1
    rate = max((size(probe) - empty) / probe, 1.0)
    low, high = 0, max(int((budget - empty) / rate * 1.05) + 2, 1)
    while size(high) <= budget:
        low, high = high, high * 2
    while high - low > 1:  # size(low) fits, size(high) does not
        middle = (low + high) // 2
        low, high = (middle, high) if size(middle) <= budget else (low, middle)
    return low
