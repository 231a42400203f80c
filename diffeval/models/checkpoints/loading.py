"""Model spec → (model, tokenizer, ModelInfo). DIFF detection and the `models inspect` summary.

Which DIFF variant a config builds, and what that variant needs, comes from the registry (models/variants/registry.py):
this module names no variant. Variants transformers does not ship are unknown to its Auto classes: every function here
that calls an Auto* class registers them first (`variants.register`), so `--model PATH` loads one without
--trust-remote-code. The registration imports transformers' Llama modeling code, so it waits for the first load
instead of `import diffeval`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PretrainedConfig

from diffeval.errors import InputError
from diffeval.models.checkpoints import gguf
from diffeval.models.checkpoints.preflight import check_spec
from diffeval.models.spec import ModelInfo, ModelSpec
from diffeval.models.variants import registry as variants
from diffeval.models.variants.base import PER_LAYER


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    info: ModelInfo


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda but no CUDA device is visible: use --device cpu or auto")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return getattr(torch, dtype)


HUB_PROBE_SECONDS = 2.0  # how long the hub may take to answer before a hub id is looked up in the local cache alone


@functools.cache
def _hub_unavailable() -> str | None:
    """Why the hub cannot be asked (HF_HUB_OFFLINE, or no answer within HUB_PROBE_SECONDS), once per process; None
    when it answers. Without an answer, hub lookups switch to the local cache: huggingface_hub would otherwise retry
    every file for ~30 s."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    answered = []

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=HUB_PROBE_SECONDS)
        except urllib.error.HTTPError:  # an answer, if not a welcome one
            pass
        except (OSError, ValueError):
            return
        answered.append(True)

    # a thread bounds the whole probe: a name lookup ignores socket timeouts
    probe = threading.Thread(target=ask, daemon=True)
    probe.start()
    probe.join(HUB_PROBE_SECONDS)
    if answered:
        return None
    constants.HF_HUB_OFFLINE = True  # what transformers and huggingface_hub read as offline mode: cache only
    return f"the hub ({constants.ENDPOINT}) is not reachable"


def _check_hub(spec: ModelSpec) -> None:
    """A hub id the hub cannot be asked for must be in the local cache: refused at once in one line otherwise."""
    if Path(spec.path).expanduser().exists():
        return
    reason = _hub_unavailable()
    if reason is None:
        return
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(spec.path, "config.json"), str):
        raise InputError(
            f"model {spec.name}: hub id {spec.spec!r} is not in the local cache and {reason}: download it first "
            f"(`hf download {spec.spec}`) or give a local folder"
        )


def source(spec: ModelSpec) -> tuple[str, dict[str, str]]:
    """Where transformers loads a model from, and how: a GGUF file is its folder plus `gguf_file`."""
    file = gguf.find(spec.path, spec.name)
    return (file.folder, {"gguf_file": file.name}) if file else (spec.path, {})


def _from_pretrained(auto, path: str, trust_remote_code: bool, gguf_file: str | None = None):
    """`auto.from_pretrained`; a GGUF file's config and tokenizer are parsed from it once per process (seconds each:
    the check stage and the engine both ask) and handed out as copies, as callers change them (pad token)."""
    if gguf_file is None:
        return auto.from_pretrained(path, trust_remote_code=trust_remote_code)
    return copy.deepcopy(_parsed_gguf(auto, path, gguf_file, trust_remote_code))


@functools.lru_cache(maxsize=8)
def _parsed_gguf(auto, path: str, gguf_file: str, trust_remote_code: bool):
    return auto.from_pretrained(path, gguf_file=gguf_file, trust_remote_code=trust_remote_code)


def load_config(spec: ModelSpec, trust_remote_code: bool = False):
    check_spec(spec)
    _check_hub(spec)
    variants.register()
    for known in variants.VARIANTS:  # before transformers reads a config it may not know
        check_folder = known.code(known.check_folder)
        if check_folder is not None:
            check_folder(spec)
    path, extra = source(spec)
    if extra:  # `source` gave GGUF loading arguments: the spec names a GGUF file
        found = gguf.find(spec.path, spec.name)
        assert found is not None
        gguf.describe(found, spec.name)  # the header first: a truncated file is named so
    try:
        with quiet_transformers():
            config = _from_pretrained(AutoConfig, path, trust_remote_code, **extra)
    except Exception as exc:  # a broken checkpoint raises anything from OSError to JSONDecodeError
        if extra and "not supported" in str(exc):  # a whole file of an architecture transformers cannot read
            raise InputError(
                f"model {spec.name}: {spec.spec} is a GGUF file of an architecture transformers cannot load "
                f"({' '.join(str(exc).split())[:LOAD_REASON_CHARS]}): use a GGUF of a Llama-family model, or the "
                "model's safetensors checkpoint"
            ) from None
        raise load_error(spec, "its config", exc) from None
    if extra and not config.architectures:  # a GGUF header names its architecture family, not the model class
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        named = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        config.architectures = [named] if named else None
    variant = variants.variant_of(config)
    if variant is not None and variant.check_config:
        variant.code(variant.check_config)(spec, config, _given_keys(path, config, extra))
    return config


