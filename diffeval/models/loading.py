"""Model spec → (model, tokenizer, ModelInfo). DIFF detection and the `models inspect` summary.

Which DIFF variant a config builds, and what that variant needs, comes from the registry (models/variants.py).
Variants transformers does not ship (DIFF V2, models/diffllama2.py) are unknown to its Auto classes: every function
here that calls an Auto* class registers them first (`register_variants`), so `--model PATH` loads one without
--trust-remote-code. The registration imports transformers' Llama modeling code, so it waits for the first load
instead of `import diffeval`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import re
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from diffeval.errors import InputError
from diffeval.models import gguf, variants
from diffeval.models.diff import AXOLOTL_INIT_KEYS, sublayer_norm
from diffeval.models.spec import ModelInfo, ModelSpec
from diffeval.models.tokenizer import check_chat_template


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    info: ModelInfo


def register_variants() -> None:
    """Make AutoConfig and AutoModelForCausalLM know the DIFF variants transformers does not ship; idempotent."""
    global _VARIANTS_REGISTERED
    if not _VARIANTS_REGISTERED:
        variants.register_hf()
        _VARIANTS_REGISTERED = True


_VARIANTS_REGISTERED = False


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


def _check_spec(spec: ModelSpec) -> None:
    """A path-looking spec must exist; anything else is treated as a hub id."""
    path = Path(spec.path).expanduser()
    if path.exists():
        if gguf.find(spec.path, spec.name):
            return
        if not (path / "config.json").is_file():
            raise InputError(f"model {spec.name}: {spec.spec} has no config.json; point at a saved checkpoint folder")
    elif spec.spec.startswith((".", "/", "~")) or spec.spec.count("/") > 1:  # hub ids are `org/name`
        raise InputError(f"model {spec.name}: path {spec.spec} does not exist; check the path or give a hub id")


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
    _check_spec(spec)
    _check_hub(spec)
    register_variants()
    _refuse_older_axolotl(spec)
    path, extra = source(spec)
    if extra:  # `source` gave GGUF loading arguments: the spec names a GGUF file
        found = gguf.find(spec.path, spec.name)
        assert found is not None
        gguf.describe(found, spec.name)  # the header first: a truncated file is named so
    try:
        with _quiet_transformers():
            config = _from_pretrained(AutoConfig, path, trust_remote_code, **extra)
    except Exception as exc:  # a broken checkpoint raises anything from OSError to JSONDecodeError
        raise _load_error(spec, "its config", exc) from None
    if extra and not config.architectures:  # a GGUF header names its architecture family, not the model class
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        named = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        config.architectures = [named] if named else None
    variant = variants.variant_of(config)
    if variant is not None and variant.check_config:
        variant.code(variant.check_config)(spec, config)
    return config


def _refuse_older_axolotl(spec: ModelSpec) -> None:
    """axolotl's first converter saved its own `llama-differential` model (single-width values, a weighted subln,
    no (1 − λ_init)): no DiffLlama computes it, and transformers cannot read its config."""
    path = Path(spec.path).expanduser() / "config.json"
    try:
        model_type = json.loads(path.read_text()).get("model_type") if path.is_file() else None
    except (ValueError, AttributeError):
        return  # AutoConfig reports the broken file
    if model_type == "llama-differential":
        raise InputError(
            f"model {spec.name}: {spec.spec} is axolotl's older LlamaDifferential layout (model_type "
            '"llama-differential"), which diffeval does not run: convert the base model again with axolotl\'s '
            "current converter (transformers' DiffLlama, plugin/convert.py)"
        )


def check_diff_keys(spec: ModelSpec, config) -> None:
    """A DiffLlama config's per-head-norm keys are honoured on every engine (`diff.sublayer_norm`), axolotl's
    initialisation keys accepted: a value that cannot be honoured is refused here, before any work."""
    for key in ("sublayer_norm", *AXOLOTL_INIT_KEYS):
        value = getattr(config, key, None)
        if hasattr(config, key) and not isinstance(value, bool):
            raise InputError(
                f"model {spec.name}: config.json has {key} = {value!r} ({type(value).__name__}); axolotl writes "
                f"true or false: set it to one of them"
            )
    eps = getattr(config, "sublayer_norm_eps", None)
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0):
        raise InputError(
            f"model {spec.name}: config.json has sublayer_norm_eps = {eps!r}; it is the per-head norm's epsilon: "
            "give a positive number, or remove it to use rms_norm_eps"
        )


# keys that mark the Motif checkpoints diffeval does not run yet (they share the architecture `MotifForCausalLM`):
# Motif-3's latent attention, experts and hyper-connections (its configs carry `num_noise_heads` too)
MOTIF_3_KEYS = ("kv_lora_rank", "q_lora_rank", "num_experts", "moe_intermediate_size", "mhc_enabled")


def check_motif_keys(spec: ModelSpec, config) -> None:
    """A Motif config diffeval computes exactly: Motif-2.6B's dense DIFF attention or Motif-2-12.7B's grouped one, with
    PolyNorm (the head counts are checked by the config class, models/motif.py)."""
    found = [key for key in MOTIF_3_KEYS if getattr(config, key, None) is not None]
    if found:
        raise InputError(
            f"model {spec.name}: config.json has {', '.join(found)}: not supported yet: Motif-3 (latent attention, "
            "experts); diffeval runs Motif-2.6B's and Motif-2-12.7B's layouts"
        )
    if config.hidden_act != "poly_norm":
        raise InputError(
            f"model {spec.name}: config.json has hidden_act = {config.hidden_act!r}; Motif's MLP is PolyNorm: set "
            '"poly_norm"'
        )


def honour_sublayer_norm(model, config) -> None:
    """transformers' DiffLlama builds every layer's per-head norm with rms_norm_eps and ignores `sublayer_norm` and
    `sublayer_norm_eps`: rebuild it as the config says (axolotl's converter sets `groupnorm = nn.Identity()`)."""
    enabled, eps = sublayer_norm(config)
    if enabled and eps == config.rms_norm_eps:
        return
    for layer in model.get_decoder().layers:
        attention = layer.self_attn
        attention.groupnorm = (
            torch.nn.RMSNorm(2 * attention.head_dim, eps=eps, elementwise_affine=False)
            if enabled
            else torch.nn.Identity()
        )


def load_tokenizer(spec: ModelSpec, trust_remote_code: bool = False):
    """The checkpoint's tokenizer (fast tokenizers only: token offsets of needles and answers come from them)."""
    _check_spec(spec)
    _check_hub(spec)
    register_variants()  # AutoTokenizer may read the model config to pick the tokenizer class
    path, extra = source(spec)
    try:
        with _quiet_transformers():
            tokenizer = _from_pretrained(AutoTokenizer, path, trust_remote_code, **extra)
    except Exception as exc:
        raise _load_error(spec, "its tokenizer", exc) from None
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(f"model {spec.name}: diffeval needs a fast (tokenizers) tokenizer, found {type(tokenizer)}")
    return tokenizer


def check_checkpoint(spec: ModelSpec, trust_remote_code: bool = False, chat_template: bool = False):
    """The check stage, before any work: the config and tokenizer load (with a chat template if the run renders one),
    the config builds its architecture and that architecture computes a forward pass with its head layout (on the
    meta device: no memory, no weights), and a local folder's weight files are whole (their headers read and their
    sizes cover the tensors they declare) and hold exactly the architecture's tensors. Returns the config."""
    config = load_config(spec, trust_remote_code)
    tokenizer = load_tokenizer(spec, trust_remote_code)
    if chat_template:
        check_chat_template(tokenizer, spec.name)
    model = check_architecture(spec, config, trust_remote_code)  # built once, read by every check below
    file = gguf.find(spec.path, spec.name)
    if file is not None:
        check_weights(spec, config, gguf.tensor_shapes(file, spec.name, model), trust_remote_code, model)
        return config
    folder = Path(spec.path).expanduser()
    if folder.is_dir():
        weights = sorted(folder.glob("*.safetensors"))
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                names = set(json.loads(index.read_text())["weight_map"].values())
            except (ValueError, KeyError, TypeError) as exc:
                raise _load_error(spec, "its weights", exc) from None
            missing = sorted(n for n in names if not (folder / n).is_file())
            if missing:
                raise _load_error(spec, "its weights", FileNotFoundError(f"missing shard(s) {', '.join(missing)}"))
        headers = {}  # file name → {tensor name: shape}, from the safetensors headers
        for path in weights:
            try:
                with safe_open(str(path), framework="pt") as handle:
                    headers[path.name] = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
            except Exception as exc:
                raise _load_error(spec, "its weights", exc) from None
        # the files transformers loads: the index's shards, or model.safetensors (not, say, consolidated.safetensors)
        loaded = sorted(names) if index.is_file() else [n for n in ("model.safetensors",) if n in headers]
        if loaded:  # pytorch_model.bin checkpoints have no header to read
            found = {tensor: shape for name in loaded for tensor, shape in headers[name].items()}
            check_weights(spec, config, found, trust_remote_code, model)
    return config


def meta_model(config, trust_remote_code: bool = False):
    """The model the config builds, on the meta device (no memory, no weights)."""
    register_variants()
    with torch.device("meta"), _quiet_transformers():
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


PROBE_TOKENS = 8  # the meta forward's length: enough for every mask and head reshape, free on the meta device


def check_architecture(spec: ModelSpec, config, trust_remote_code: bool = False):
    """The config builds its model, and the model computes: head counts, KV heads and head_dim that fit each
    other (a DiffLlama needs an even number of KV heads, reshapes need whole heads). Both run on the meta device, so
    a config that would crash at its first forward, after other models had already written records, is refused now.
    Custom code (--trust-remote-code) is built but not run: it may read tensor values, which meta tensors lack.
    Returns the meta model."""
    try:
        model = meta_model(config, trust_remote_code)
    except Exception as exc:
        raise _config_error(spec, "does not build its architecture", exc) from None
    if trust_remote_code and type(model).__module__.startswith("transformers_modules"):
        return model
    try:  # tensors the forward creates (positions, masks, the cache) must be meta too
        with torch.device("meta"), torch.no_grad():
            model(input_ids=torch.zeros(1, PROBE_TOKENS, dtype=torch.long))
    except Exception as exc:
        if "meta" in str(exc):  # an operation meta tensors lack (reading a value): inconclusive, not a bad config
            return model
        raise _config_error(spec, "has a head layout its architecture cannot compute", exc) from None
    return model


def _config_error(spec: ModelSpec, what: str, exc: Exception) -> InputError:
    reason = " ".join(str(exc).split())[:300] or type(exc).__name__
    return InputError(
        f"model {spec.name}: the config.json of {spec.spec} {what} ({reason}): fix num_attention_heads, "
        "num_key_value_heads and head_dim, or use the config.json the weights were saved with"
    )


@contextmanager
def _quiet_transformers():
    """transformers' own load report and warnings stay off the terminal: diffeval's check stage states what they
    find in one line (a missing or misshapen tensor is refused before any load)."""
    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.utils.logging.set_verbosity(verbosity)


def architecture_shapes(config, trust_remote_code: bool = False, model=None):
    """The model the config builds, on the meta device (no memory): its state dict's names and shapes (non-persistent
    buffers are not in it), the groups of tied names (a checkpoint stores one of each), and the model (`model`: one
    already built from this config)."""
    model = meta_model(config, trust_remote_code) if model is None else model
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    groups: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(parameter), []).append(name)
    return shapes, [names for names in groups.values() if len(names) > 1], model


