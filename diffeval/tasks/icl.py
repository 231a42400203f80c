"""Many-shot in-context learning and its robustness to example order (paper Figures 6 and 7; Bertsch et al. 2024).

Recipe:
1. runs: for each dataset, draw and k, a seeded draw of k demonstrations from the train split (the first k of one
   seeded permutation, so smaller k are prefixes of larger ones); each order (`random:K`, `alternating:K`,
   `grouped:K`) is a permutation of that same multiset, identical for every model. `shots=max` is the largest k
   whose prompt fits every model's context.
2. samples: one per run × test query; the test set is the protocol's fixed indices (`--test-indices`) or a seeded
   sample of the test split.
3. prompt: "Question: …\\nType: label" demonstrations joined by blank lines, then the query; each model tokenizes the
   same text. With `--chat-template` the demonstrations and the query are the user turn of the model's own template
   and the label is the assistant's reply. A run that does not fit a model's context is recorded as over budget,
   never truncated.
4. backend: constrained decoding. The log-likelihood of every label's tokens after the prompt, each query and label
   tokenized inside the whole prompt; the demonstration block's KV cache is computed once per (model, run) and reused
   for every query and label.
5. score: the best-scoring label (summed log-probability; `--length-norm` divides by the label's token count).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from functools import lru_cache
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING

from diffeval.config import context_option, option, parse_str_list
from diffeval.data import icl as icl_data
from diffeval.errors import InputError
from diffeval.models.backend import Backend, Tokenizer
from diffeval.models.tokenizer import PromptTokenizer, encode_choices_in_context
from diffeval.paper import FIGURE7_TREC
from diffeval.records import MayBeAbsent, Record, sample_id
from diffeval.tasks.base import Listing, Reporting, Running, Scoring, Task, Viewing, with_cells

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    import pandas as pd

SUMMARY_KEYS = ["model", "dataset", "shots", "order", "order_seed", "draw"]
ORDER_TYPES = ("random", "alternating", "grouped")


def parse_shots(text: str | int | list) -> list:
    items = text if isinstance(text, list) else str(text).split(",")
    out = []
    for item in items:
        token = str(item).strip()
        if token != "max" and not token.isdigit():
            raise InputError(f"bad --shots value {token!r}: use non-negative integers or max, e.g. 1,10,100,max")
        out.append(token if token == "max" else int(token))
    return out


@dataclass(frozen=True)
class IclOptions:
    """Many-shot ICL with order robustness (paper Figures 6 and 7; Bertsch et al. 2024)."""

    ctx: list[int] = context_option([4096], help="the prompt budget, e.g. 64k (one length)")
    datasets: list[str] = option(
        ["trec"], help="trec, trec-fine, banking77, clinic150; comma list", flag="--dataset", parse=parse_str_list
    )
    shots: list = option(
        [1, 10, 100], help="demonstrations per prompt, comma list; max fills the context", parse=parse_shots
    )
    orders: list[str] = option(
        ["random:3"], help="random:K, alternating:K, grouped[:K]; comma list", parse=parse_str_list
    )
    test_size: int = option(250, help="test queries per dataset [default: 250]")
    draws: int = option(1, help="independent demonstration draws [default: 1]")
    data_dir: str | None = option(None, help="read local files in the ../shared/datasets layout, not the hub")
    test_indices: str | None = option(None, help="JSON list of test rows, or a folder of <name>-indices.txt")
    length_norm: bool = option(False, help="score labels by mean token log-prob", flag="--length-norm")

    def validate(self) -> None:
        if len(self.ctx) != 1:
            raise InputError(f"--ctx {self.ctx}: ICL takes one context length (the prompt budget), e.g. --ctx 64k")
        unknown = [d for d in self.datasets if d not in icl_data.DATASETS]
        if unknown or not self.datasets:
            raise InputError(f"unknown dataset(s) {unknown}: use any of {', '.join(icl_data.DATASETS)}")
        for shots in self.shots:
            if shots != "max" and (not isinstance(shots, int) or shots < 0):
                raise InputError(f"bad --shots value {shots!r}: use non-negative integers or max, e.g. 1,10,100,max")
        parse_orders(self.orders)
        if self.test_size < 1 or self.draws < 1:
            raise InputError("--test-size and --draws must be at least 1")


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


@dataclass(frozen=True)
class ICLSample:
    sample_id: str
    run: Run
    shots_requested: str
    test_id: int
    seed: int


def parse_orders(orders: list[str]) -> list[tuple[str, int]]:
    parsed = []
    for item in orders:
        kind, _, count = str(item).partition(":")
        if kind not in ORDER_TYPES or (count and not count.isdigit()) or (count and int(count) < 1):
            raise InputError(f"bad order {item!r}: use random:K, alternating:K or grouped[:K], e.g. random:10")
        parsed.append((kind, int(count or 1)))
    return parsed


@lru_cache(maxsize=8)
def dataset(name: str, data_dir: str | None) -> icl_data.ICLDataset:
    return icl_data.load(name, data_dir)


def test_ids(options, name: str, seed: int) -> list[int]:
    data = dataset(name, options.data_dir)
    if options.test_indices:
        path = Path(options.test_indices).expanduser()
        if path.is_dir():  # the protocol's folder of index files (long-context-icl `dataset-splits/`)
            files = {"trec": "trec", "trec-fine": "trec", "banking77": "banking", "clinic150": "clinic"}
            path = path / f"{files[name]}-indices.txt"
        elif len(options.datasets) > 1:
            raise InputError("--test-indices FILE serves one dataset: give a folder of <name>-indices.txt for several")
        ids = icl_data.load_indices(str(path))
        if max(ids, default=-1) >= len(data.test) or min(ids, default=0) < 0:
            raise InputError(f"--test-indices {path}: indices outside the {len(data.test)} test rows of {name}")
        return ids[: options.test_size]
    rng = random.Random(f"icl-test|{name}|{seed}")
    return sorted(rng.sample(range(len(data.test)), min(options.test_size, len(data.test))))


def demonstrations(name: str, data_dir: str | None, seed: int, draw: int, shots: int) -> list[int]:
    """Train indices of a draw: the first `shots` of a seeded permutation (nested across k)."""
    train = dataset(name, data_dir).train
    if shots > len(train):
        raise InputError(f"{shots} shots exceed the {len(train)} training examples of {name}")
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


def prompt_texts(
    block: str, queries: list[str], labels: list[str], renderer, chat_template: bool, model: str
) -> tuple[str, list[str], list[str]]:
    """(context, per query the text after it, the choices) whose concatenations are the prompts a model scores.
    Raw: the demonstration block, each query, each label after a space. With the chat template: the block and the
    query form the user turn, and the label is the assistant's reply, right after the generation prompt; the context
    is the template's opening and the block (shared by every query, so its KV cache serves them all), each query
    text ends with the template's generation prompt. `renderer`: a backend or prompt tokenizer (`render_prompt`)."""
    if not chat_template:
        return block, queries, [" " + label for label in labels]
    context, tails = None, []
    for query in queries:
        text = renderer.render_prompt(block + query, "", True)
        at = text.find(block + query)
        if at < 0 or context not in (None, text[: at + len(block)]):
            raise InputError(
                f"model {model}'s chat template rewrites the user turn, so the ICL demonstrations cannot be shared "
                "across queries: run it without --chat-template"
            )
        context = text[: at + len(block)]
        tails.append(text[at + len(block) :])
    return context or block, tails, list(labels)


