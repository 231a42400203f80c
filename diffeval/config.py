"""RunConfig: every option of a run, validated once at the edge (CLI flags, YAML preset or library call)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from diffeval.errors import InputError

# the built-in reference pair, shipped as package data (see diffeval/toy_models/MODEL_CARD.md)
BUILTIN_MODELS = Path(__file__).resolve().parent / "toy_models"
DEFAULT_PAIR = ("diff=toy-diff", "base=toy-base")

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
MODEL_KINDS = ("auto", "diff", "base")


def builtin_models() -> list[str]:
    if not BUILTIN_MODELS.is_dir():
        return []
    return sorted(p.name for p in BUILTIN_MODELS.iterdir() if (p / "config.json").is_file())


def model_path(spec: str) -> str:
    """A built-in model's folder inside the package (toy-diff, toy-base), else the spec unchanged."""
    return str(BUILTIN_MODELS / spec) if spec in builtin_models() else spec


def parse_ctx(text: str | int | list) -> list[int]:
    """'4k' → 4096, '64K' → 65536, '65536' → 65536; comma lists allowed (k = 1024)."""
    items = text if isinstance(text, list) else str(text).split(",")
    lengths = []
    for item in items:
        token = str(item).strip()
        match = re.fullmatch(r"(\d+)\s*([kK]?)", token)
        if not match or int(match.group(1)) == 0:
            raise InputError(f"bad context length {token!r}: use a positive integer or NNk, e.g. 4k,8k or 65536")
        lengths.append(int(match.group(1)) * (1024 if match.group(2) else 1))
    return lengths


def parse_int_list(text: str | int | list, what: str) -> list[int]:
    items = text if isinstance(text, list) else str(text).split(",")
    try:
        return [int(str(item).strip()) for item in items]
    except ValueError:
        raise InputError(f"bad {what} {text!r}: use integers separated by commas, e.g. 0,50,100") from None


@dataclass(frozen=True)
class ModelSpec:
    """One model to evaluate: `name=spec[:diff|:base]` on the command line, or a mapping in YAML."""

    name: str
    spec: str
    kind: str = "auto"  # auto: DiffLlamaForCausalLM is DIFF, anything else a baseline

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
        return cls(name=name, spec=spec, kind=kind)


def _default_name(spec: str) -> str:
    return Path(spec.rstrip("/")).name or spec


@dataclass(frozen=True)
class NeedleOptions:
    """The multi-needle task: N needles per sample, R of them queried, at every ctx × depth × (N, R)."""

    ctx: list[int] = field(default_factory=lambda: [4096])
    needles: list[int] = field(default_factory=lambda: [1])
    queries: list[int] = field(default_factory=lambda: [1])
    depths: list[int] = field(default_factory=lambda: [0, 25, 50, 75, 100])
    samples: int = 50
    haystack: str = "noise"

    def nr_pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.needles, self.queries, strict=True))

    def validate(self) -> None:
        if len(self.queries) == 1 and len(self.needles) > 1:
            object.__setattr__(self, "queries", self.queries * len(self.needles))
        if len(self.needles) != len(self.queries):
            raise InputError(
                f"--needles {self.needles} and --queries {self.queries} differ in length: "
                "give one R for all or one R per N"
            )
        for n, r in self.nr_pairs():
            if r < 1 or n < r:
                raise InputError(f"needles N={n}, queries R={r}: need 1 <= R <= N")
            if n > 64:
                raise InputError(f"needles N={n}: at most 64 needles per sample")
        for depth in self.depths:
            if not 0 <= depth <= 100:
                raise InputError(f"depth {depth} is outside 0-100: give depths in percent, e.g. 0,25,50,75,100")
        if self.samples < 1:
            raise InputError(f"--samples {self.samples}: need at least 1 sample per cell")


