"""ICL's demonstrations: the datasets, the test queries, seeded draws of demonstrations and their orders, and the
demonstration block a run's prompts share."""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from diffeval.data import icl as icl_data
from diffeval.errors import InputError
from diffeval.tasks.choices.icl_options import TEST_SIZE, IclOptions


@dataclass(frozen=True)
class Run:
    """One demonstration block: a dataset, a draw of k demonstrations, and one order of them."""

    dataset: str
    shots: int
    order: str
    order_seed: int
    draw: int

    @property
    def key(self) -> tuple:
        return (self.dataset, self.shots, self.order, self.order_seed, self.draw)


@lru_cache(maxsize=8)
def dataset(name: str, data_dir: str | None) -> icl_data.ICLDataset:
    return icl_data.load(name, data_dir)


def test_ids(options: IclOptions, name: str, seed: int) -> list[int]:
    data = dataset(name, options.data_dir)
    if options.test_indices:
        path = icl_data.indices_file(options.test_indices, name)
        if not Path(options.test_indices).expanduser().is_dir() and len(options.datasets) > 1:
            raise InputError("--test-indices FILE serves one dataset: give a folder of <name>-indices.txt for several")
        ids = icl_data.load_indices(str(path))
        if max(ids, default=-1) >= len(data.test) or min(ids, default=0) < 0:
            raise InputError(f"--test-indices {path}: indices outside the {len(data.test)} test rows of {name}")
        if options.test_size > len(ids) and options.test_size != TEST_SIZE:
            raise InputError(f"--test-size {options.test_size}: --test-indices {path} lists {len(ids)} test rows: "
                             f"give --test-size {len(ids)} or fewer")  # fmt: skip
        return ids[: options.test_size]
    if options.test_size > len(data.test) and options.test_size != TEST_SIZE:
        raise InputError(f"--test-size {options.test_size}: {name} holds {len(data.test)} test rows: give "
                         f"--test-size {len(data.test)} or fewer")  # fmt: skip
    rng = random.Random(f"icl-test|{name}|{seed}")
    return sorted(rng.sample(range(len(data.test)), min(options.test_size, len(data.test))))


def demonstrations(name: str, data_dir: str | None, seed: int, draw: int, shots: int) -> list[int]:
    """Train indices of a draw: the first `shots` of a seeded permutation (nested across k)."""
    train = dataset(name, data_dir).train
    if shots > len(train):
        raise InputError(f"--shots {shots}: {name} holds {len(train)} training examples: give at most {len(train)}, "
                         "or max")  # fmt: skip
    order = list(range(len(train)))
    random.Random(f"icl-draw|{name}|{seed}|{draw}").shuffle(order)
    return order[:shots]


def ordered(run: Run, data_dir: str | None, seed: int) -> list[int]:
    """The run's demonstrations in its order: a permutation of the draw's multiset."""
    demos = demonstrations(run.dataset, data_dir, seed, run.draw, run.shots)
    train = dataset(run.dataset, data_dir).train
    rng = random.Random(f"icl-order|{run.dataset}|{seed}|{run.draw}|{run.shots}|{run.order}|{run.order_seed}")
    if run.order == "random":
        rng.shuffle(demos)
        return demos
    by_class: dict[int, list[int]] = {}
    for index in sorted(demos):
        by_class.setdefault(train[index].label, []).append(index)
    classes = sorted(by_class)
    if run.order_seed > 0 or run.order == "alternating":  # variant 0 of grouped is plain sorting by label id
        rng.shuffle(classes)
        for members in by_class.values():
            rng.shuffle(members)
    if run.order == "grouped":
        return [i for c in classes for i in by_class[c]]
    out, queues = [], [list(by_class[c]) for c in classes]
    while any(queues):  # round-robin over classes
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def format_example(name: str, text: str, label: str | None) -> str:
    input_prefix, output_prefix = icl_data.FORMATS[name]
    return f"{input_prefix}: {text}\n{output_prefix}:" + (f" {label}" if label is not None else "")


def demonstration_block(run: Run, data_dir: str | None, seed: int) -> str:
    data = dataset(run.dataset, data_dir)
    examples = [data.train[i] for i in ordered(run, data_dir, seed)]
    return "".join(format_example(run.dataset, e.text, data.labels[e.label]) + "\n\n" for e in examples)
