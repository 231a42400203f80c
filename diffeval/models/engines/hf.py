"""The transformers backend: greedy batched generation, prefix-reusing choice scoring, attention rows through the
attention interface, and the loaded model itself for tasks that need transformers internals.

A batch never costs more memory than the longest prompt the engine takes alone: prompts are left-padded together
only while the padded batch holds at most `MAX_BATCH_TOKENS` tokens (batch × longest prompt), so its activations,
attention mask and KV cache stay those of one 4K prompt; longer prompts run one at a time. Each `Generation` says how
many prompts shared its forward pass."""

from __future__ import annotations

import copy
import dataclasses
import gc
import inspect
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.modeling_outputs import CausalLMOutputWithPast

from diffeval.errors import InputError
from diffeval.models.backend import Encoding, EngineSettings, Generation
from diffeval.models.capture import capturing
from diffeval.models.checkpoints.loading import LoadedModel, check_attn_impl, load_model, load_tokenizer
from diffeval.models.layer_kinds import check_captured
from diffeval.models.spec import ModelInfo, ModelSpec
from diffeval.models.thinking import Markers, resolve_markers
from diffeval.models.tokenizer import HFTokenizer, answer_end, cut_at_stop, through_ids, tokens_through_stop


class HFBackend:
    name: ClassVar[str] = "hf"
    # prompt tokens one forward pass may hold, padding included. Past it batching costs more than it saves (toy-base,
    # CPU, benchmarks/hf_batching.py): 4 equal-length 16K prompts together peaked at 1.7x the RSS of one at a time
    # and took 1.2x the time; 2 padded 4K prompts took 1.7x; 4 prompts of 1K took 0.96x
    MAX_BATCH_TOKENS = 4096
    # positions per slice of `token_nll`'s LM head: 512 × a 49K vocabulary is 100 MB of fp32 logits
    NLL_SLICE = 512

    def __init__(self, loaded: LoadedModel, switches: Mapping[str, Any] | None = None):
        if not loaded.tokenizer.is_fast:
            # token offsets of needles and answer spans come from the fast tokenizer's offset mapping
            raise InputError(f"model {loaded.info.name}: diffeval needs a fast (tokenizers) tokenizer")
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        # encoding gets its own copy: the runner may build prompts in a thread while `generate` decodes, and a
        # tokenizers object must not be used from two threads at once
        self._encoder = HFTokenizer(copy.deepcopy(loaded.tokenizer))
        self.info = loaded.info
        self.device = self.model.device
        eos = self.model.generation_config.eos_token_id  # load_model sets every stop id there
        self.stop_ids = {eos} if isinstance(eos, int) else set(eos or [])
        self._cache = cache_keyword(self.model.forward)
        self.switches = dict(switches or {})  # the chat template's (--template-switch)
        self._markers: dict[tuple[str, ...] | None, Markers] = {}

    @classmethod
    def check_model(cls, info: ModelInfo, settings: EngineSettings) -> None:
        """transformers runs every causal LM it can load, with an attention implementation it knows (other engines'
        options are refused before this, by `config.assemble`)."""
        check_attn_impl(settings.attn_impl)

    @classmethod
    def load(cls, spec: ModelSpec, settings: EngineSettings) -> HFBackend:
        # process-wide, as torch has it; more threads than free cores slow every one of them down. `settings.threads`
        # is hf's --threads (HFOptions), else the cores the load leaves free
        torch.set_num_threads(settings.threads)
        loaded = load_model(spec, settings.device, settings.dtype, settings.attn_impl, settings.trust_remote_code)
        return cls(loaded, settings.switches)

    @classmethod
    def open_tokenizer(cls, spec: ModelSpec, settings: EngineSettings) -> HFTokenizer:
        return HFTokenizer(load_tokenizer(spec, settings.trust_remote_code), settings.switches)

    def torch_module(self) -> LoadedModel:
        return LoadedModel(self.model, self.tokenizer, self.info)

    def close(self) -> None:
        self.model = self.tokenizer = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def render_prompt(self, user: str, answer_prefix: str, chat_template: bool) -> str:
        # the template is jinja on the tokenizer object, not the Rust encoder: the shared tokenizer is safe here
        return HFTokenizer(self.tokenizer, self.switches).render_prompt(
            user, answer_prefix, chat_template, self.info.name
        )

    def render_messages(self, messages: Sequence[Mapping[str, str]], chat_template: bool) -> str:
        return HFTokenizer(self.tokenizer, self.switches).render_messages(messages, chat_template, self.info.name)

    def thinking_markers(self, given: Sequence[str] | None) -> Markers:
        # resolved once per markers asked for: a task asks at every chunk it generates
        key = tuple(given) if given else None
        if key not in self._markers:
            self._markers[key] = resolve_markers(self.tokenizer, self.info.name, key, self.switches)
        return self._markers[key]

    def encode(self, text: str, special_tokens: bool = True) -> Encoding:
        return self._encoder.encode(text, special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def document_start(self) -> list[int]:
        return self._encoder.document_start()

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, stop: list[str], end: Sequence[int] | None = None
    ) -> list[Generation]:
        results: dict[int, Generation] = {}
        for group in forward_groups([len(p) for p in prompts], self.MAX_BATCH_TOKENS):
            outputs = self._generate_together([prompts[i] for i in group], max_new_tokens, stop, end)
            results.update(zip(group, outputs))
        return [results[i] for i in range(len(prompts))]

    @torch.inference_mode()
    def _generate_together(
        self, prompts: list[list[int]], max_new_tokens: int, stop: list[str], end: Sequence[int] | None = None
    ) -> list[Generation]:
        """One `generate` call: the prompts left-padded into one tensor (no padding when their lengths are equal).
        With `end`, a row also stops once its generated ids end in those ids, and is cut just after their first
        occurrence (a row that reached EOS first keeps no marker)."""
        start = time.perf_counter()
        batch = self.tokenizer.pad({"input_ids": prompts}, return_tensors="pt", padding=True)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        # greedy and nothing else: the model's generation_config is diffeval's own (load_model)
        decoder, width = HFTokenizer(self.tokenizer), batch["input_ids"].shape[1]
        criteria: list[StoppingCriteria] = [_AnswerEnded(decoder, prompts, width, stop, self.stop_ids)] if stop else []
        if end:
            criteria.append(_IdsEnded(end, width))
        output = self.model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            stopping_criteria=StoppingCriteriaList(criteria) if criteria else None,
        )
        seconds = (time.perf_counter() - start) / len(prompts)
        results = []
        for prompt, row in zip(prompts, output[:, width:].tolist()):
            row = tokens_through_stop(decoder, prompt, _through_stop(row, self.stop_ids), stop, self.stop_ids)
            row = through_ids(row, end)
            text = decoder.decode_continuation(prompt, row, self.stop_ids)
            results.append(Generation(cut_at_stop(text, stop), len(row), seconds, batch=len(prompts), ids=row))
        return results

    @torch.inference_mode()
    def score_choices(
        self, prefix: list[int], queries: list[list[int]], choices: list[list[list[int]]], reuse: bool = True
    ):
        """Yields, per query, (summed log-probability, token count) of each of its choices after prefix + query.

        With `reuse` the prefix's KV cache is computed once and brought back after every query and choice (cropped, or
        restored from a snapshot where it holds state), so each query costs only its own tokens and its choices'.
        Without it every (query, choice) runs the full sequence.
        """
        if not reuse:
            for query, options in zip(queries, choices):
                yield [self._choice_logprob_naive(prefix + query, choice) for choice in options]
            return
        if not prefix:  # nothing shared: each query is its own prefix
            for query, options in zip(queries, choices):
                yield from self.score_choices(query, [[]], [options])
            return
        # only the last position's logits are needed from the prefix: skip the LM head over the whole block
        prefix_out = self.model(input_ids=self._ids(prefix), use_cache=True, logits_to_keep=1)
        cache = getattr(prefix_out, self._cache)
        after_prefix = _mark(cache)
        for query, options in zip(queries, choices):
            if query:
                last = self.model(input_ids=self._ids(query), **{self._cache: cache}, use_cache=True, logits_to_keep=1)
                last = last.logits
            else:
                last = prefix_out.logits
            first = torch.log_softmax(last[0, -1].float(), dim=-1)
            after_query = _mark(cache)
            scores = []
            for choice in options:
                total = float(first[choice[0]])
                if len(choice) > 1:
                    rest = self.model(input_ids=self._ids(choice[:-1]), **{self._cache: cache}, use_cache=True)
                    total += _continuation_logprob(rest.logits[0], choice[1:])
                    _rewind(cache, after_query)
                scores.append((total, len(choice)))
            _rewind(cache, after_prefix)
            yield scores

    def _choice_logprob_naive(self, context: list[int], choice: list[int]) -> tuple[float, int]:
        logits = self.model(input_ids=self._ids(context + choice[:-1])).logits[0]
        return _continuation_logprob(logits[len(context) - 1 :], choice), len(choice)

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], device=self.device)

    @torch.inference_mode()
    def token_nll(self, ids: list[int]):
        """NLL (nats) of ids[1:], each after the ones before it: one causal pass through the decoder, then the LM head
        and the loss over slices of `NLL_SLICE` positions, so no L × vocab logits tensor is held (64K positions of a
        49K vocabulary are 12.8 GB in fp32); a slice's logits are freed before the next is computed."""
        check_plain_head(self.model.config, self.info.name)
        hidden = self.model.get_decoder()(input_ids=self._ids(ids), use_cache=False).last_hidden_state[0, :-1]
        head = self.model.get_output_embeddings()
        targets = torch.tensor(ids[1:], device=self.device)
        nll = torch.empty(len(ids) - 1, dtype=torch.float32)
        for start in range(0, len(ids) - 1, self.NLL_SLICE):
            logits = head(hidden[start : start + self.NLL_SLICE]).float()
            picked = logits.gather(1, targets[start : start + self.NLL_SLICE, None])[:, 0]
            nll[start : start + len(picked)] = (torch.logsumexp(logits, dim=-1) - picked).cpu()
            del logits
        return nll.numpy()

    @torch.inference_mode()
    def attention_rows(self, ids: list[int], rows: list[int], segment_ids: list[int], n_segments: int):
        """(layers, heads, rows, segments) numpy array: each head's softmax weight per key segment, for the chosen
        rows only, over the layers that attend (a hybrid's Mamba layers have no map); and, for DIFF V2, its per-token
        λ at those rows, (layers, h, rows) (None otherwise)."""
        with capturing(self.model, rows, segment_ids, n_segments) as capture:
            # the decoder alone: the LM head over every position would cost T × vocab floats for nothing
            self.model.get_decoder()(input_ids=torch.tensor([ids], device=self.device), use_cache=False)
        check_captured(self.info, capture.shares, "the attention analysis")
        shares = torch.stack([capture.shares[layer] for layer in sorted(capture.shares)]).float().cpu().numpy()
        lambdas = None
        if capture.lambdas:
            lambdas = torch.stack([capture.lambdas[layer] for layer in sorted(capture.lambdas)]).numpy()
        return shares, lambdas