@dataclass(frozen=True)
class AttentionOptions(NeedleOptions):
    """Attention-to-answer analysis on the needle task's samples (paper Table 3)."""

    samples: int = 20
    rows: str = "last"  # last: the row predicting the first answer token; answer: also each teacher-forced answer row
    span: str = "answer"  # answer: the queried number's tokens; needle: the whole queried needle sentence

    def validate(self) -> None:
        super().validate()
        if self.rows not in ("last", "answer"):
            raise InputError(f"bad --rows {self.rows!r}: use last or answer")
        if self.span not in ("answer", "needle"):
            raise InputError(f"bad --span {self.span!r}: use answer or needle")


@dataclass(frozen=True)
class IclOptions:
    """Many-shot ICL with order robustness (paper Figures 6 and 7; Bertsch et al. 2024)."""

    ctx: list[int] = field(default_factory=lambda: [4096])
    datasets: list[str] = field(default_factory=lambda: ["trec"])
    shots: list = field(default_factory=lambda: [1, 10, 100])  # ints, or "max"
    orders: list[str] = field(default_factory=lambda: ["random:3"])
    test_size: int = 250
    draws: int = 1
    data_dir: str | None = None
    test_indices: str | None = None
    length_norm: bool = False

    def validate(self) -> None:
        from diffeval.data.icl import DATASETS
        from diffeval.tasks.icl import parse_orders

        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: ICL takes one context length (the prompt budget), e.g. --ctx 64k")
        unknown = [d for d in self.datasets if d not in DATASETS]
        if unknown or not self.datasets:
            raise InputError(f"unknown dataset(s) {unknown}: use any of {', '.join(DATASETS)}")
        for shots in self.shots:
            if shots != "max" and (not isinstance(shots, int) or shots < 0):
                raise InputError(f"bad --shots value {shots!r}: use non-negative integers or max, e.g. 1,10,100,max")
        parse_orders(self.orders)
        if self.test_size < 1 or self.draws < 1:
            raise InputError("--test-size and --draws must be at least 1")


@dataclass(frozen=True)
class HallucinationOptions:
    """Contextual hallucination on summarization and QA (paper Table 4)."""

    ctx: list[int] = field(default_factory=lambda: [4096])
    datasets: list[str] = field(default_factory=lambda: ["xsum"])
    samples: int = 100
    judge: str | None = None  # required: there is no silent default
    data_dir: str | None = None
    judge_cache: str | None = None
    judge_timeout: float = 60.0
    judge_retries: int = 5
    judge_concurrency: int = 4

    def validate(self) -> None:
        from diffeval.data.hallucination import DATASETS

        if not self.judge:
            raise InputError("--judge is required: openai:MODEL, openai-compatible:BASE_URL#MODEL, hf:PATH or overlap")
        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: hallucination runs take one context length, e.g. --ctx 4k")
        unknown = [d for d in self.datasets if d not in DATASETS]
        if unknown or not self.datasets:
            raise InputError(f"unknown dataset(s) {unknown}: use any of {', '.join(DATASETS)}")
        if self.samples < 1 or self.judge_retries < 0 or self.judge_concurrency < 1 or self.judge_timeout <= 0:
            raise InputError("--samples and --judge-concurrency must be at least 1, --judge-timeout positive")


