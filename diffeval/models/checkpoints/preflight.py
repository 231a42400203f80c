"""Checks a run passes before torch or transformers is imported: each answers a wrong input in well under a second.

The engine's package is installed, each model's path exists and holds a checkpoint, a GGUF file has the gguf package to
read it, and the longest context fits the model's positions as its config.json or GGUF header says. The check stage
(check.py) then loads what these cannot read: the architecture, the tokenizer, the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from diffeval.errors import InputError
from diffeval.models.backend import check_installed
from diffeval.models.checkpoints import gguf
from diffeval.models.spec import ModelSpec


def preflight(models: list[ModelSpec], backend: str, longest: int, allow_overlength: bool) -> None:
    check_installed(backend)
    for spec in models:
        check_spec(spec)
        positions = max_positions(spec)
        if positions is not None:
            check_context(spec.name, longest, positions, allow_overlength)


def check_spec(spec: ModelSpec) -> None:
    """A path-looking spec must exist and hold a checkpoint (a config.json, or a GGUF file the gguf package can read);
    anything else is a hub id."""
    path = Path(spec.path).expanduser()
    if path.exists():
        if gguf.find(spec.path, spec.name):
            gguf.require_package(spec.name)
            return
        if not (path / "config.json").is_file():
            raise InputError(f"model {spec.name}: {spec.spec} has no config.json; point at a saved checkpoint folder")
    elif spec.spec.startswith((".", "/", "~")) or spec.spec.count("/") > 1:  # hub ids are `org/name`
        raise InputError(f"model {spec.name}: path {spec.spec} does not exist; check the path or give a hub id")


def check_context(model: str, longest: int, positions: int, allow_overlength: bool) -> None:
    if longest > positions and not allow_overlength:
        raise InputError(
            f"context {longest} exceeds {model}'s max_position_embeddings {positions}: "
            "use a shorter --ctx, or --allow-overlength to extrapolate"
        )


def max_positions(spec: ModelSpec) -> int | None:
    """The positions a local checkpoint declares (config.json, or the GGUF header's context length); None when only
    loading the config can tell (a hub id, custom code, a config without the key)."""
    file = gguf.find(spec.path, spec.name)
    if file is not None:
        return gguf.context_length(file, spec.name)
    path = Path(spec.path).expanduser() / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # the check stage names a broken config
    for level in (config, config.get("text_config") or {}) if isinstance(config, dict) else ():
        value = level.get("max_position_embeddings") if isinstance(level, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
