"""Many-shot ICL: loaders on fixtures in the real schemas, seeded draws and orders, KV reuse, CLI end to end."""

import csv
import json
from collections import Counter
from dataclasses import replace
from itertools import groupby
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import SHARED_DATASETS, pair_options, run_cli
from diffeval.data import icl as icl_data
from diffeval.errors import InputError
from diffeval.models.backend import EngineSettings, open_tokenizer
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.models.tokenizer import encode_choices_in_context
from diffeval.tasks import build_config
from diffeval.tasks.choices import icl
from diffeval.tasks.choices import icl_demonstrations as demos

QUESTIONS = [
    "How far is it from Denver to Aspen ?",
    "What is a caldera ?",
    "Who killed Gandhi ?",
    "Where is Belize located ?",
    "What does CPR stand for ?",
    "What fowl grabs the spotlight ?",
]
COARSE = [
    ("NUM", "NUM:dist", 5, 40),
    ("DESC", "DESC:def", 2, 24),
    ("HUM", "HUM:ind", 3, 29),
    ("LOC", "LOC:country", 4, 33),
    ("ABBR", "ABBR:exp", 0, 1),
    ("ENTY", "ENTY:animal", 1, 2),
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Small datasets written in the schemas of ../shared/datasets (trec jsonl, banking77 csv, clinc150 json)."""
    root = tmp_path_factory.mktemp("icl-data")
    (root / "trec").mkdir()
    for split, count in (("train", 60), ("test", 12)):
        with (root / "trec" / f"{split}.jsonl").open("w") as handle:
            for i in range(count):
                coarse, fine, coarse_id, fine_id = COARSE[i % 6]
                row = {
                    "text": f"{QUESTIONS[i % 6]} ({split} {i})",
                    "coarse_label": coarse,
                    "fine_label": fine,
                    "coarse_label_id": coarse_id,
                    "fine_label_id": fine_id,
                }
                handle.write(json.dumps(row) + "\n")
    (root / "banking77").mkdir()
    for split, count in (("train", 40), ("test", 8)):
        with (root / "banking77" / f"{split}.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "category"])
            for i in range(count):
                writer.writerow([f"my card {i} is {split}", ["card_arrival", "lost_or_stolen_card"][i % 2]])
    (root / "clinc150").mkdir()
    clinc = {
        "train": [[f"translate {i}", "translate"] if i % 2 else [f"weather {i}", "weather"] for i in range(30)],
        "oos_train": [["how much has the dow changed", "oos"]] * 3,
        "test": [["say hi in italian", "translate"], ["is it raining", "weather"]],
        "oos_test": [["dow?", "oos"]],
    }
    (root / "clinc150" / "data_oos_plus.json").write_text(json.dumps(clinc))
    return root


def _options(data_dir, **overrides):
    values = {"models": ["a/b"], "data_dir": str(data_dir), "ctx": "2k", "test_size": 6, **overrides}
    return build_config("icl", {}, values).options


@pytest.mark.transformers_floor
def test_loaders_and_verbalizers(data_dir):
    trec = icl_data.load("trec", str(data_dir))
    assert trec.labels == ["abbreviation", "entity", "description", "human", "location", "numeric"]
    assert len(trec.train) == 60 and trec.test[0].label == 5
    fine = icl_data.load("trec-fine", str(data_dir))
    assert len(fine.labels) == 50 and fine.labels[40] == "numeric distance" and fine.labels[5] == "entity creation"
    banking = icl_data.load("banking77", str(data_dir))
    assert banking.labels == ["card arrival", "lost or stolen card"]
    clinc = icl_data.load("clinic150", str(data_dir))
    assert clinc.labels == ["oos", "translate", "weather"] and len(clinc.train) == 33 and len(clinc.test) == 3
    with pytest.raises(InputError, match="missing"):
        icl_data.load("trec", str(data_dir / "nowhere"))


@pytest.mark.transformers_floor
def test_orders_permute_one_draw(data_dir):
    options = _options(data_dir)
    draw = demos.demonstrations("trec", options.data_dir, 0, 0, 24)
    assert demos.demonstrations("trec", options.data_dir, 0, 0, 12) == draw[:12]  # nested across k
    assert demos.demonstrations("trec", options.data_dir, 0, 1, 24) != draw
    train = demos.dataset("trec", options.data_dir).train
    orders = {}
    for kind in ("random", "alternating", "grouped"):
        for variant in range(3):
            order = demos.ordered(demos.Run("trec", 24, kind, variant, 0), options.data_dir, 0)
            assert sorted(order) == sorted(draw)
            orders[(kind, variant)] = order
    assert len({tuple(o) for o in orders.values()}) == 9
    labels = [train[i].label for i in orders[("alternating", 0)]]
    classes = len(set(labels))
    assert len(set(labels[:classes])) == classes  # round robin: one of each class first
    assert len(set(labels[classes : 2 * classes])) > 1
    grouped = [train[i].label for i in orders[("grouped", 0)]]
    assert grouped == sorted(grouped)


@pytest.mark.transformers_floor
def test_samples_are_the_same_for_every_model_and_resolve_max(data_dir, tiny_models):
    config = build_config(
        "icl",
        {},
        {
            "models": [f"d={tiny_models['diff']}", f"b={tiny_models['base']}"],
            "data_dir": str(data_dir),
            "ctx": "1k",
            "shots": "2,max",
            "test_size": 4,
            "orders": "random:2,grouped",
        },
    )
    tokenizers = {m.name: open_tokenizer(m, EngineSettings()) for m in config.models}
    max_shots = icl.prepare(config, tokenizers)
    samples = icl.make_samples(config.options, config.seed, prepared=max_shots)
    assert len(samples) == 2 * 3 * 4 and len({s.sample_id for s in samples}) == len(samples)
    k = max_shots[("trec", 0)]
    assert 2 < k < 60
    # the prompts `evaluate` builds, in context: every order fits at k, and some model's does not at k + 1
    backends = [HFBackend(load_model(ModelSpec(n, str(tiny_models[n])), "cpu")) for n in ("diff", "base")]
    kept = [s for s in samples if s.shots_requested == "max"]

    def over_budget(shots: int) -> list[bool]:
        flags = []
        for backend in backends:
            for run, batch in groupby(kept, key=lambda s: s.run):
                batch = [icl.ICLSample(s.sample_id, replace(run, shots=shots), "max", s.test_id, 0) for s in batch]
                flags += [r.fields.get("status") == "over_budget" for r in icl.evaluate(batch, backend, config)]
        return flags

    assert not any(over_budget(k)) and any(over_budget(k + 1))


@pytest.mark.transformers_floor
def test_kv_reuse_gives_the_naive_scores(data_dir, tiny_models):
    backend = HFBackend(load_model(ModelSpec("diff", str(tiny_models["diff"])), "cpu"))
    run = demos.Run("trec", 10, "random", 0, 0)
    data = demos.dataset("trec", str(data_dir))
    prefix, queries, choices = encode_choices_in_context(
        backend,
        demos.demonstration_block(run, str(data_dir), 0),
        [demos.format_example("trec", e.text, None) for e in data.test[:4]],
        [" " + label for label in data.labels],
    )
    reused = list(backend.score_choices(prefix, queries, choices))
    naive = list(backend.score_choices(prefix, queries, choices, reuse=False))
    for fast, slow in zip(reused, naive):
        assert [c for _, c in fast] == [c for _, c in slow]
        assert [v for v, _ in fast] == pytest.approx([v for v, _ in slow], abs=1e-3)


@pytest.mark.transformers_floor
def test_over_budget_runs_are_reported_not_truncated(data_dir, tiny_models):
    backend = HFBackend(load_model(ModelSpec("base", str(tiny_models["base"])), "cpu"))
    config = SimpleNamespace(options=_options(data_dir, ctx="256"), seed=0, chat_template=False)
    batch = icl.make_samples(config.options, 0, limit=2)[:2]
    batch = [icl.ICLSample(s.sample_id, demos.Run("trec", 50, "random", 0, 0), "50", s.test_id, 0) for s in batch]
    records = [r.to_dict() for r in icl.evaluate(batch, backend, config)]
    assert [r["status"] for r in records] == ["over_budget", "over_budget"]
    assert all(r["prediction"] is None and r["prompt_tokens"] > 256 for r in records)


@pytest.mark.transformers_floor
def test_bad_icl_input(data_dir):
    with pytest.raises(InputError, match="one context length"):
        _options(data_dir, ctx="1k,2k")
    with pytest.raises(InputError, match="bad order"):
        _options(data_dir, orders="sorted:2")
    with pytest.raises(InputError, match="bad --shots"):
        _options(data_dir, shots="1,lots")
    with pytest.raises(InputError, match="unknown dataset"):
        _options(data_dir, datasets="imdb")


@pytest.mark.slow
def test_icl_cli_end_to_end(data_dir, tiny_models, tmp_path):
    out = tmp_path / "icl"
    indices = tmp_path / "trec-indices.json"
    indices.write_text("[3, 0, 7, 11]")
    result = run_cli(
        "run",
        "icl",
        *pair_options(tiny_models),
        "--dataset",
        "trec",
        "--shots",
        "3,12",
        "--ctx",
        "1k",
        "--orders",
        "random:3,alternating:2",
        "--data-dir",
        str(data_dir),
        "--test-indices",
        str(indices),
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 2 * 5 * 4
    assert {r["test_id"] for r in records} == {3, 0, 7, 11}
    assert all(len(r["label_scores"]) == 6 and r["status"] == "ok" for r in records)
    per_run = Counter((r["model"], r["shots"], r["order"], r["order_seed"]) for r in records)
    assert set(per_run.values()) == {4}
    table = (out / "table.md").read_text()
    assert "Figure 7 layout" in table and "trec 12-shot alternating" in table
    assert (out / "icl_accuracy_vs_shots.png").is_file() and (out / "icl_order_robustness.png").is_file()
    summary = (out / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("model,dataset,shots,order,order_seed,draw,n,accuracy")


@pytest.mark.slow
@pytest.mark.integration
def test_real_trec_with_protocol_indices(tiny_models, tmp_path):
    if not (SHARED_DATASETS / "trec" / "train.jsonl").is_file():
        pytest.skip(f"{SHARED_DATASETS} absent: the shared datasets are only on CI and dev machines")
    out = tmp_path / "trec"
    result = run_cli(
        "run",
        "icl",
        "-m",
        f"diff={tiny_models['diff']}",
        "--dataset",
        "trec,trec-fine",
        "--shots",
        "8",
        "--ctx",
        "2k",
        "--orders",
        "random:2",
        "--test-size",
        "5",
        "--data-dir",
        str(SHARED_DATASETS),
        "--test-indices",
        str(SHARED_DATASETS / "long-context-icl-splits"),
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["test_id"] for r in records[:5]] == [360, 17, 361, 411, 67]  # the protocol's fixed test rows
    assert {len(r["label_scores"]) for r in records} == {6, 50}


@pytest.mark.slow
def test_a_run_with_every_prompt_over_budget_writes_counts_and_tables(data_dir, tiny_models, tmp_path):
    out = tmp_path / "over"
    args = ["run", "icl", "-m", f"base={tiny_models['base']}", "--shots", "50", "--ctx", "256", "--test-size", "3"]
    result = run_cli(*args, "--orders", "random:1", "--data-dir", str(data_dir), "--out", str(out))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "Runs over the context budget" in (out / "table.md").read_text()
    assert not list(out.glob("*.png"))  # nothing was scored, so nothing is drawn
    assert (out / "summary.csv").read_text().splitlines()[1] == "base,trec,50,random,0,0,0,,,"  # n = 0 scored