# config fields by which a model transforms its LM head's output: `token_nll` applies the head itself, so it refuses
# these rather than return another distribution's NLL
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def check_plain_head(config, model: str) -> None:
    for name in LOGIT_TRANSFORMS:
        if getattr(config, name, None) not in (None, 1, 1.0):
            raise InputError(f"model {model} transforms its logits ({name}): nll on hf supports plain LM heads only")


def cache_keyword(forward) -> str:
    """The keyword (and output field) a model's forward takes its KV cache by: transformers 5.24 names it `cache`,
    5.19-5.23 `past_key_values`. The forward's signature says which it takes (a checkpoint's remote code may be older
    than transformers); one that takes both (diffeval's Phi-4-mini-flash) answers in transformers' output field."""
    parameters = inspect.signature(forward).parameters
    outputs = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
    takes_cache = "cache" in parameters and ("past_key_values" not in parameters or "cache" in outputs)
    return "cache" if takes_cache else "past_key_values"


def forward_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices of the prompts that share one forward pass, in order: a group grows while its padded size (members ×
    longest) stays within `max_tokens`; a prompt longer than that runs alone."""
    groups: list[list[int]] = []
    longest = 0
    for i, length in enumerate(lengths):
        if groups and (len(groups[-1]) + 1) * max(longest, length) <= max_tokens:
            groups[-1].append(i)
            longest = max(longest, length)
        else:
            groups.append([i])
            longest = length
    return groups


def _mark(cache):
    """A point `_rewind` can bring the cache back to: a snapshot where the cache offers one (Phi-4-mini-flash's, whose
    Mamba states and sliding windows hold no earlier positions to crop back to), else its length."""
    return cache.snapshot() if hasattr(cache, "snapshot") else cache.get_seq_length()


def _rewind(cache, mark) -> None:
    """Back to `mark`: positions past it dropped (transformers 5 crops by a negative count of tokens to remove)."""
    if hasattr(cache, "restore"):
        cache.restore(mark)
        return
    extra = cache.get_seq_length() - mark
    if extra > 0:
        cache.crop(-extra)


def _continuation_logprob(logits: torch.Tensor, targets: list[int]) -> float:
    """Sum of log P(targets[i]) under logits[i] (row i predicts target i)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return float(logprobs[torch.arange(len(targets)), torch.tensor(targets, device=logits.device)].sum())