@dataclass(frozen=True)
class OutliersOptions:
    """Activation outliers (paper Table 5): sequences of `ctx` tokens (the training length) covering `tokens`."""

    ctx: list[int] = field(default_factory=lambda: [4096])
    tokens: int = 409_600
    haystack: str = "noise"

    def validate(self) -> None:
        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: give one sequence length (the model's training length)")
        if self.tokens < 1:
            raise InputError("--tokens must be positive, e.g. 400k")


LM_EVAL_PAPER_TASKS = ["arc_challenge", "arc_easy", "boolq", "hellaswag", "openbookqa", "piqa", "winogrande"]


@dataclass(frozen=True)
class QuantizeOptions:
    """Attention logits quantized to b bits, evaluated zero-shot with lm-eval (paper Figure 8)."""

    ctx: list[int] = field(default_factory=lambda: [2048])  # lm-eval's max_length
    bits: list[int] = field(default_factory=lambda: [16, 8, 6, 4])
    lm_tasks: list[str] = field(default_factory=lambda: ["hellaswag"])
    granularity: str = "row"
    include_path: str | None = None
    lm_batch_size: int = 8

    def validate(self) -> None:
        from diffeval.models.activations import GRANULARITIES

        if any(b < 2 or b > 16 for b in self.bits):
            raise InputError(f"--bits {self.bits}: use widths from 2 to 16 (16 = unquantized)")
        if self.granularity not in GRANULARITIES:
            raise InputError(f"bad --granularity {self.granularity!r}: use one of {', '.join(GRANULARITIES)}")
        _check_lm_eval_options(self)


@dataclass(frozen=True)
class ZeroshotOptions:
    """Zero-shot lm-eval benchmarks (paper Table 1 layout)."""

    ctx: list[int] = field(default_factory=lambda: [2048])
    lm_tasks: list[str] = field(default_factory=lambda: list(LM_EVAL_PAPER_TASKS))
    include_path: str | None = None
    lm_batch_size: int = 8

    def validate(self) -> None:
        _check_lm_eval_options(self)


def _check_lm_eval_options(options) -> None:
    if not options.lm_tasks:
        raise InputError("--tasks is empty: name lm-eval tasks, e.g. hellaswag,arc_easy")
    if options.include_path and not Path(options.include_path).expanduser().is_dir():
        raise InputError(f"--include-path {options.include_path} is not a folder of lm-eval task YAMLs")
    if options.lm_batch_size < 1:
        raise InputError("--lm-batch-size must be at least 1")


TASK_OPTIONS = {
    "needle": NeedleOptions,
    "attention": AttentionOptions,
    "icl": IclOptions,
    "hallucination": HallucinationOptions,
    "outliers": OutliersOptions,
    "quantize": QuantizeOptions,
    "zeroshot": ZeroshotOptions,
}
# options that change what is computed: they define a run folder's identity (sample counts do not,
# so a run can be extended with more samples and still resume)
_IDENTITY_EXCLUDED = {
    "samples",
    "limit",
    "batch_size",
    "out",
    "overwrite",
    "device",
    "judge_cache",
    "judge_timeout",
    "judge_retries",
    "judge_concurrency",
}


@dataclass(frozen=True)
class RunConfig:
    task: str
    models: list[ModelSpec]
    options: (
        NeedleOptions
        | AttentionOptions
        | IclOptions
        | HallucinationOptions
        | OutliersOptions
        | QuantizeOptions
        | ZeroshotOptions
    )
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    attn_impl: str = "sdpa"
    chat_template: bool = False
    max_new_tokens: int = 32
    batch_size: int = 1
    limit: int | None = None
    out: str | None = None
    overwrite: bool = False
    trust_remote_code: bool = False
    allow_overlength: bool = False

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
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise InputError("--max-new-tokens and --batch-size must be at least 1")
        if self.limit is not None and self.limit < 1:
            raise InputError(f"--limit {self.limit}: give at least 1, or leave it out")
        self.options.validate()
        for ctx in self.options.ctx:
            if ctx <= self.max_new_tokens + 64:
                raise InputError(f"context {ctx} leaves no room for a prompt: use at least {self.max_new_tokens + 65}")
        return self

    def identity(self) -> dict[str, Any]:
        """What defines the results of a run folder."""
        data = self.to_dict()
        data["options"] = {k: v for k, v in data["options"].items() if k not in _IDENTITY_EXCLUDED}
        return {k: v for k, v in data.items() if k not in _IDENTITY_EXCLUDED}

    def identity_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:10]

    def out_dir(self) -> Path:
        return Path(self.out) if self.out else Path("results") / f"{self.task}-{self.identity_hash()}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        data = dict(data)
        options = TASK_OPTIONS[data["task"]](**data.pop("options"))
        models = [ModelSpec(**m) for m in data.pop("models")]
        return cls(models=models, options=options, **data)