def _given_keys(path: str, config, extra: dict) -> set[str]:
    """The keys the checkpoint's config itself holds: the loaded config has the class's defaults filled in (a Llama
    config without head_dim gets hidden_size // num_attention_heads), so a check of a missing key reads these. A
    GGUF file's config is built from its header: every key counts as given."""
    if extra:
        return set(config.to_dict())
    with quiet_transformers():
        return set(PretrainedConfig.get_config_dict(path)[0])


def load_tokenizer(spec: ModelSpec, trust_remote_code: bool = False):
    """The checkpoint's tokenizer (fast tokenizers only: token offsets of needles and answers come from them)."""
    check_spec(spec)
    _check_hub(spec)
    variants.register()  # AutoTokenizer may read the model config to pick the tokenizer class
    path, extra = source(spec)
    try:
        with quiet_transformers():
            tokenizer = _from_pretrained(AutoTokenizer, path, trust_remote_code, **extra)
    except Exception as exc:
        raise load_error(spec, "its tokenizer", exc) from None
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(f"model {spec.name}: diffeval needs a fast (tokenizers) tokenizer, found {type(tokenizer)}")
    return tokenizer


@contextmanager
def quiet_transformers():
    """transformers' own load report and warnings stay off the terminal: diffeval's check stage states what they
    find in one line (a missing or misshapen tensor is refused before any load)."""
    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.utils.logging.set_verbosity(verbosity)


LOAD_REASON_CHARS = 400


MEMORY_WORDS = ("out of memory", "cannot allocate", "can't allocate", "not enough memory", "insufficient memory")


def is_resource_error(exc: BaseException) -> bool:
    """Memory ran out (the host's or the device's): the run's settings ask for too much, the files are not at fault."""
    return isinstance(exc, MemoryError) or any(word in str(exc).lower() for word in MEMORY_WORDS)


def memory_error(spec: ModelSpec, dtype: torch.dtype, device: str, exc: BaseException) -> InputError:
    """A load that ran out of memory, blamed on the options that sized it, with a value that needs less."""
    reason = " ".join(str(exc).split())[:LOAD_REASON_CHARS] or type(exc).__name__
    name = str(dtype).removeprefix("torch.")
    if dtype == torch.float32:
        fix = "pass --dtype bfloat16 (half of float32's memory)"
    elif device == "cuda":
        fix = "pass --device cpu (the machine's memory), or free the GPU"
    else:
        fix = "run it on a machine with more memory, or close what holds it"
    return InputError(
        f"model {spec.name}: its weights do not fit in the {device} memory as --dtype {name} ({reason}); the "
        f"checkpoint files are whole: {fix}"
    )


def load_error(spec: ModelSpec, what: str, exc: Exception) -> InputError:
    # the whole message on one line: a config validator's reason comes on the lines after its heading
    text = " ".join(str(exc).split())
    if "trust_remote_code" in text:
        return InputError(f"model {spec.name} uses custom code: rerun with --trust-remote-code")
    reason = text[:LOAD_REASON_CHARS] + ("…" if len(text) > LOAD_REASON_CHARS else "") or type(exc).__name__
    local = Path(spec.path).expanduser().exists()
    return InputError(
        f"model {spec.name}: cannot load {what} from {spec.spec!r} ({reason}); "
        + ("check the checkpoint files" if local else "check the hub id and the network")
    )


def stop_token_ids(spec: ModelSpec, config, tokenizer) -> list[int]:
    """The ids a generation ends at, the same on every engine: the tokenizer's EOS and every EOS the checkpoint's
    generation config (or, without one, its model config) lists. Llama-3 lists several."""
    try:
        listed = GenerationConfig.from_pretrained(source(spec)[0]).eos_token_id
    except OSError:  # no generation_config.json: transformers and vLLM fall back to the model config's
        listed = getattr(config.get_text_config(), "eos_token_id", None)
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for token in [listed] if isinstance(listed, int) else listed or []:
        if token not in ids:
            ids.append(token)
    return ids