class _AnswerEnded(StoppingCriteria):
    """Stops each row once its answer has ended by the rule every engine applies (tokenizer.answer_end): a stop
    string counts only after the answer has begun, which transformers' own stop strings cannot express."""

    def __init__(self, decoder: HFTokenizer, prompts: list[list[int]], width: int, stop: list[str], stop_ids):
        self.decoder, self.prompts, self.width, self.stop, self.stop_ids = decoder, prompts, width, stop, stop_ids

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        ended = [
            answer_end(self.decoder.decode_continuation(prompt, _through_stop(row, self.stop_ids), self.stop_ids),
                       self.stop) is not None
            for prompt, row in zip(self.prompts, input_ids[:, self.width :].tolist())
        ]  # fmt: skip
        return torch.tensor(ended, dtype=torch.bool, device=input_ids.device)


class _IdsEnded(StoppingCriteria):
    """Stops each row once its generated ids end in `end` (a reasoning model's end-of-thinking marker): one tensor
    comparison per step, where decoding every row at every step would cost the square of a long thinking."""

    def __init__(self, end: Sequence[int], width: int):
        self.end, self.width = list(end), width

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        if input_ids.shape[1] - self.width < len(self.end):  # the marker cannot be generated yet (never the prompt's)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        end = torch.tensor(self.end, device=input_ids.device)
        return (input_ids[:, -len(self.end) :] == end).all(dim=1)


def _through_stop(row: list[int], stop_ids: set[int]) -> list[int]:
    """A generated row up to and including its first EOS (counted as generated, as vLLM counts it); finished rows of a
    batch are padded after it."""
    for i, token in enumerate(row):
        if token in stop_ids:
            return row[: i + 1]
    return row
