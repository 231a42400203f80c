"""LongBench v2's options (`LongBench2Options`: the lengths, the mode, the prompt, the data and its filters) and
their checks."""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import context_option, option, str_list
from diffeval.data import longbench2 as data
from diffeval.errors import InputError

MODES = ("generate", "choices")
PROMPTS = ("official", "lm-eval")


@dataclass(frozen=True)
class LongBench2Options:
    """LongBench v2: multiple-choice questions over long real documents, each cut from its middle to the budget."""

    ctx: list[int] = context_option(
        [4096],
        help="context lengths, e.g. 4k,8k: each question's document is cut from its middle to fit each [default: 4k]",
    )
    mode: str = option(
        "generate",
        help="generate: greedy answer, read as LongBench's pred.py reads it | choices: the "
        "highest log-likelihood of the letters A-D after the prompt [default: generate]",
    )
    prompt: str = option(
        "official",
        help="official: LongBench v2's 0-shot prompt | lm-eval: lm-eval's longbench2 "
        "prompt (ending 'Answer:'; --mode choices only) [default: official]",
    )
    data_dir: str | None = option(
        None,
        help=f"a LongBench v2 file (data.json, JSONL or parquet) or a folder holding one [default: the hub's "
        f"{data.HUB_ID}]; package:fixtures: the invented fixture",
        reads=lambda o: [data.local_file(o.data_dir)],
    )
    domains: list[str] = option(
        [],
        help="only these domains, e.g. 'Single-Document QA' [default: all]",
        flag="--domain",
        parse=str_list("--domain"),
    )
    difficulties: list[str] = option(
        [], help="only these: easy, hard [default: both]", flag="--difficulty", parse=str_list("--difficulty")
    )
    length_labels: list[str] = option(
        [],
        help="only these of the dataset's length labels: short, medium, long [default: all]",
        flag="--length-label",
        parse=str_list("--length-label"),
    )
    samples: int | None = option(
        None, type=int, identity=False, help="questions, the first N after the filters [default: all]"
    )

    def validate(self) -> None:
        if self.mode not in MODES:
            raise InputError(f"unknown --mode {self.mode!r}: use generate or choices")
        if self.prompt not in PROMPTS:
            raise InputError(f"unknown --prompt {self.prompt!r}: use official or lm-eval")
        if self.prompt == "lm-eval" and self.mode != "choices":
            raise InputError("--prompt lm-eval is lm-eval's log-likelihood prompt: add --mode choices, or leave it out")
        for flag, values, known in (
            ("--difficulty", self.difficulties, data.DIFFICULTIES),
            ("--length-label", self.length_labels, data.LENGTH_LABELS),
        ):
            unknown = [v for v in values if v not in known]
            if unknown:
                raise InputError(f"unknown {flag} {unknown[0]!r}: use any of {', '.join(known)}")
        if self.samples is not None and self.samples < 1:
            raise InputError(f"--samples {self.samples}: give at least 1, or leave it out for every question")
