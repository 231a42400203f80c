"""RunConfig: every option of a run, validated once at the edge (CLI flags, YAML preset or library call).

This module knows no task and no model engine. A task's options are a dataclass whose fields are declared with
`option(...)`: the field's metadata gives its command-line flag and help, how a comma list is parsed, and whether it
belongs to the run's identity. The CLI and the identity rules are derived from those declarations.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
import re
import types
from collections.abc import Callable
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from diffeval.errors import InputError

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
INPUT_HASHES = "input_sha256"  # run.json's config key that holds `RunConfig.input_sha256`


def option(
    default: Any = None,
    *,
    help: str,
    flag: str | None = None,
    parse=None,
    type: type | None = None,
    identity: bool | str = True,
    cli: bool = True,
    context: bool = False,
    distinct: bool = True,
    applies: tuple[Any, str] | None = None,
    reads: Callable[[Any], list[Path]] | None = None,
) -> Any:
    """A declared option.

    flag: Typer's parameter declaration (default `--field-name`; `--a/--no-a` for on/off switches).
    parse: turns a comma-list string (or a YAML list) into the field's value; the CLI then takes a string.
    type: the value's type when the default is None. identity=False: the option does not change what is computed
    (sample counts, placement, caches), so a run folder resumes with a different value. identity="set": it joins the
    identity, and run.json's config, only where its value is not the default, so that runs without it keep the
    identity (and folder name) and run.json they had before the option existed (--thinking-budget).
    cli=False: YAML only; on a RunConfig field: only the tasks that list it in their `run_options` take it (the
    others refuse it).
    context=True: the run's context lengths; declare them with `context_option`. distinct=False: a parsed list whose
    values may repeat (one of several lists read in pairs); otherwise a repeated value is refused.
    applies: (options → bool, the clause that makes it apply, e.g. "with --probe vt"): an option that acts only beside
    some other values; given (by flag or YAML) where it would do nothing, it is refused, not ignored.
    reads: the task's options → the user files this option's value makes the task read, in the order read (none for
    a value that names no file, such as a hub dataset or a built-in source). Their content joins the run's identity
    (`RunConfig.input_sha256`): a file edited in place under the same path is another run.
    """
    metadata = {"help": help, "flag": flag, "parse": parse, "type": type, "identity": identity, "cli": cli}
    if not distinct:
        metadata["distinct"] = False
    if applies:
        metadata["applies"] = applies
    if reads is not None:
        metadata["reads"] = reads
    if context:  # the run's context lengths: declared through `context_option`
        metadata["context"] = True
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def context_option(default: list[int], *, help: str) -> Any:
    """The run's context lengths (`--ctx`, parsed by `parse_ctx`): the one option every task declares with this, and
    the one place the runner, the engines and a task's hooks read them from (`RunConfig.lengths`,
    `RunContext.lengths`)."""
    return option(default, help=help, parse=parse_ctx, context=True)


def context_field(options_class: type) -> str:
    """The name of the options field declared with `context_option`."""
    for f in fields(options_class):
        if f.metadata.get("context"):
            return f.name
    raise TypeError(f"{options_class.__name__} declares no context length: declare it with config.context_option")


def value_type(f: Field) -> type:
    """The Python type of an option's value as the command line gives it: its declared type, else str for parsed
    lists (a declared list[str] is a repeatable flag)."""
    if f.metadata.get("type"):
        return f.metadata["type"]
    if f.metadata.get("parse"):
        return str
    default = field_default(f)
    return str if default is None else type(default)


def field_default(f: Field) -> Any:
    """The field's default value (None for a field without one, such as RunConfig.task)."""
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


def parse_ctx(text: str | int | list) -> list[int]:
    """'4k' → 4096, '64K' → 65536, '65536' → 65536; comma lists allowed (k = 1024)."""
    items = text if isinstance(text, list) else str(text).split(",")
    lengths = []
    for item in items:
        token = str(item).strip()
        match = re.fullmatch(r"([0-9]+)\s*([kK]?)", token)
        if not match or int(match.group(1)) == 0:
            raise InputError(f"bad context length {token!r}: use a positive integer or NNk, e.g. 4k,8k or 65536")
        lengths.append(int(match.group(1)) * (1024 if match.group(2) else 1))
    return lengths