def resolve_max_shots(config, tokenizers: dict[str, Tokenizer]) -> dict[tuple[str, int], int]:
    """`shots=max`: per dataset and draw, the largest k whose prompts fit every model's context in every order.

    A first k comes from the draw's demonstrations encoded as one block (tokens count in context: a BPE merge can
    cross the seam between two demonstrations, so they cost more or fewer than encoded one by one), beside the
    longest query and label and the chat template's turns; then each order's whole prompt is built and encoded as
    `evaluate` encodes it, and k shrinks until the longest fits."""
    options = config.options
    ctx = options.ctx[0]
    best = {}
    for name in options.datasets:
        data = dataset(name, options.data_dir)
        queries = [format_example(name, data.test[i].text, None) for i in test_ids(options, name, config.seed)]
        for draw in range(options.draws):
            pool = demonstrations(name, options.data_dir, config.seed, draw, len(data.train))
            texts = [format_example(name, data.train[i].text, data.labels[data.train[i].label]) + "\n\n" for i in pool]
            k = len(texts)
            for model, tokenizer in tokenizers.items():
                k = min(k, _shots_by_block(tokenizer, model, texts[:k], queries, data.labels, config, ctx))
                k = _fitting_shots(PromptTokenizer(tokenizer, model), name, k, draw, queries, data, config)
            best[(name, draw)] = k
    return best


