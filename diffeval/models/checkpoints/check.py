"""The check stage, before any work: a model's config, tokenizer, architecture and weights, each refused in one line
when it cannot run. What a variant's checkpoints must hold beyond that, the variant's record says (its config checks
run as the config loads, in loading.py; its layout hints name what mismatched weights are)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from diffeval.errors import InputError
from diffeval.models.checkpoints import gguf
from diffeval.models.checkpoints.loading import load_config, load_error, load_tokenizer, quiet_transformers
from diffeval.models.spec import ModelSpec
from diffeval.models.tokenizer import check_chat_template
from diffeval.models.variants import registry as variants


def check_checkpoint(
    spec: ModelSpec, trust_remote_code: bool = False, chat_template: bool = False, switches: dict | None = None
):
    """The check stage, before any work: the config and tokenizer load (with a chat template if the run renders one,
    rendered with the run's --template-switch `switches`), the config builds its architecture and that architecture
    computes a forward pass with its head layout (on the meta device: no memory, no weights), and a local folder's
    weight files are whole (their headers read and their sizes cover the tensors they declare) and hold exactly the
    architecture's tensors. Returns the config."""
    config = load_config(spec, trust_remote_code)
    tokenizer = load_tokenizer(spec, trust_remote_code)
    if chat_template:
        check_chat_template(tokenizer, spec.name, switches)
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
                raise load_error(spec, "its weights", exc) from None
            missing = sorted(n for n in names if not (folder / n).is_file())
            if missing:
                raise load_error(spec, "its weights", FileNotFoundError(f"missing shard(s) {', '.join(missing)}"))
        headers = {}  # file name → {tensor name: shape}, from the safetensors headers
        for path in weights:
            try:
                with safe_open(str(path), framework="pt") as handle:
                    headers[path.name] = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
            except Exception as exc:
                raise load_error(spec, "its weights", exc) from None
        # the files transformers loads: the index's shards, or model.safetensors (not, say, consolidated.safetensors)
        loaded = sorted(names) if index.is_file() else [n for n in ("model.safetensors",) if n in headers]
        if loaded:  # pytorch_model.bin checkpoints have no header to read
            found = {tensor: shape for name in loaded for tensor, shape in headers[name].items()}
            check_weights(spec, config, found, trust_remote_code, model)
    return config


def meta_model(config, trust_remote_code: bool = False):
    """The model the config builds, on the meta device (no memory, no weights)."""
    variants.register()
    with torch.device("meta"), quiet_transformers():
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
        + layout_hint(config, missing, unexpected, misshapen)
    )


def _names(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def layout_hint(config, missing: list[str], unexpected: list[str], misshapen: list[str]) -> str:
    """What to do, naming the layout where the tensor names say which one the weights come from: each variant is asked
    (whether the config is its own or not), in the registry's order."""
    own = variants.variant_of(config)
    for variant in variants.VARIANTS:
        hint = variant.code(variant.layout_hint)
        said = hint(missing, unexpected, variant is own) if hint is not None else None
        if said:
            return said
    if any(".lambda_" in n for n in unexpected + missing + misshapen):
        return "the DIFF tensors do not fit this config; use the config.json the weights were saved with"
    return "use the config.json the weights were saved with, or re-save the model with save_pretrained"


def _renamed_on_load(model) -> bool:
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # transformers before conversion mappings: names load as they are
        return False
    return any(get_checkpoint_conversion_mapping(k) for k in (type(model).__name__, model.config.model_type))
