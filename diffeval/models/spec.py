"""Which model to evaluate (ModelSpec), the built-in reference pair, and what diffeval knows about a model (ModelInfo).

No torch or transformers here: specs are parsed and validated before any engine is imported.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diffeval.errors import InputError

# the built-in reference pair, shipped as package data (see diffeval/toy_models/MODEL_CARD.md)
BUILTIN_MODELS = Path(__file__).resolve().parents[1] / "toy_models"
DEFAULT_PAIR = ("diff=toy-diff", "base=toy-base")
MODEL_KINDS = ("auto", "diff", "base")


def builtin_models() -> list[str]:
    if not BUILTIN_MODELS.is_dir():
        return []
    return sorted(p.name for p in BUILTIN_MODELS.iterdir() if (p / "config.json").is_file())


def near_builtin(spec: str) -> str | None:
    """The built-in name a spec misspells (`toy-dif` → toy-diff); None for a built-in name, an existing path or
    anything not close to one (a hub id `org/name` never is: built-in names have no '/')."""
    names = builtin_models()
    if spec in names or "/" in spec or Path(spec).expanduser().exists():
        return None
    match = difflib.get_close_matches(spec.lower(), names, n=1, cutoff=0.8)
    return match[0] if match else None


def model_path(spec: str) -> str:
    """A built-in model's folder inside the package (toy-diff, toy-base), else the spec unchanged."""
    return str(BUILTIN_MODELS / spec) if spec in builtin_models() else spec


@dataclass(frozen=True)
class ModelSpec:
    """One model to evaluate: `name=spec[:diff|:base]` on the command line, or a mapping in YAML."""

    name: str
    spec: str
    kind: str = "auto"  # auto: DiffLlamaForCausalLM (V1) and DiffLlama2ForCausalLM (V2) are DIFF, others baselines

    @classmethod
    def parse(cls, text: str | dict) -> ModelSpec:
        if isinstance(text, dict):
            unknown = set(text) - {"name", "spec", "kind"}
            if "spec" not in text or unknown:
                raise InputError(f"bad model entry {text!r}: give 'spec' and optionally 'name' and 'kind'")
            spec = str(text["spec"])
            return cls._checked(str(text.get("name") or _default_name(spec)), spec, str(text.get("kind", "auto")))
        name, sep, rest = str(text).partition("=")
        if not sep:
            name, rest = "", name
        kind = "auto"
        for suffix in ("diff", "base"):
            if rest.endswith(f":{suffix}"):
                rest, kind = rest[: -len(suffix) - 1], suffix
        if not rest:
            raise InputError(f"bad --model {text!r}: use NAME=PATH_OR_HUB_ID or a bare PATH_OR_HUB_ID")
        return cls._checked(name or _default_name(rest), rest, kind)

    @classmethod
    def _checked(cls, name: str, spec: str, kind: str) -> ModelSpec:
        if kind not in MODEL_KINDS:
            raise InputError(f"bad model kind {kind!r} for {name}: use one of {', '.join(MODEL_KINDS)}")
        if not re.fullmatch(r"[\w.\-]+", name):
            raise InputError(f"bad model name {name!r}: use letters, digits, '.', '-' or '_'")
        near = near_builtin(spec)
        if near:  # refused here, before a hub lookup spends its retries on a typo
            raise InputError(f"model {name}: {spec!r} is neither a built-in model nor a folder: did you mean {near}?")
        return cls(name=name, spec=spec, kind=kind)

    @property
    def path(self) -> str:
        """Where the engine loads it from: a folder (built-in names resolve into the package) or a hub id."""
        return model_path(self.spec)


def parse_models(raw: Any) -> list[ModelSpec]:
    """`--model` values or YAML `models:` (a list, a single entry, or `{name: spec}`); none → the built-in pair."""
    raw = raw or []
    if not raw and all(name in builtin_models() for name in ("toy-diff", "toy-base")):
        raw = list(DEFAULT_PAIR)  # the offline default: the shipped reference pair
    if isinstance(raw, dict) and "spec" not in raw:  # YAML `models: {diff: PATH, base: PATH}`
        raw = [{"name": k, **(v if isinstance(v, dict) else {"spec": v})} for k, v in raw.items()]
    if isinstance(raw, (str, dict)):
        raw = [raw]
    return [ModelSpec.parse(m) for m in raw]


def _default_name(spec: str) -> str:
    return Path(spec.rstrip("/")).name or spec


@dataclass
class ModelInfo:
    name: str
    spec: str
    architecture: str
    is_diff: bool
    layers: int | None
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    max_positions: int | None
    rope_theta: float | None
    parameters: int | None = None
    lambdas: list[dict[str, float]] = field(default_factory=list)
    # which Differential Transformer a DIFF model is: "v1" (DiffLlama) or "v2" (DiffLlama2); None for a baseline, or
    # a model declared DIFF with `:diff` whose architecture is neither
    diff_variant: str | None = None
    # grouped differential attention (Motif-2-12.7B): its noise heads, one per group of signal heads; None otherwise
    noise_heads: int | None = None
    # a GGUF checkpoint: its file, architecture and quantization type, and on vLLM the dequantized folder it runs from
    gguf: dict[str, str] | None = None
    # every decoder layer's kind, in order (models/variants/base.py `Layer`, as a dict): what it mixes tokens with,
    # its window, the layer whose KV it reuses, its KV sets and state; the analyses and the KV cache plan read it
    layer_kinds: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