def is_diff_config(config, kind: str = "auto") -> bool:
    if kind != "auto":
        return kind == "diff"
    return variants.variant_of(config) is not None


def describe(spec: ModelSpec, config, model=None, kind: str = "auto") -> ModelInfo:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text_config, "num_attention_heads", None)
    hidden = getattr(text_config, "hidden_size", None)
    head_dim = getattr(text_config, "head_dim", None) or (hidden // heads if hidden and heads else None)
    rope = getattr(text_config, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    is_diff = is_diff_config(config, kind)
    variant = variants.variant_of(config)
    info = ModelInfo(
        name=spec.name,
        spec=spec.spec,
        architecture=(config.architectures or [type(model).__name__ if model is not None else config.model_type])[0],
        is_diff=is_diff,
        layers=getattr(text_config, "num_hidden_layers", None),
        heads=heads,
        kv_heads=getattr(text_config, "num_key_value_heads", heads),
        head_dim=head_dim,
        max_positions=getattr(text_config, "max_position_embeddings", None),
        rope_theta=rope_theta if rope_theta is not None else getattr(text_config, "rope_theta", None),
        diff_variant=variant.name if is_diff and variant else None,
        noise_heads=getattr(text_config, "num_noise_heads", None) if is_diff and variant else None,
    )
    info.layer_kinds = [asdict(layer) for layer in variants.layers_of(config)]
    file = gguf.find(spec.path, spec.name)
    if file is not None:
        info.gguf = gguf.describe(file, spec.name)
    if model is not None:
        info.parameters = sum(p.numel() for p in model.parameters())
        if is_diff and variant and variant.lambda_form == PER_LAYER:
            info.lambdas = variant.code(variant.inspect_lambdas)(model)
    return info


def check_attn_impl(name: str) -> None:
    """An attention implementation transformers knows (eager and those in its registry), or a hub kernel (`org/name`,
    fetched by transformers): anything else fails at the first load, after other models may have run."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    known = ["eager", *ALL_ATTENTION_FUNCTIONS.keys()]
    if name not in known and "/" not in name:
        raise InputError(f"unknown --attn-impl {name!r}: use one of {', '.join(known)}")


def load_model(
    spec: ModelSpec,
    device: str = "auto",
    dtype: str = "auto",
    attn_impl: str = "sdpa",
    trust_remote_code: bool = False,
) -> LoadedModel:
    config = load_config(spec, trust_remote_code)
    device = resolve_device(device)
    transformers.utils.logging.disable_progress_bar()  # diffeval draws its own progress bars
    torch_dtype = resolve_dtype(dtype, device)
    kwargs = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if attn_impl:
        kwargs["attn_implementation"] = attn_impl
    tokenizer = load_tokenizer(spec, trust_remote_code)
    try:
        with quiet_transformers():
            path, extra = source(spec)
            with gguf.quiet_loader() if extra else contextlib.nullcontext():
                # a GGUF file's config is the one parsed above: handed over, it is not parsed from the file again
                given = {"config": config} if extra else {}
                model = AutoModelForCausalLM.from_pretrained(path, **kwargs, **extra, **given)
    except Exception as exc:  # truncated or mismatched weight files, or too little memory for --dtype
        if is_resource_error(exc):
            raise memory_error(spec, torch_dtype, device, exc) from None
        raise load_error(spec, "its weights", exc) from None
    variant = variants.variant_of(config)
    if variant is not None and variant.after_load:
        variant.code(variant.after_load)(model, config)
    try:
        model.to(device).eval()  # type: ignore[arg-type]  # transformers' wrapper of `to` hides torch's signature
    except Exception as exc:
        if is_resource_error(exc):
            raise memory_error(spec, torch_dtype, device, exc) from None
        raise
    if tokenizer.pad_token_id is None:
        # batched generation pads on the left; any id works because padded positions are masked out
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.convert_ids_to_tokens(0)
    tokenizer.padding_side = "left"
    # decoding is diffeval's (greedy, no penalties), never the checkpoint's: transformers fills every setting a call
    # leaves unset from `model.generation_config`, so a checkpoint asking for repetition_penalty would get it
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=stop_token_ids(spec, config, tokenizer),
        pad_token_id=tokenizer.pad_token_id,
    )
    return LoadedModel(model=model, tokenizer=tokenizer, info=describe(spec, config, model, spec.kind))


def library_versions() -> dict[str, str]:
    import diffeval

    return {"diffeval": diffeval.__version__, "torch": torch.__version__, "transformers": transformers.__version__}
