"""DiffLlama's checkpoint rules, asked by the check stage (models/checkpoints/check.py) and the loader: axolotl's
older layout refused, its per-head-norm and initialisation keys honoured, the paper's own modules recognised."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from diffeval.errors import InputError
from diffeval.models.diff import AXOLOTL_INIT_KEYS, sublayer_norm
from diffeval.models.spec import ModelSpec


def refuse_older_axolotl(spec: ModelSpec) -> None:
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


def check_diff_keys(spec: ModelSpec, config, given: set[str]) -> None:
    """A DiffLlama config's per-head-norm keys are honoured on every engine (`diff.sublayer_norm`), axolotl's
    initialisation keys accepted: a value that cannot be honoured is refused here, before any work."""
    for key in ("sublayer_norm", *AXOLOTL_INIT_KEYS):
        value = getattr(config, key, None)
        if key in given and not isinstance(value, bool):
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


def layout_hint(missing: list[str], unexpected: list[str], own: bool) -> str | None:
    """The paper's own V1 modules, whatever the config; a DiffLlama config's weights without their λ tensors."""
    if any(".subln." in n or ".out_proj." in n for n in unexpected):
        return (
            "these are the paper's own Diff-Transformer modules (microsoft/unilm: subln, out_proj): convert them with "
            "`diffeval models convert --from unilm-v1:MODULE SRC DST`, MODULE the file they were trained with "
            "(diffattn, flashdiff1 or flashdiff2)"
        )
    if own and missing and all(".lambda_" in n for n in missing) and not unexpected:
        return (
            "a DiffLlama checkpoint without its λ tensors (saved from a Llama, or cut short?); point --model at the "
            "DIFF checkpoint that was trained, or give these weights the config they were saved with"
        )
    return None


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
