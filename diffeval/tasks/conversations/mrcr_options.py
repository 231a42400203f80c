"""MRCR's options (`MrcrOptions`: lengths, needle counts, samples, the asked index, the rendering, where the
conversations come from) and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import context_option, int_list, option
from diffeval.data import mrcr as data
from diffeval.data.haystack import source_files
from diffeval.errors import InputError

RENDERINGS = ("chat", "plain")
SOURCES = ("generated", "openai")
MOST_NEEDLES = 64


@dataclass(frozen=True)
class MrcrOptions:
    """OpenAI-MRCR: reproduce the i-th of several identical requests' replies in a long conversation."""

    ctx: list[int] = context_option([2048, 4096, 8192], help="context lengths, e.g. 4k,32k,128k [default: 2k,4k,8k]")
    needles: list[int] = option([2, 4, 8], help="needle counts: identical requests per conversation [default: 2,4,8]",
                                parse=int_list("--needles"))  # fmt: skip
    samples: int = option(8, help="conversations per length and needle count [default: 8]", identity=False)
    index: int | None = option(
        None, type=int, help="ask for this needle (1-based) in every conversation [default: seeded per conversation]"
    )
    rendering: str = option(
        "chat",
        help="chat: every turn through the model's chat template | plain: role prefixes (User:, Assistant:), for "
        "models without a chat template [default: chat]",
    )
    source: str = option(
        "generated",
        help="generated: conversations built here from real text | openai: OpenAI's rows (hub openai/mrcr, or "
        "--data-dir) [default: generated]",
    )
    replies: str = option(
        "book",
        help="the text assistant replies are drawn from: book | essays:PATH | hf:DATASET[:SPLIT[:FIELD]] "
        "[default: book]",
        applies=(lambda o: o.source == "generated", "with --source generated"),
        reads=lambda o: source_files(o.replies),
    )
    data_dir: str | None = option(
        None,
        help="a parquet or JSONL file of OpenAI's MRCR rows, or a folder holding mrcr.parquet or mrcr.jsonl "
        "[default: the hub's openai/mrcr]",
        applies=(lambda o: o.source == "openai", "with --source openai"),
        reads=lambda o: [data.local_file(o.data_dir)],
    )

    def validate(self) -> None:
        if self.rendering not in RENDERINGS:
            raise InputError(f"--rendering {self.rendering}: use chat or plain")
        if self.source not in SOURCES:
            raise InputError(f"--source {self.source}: use generated or openai")
        if not self.needles or min(self.needles) < 1 or max(self.needles) > MOST_NEEDLES:
            raise InputError(f"--needles {self.needles}: give needle counts from 1 to {MOST_NEEDLES}, e.g. 2,4,8")
        if self.samples < 1:
            raise InputError(f"--samples {self.samples}: give at least 1")
        if self.index is not None:
            if self.source == "openai":
                raise InputError(
                    "--index applies to generated conversations; OpenAI's rows name their own: leave it out"
                )
            if not 1 <= self.index <= min(self.needles):
                raise InputError(f"--index {self.index} is beyond the needle count {min(self.needles)} of --needles "
                                 f"{','.join(map(str, self.needles))}: give 1 to {min(self.needles)}")  # fmt: skip
        if self.source == "generated" and self.replies.startswith(("noise", "needles:")):
            raise InputError(f"--replies {self.replies}: replies are real text: use book, essays:PATH or hf:DATASET")