def _shots_by_block(tokenizer, model: str, texts: list[str], queries: list[str], labels, config, ctx: int) -> int:
    """The most demonstrations, in the draw's order, whose block fits `ctx` beside the longest query and label."""
    import bisect

    scaffold = len(tokenizer.encode(tokenizer.render_prompt("", "", True, model)).ids) if config.chat_template else 1
    labels = labels if config.chat_template else [" " + label for label in labels]
    reserve = (
        scaffold
        + max(map(len, tokenizer.encode_many(queries, special_tokens=False)))
        + max(map(len, tokenizer.encode_many(labels, False)))
    )
    encoding = tokenizer.encode("".join(texts), special_tokens=False)
    ends = [end for _, end in encoding.offsets]  # a token belongs to the demonstrations up to where it ends
    fitting, boundary = 0, 0
    for count, text in enumerate(texts, 1):
        boundary += len(text)
        if bisect.bisect_right(ends, boundary) + reserve > ctx:
            break
        fitting = count
    return fitting


def _fitting_shots(renderer, name: str, k: int, draw: int, queries: list[str], data, config) -> int:
    """The most shots, at most k, whose every order's whole prompt fits the context: k shrinks by about the
    demonstrations an overshoot holds, then grows back one at a time where a long step skipped some that fit."""
    ctx = config.options.ctx[0]
    over_at = None  # the fewest shots known not to fit
    while k > 0 and (over := _longest_prompt(renderer, name, k, draw, queries, data, config) - ctx) > 0:
        over_at = k
        k -= max(1, over * k // ctx)
    while over_at is not None and k + 1 < over_at:
        if _longest_prompt(renderer, name, k + 1, draw, queries, data, config) > ctx:
            break
        k += 1
    return k


def _longest_prompt(renderer, name: str, shots: int, draw: int, queries: list[str], data, config) -> int:
    """The tokens of the longest prompt (block, query and label, in one piece) over every order of `shots`."""
    longest = 0
    for kind, variants in parse_orders(config.options.orders):
        for variant in range(variants):
            block = demonstration_block(Run(name, shots, kind, variant, draw), config.options.data_dir, config.seed)
            texts = prompt_texts(block, queries, data.labels, renderer, config.chat_template, renderer.name)
            prefix, query_ids, choices = encode_choices_in_context(renderer, *texts)
            longest = max(longest, len(prefix) + max(len(q) + max(map(len, c)) for q, c in zip(query_ids, choices)))
    return longest


def make_samples(options, seed: int, limit: int | None = None, prepared=None) -> list[ICLSample]:
    """`prepared`: the `shots=max` resolution from `prepare`."""
    samples = []
    for name in options.datasets:
        ids = test_ids(options, name, seed)[:limit] if limit else test_ids(options, name, seed)
        for draw in range(options.draws):
            for requested in options.shots:
                shots = prepared[(name, draw)] if requested == "max" else int(requested)
                for kind, variants in parse_orders(options.orders):
                    for variant in range(variants):
                        run = Run(name, shots, kind, variant, draw)
                        for test_id in ids:
                            key = f"icl|{seed}|{'|'.join(map(str, run.key))}|{test_id}"
                            samples.append(ICLSample(sample_id(key), run, str(requested), test_id, seed))
    return samples


def prepare(config, tokenizers: dict[str, Tokenizer]):
    """Resolve `shots=max` against every model's tokenizer before any sample is built."""
    return resolve_max_shots(config, tokenizers) if "max" in config.options.shots else None


def check_inputs(config) -> None:
    for name in config.options.datasets:
        test_ids(config.options, name, config.seed)
        data = dataset(name, config.options.data_dir)
        for shots in config.options.shots:
            if shots != "max" and int(shots) > len(data.train):
                raise InputError(f"{shots} shots exceed the {len(data.train)} training examples of {name}")


def batches(todo: list[ICLSample], config) -> list[list[ICLSample]]:
    """All queries of one run together: its demonstration block is encoded once."""
    return [list(group) for _, group in groupby(todo, key=lambda s: s.run.key)]


def evaluate(batch: list[ICLSample], backend: Backend, config):
    """Yields one record per test query as soon as it is scored."""
    options = config.options
    run = batch[0].run
    data = dataset(run.dataset, options.data_dir)
    # every query and label is tokenized inside its prompt: prefix + queries[i] + choices[i][j] are the ids of the
    # whole prompt "block, query i, label j" encoded in one piece
    prefix, queries, choices = encode_choices_in_context(
        backend,
        *prompt_texts(
            demonstration_block(run, options.data_dir, config.seed),
            [format_example(run.dataset, data.test[s.test_id].text, None) for s in batch],
            data.labels,
            backend,
            config.chat_template,
            backend.info.name,
        ),
    )
    longest = len(prefix) + max(len(q) + max(map(len, c)) for q, c in zip(queries, choices))
    run_fields = {
        "dataset": run.dataset,
        "shots": run.shots,
        "order": run.order,
        "order_seed": run.order_seed,
        "draw": run.draw,
        "demonstration_tokens": len(prefix),
    }

    def make(sample: ICLSample, prompt_tokens: int, seconds: float, **outcome) -> Record:
        gold = data.test[sample.test_id].label
        fields = {
            **run_fields,
            "shots_requested": sample.shots_requested,
            "test_id": sample.test_id,
            "gold": gold,
            "gold_label": data.labels[gold],
            **outcome,
        }
        return Record("icl", backend.info.name, sample.sample_id, prompt_tokens, 0, seconds, fields)

    if longest > options.ctx[0]:
        for sample in batch:
            yield make(
                sample,
                longest,
                0.0,
                status="over_budget",
                prediction=None,
                predicted_label=None,
                correct=None,
                score=None,
                label_scores=None,
            )
        return
    start = time.perf_counter()
    for sample, query, scores in zip(batch, queries, backend.score_choices(prefix, queries, choices)):
        values = [total / count if options.length_norm else total for total, count in scores]
        prediction = max(range(len(values)), key=values.__getitem__)
        gold = data.test[sample.test_id].label
        now = time.perf_counter()
        yield make(
            sample,
            len(prefix) + len(query),
            now - start,
            status="ok",
            prediction=prediction,
            predicted_label=data.labels[prediction],
            correct=prediction == gold,
            score=float(prediction == gold),
            label_scores=[round(v, 4) for v in values],
        )
        start = now


def _scored(records: pd.DataFrame) -> pd.DataFrame:
    return records[records["status"] == "ok"].assign(score=lambda f: f["score"].astype(float))


def order_statistics(records: pd.DataFrame) -> pd.DataFrame:
    """Per model, dataset, shots and order type: accuracy over its orders (mean, std, min, max, best - worst)."""
    per_run = _scored(records).groupby(SUMMARY_KEYS, sort=False)["score"].mean().reset_index()
    stats = per_run.groupby(["model", "dataset", "shots", "order"], sort=False)["score"].agg(
        runs="count", mean="mean", std="std", min="min", max="max"
    )
    stats["margin"] = (stats["max"] - stats["min"]) * 100
    return stats.round(4).reset_index()


def tables(records: pd.DataFrame, options: IclOptions, paper: bool = False) -> dict[str, pd.DataFrame]:
    scored = _scored(records)
    out = {}
    accuracy = scored.pivot_table(
        index="model", columns=["dataset", "shots"], values="score", aggfunc="mean", sort=False
    )
    column_cells = [{"dataset": d, "shots": k, "status": "ok"} for d, k in accuracy.columns]
    accuracy.columns = [f"{d} {k}-shot" for d, k in accuracy.columns]
    out["icl_accuracy"] = with_cells(accuracy.round(3), [{"model": m} for m in accuracy.index], column_cells)
    stats = order_statistics(records)
    stats["setting"] = stats["dataset"] + " " + stats["shots"].astype(str) + "-shot " + stats["order"]
    settings = {  # setting label → the records behind it
        s: {"dataset": d, "shots": k, "order": o, "status": "ok"}
        for s, d, k, o in stats[["setting", "dataset", "shots", "order"]].itertuples(index=False)
    }
    orders = stats.set_index(["model", "setting"])[["runs", "mean", "std", "min", "max", "margin"]]
    out["icl_orders"] = with_cells(
        orders, [{"model": m, **settings[s]} for m, s in orders.index], [{}] * orders.shape[1]
    )
    margins = stats.pivot_table(index="setting", columns="model", values="margin", sort=False)
    models = list(stats["model"].unique())
    margins = margins[models]
    if paper:  # the paper's TREC margins beside ours, for TREC settings with the same order type
        for setting in margins.index:
            dataset, _, order = setting.split(" ")
            for model, value in FIGURE7_TREC.get(order, {}).items() if dataset == "trec" else ():
                margins.loc[setting, model] = value
    out["figure7_margins"] = with_cells(
        margins.round(1),
        [settings[s] for s in margins.index],
        [{"model": m} if m in models else None for m in margins.columns],
    )
    over = records[records["status"] == "over_budget"]
    if len(over):
        counts = over.groupby(["model", "dataset", "shots"]).size().to_frame("queries")
        out["over_budget"] = with_cells(
            counts,
            [{"model": m, "dataset": d, "shots": k, "status": "over_budget"} for m, d, k in counts.index],
            [{}],
        )
    return out


def plots(records: pd.DataFrame, folder: Path) -> list[Path]:
    from diffeval.plotting import plt

    scored = _scored(records)
    names = list(scored["dataset"].unique())
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        curve = scored[scored["dataset"] == name].groupby(["shots", "model"])["score"].mean().unstack()
        curve.plot(ax=ax, marker="o", logx=bool(curve.index.max() > 10 * max(curve.index.min(), 1)))
        ax.set(title=f"{name}: accuracy vs shots", xlabel="shots", ylabel="accuracy")
    fig.tight_layout()
    shots_png = folder / "icl_accuracy_vs_shots.png"
    fig.savefig(shots_png, dpi=120)
    plt.close(fig)
    per_run = scored.groupby(SUMMARY_KEYS, sort=False)["score"].mean().reset_index()
    per_run["group"] = per_run["dataset"] + " " + per_run["shots"].astype(str) + "-shot " + per_run["order"]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * per_run["group"].nunique() * per_run["model"].nunique()), 4))
    labels, data = [], []
    for (group, model), values in per_run.groupby(["group", "model"], sort=False)["score"]:
        labels.append(f"{group}\n{model}")
        data.append(values.to_numpy())
    ax.boxplot(data)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right", fontsize=7)
    ax.set(title="accuracy across orders of the same demonstrations", ylabel="accuracy")
    fig.tight_layout()
    box_png = folder / "icl_order_robustness.png"
    fig.savefig(box_png, dpi=120)
    plt.close(fig)
    return [shots_png, box_png]