def find_preset(name_or_path: str) -> Path:
    """A YAML file path, or the name of a preset shipped with diffeval (e.g. `needle-4k-table2`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = resources.files("diffeval") / "presets" / f"{path.stem}.yaml"
    if packaged.is_file():
        return Path(str(packaged))
    raise InputError(
        f"config {name_or_path!r} not found: give a YAML file path or a preset name ({', '.join(list_presets())})"
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
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a mapping of option: value, not a {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def parse_str_list(text: str | list) -> list[str]:
    items = text if isinstance(text, list) else str(text).split(",")
    return [str(item).strip() for item in items if str(item).strip()]


def parse_shots(text: str | int | list) -> list:
    items = text if isinstance(text, list) else str(text).split(",")
    out = []
    for item in items:
        token = str(item).strip()
        if token != "max" and not token.isdigit():
            raise InputError(f"bad --shots value {token!r}: use non-negative integers or max, e.g. 1,10,100,max")
        out.append(token if token == "max" else int(token))
    return out


# options given as comma lists on the command line (or YAML lists)
LIST_OPTIONS = {
    "ctx": parse_ctx,
    "needles": lambda v: parse_int_list(v, "--needles"),
    "queries": lambda v: parse_int_list(v, "--queries"),
    "depths": lambda v: parse_int_list(v, "--depths"),
    "datasets": parse_str_list,
    "orders": parse_str_list,
    "shots": parse_shots,
    "bits": lambda v: parse_int_list(v, "--bits"),
    "lm_tasks": parse_str_list,
    "tokens": lambda v: parse_ctx(v)[0],
}


def build_config(task: str, yaml_values: dict[str, Any], flags: dict[str, Any]) -> RunConfig:
    """Merge preset values and command-line flags (flags win) into a validated RunConfig."""
    if task not in TASK_OPTIONS:
        raise InputError(f"unknown task {task!r}: use one of {', '.join(TASK_OPTIONS)}")
    values = {**yaml_values, **{k: v for k, v in flags.items() if v is not None}}
    if values.pop("task", task) != task:
        raise InputError(f"the config is for task {yaml_values.get('task')!r}, not {task!r}: run that task instead")
    option_cls = TASK_OPTIONS[task]
    option_names = {f.name for f in fields(option_cls)}
    run_names = {f.name for f in fields(RunConfig)} - {"task", "options"}
    unknown = set(values) - option_names - run_names
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(sorted(unknown))}: see `diffeval run {task} --help`")
    raw_models = values.pop("models", None) or []
    if not raw_models and all(name in builtin_models() for name in ("toy-diff", "toy-base")):
        raw_models = list(DEFAULT_PAIR)  # the offline default: the shipped reference pair
    if isinstance(raw_models, dict) and "spec" not in raw_models:  # YAML `models: {diff: PATH, base: PATH}`
        raw_models = [{"name": k, **(v if isinstance(v, dict) else {"spec": v})} for k, v in raw_models.items()]
    if isinstance(raw_models, (str, dict)):
        raw_models = [raw_models]
    models = [ModelSpec.parse(m) for m in raw_models]
    option_values = {k: values.pop(k) for k in list(values) if k in option_names}
    if str(option_values.get("data_dir", "")).startswith("package:"):  # data shipped inside diffeval
        option_values["data_dir"] = str(resources.files("diffeval") / option_values["data_dir"][len("package:") :])
    for key, parse in LIST_OPTIONS.items():
        if key in option_values:
            option_values[key] = parse(option_values[key])
    try:
        options = option_cls(**option_values)
        config = RunConfig(task=task, models=models, options=options, **values)
    except TypeError as exc:
        raise InputError(f"bad option value: {exc}") from None
    counts = [("seed", config.seed), ("max_new_tokens", config.max_new_tokens)]
    counts += [(name, getattr(options, name)) for name in ("samples", "test_size", "draws") if hasattr(options, name)]
    for name, value in counts:
        if not isinstance(value, int) or isinstance(value, bool):
            raise InputError(f"option {name} must be an integer, got {value!r}")
    return config.validate()