def check_weights(
    spec: ModelSpec, config, found: dict[str, tuple[int, ...]], trust_remote_code: bool = False, model=None
) -> None:
    """Before any work: the checkpoint's tensors (`found`: name → shape) are exactly those of the architecture its
    config names, with the same shapes. transformers would fill a missing tensor with random values and drop an
    unexpected one, silently."""
    expected, tied, model = architecture_shapes(config, trust_remote_code, model)
    if _renamed_on_load(model):  # transformers renames this architecture's checkpoint keys while loading
        return
    prefix = model.base_model_prefix
    under = prefix + "."
    if prefix and not any(k.startswith(under) for k in found) and any(k.startswith(under) for k in expected):
        found = {f"{prefix}.{name}": shape for name, shape in found.items()}  # saved from the base model alone
    optional = {name for names in tied if any(n in found for n in names) for name in names}
    ignore_missing = [re.compile(p) for p in model._keys_to_ignore_on_load_missing or []]
    ignore_unexpected = [re.compile(p) for p in model._keys_to_ignore_on_load_unexpected or []]
    missing = sorted(
        n for n in expected if n not in found and n not in optional and not any(p.search(n) for p in ignore_missing)
    )
    unexpected = sorted(n for n in found if n not in expected and not any(p.search(n) for p in ignore_unexpected))
    misshapen = sorted(n for n in found if n in expected and found[n] != expected[n])
    if not (missing or unexpected or misshapen):
        return
    problems = []
    if missing:
        problems.append(f"missing {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected {_names(unexpected)}")
    if misshapen:
        shown = ", ".join(f"{n} {list(found[n])} (model {list(expected[n])})" for n in misshapen[:3])
        problems.append(f"misshapen {shown}" + (f" and {len(misshapen) - 3} more" if len(misshapen) > 3 else ""))
    architecture = (config.architectures or [config.model_type])[0]
    raise InputError(
        f"model {spec.name}: the weights in {spec.spec} do not match {architecture} ({'; '.join(problems)}): "
        + _layout_hint(missing, unexpected, misshapen)
    )