def is_count(token: str) -> bool:
    """A non-negative integer written in ASCII digits. `str.isdigit` also accepts '²' or '①', which `int` rejects."""
    return token.isascii() and token.isdigit()


def parse_int_list(text: str | int | list, what: str = "value") -> list[int]:
    items = text if isinstance(text, list) else str(text).split(",")
    tokens = [str(item).strip() for item in items]
    if not all(re.fullmatch(r"-?[0-9]+", token) for token in tokens):  # int() also takes '٣' and '1_0'
        raise InputError(f"bad {what} {text!r}: use integers separated by commas, e.g. 0,50,100")
    return [int(token) for token in tokens]


def int_list(what: str):
    """A parser for comma lists of integers that names its option in errors."""
    return lambda value: parse_int_list(value, what)


def parse_str_list(text: str | list, what: str = "list") -> list[str]:
    if isinstance(text, str) and not text.strip():
        return []  # no names at all: the option's own check says what it needs
    items = [str(item).strip() for item in (text if isinstance(text, list) else str(text).split(","))]
    if not all(items):  # "a,,b" or "a,": an item left out by mistake, never dropped in silence
        raise InputError(f"bad {what} {text!r}: an item is empty: give names separated by single commas")
    return items


def str_list(what: str):
    """A parser for comma lists of names that names its option in errors."""
    return lambda value: parse_str_list(value, what)


