"""The transformers backend: greedy batched generation with left padding."""

from __future__ import annotations

import time

import torch

from diffeval.errors import InputError
from diffeval.models.backend import Encoding, Generation
from diffeval.models.capture import capturing
from diffeval.models.loading import LoadedModel


class HFBackend:
    def __init__(self, loaded: LoadedModel):
        if not loaded.tokenizer.is_fast:
            # token offsets of needles and answer spans come from the fast tokenizer's offset mapping
            raise InputError(f"model {loaded.info.name}: diffeval needs a fast (tokenizers) tokenizer")
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.info = loaded.info
        self.device = self.model.device

    def render_prompt(self, user: str, answer_prefix: str, chat_template: bool) -> str:
        if not chat_template:
            return user + answer_prefix
        if not self.tokenizer.chat_template:
            raise InputError(f"model {self.info.name} has no chat template: rerun with --no-chat-template")
        messages = [{"role": "user", "content": user}]
        rendered = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return rendered + answer_prefix

    def encode(self, text: str, special_tokens: bool = True) -> Encoding:
        # a chat template already carries its own BOS; raw prompts get the tokenizer's special tokens
        add_special = special_tokens and not (self.tokenizer.bos_token and text.startswith(self.tokenizer.bos_token))
        enc = self.tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
        return Encoding(ids=enc["input_ids"], offsets=[tuple(o) for o in enc["offset_mapping"]])

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop: list[str]) -> list[Generation]:
        start = time.perf_counter()
        batch = self.tokenizer.pad({"input_ids": prompts}, return_tensors="pt", padding=True)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        output = self.model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            stop_strings=stop or None,
            tokenizer=self.tokenizer,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        seconds = (time.perf_counter() - start) / len(prompts)
        new = output[:, batch["input_ids"].shape[1] :]
        results = []
        for row in new.tolist():
            row = _strip_padding(row, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id)
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            results.append(Generation(text=cut_at_stop(text, stop), new_tokens=len(row), seconds=seconds))
        return results


    @torch.inference_mode()
    def attention_rows(self, ids: list[int], rows: list[int], segment_ids: list[int], n_segments: int) -> torch.Tensor:
        """(layers, heads, rows, segments): each head's softmax weight per key segment, for the chosen rows only."""
        with capturing(self.model, rows, segment_ids, n_segments) as capture:
            # the decoder alone: the LM head over every position would cost T × vocab floats for nothing
            self.model.get_decoder()(input_ids=torch.tensor([ids], device=self.device), use_cache=False)
        return torch.stack([capture.shares[layer] for layer in sorted(capture.shares)])


def cut_at_stop(text: str, stop: list[str]) -> str:
    cut = min((text.find(s) for s in stop if s in text), default=len(text))
    return text[:cut]


def _strip_padding(row: list[int], pad_id: int | None, eos_id: int | None) -> list[int]:
    """Finished sequences in a batch are padded to the longest; drop everything from the first EOS/pad."""
    for i, token in enumerate(row):
        if token in (pad_id, eos_id):
            return row[:i]
    return row
