"""Hallucination's options (`HallucinationOptions`: the prompt budget, datasets, documents per dataset, the judges
and how they are reached) and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diffeval.config import context_option, option, str_list
from diffeval.data import hallucination as data
from diffeval.errors import InputError
from diffeval.models.backend import available_backends

# the request settings act on judges reached over HTTP only (judges.ChatJudge)
ON_API_JUDGE = (lambda options: any(j.startswith(("openai:", "openai-compatible:")) for j in options.judge),
                "with an openai: or openai-compatible: --judge")  # fmt: skip

SAMPLES = 100  # the default --samples: at most this many (a given --samples the data cannot fill is refused)


@dataclass(frozen=True)
class HallucinationOptions:
    """Contextual hallucination on summarization and QA (paper Table 4)."""

    ctx: list[int] = context_option([4096], help="the prompt budget, e.g. 4k (one length)")
    datasets: list[str] = option(
        ["xsum"],
        help="xsum, cnndm, multi_news, qasper, hotpotqa, 2wikimqa",
        flag="--dataset",
        parse=str_list("--dataset"),
    )
    samples: int = option(
        SAMPLES, help=f"documents per dataset (the first N) [default: {SAMPLES}, or all where fewer]", identity=False
    )
    judge: list[str] = option(  # required: there is no silent default
        [],
        type=list[str],
        parse=lambda value: [value] if isinstance(value, str) else [str(v) for v in value],
        help="required: openai:MODEL | openai-compatible:BASE_URL#MODEL | hf:PATH | overlap (offline proxy); "
        "repeat for more judges: the first is primary, the others are compared with it",
    )
    judge_backend: str = option("hf", help="engine of an hf:PATH judge: hf | vllm [default: hf]")
    # "set": runs without it keep their identity and run.json
    judge_thinking_budget: int | None = option(
        None,
        help="tokens a judge that is a reasoning model may think before its verdict, which is read after the "
        "thinking [default: no thinking phase]",
        type=int,
        identity="set",
        applies=(lambda o: any(j != "overlap" for j in o.judge), "with an hf:, openai: or openai-compatible: --judge"),
    )
    data_dir: str | None = option(
        None,
        help="read local JSONL files (../shared/datasets/hallucination layout)",
        reads=lambda o: [data.local_file(name, Path(o.data_dir).expanduser()) for name in o.datasets],
    )
    judge_cache: str | None = option(None, help="verdict cache folder [default: ~/.cache/diffeval]", identity=False)
    judge_timeout: float = option(60.0, help="seconds per judge request [default: 60]", identity=False,
                                  applies=ON_API_JUDGE)  # fmt: skip
    judge_retries: int = option(5, help="retries on 429, 5xx and timeouts [default: 5]", identity=False,
                                applies=ON_API_JUDGE)  # fmt: skip
    judge_concurrency: int = option(4, help="judge requests in flight [default: 4]", identity=False,
                                    applies=ON_API_JUDGE)  # fmt: skip

    def documents_up_to(self) -> bool:
        """Whether --samples is a ceiling (its default) rather than a count the data must hold (given)."""
        return self.samples == SAMPLES

    def validate(self) -> None:
        if len(set(self.judge)) != len(self.judge):
            raise InputError(f"--judge {self.judge}: each judge once")
        if not self.judge:
            raise InputError("--judge is required: openai:MODEL, openai-compatible:BASE_URL#MODEL, hf:PATH or overlap")
        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: hallucination runs take one context length, e.g. --ctx 4k")
        unknown = [d for d in self.datasets if d not in data.DATASETS]
        if not self.datasets:
            raise InputError(f"--dataset is empty: name one or more of {', '.join(data.DATASETS)}")
        if unknown:
            raise InputError(f"unknown dataset(s) {unknown}: use any of {', '.join(data.DATASETS)}")
        if self.judge_cache and Path(self.judge_cache).expanduser().exists() and not Path(self.judge_cache).is_dir():
            raise InputError(f"--judge-cache {self.judge_cache} is a file: give a folder for the verdict cache")
        engines = available_backends()
        if self.judge_backend not in engines:
            raise InputError(f"unknown --judge-backend {self.judge_backend!r}: use one of {', '.join(engines)}")
        if self.judge_backend != "hf" and not any(j.startswith("hf:") for j in self.judge):
            raise InputError(
                f"--judge-backend {self.judge_backend} runs hf:PATH judges, and no --judge is one: leave it out"
            )
        if self.judge_thinking_budget is not None and self.judge_thinking_budget < 1:
            raise InputError(f"--judge-thinking-budget {self.judge_thinking_budget}: give at least 1, or leave it out")
        if self.samples < 1 or self.judge_retries < 0 or self.judge_concurrency < 1 or self.judge_timeout <= 0:
            raise InputError("--samples and --judge-concurrency must be at least 1, --judge-timeout positive")
