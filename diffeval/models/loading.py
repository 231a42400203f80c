"""Model spec → (model, tokenizer, ModelInfo). DIFF detection and the `models inspect` summary."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from diffeval.errors import InputError
from diffeval.models.diff import DIFF_ARCHITECTURES, layer_lambdas
from diffeval.models.spec import ModelInfo, ModelSpec


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


def _check_spec(spec: ModelSpec) -> None:
    """A path-looking spec must exist; anything else is treated as a hub id."""
    path = Path(spec.path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise InputError(f"model {spec.name}: {spec.spec} has no config.json; point at a saved checkpoint folder")
    elif spec.spec.startswith((".", "/", "~")) or spec.spec.count("/") > 1:  # hub ids are `org/name`
        raise InputError(f"model {spec.name}: path {spec.spec} does not exist; check the path or give a hub id")


def load_config(spec: ModelSpec, trust_remote_code: bool = False):
    _check_spec(spec)
    try:
        return AutoConfig.from_pretrained(spec.path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # a broken checkpoint raises anything from OSError to JSONDecodeError
        raise _load_error(spec, "its config", exc) from None


def load_tokenizer(spec: ModelSpec, trust_remote_code: bool = False):
    """The checkpoint's tokenizer (fast tokenizers only: token offsets of needles and answers come from them)."""
    _check_spec(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise _load_error(spec, "its tokenizer", exc) from None
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(f"model {spec.name}: diffeval needs a fast (tokenizers) tokenizer, found {type(tokenizer)}")
    return tokenizer


def check_checkpoint(spec: ModelSpec, trust_remote_code: bool = False):
    """Before any work: the config and tokenizer load, and a local folder's weight files are whole (their headers
    read and their sizes cover the tensors they declare). Returns the config."""
    config = load_config(spec, trust_remote_code)
    load_tokenizer(spec, trust_remote_code)
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
        for path in weights:
            try:
                with safe_open(str(path), framework="pt"):
                    pass
            except Exception as exc:
                raise _load_error(spec, "its weights", exc) from None
    return config


def _load_error(spec: ModelSpec, what: str, exc: Exception) -> InputError:
    text = str(exc).strip()
    if "trust_remote_code" in text:
        return InputError(f"model {spec.name} uses custom code: rerun with --trust-remote-code")
    first = text.splitlines()[0][:300] if text else type(exc).__name__
    return InputError(
        f"model {spec.name}: cannot load {what} from {spec.spec!r} ({first}); "
        "check the checkpoint files, or the hub id and network"
    )


def is_diff_config(config, kind: str = "auto") -> bool:
    if kind != "auto":
        return kind == "diff"
    return any(arch in DIFF_ARCHITECTURES for arch in (config.architectures or [])) or config.model_type == "diffllama"


def describe(spec: ModelSpec, config, model=None, kind: str = "auto") -> ModelInfo:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text_config, "num_attention_heads", None)
    hidden = getattr(text_config, "hidden_size", None)
    head_dim = getattr(text_config, "head_dim", None) or (hidden // heads if hidden and heads else None)
    rope = getattr(text_config, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    is_diff = is_diff_config(config, kind)
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
    )
    if model is not None:
        info.parameters = sum(p.numel() for p in model.parameters())
        if is_diff and hasattr(model.get_decoder().layers[0].self_attn, "lambda_q1"):
            info.lambdas = layer_lambdas(model)
    return info


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
        model = AutoModelForCausalLM.from_pretrained(spec.path, **kwargs)
    except Exception as exc:  # truncated or mismatched weight files
        raise _load_error(spec, "its weights", exc) from None
    model.to(device).eval()
    if tokenizer.pad_token_id is None:
        # batched generation pads on the left; any id works because padded positions are masked out
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.convert_ids_to_tokens(0)
    tokenizer.padding_side = "left"
    return LoadedModel(model=model, tokenizer=tokenizer, info=describe(spec, config, model, spec.kind))


def library_versions() -> dict[str, str]:
    import diffeval

    return {"diffeval": diffeval.__version__, "torch": torch.__version__, "transformers": transformers.__version__}