@dataclass(frozen=True)
class RunConfig:
    task: str
    models: list  # ModelSpec entries (diffeval.models.spec), parsed by the layer that knows models
    options: Any  # the task's options dataclass
    seed: int = option(0, help="seed of the sample content [default: 0]")
    backend: str = option("hf", help="engine that runs the models [default: hf]")
    device: str = option("auto", help="auto | cpu | cuda", identity=False)
    dtype: str = option("auto", help="auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16")
    attn_impl: str = option("sdpa", help="transformers attention implementation [default: sdpa]")
    chat_template: bool = option(  # only the tasks that list it in their run_options build chat prompts
        False,
        help="render each prompt with the model's chat template [default: off]",
        flag="--chat-template/--no-chat-template",
        cli=False,
    )
    max_new_tokens: int | None = option(  # only the tasks that list it in their run_options generate free text
        None,
        help="tokens to generate, also reserved in the prompt budget [default: the expected answer's length in the "
        "model's tokens + 16 per queried needle, at least 32]",
        type=int,
        cli=False,
    )
    # a reasoning model's thinking phase (docs/reasoning.md); "set": runs without it keep their identity and run.json
    thinking_budget: int | None = option(
        None,
        help="tokens a reasoning model may think before its answer, beside the answer's own budget and also reserved "
        "in the prompt budget; needs --chat-template [default: no thinking phase]",
        type=int,
        cli=False,
        identity="set",
    )
    think_markers: list[str] | None = option(
        None,
        help="START,END: the thinking markers, where the model's chat template and tokenizer do not name them, e.g. "
        "<think>,</think> [default: from the tokenizer or chat template]",
        parse=str_list("--think-markers"),
        cli=False,
        identity="set",
    )
    template_switch: list[str] = option(
        [],
        help="NAME=VALUE passed to the chat template, e.g. enable_thinking=false; repeatable",
        type=list[str],
        parse=lambda value: [value] if isinstance(value, str) else [str(v) for v in value],
        cli=False,
        identity="set",
    )
    batch_size: int | None = option(
        None, help="prompts per backend call [default: 1 on hf, 256 on vllm]", type=int, identity=False
    )
    limit: int | None = option(None, help="cap samples per cell (quick runs, CI)", type=int, identity=False)
    out: str | None = option(None, help="run folder [default: results/TASK-<config hash>]", identity=False)
    overwrite: bool = option(False, help="replace a run folder holding another config", identity=False)
    break_lock: bool = option(False, help="take a run folder's lock held from another host", identity=False)
    trust_remote_code: bool = option(False, help="allow custom model code")
    allow_overlength: bool = option(False, help="allow ctx beyond max positions")
    # scale-out on Ray: where and how wide a run goes, never what it computes
    ray: str | None = option(
        None, help="run on Ray: alone, a local instance; auto or HOST:PORT joins a cluster", identity=False
    )
    workers: int | None = option(None, help="Ray workers (actors) per model [default: 1]", type=int, identity=False)
    gpus_per_worker: float | None = option(
        None,
        help="GPUs per Ray worker [default: --tensor-parallel-size on vllm, 1 on hf, 0 without GPUs]",
        type=float,
        identity=False,
    )
    cpus_per_worker: float = option(1.0, help="CPUs per Ray worker [default: 1]", identity=False)
    dry_run: bool = option(False, help="print samples and token totals per task and model, load no model",
                           identity=False)  # fmt: skip
    tokens_per_s: float | None = option(
        None,
        help="--dry-run: estimate the time at this many tokens/s per model (prompt + generated, as the progress bar "
        "counts them); without it, at the rate an earlier run folder of the same models recorded on this machine, "
        "else from each model's config and this machine's matmul rate",
        type=float,
        identity=False,
    )
    calibrate: bool = option(
        False,
        help="--dry-run: load each model and time one sample per length, and estimate the time from that",
        identity=False,
    )
    # the run's engine's own options (an instance of its Engine.options class, built by `assemble`); run.json keeps
    # them beside RunConfig's own fields, as it did when they were RunConfig fields
    engine: Any = None

    def validate(self) -> RunConfig:
        if not self.models:
            raise InputError("no model given: pass --model NAME=PATH_OR_HUB_ID (repeatable), e.g. --model diff=./ckpt")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise InputError(f"model names repeat in {names}: give each --model a unique NAME=")
        if self.device not in DEVICES:
            raise InputError(f"bad --device {self.device!r}: use one of {', '.join(DEVICES)}")
        if self.dtype not in DTYPES:
            raise InputError(f"bad --dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if (self.max_new_tokens is not None and self.max_new_tokens < 1) or (
            self.batch_size is not None and self.batch_size < 1
        ):
            raise InputError("--max-new-tokens and --batch-size must be at least 1")
        if self.engine is not None:
            self.engine.validate()
        if self.workers is not None and not self.ray:
            raise InputError("--workers needs --ray: add --ray for a local Ray instance, or --ray HOST:PORT")
        if (
            (self.workers is not None and self.workers < 1)
            or self.cpus_per_worker <= 0
            or (self.gpus_per_worker or 0) < 0
        ):
            raise InputError("--workers and --cpus-per-worker must be positive, --gpus-per-worker not negative")
        if self.tokens_per_s is not None:
            if not (math.isfinite(self.tokens_per_s) and self.tokens_per_s > 0):
                raise InputError(f"--tokens-per-s {self.tokens_per_s:g}: give a positive rate, e.g. 20000")
            if not self.dry_run:
                raise InputError("--tokens-per-s only sizes a dry run: add --dry-run, or leave it out")
        if self.calibrate and not self.dry_run:
            raise InputError("--calibrate only sizes a dry run: add --dry-run, or leave it out")
        if self.calibrate and self.tokens_per_s is not None:
            raise InputError("--calibrate and --tokens-per-s both set the dry run's rate: give one of them")
        if self.limit is not None and self.limit < 1:
            raise InputError(f"--limit {self.limit}: give at least 1, or leave it out")
        self._validate_thinking()
        self.options.validate()  # what a context length must hold is the task's: tasks/base.py ContextBudget
        return self

    def _validate_thinking(self) -> None:
        """The thinking options' refusals, each in one line (what a model's markers must be is checked where the
        model loads: runner.check_models)."""
        if self.thinking_budget is not None:
            if self.thinking_budget < 1:
                raise InputError(f"--thinking-budget {self.thinking_budget}: give at least 1, or leave it out")
            if not self.chat_template:
                raise InputError(
                    "--thinking-budget needs --chat-template: a reasoning model thinks in its chat template's "
                    "assistant turn; add --chat-template"
                )
        if self.think_markers is not None:
            if self.thinking_budget is None:
                raise InputError("--think-markers applies only with --thinking-budget: leave it out")
            markers = [m.strip() for m in self.think_markers]
            if len(markers) != 2 or not all(markers) or markers[0] == markers[1]:
                raise InputError(
                    f"--think-markers {','.join(self.think_markers)}: give START,END, two different markers, "
                    "e.g. <think>,</think>"
                )
        if self.template_switch and not self.chat_template:
            raise InputError("--template-switch applies only with --chat-template: leave it out")
        self.switches  # noqa: B018  # refuses a bad NAME=VALUE

    @property
    def switches(self) -> dict[str, Any]:
        """--template-switch as the chat template's keyword arguments: "enable_thinking=false" → {"enable_thinking":
        False}; each value is read as YAML reads a scalar (true/false, numbers, else the string)."""
        switches: dict[str, Any] = {}
        for item in self.template_switch:
            name, equals, text = str(item).partition("=")
            name = name.strip()
            value = yaml.safe_load(text) if equals and text.strip() else None
            if not equals or not name.isidentifier() or not isinstance(value, (str, int, float, bool)):
                raise InputError(f"bad --template-switch {item!r}: give NAME=VALUE, e.g. enable_thinking=false")
            if name in switches:
                raise InputError(f"--template-switch {name} is given twice: give each switch once")
            switches[name] = value
        return switches

    @property
    def lengths(self) -> list[int]:
        """The run's context lengths: the task options' field declared with `context_option`."""
        return list(getattr(self.options, context_field(type(self.options))))

    @functools.cached_property
    def input_sha256(self) -> dict[str, str]:
        """The sha256 of what each option declared with `reads` makes the task read, by option name; an option whose
        value names no user file is left out. Read once per config: the identity and run.json both use it."""
        hashes = {}
        for f in fields(type(self.options)):
            value = getattr(self.options, f.name)
            if f.metadata.get("reads") is not None and value:
                paths = f.metadata["reads"](self.options)
                if paths:
                    hashes[f.name] = content_sha256(paths)
        return hashes

    def identity(self) -> dict[str, Any]:
        """What defines the results of a run folder."""
        return self.identity_of(self.to_dict())

    def identity_of(self, stored: dict[str, Any]) -> dict[str, Any]:
        """The identity of a config as stored in run.json, by this config's rules. Keys that older folders lack take
        today's defaults (a folder from before `backend` existed ran on hf), so those folders resume; one from before
        input hashes takes today's content (and records it when it resumes)."""
        stored_options = stored.get("options") or {}
        # the engine's options sit beside RunConfig's own in run.json; those that change results join the identity
        # (the built-in engines declare none, so their folders keep their names)
        engine = _identity_fields(type(self.engine), stored) if self.engine is not None else {}
        identity = {
            **_identity_fields(RunConfig, stored, skip=("options", "engine")),
            **engine,
            "options": applying(type(self.options), _identity_fields(type(self.options), stored_options)),
        }
        inputs = stored.get(INPUT_HASHES, self.input_sha256)
        if inputs:  # a run that reads no user file keeps the identity (and folder name) it had before input hashes
            identity[INPUT_HASHES] = inputs
        return identity

    def identity_hash(self) -> str:
        identity = self.identity()
        if identity["backend"] == "hf":  # hf runs keep the folder names they had before backends existed
            del identity["backend"]
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:10]

    def out_dir(self) -> Path:
        return Path(self.out) if self.out else Path("results") / f"{self.task}-{self.identity_hash()}"

    def to_dict(self) -> dict[str, Any]:
        """run.json's config: RunConfig's fields, the engine's options beside them, the task's under `options`."""
        data = _drop_unset(RunConfig, asdict(self))
        if isinstance(data.get("options"), dict):
            data["options"] = _drop_unset(type(self.options), data["options"])
        engine = data.pop("engine") or {}
        inputs = {INPUT_HASHES: self.input_sha256} if self.input_sha256 else {}
        return {**data, **engine, **inputs}

    def known_fields(self) -> tuple[set[str], set[str]]:
        """The keys this version writes in run.json's config, and in its `options`: any other key was written by
        another version (`results.RunFolder` refuses to resume over it). Every engine's options count (a folder of
        another engine, or from before engines had options of their own, holds them): the fields of every
        EngineOptions class loaded, and building a config (`tasks.build_config`) loads every engine's."""
        engines = {f.name for cls in _subclasses(EngineOptions) for f in fields(cls)}
        own = {f.name for f in fields(RunConfig) if f.name != "engine"}
        return own | engines | {INPUT_HASHES}, {f.name for f in fields(type(self.options))}


