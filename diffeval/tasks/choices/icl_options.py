"""ICL's options (`IclOptions`: the prompt budget, datasets, shot counts, orders, test queries, draws) and the
parsing of its `--shots` and `--orders` values."""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import context_option, is_count, option, str_list
from diffeval.data import icl as icl_data
from diffeval.errors import InputError

ORDER_TYPES = ("random", "alternating", "grouped")
TEST_SIZE = 250  # the default --test-size (the protocol's): at most this many; a given one the data must hold


def parse_shots(text: str | int | list) -> list:
    items = text if isinstance(text, list) else str(text).split(",")
    out = []
    for item in items:
        token = str(item).strip()
        if token != "max" and not is_count(token):
            raise InputError(f"bad --shots value {token!r}: use non-negative integers or max, e.g. 1,10,100,max")
        out.append(token if token == "max" else int(token))
    return out


def parse_orders(orders: list[str]) -> list[tuple[str, int]]:
    parsed = []
    for item in orders:
        kind, _, count = str(item).partition(":")
        if kind not in ORDER_TYPES or (count and not is_count(count)) or (count and int(count) < 1):
            raise InputError(f"bad order {item!r}: use random:K, alternating:K or grouped[:K], e.g. random:10")
        parsed.append((kind, int(count or 1)))
    return parsed


@dataclass(frozen=True)
class IclOptions:
    """Many-shot ICL with order robustness (paper Figures 6 and 7; Bertsch et al. 2024)."""

    ctx: list[int] = context_option([4096], help="the prompt budget, e.g. 64k (one length)")
    datasets: list[str] = option(
        ["trec"],
        help="trec, trec-fine, banking77, clinic150; comma list",
        flag="--dataset",
        parse=str_list("--dataset"),
    )
    shots: list = option(
        [1, 10, 100], help="demonstrations per prompt, comma list; max fills the context", parse=parse_shots
    )
    orders: list[str] = option(
        ["random:3"], help="random:K, alternating:K, grouped[:K]; comma list", parse=str_list("--orders")
    )
    test_size: int = option(TEST_SIZE, help=f"test queries per dataset [default: {TEST_SIZE}, or all where fewer]")
    draws: int = option(1, help="independent demonstration draws [default: 1]")
    data_dir: str | None = option(
        None,
        help="read local files in the ../shared/datasets layout, not the hub",
        reads=lambda o: icl_data.local_files(o.datasets, o.data_dir),
    )
    test_indices: str | None = option(
        None,
        help="JSON list of test rows, or a folder of <name>-indices.txt",
        reads=lambda o: list(dict.fromkeys(icl_data.indices_file(o.test_indices, name) for name in o.datasets)),
    )
    length_norm: bool = option(False, help="score labels by mean token log-prob", flag="--length-norm")

    def validate(self) -> None:
        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: ICL takes one context length (the prompt budget), e.g. --ctx 64k")
        unknown = [d for d in self.datasets if d not in icl_data.DATASETS]
        if not self.datasets:
            raise InputError(f"--dataset is empty: name one or more of {', '.join(icl_data.DATASETS)}")
        if unknown:
            raise InputError(f"unknown dataset(s) {unknown}: use any of {', '.join(icl_data.DATASETS)}")
        for shots in self.shots:
            if shots != "max" and (not isinstance(shots, int) or shots < 0):
                raise InputError(f"bad --shots value {shots!r}: use non-negative integers or max, e.g. 1,10,100,max")
        parse_orders(self.orders)
        if self.test_size < 1 or self.draws < 1:
            raise InputError("--test-size and --draws must be at least 1")