def sample_view(config, records: dict[str, dict], tokenizer_for, full_text: bool | None):
    """For `diffeval view`: the demonstrations' labels in their order, rebuilt from the run's config, the test query,
    and per model its gold and predicted label with every label's score (the prediction emphasised)."""
    from diffeval.tasks.blocks import Bar, Bars, Document, Labels, Notice, Section, Text

    first = next(iter(records.values()))
    run = Run(first["dataset"], int(first["shots"]), first["order"], first["order_seed"], first["draw"])
    data = dataset(run.dataset, config.options.data_dir)
    sequence = [data.train[i].label for i in ordered(run, config.options.data_dir, config.seed)]
    blocks = [
        Labels(sequence, data.labels, title=f"Demonstration order: {len(sequence)} shots ({run.order})"),
        Text([data.test[first["test_id"]].text], style="mono", title="Test query"),
    ]
    for model, record in records.items():
        scores = record.get("label_scores") or []
        if scores:
            shown = Bars([
                Bar(label, score, colour=i, emphasis=i == record.get("prediction"),
                    note="(gold)" if i == record["gold"] else None)
                for i, (label, score) in enumerate(zip(data.labels, scores))
            ], title="label scores (log-likelihood)")  # fmt: skip
        else:  # over the context budget
            shown = Notice(f"not scored: {record.get('status')}", level="note")
        title = f"{model}: gold {record['gold_label']}, predicted {record.get('predicted_label') or '—'}"
        blocks.append(Section([shown], title=title, model=model, right=record.get("correct")))
    return Document(blocks)