def folder_files(folder: str) -> list[Path]:
    """Every file below a folder, by relative path: what a tool that walks the folder may read."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        return [root]
    # not what tools and editors leave beside the inputs (lm-eval's import writes __pycache__ during a run)
    return sorted(
        path
        for path in root.rglob("*")
        if path.is_file()
        and not any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(root).parts)
    )


def content_sha256(paths: list[Path]) -> str:
    """One sha256 of the files' bytes in the order given (each length-prefixed, so no two lists of contents hash
    alike). A missing or unreadable file hashes as such: the task's own reader refuses it in its words."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            digest.update(f"unreadable:{type(exc).__name__}\n".encode())
            continue
        digest.update(f"{len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()


def _identity_fields(cls, stored: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The identity's values of `cls`'s fields as `stored` holds them (today's default where it lacks one); a field
    declared identity="set" is left out at its default, as it was before the field existed."""
    out = {}
    for f in fields(cls):
        mode = f.metadata.get("identity", True)
        if not mode or f.name in skip:
            continue
        value = stored.get(f.name, field_default(f))
        if mode == "set" and value == field_default(f):
            continue
        out[f.name] = value
    return out


def _drop_unset(cls, data: dict[str, Any]) -> dict[str, Any]:
    """`data` (a dataclass's fields as a dict) without the identity="set" fields at their default: run.json then
    holds the keys it held before those fields existed."""
    unset = {
        f.name
        for f in fields(cls)
        if f.metadata.get("identity") == "set" and f.name in data and data[f.name] == field_default(f)
    }
    return {k: v for k, v in data.items() if k not in unset}


def applying(options_class: type, values: dict[str, Any]) -> dict[str, Any]:
    """Identity values with each option that acts on nothing beside the others (its `applies` test false) at its
    default: a folder an older version wrote with such a value resumes under the command that leaves it out."""
    declared = {f.name: f for f in fields(options_class)}
    view = types.SimpleNamespace(**{name: values.get(name, field_default(f)) for name, f in declared.items()})
    return {
        name: field_default(declared[name])
        if "applies" in declared[name].metadata and not declared[name].metadata["applies"][0](view)
        else value
        for name, value in values.items()
    }


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Names of identity entries that differ (options flattened beside the run's own)."""

    def flat(data: dict[str, Any]) -> dict[str, Any]:
        own = {k: v for k, v in data.items() if k not in ("options", INPUT_HASHES)}  # content: `changed_inputs`
        return {**own, **data.get("options", {})}

    old, new = flat(old), flat(new)
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def changed_inputs(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Names of the options whose value is the same in both identities but whose files' content differs."""
    old_hashes, new_hashes = old.get(INPUT_HASHES) or {}, new.get(INPUT_HASHES) or {}
    valued = set(changed_keys(old, new))  # an option given another value is named as such
    return sorted(
        k for k in set(old_hashes) | set(new_hashes) if k not in valued and old_hashes.get(k) != new_hashes.get(k)
    )


def assemble(
    task: str, options_cls: type, models: list, values: dict[str, Any], engines: dict[str, type] | None = None
) -> RunConfig:
    """A validated RunConfig from merged preset and flag values (models already parsed). `engines` maps each engine's
    name to its options class (models.backend.engine_options): the run's engine's options are built from the values,
    and a value for an option only other engines declare is refused unless it is that option's default."""
    values = dict(values)
    if values.pop("task", task) != task:
        raise InputError("the config is for another task: run that task instead, or remove its `task:` key")
    values.pop("models", None)
    engines = engines or {}
    option_fields = {f.name: f for f in fields(options_cls)}
    run_fields = {f.name: f for f in fields(RunConfig) if f.name not in ("task", "models", "options", "engine")}
    engine_fields = declared_engine_options(engines)
    if set(engine_fields) & set(option_fields):
        raise ValueError(f"task {task} and an engine both declare {sorted(set(engine_fields) & set(option_fields))}")
    unknown = set(values) - set(option_fields) - set(run_fields) - set(engine_fields)
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(sorted(unknown))}: see `diffeval run {task} --help`")
    declared = {**option_fields, **engine_fields}
    for name, value in values.items():  # RunConfig's own parsed options (--think-markers, --template-switch)
        if name in run_fields and run_fields[name].metadata.get("parse") and value is not None:
            values[name] = run_fields[name].metadata["parse"](value)
    option_values = {k: values.pop(k) for k in list(values) if k in option_fields}
    engine_values = {k: values.pop(k) for k in list(values) if k in engine_fields}
    for parsed in (option_values, engine_values):
        for name, value in parsed.items():
            if isinstance(value, str) and value.startswith("package:"):  # data shipped inside diffeval
                parsed[name] = str(resources.files("diffeval") / value[len("package:") :])
            elif declared[name].metadata.get("parse") and value is not None:
                parsed[name] = declared[name].metadata["parse"](value)
                _refuse_repeats(declared[name], parsed[name])
    for name, value in {**option_values, **engine_values, **values}.items():
        _check_type(name, value, declared.get(name) or run_fields[name])
    try:
        options = options_cls(**option_values)
    except TypeError as exc:
        raise InputError(f"bad option value: {exc}") from None
    backend = values.get("backend", field_default(run_fields["backend"]))
    # an unknown backend has no options to build: the caller refuses it (models.backend.check_backend)
    engine = _engine_options(backend, engines, engine_values, engine_fields) if backend in engines else None
    config = RunConfig(task=task, models=models, options=options, engine=engine, **values).validate()
    _refuse_unused(config.options, option_fields, option_values)
    return config


@dataclass(frozen=True)
class EngineOptions:
    """An engine's own options: a subclass declares them as fields with `option(...)`, as a task's options class
    does, and the CLI, presets and run.json take them from there. An engine without options of its own has these."""

    def validate(self) -> None:
        """Refuse a bad value in one line (InputError); these options have none to check."""

    def worker_gpus(self) -> float:
        """GPUs one Ray worker of this engine holds on a cluster that has GPUs."""
        return 1

    def torch_threads(self) -> int | None:
        """The torch threads this engine's process runs with, as run.json's machine record names them; None: the
        cores the load leaves free at the run's start (machine.start_threads)."""
        return None


def _subclasses(cls: type) -> list[type]:
    direct: list[type] = cls.__subclasses__()
    return [sub for child in direct for sub in (child, *_subclasses(child))]


def flag_name(f: Field) -> str:
    """The option's command-line flag (the on form of an on/off switch)."""
    return (f.metadata.get("flag") or "--" + f.name.replace("_", "-")).split("/")[0]


def declared_engine_options(engines: dict[str, type]) -> dict[str, Field]:
    """Every option an engine declares, by name. Engines may share an option (an engine built on another keeps its
    options), but only as one declaration; none may take the name of a RunConfig field."""
    run_names = {f.name for f in fields(RunConfig)}
    declared: dict[str, Field] = {}
    for engine, cls in engines.items():
        for f in fields(cls):
            if f.name in run_names:
                raise ValueError(f"engine {engine}: option {f.name} is a RunConfig field")
            if f.name in declared and _declaration(declared[f.name]) != _declaration(f):
                raise ValueError(f"engine {engine} declares option {f.name} unlike another engine")
            declared[f.name] = f
    return declared


def _declaration(f: Field) -> tuple:
    return field_default(f), dict(f.metadata)


def _engine_options(backend: str, engines: dict[str, type], values: dict[str, Any], declared: dict[str, Field]) -> Any:
    """The run's engine's options from the given values. An option only other engines declare would be ignored, so a
    value other than its default is refused in one line that names the engine(s) it sets."""
    cls = engines[backend]
    own = {f.name for f in fields(cls)}
    given = [name for name in declared if name in values and values[name] != field_default(declared[name])]
    foreign = [name for name in given if name not in own]  # in declaration order, as --help lists them
    if foreign:
        owners = [engine for engine, other in engines.items() if {f.name for f in fields(other)} >= set(foreign)]
        if not owners:  # options of different engines: name the first one's
            foreign = foreign[:1]
            owners = [engine for engine, other in engines.items() if foreign[0] in {f.name for f in fields(other)}]
        flags = ", ".join(flag_name(declared[name]) for name in foreign)
        engine = " or ".join(owners)
        raise InputError(
            f"{flags} set(s) the {engine} engine, not {backend}: add --backend {owners[0]}, or leave it out"
        )
    try:
        return cls(**{name: value for name, value in values.items() if name in own})
    except TypeError as exc:
        raise InputError(f"bad option value: {exc}") from None


def _refuse_repeats(f: Field, value: Any) -> None:
    """A list option naming one value twice would run (and record) the same samples twice: refuse it."""
    if not isinstance(value, list) or not f.metadata.get("distinct", True):
        return
    seen: set = set()
    for item in value:
        key = json.dumps(item, sort_keys=True)
        if key in seen:
            raise InputError(f"{flag_name(f)} names {item!r} twice: give each value once")
        seen.add(key)


def _refuse_unused(options: Any, declared: dict[str, Field], given: dict[str, Any]) -> None:
    """An option given beside values that leave it nothing to do would be ignored: refuse it in one line."""
    for name, value in given.items():
        applies = declared[name].metadata.get("applies")
        if applies and not applies[0](options):
            shown = ",".join(map(str, value)) if isinstance(value, list) else value
            raise InputError(f"{flag_name(declared[name])} {shown} applies only {applies[1]}: leave it out")


def _check_type(name: str, value: Any, f: Field) -> None:
    if value is None or f.metadata.get("parse"):
        return
    kind = value_type(f)
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        raise InputError(f"option {name} must be {'an' if kind is int else 'a'} {kind.__name__}, got {value!r}")


def find_preset(name_or_path: str) -> Path:
    """A YAML file path, or the name of a preset shipped with diffeval (e.g. `needle-4k-table2`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = resources.files("diffeval") / "presets" / f"{path.stem}.yaml"
    if packaged.is_file():
        return Path(str(packaged))
    near = difflib.get_close_matches(path.stem, list_presets(), n=1, cutoff=0.8)
    hint = f"did you mean {near[0]}? Or give" if near else "give"
    raise InputError(
        f"config {name_or_path!r} not found: {hint} a YAML file path or a preset name ({', '.join(list_presets())})"
    )


def list_presets() -> list[str]:
    folder = resources.files("diffeval") / "presets"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_yaml(name_or_path: str) -> dict[str, Any]:
    path = find_preset(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where else ""
        raise InputError(f"malformed YAML in {path}{line}: fix the syntax and rerun") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path} ({type(exc).__name__}): give a readable YAML file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a mapping of option: value, not a {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}
