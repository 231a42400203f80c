"""ICL's tables, plots and sample view: accuracy per dataset and shots, accuracy across orders of the same
demonstrations and the paper's Figure 7 margins, and a sample's demonstration order with each model's label scores."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffeval.paper import FIGURE7_TREC, coverage
from diffeval.tasks.base import RunContext, with_cells
from diffeval.tasks.choices.icl_demonstrations import Run, dataset, ordered
from diffeval.tasks.choices.icl_options import IclOptions

if TYPE_CHECKING:  # annotations only: heavy libraries load inside the functions that use them (a fast CLI)
    from pathlib import Path

    import pandas as pd

SUMMARY_KEYS = ["model", "dataset", "shots", "order", "order_seed", "draw"]


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
    from diffeval.plotting import legend, panels, plt, save, text_width

    scored = _scored(records)
    names = list(scored["dataset"].unique())
    fig, axes = panels(len(names), 0.6 + 4.5 * len(names), 3.6, sharey=True)
    for ax, name in zip(axes, names):
        curve = scored[scored["dataset"] == name].groupby(["shots", "model"])["score"].mean().unstack()
        curve.plot(ax=ax, marker="o", logx=bool(curve.index.max() > 10 * max(curve.index.min(), 1)))
        ax.set(title=f"{name}: accuracy vs shots", xlabel="shots")
    axes[0].set_ylabel("accuracy")
    legend(fig, axes, title="model")
    shots_png = save(fig, folder / "icl_accuracy_vs_shots.png")

    # one group of boxes per setting, a box per model side by side in the model's colour
    per_run = scored.groupby(SUMMARY_KEYS, sort=False)["score"].mean().reset_index()
    per_run["setting"] = per_run["dataset"] + "\n" + per_run["shots"].astype(str) + "-shot " + per_run["order"]
    settings, models = list(per_run["setting"].unique()), list(per_run["model"].unique())
    group = max(max(text_width(setting, "small") for setting in settings) + 0.2, 0.35 * len(models) + 0.2)
    fig, (ax,) = panels(1, max(6.0, 1.0 + group * len(settings)), 4)
    width = 0.8 / len(models)
    for m, model in enumerate(models):
        runs = per_run[per_run["model"] == model]
        present = [s for s in settings if (runs["setting"] == s).any()]
        colour = plt.get_cmap("tab10")(m % 10)
        boxes = ax.boxplot(
            [runs.loc[runs["setting"] == s, "score"].to_numpy() for s in present],
            positions=[settings.index(s) - 0.4 + width * (m + 0.5) for s in present],
            widths=width * 0.8, patch_artist=True, boxprops={"facecolor": colour}, medianprops={"color": "black"},
        )["boxes"]  # fmt: skip
        boxes[0].set_label(model)  # the legend's entry (boxplot's own `label` needs matplotlib 3.9)
    ax.set_xticks(range(len(settings)), settings, fontsize="small")
    ax.set(title="accuracy across orders of the same demonstrations", ylabel="accuracy")
    legend(fig, [ax], title="model")
    return [shots_png, save(fig, folder / "icl_order_robustness.png")]


def sample_view(context: RunContext[IclOptions], records: dict[str, dict], tokenizer_for, full_text: bool | None):
    """For `diffeval view`: the demonstrations' labels in their order, rebuilt from the run's context, the test query,
    and per model its gold and predicted label with every label's score (the prediction emphasised)."""
    from diffeval.tasks.blocks import Bar, Bars, Block, Document, Labels, Notice, Section, Text

    first = next(iter(records.values()))
    run = Run(first["dataset"], int(first["shots"]), first["order"], first["order_seed"], first["draw"])
    data = dataset(run.dataset, context.options.data_dir)
    sequence = [data.train[i].label for i in ordered(run, context.options.data_dir, context.seed)]
    blocks = [
        Labels(sequence, data.labels, title=f"Demonstration order: {len(sequence)} shots ({run.order})"),
        Text([data.test[first["test_id"]].text], style="mono", title="Test query"),
    ]
    for model, record in records.items():
        scores = record.get("label_scores") or []
        shown: Block
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


def paper_coverage(records: pd.DataFrame, options: IclOptions) -> str:
    """Figure 7 gives TREC's best − worst accuracy margin over orders of the same demonstrations, random and
    alternating (the paper's other ICL figures are plots without numbers)."""
    run = set(records.loc[records["dataset"] == "trec", "order"])
    has = [f"TREC {order} orders" for order in FIGURE7_TREC if order in run]
    lacks = [f"TREC {order} orders" for order in FIGURE7_TREC if order not in run]
    return coverage("Figure 7 margins", has, lacks)