def sizing(samples: list[ICLSample], tokenizer, config) -> tuple[int, int]:
    """Prompt tokens as computed: each run's demonstration block once (its KV cache serves every query), plus every
    query (with the chat template: the template's turns around them too). Labels are scored, not generated."""
    total, blocks = 0, {}  # run key → its demonstration block
    for sample in samples:
        run, first = sample.run, sample.run.key not in blocks
        data = dataset(run.dataset, config.options.data_dir)
        if first:
            blocks[run.key] = demonstration_block(run, config.options.data_dir, config.seed)
        query = format_example(run.dataset, data.test[sample.test_id].text, None)
        context, [text], _ = prompt_texts(
            blocks[run.key], [query], data.labels, tokenizer, config.chat_template, tokenizer.name
        )
        if first:
            total += len(tokenizer.encode(context).ids)
        total += len(tokenizer.encode(text, special_tokens=False).ids)
    return total, 0


# an over-budget record holds null where a scored one holds its prediction; the view's fields are absent from
# hand-made and older records, and test_id from records older than the clusters
RECORD_SCHEMA = {
    "dataset": str,
    "shots": int,
    "order": str,
    "order_seed": int,
    "draw": int,
    "status": str,
    "score": float | None,
    "correct": bool | None,
    "test_id": MayBeAbsent(int),
    "gold": MayBeAbsent(int),
    "gold_label": MayBeAbsent(str),
    "prediction": MayBeAbsent(int | None),
    "predicted_label": MayBeAbsent(str | None),
    "label_scores": MayBeAbsent(list[float] | None),
}


