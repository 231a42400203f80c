"""The Backend protocol: everything a task asks of a model engine. Tasks never know which engine runs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from diffeval.models.loading import ModelInfo


@dataclass
class Encoding:
    ids: list[int]
    offsets: list[tuple[int, int]]  # character span of each token in the encoded text


@dataclass
class Generation:
    text: str
    new_tokens: int
    seconds: float


class Backend(Protocol):
    info: ModelInfo

    def render_prompt(self, user: str, answer_prefix: str, chat_template: bool) -> str:
        """The full prompt text: raw `user + answer_prefix`, or the model's chat template around `user`."""

    def encode(self, text: str, special_tokens: bool = True) -> Encoding:
        """Token ids of a full prompt (special tokens included unless told) and each token's character span."""

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop: list[str]) -> list[Generation]:
        """Greedy continuations of token-id prompts, cut at the first stop string."""

    def score_choices(
        self, prefix: list[int], queries: list[list[int]], choices: list[list[int]]
    ) -> Iterator[list[tuple[float, int]]]:
        """Per query, (summed log-probability, token count) of every choice's tokens after prefix + query; the prefix
        is computed once and reused for every query and choice."""

    def attention_rows(self, ids: list[int], rows: list[int], segment_ids: list[int], n_segments: int) -> Tensor:
        """(layers, heads, rows, segments): per-head attention weight on each key segment, for chosen rows only."""
