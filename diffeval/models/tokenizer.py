"""A model's own tokenizer (transformers fast tokenizer) behind the `Tokenizer` protocol: every engine encodes with
it, so both backends hand the model identical token ids."""

from __future__ import annotations

from diffeval.errors import InputError
from diffeval.models.backend import Encoding


class HFTokenizer:
    def __init__(self, tokenizer):
        self.hf = tokenizer

    def encode(self, text: str, special_tokens: bool = True) -> Encoding:
        # a chat template already carries its own BOS; raw prompts get the tokenizer's special tokens
        add_special = special_tokens and not (self.hf.bos_token and text.startswith(self.hf.bos_token))
        enc = self.hf(text, add_special_tokens=add_special, return_offsets_mapping=True)
        return Encoding(ids=enc["input_ids"], offsets=[tuple(o) for o in enc["offset_mapping"]])

    def encode_many(self, texts: list[str], special_tokens: bool = True) -> list[list[int]]:
        return self.hf(texts, add_special_tokens=special_tokens).input_ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def render_prompt(self, user: str, answer_prefix: str, chat_template: bool, model: str) -> str:
        """The full prompt text: raw `user + answer_prefix`, or the model's chat template around `user`."""
        if not chat_template:
            return user + answer_prefix
        if not self.hf.chat_template:
            raise InputError(f"model {model} has no chat template: rerun with --no-chat-template")
        messages = [{"role": "user", "content": user}]
        return self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + answer_prefix


class PromptTokenizer:
    """A model's tokenizer standing in for its backend where prompts are only built, never run (`--dry-run`)."""

    def __init__(self, tokenizer: HFTokenizer, name: str):
        self.tokenizer, self.name = tokenizer, name

    def encode(self, text: str, special_tokens: bool = True) -> Encoding:
        return self.tokenizer.encode(text, special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def render_prompt(self, user: str, answer_prefix: str, chat_template: bool) -> str:
        return self.tokenizer.render_prompt(user, answer_prefix, chat_template, self.name)