TASK = Task(
    name="icl",
    help="Many-shot in-context learning and order robustness (paper Figures 6 and 7).",
    options=IclOptions,
    run_options=("chat_template",),
    running=Running(
        make_samples=make_samples,
        evaluate=evaluate,
        needs=frozenset({"score"}),
        # no budget: a run whose prompt does not fit its length is recorded as over budget, per model
        check_inputs=check_inputs,
        prepare=prepare,
        batches=batches,
        sizing=sizing,
    ),
    reporting=Reporting(
        tables=tables,
        titles={
            "icl_accuracy": "ICL accuracy per dataset and shots (mean over draws and orders)",
            "icl_orders": "ICL accuracy across orders of the same demonstrations",
            "figure7_margins": "Figure 7 layout: best - worst accuracy margin over orders (points)",
            "over_budget": "Runs over the context budget (not scored)",
        },
        note=(
            "accuracy = fraction of test queries whose highest-likelihood label is the gold label; margin = best - "
            "worst accuracy (points) over the orders of the same demonstrations; over-budget runs are excluded and "
            "counted"
        ),
        summary_keys=SUMMARY_KEYS,
        pair_keys=["dataset", "shots"],
        metrics={"accuracy": "score"},
        cluster_keys=["dataset", "test_id"],  # a test query is asked under every order, draw and shot count
        decimals={"margin": 1, "figure7_margins": 1},  # margins are in points
        plots=plots,
    ),
    viewing=Viewing(
        sample_view=sample_view, listing=Listing(answer="predicted_label", expected="gold_label", outcome="correct")
    ),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