def _names(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _layout_hint(missing: list[str], unexpected: list[str], misshapen: list[str]) -> str:
    """What to do, naming the layout where the tensor names say which one the weights come from."""
    names = unexpected + missing + misshapen
    if any(".subln." in n or ".out_proj." in n for n in unexpected):
        return (
            "these are the paper's own Diff-Transformer modules (microsoft/unilm: subln, out_proj): convert them with "
            "`diffeval models convert --from unilm-v1:MODULE SRC DST`, MODULE the file they were trained with "
            "(diffattn, flashdiff1 or flashdiff2)"
        )
    if any(".lambda_proj." in n for n in unexpected):
        return (
            "these are Differential Transformer V2 weights (lambda_proj): give them a V2 config (model_type "
            '"diffllama2", architectures ["DiffLlama2ForCausalLM"], num_attention_heads = the differential heads h, '
            "q_proj making 2h query heads), or, if they were trained with the paper's module (interleaved rotary), "
            "convert them with `diffeval models convert --from unilm-v2 SRC DST`"
        )
    if missing and all(".lambda_proj." in n for n in missing) and not unexpected:
        return (
            "a DIFF V2 checkpoint without its λ projections (lambda_proj; saved from a Llama, or cut short?); point "
            "--model at the V2 checkpoint that was trained, or give these weights the config they were saved with"
        )
    if missing and all(".lambda_" in n for n in missing) and not unexpected:
        return (
            "a DiffLlama checkpoint without its λ tensors (saved from a Llama, or cut short?); point --model at the "
            "DIFF checkpoint that was trained, or give these weights the config they were saved with"
        )
    if any(".lambda_" in n for n in names):
        return "the DIFF tensors do not fit this config; use the config.json the weights were saved with"
    return "use the config.json the weights were saved with, or re-save the model with save_pretrained"


def _renamed_on_load(model) -> bool:
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # transformers before conversion mappings: names load as they are
        return False
    return any(get_checkpoint_conversion_mapping(k) for k in (type(model).__name__, model.config.model_type))


LOAD_REASON_CHARS = 400


def _load_error(spec: ModelSpec, what: str, exc: Exception) -> InputError:
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
    file = gguf.find(spec.path, spec.name)
    if file is not None:
        info.gguf = gguf.describe(file, spec.name)
    if model is not None:
        info.parameters = sum(p.numel() for p in model.parameters())
        if is_diff and variant and variant.lambda_form == variants.PER_LAYER:
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
    kwargs = {"dtype": resolve_dtype(dtype, device), "trust_remote_code": trust_remote_code}
    if attn_impl:
        kwargs["attn_implementation"] = attn_impl
    tokenizer = load_tokenizer(spec, trust_remote_code)
    try:
        with _quiet_transformers():
            path, extra = source(spec)
            with gguf.quiet_loader() if extra else contextlib.nullcontext():
                model = AutoModelForCausalLM.from_pretrained(path, **kwargs, **extra)
    except Exception as exc:  # truncated or mismatched weight files
        raise _load_error(spec, "its weights", exc) from None
    variant = variants.variant_of(config)
    if variant is not None and variant.after_load:
        variant.code(variant.after_load)(model, config)
    model.to(device).eval()  # type: ignore[arg-type]  # transformers' wrapper of `to` hides torch's signature
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
