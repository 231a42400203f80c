"""The built-in reference pair: default models, names, the shipped weights, and deterministic resumable training."""

import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerFast

from conftest import run_cli, run_cli_in_process
from diffeval.data.cities import CITIES
from diffeval.errors import InputError
from diffeval.models.spec import BUILTIN_MODELS, builtin_models
from diffeval.tasks import build_config
from diffeval.toy.corpus import TRAIN_PLACES, DocumentMaker
from diffeval.toy.train import RUN_MARKER, TrainConfig, build_model, parameter_matched_ffn, train

REFERENCE_RUN = Path(__file__).resolve().parents[1] / "results" / "toy-pair"
THREE_WAY_RUN = Path(__file__).resolve().parents[1] / "results" / "toy-three-way"


def test_pair_ships_as_package_data_and_is_the_default():
    assert builtin_models() == ["toy-base", "toy-diff", "toy-diff2"]
    config = build_config("needle", {}, {"ctx": "1k"})
    assert [(m.name, m.spec) for m in config.models] == [("diff", "toy-diff"), ("base", "toy-base")]
    sizes = [(BUILTIN_MODELS / m / "model.safetensors").stat().st_size for m in builtin_models()]
    assert sum(sizes) < 50 * 2**20
    diff, diff2, base = (
        sum(t.numel() for t in load_file(BUILTIN_MODELS / m / "model.safetensors").values())
        for m in ("toy-diff", "toy-diff2", "toy-base")
    )
    assert abs(diff - base) / base < 0.02
    assert diff2 == base  # V2's extra query heads and λ projection are paid for by a narrower FFN
    tokenizers = {(BUILTIN_MODELS / m / "tokenizer.json").read_bytes() for m in builtin_models()}
    assert len(tokenizers) == 1
    assert not set(TRAIN_PLACES) & set(CITIES)  # training keys are disjoint from the evaluation's


@pytest.mark.parametrize("kind", ["diff", "diff2", "base"])
def test_toy_recipe_matches_parameters_across_kinds(kind):
    sizes = TrainConfig(kind=kind, out="unused", work="unused")
    ffn = parameter_matched_ffn(kind, sizes.hidden, sizes.heads, sizes.head_dim, sizes.ffn)
    model = build_model(replace(sizes, ffn=ffn), vocab_size=2048)
    baseline = build_model(replace(sizes, kind="base"), vocab_size=2048)
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in baseline.parameters())
    # V1 keeps the FFN and adds its λ vectors (λq1, λk1, λq2, λk2 per layer); V2's FFN pays for its extra weights
    assert extra == {"diff": 4 * sizes.head_dim * sizes.layers}.get(kind, 0)
    assert type(model).__name__ == {"diff": "DiffLlamaForCausalLM", "diff2": "DiffLlama2ForCausalLM"}.get(
        kind, "LlamaForCausalLM"
    )


@pytest.mark.slow
def test_toy_diff2_reproduces_the_three_way_run(tmp_path):
    """The real CLI on the shipped V2 weights: the committed three-way run's 1K single-needle cell, exactly."""
    out = tmp_path / "v2"
    cell = ["--ctx", "1k", "--needles", "1", "--queries", "1", "--depths", "0,25,50,75,100", "--samples", "20"]
    result = run_cli("run", "needle", "-m", "v2=toy-diff2", *cell, "--out", str(out))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    reference = {
        r["sample_id"]: r["output"]
        for r in map(json.loads, (THREE_WAY_RUN / "samples.jsonl").read_text().splitlines())
        if r["model"] == "v2"
    }
    assert len(records) == 100 and all(reference[r["sample_id"]] == r["output"] for r in records)
    accuracy = sum(r["score"] for r in records) / 100
    assert f"toy-diff2 | {accuracy:.2f}" in (BUILTIN_MODELS / "MODEL_CARD.md").read_text()


@pytest.mark.slow
def test_default_run_reproduces_the_reference_run(tmp_path):
    """The real CLI on the shipped weights, without --model: the committed reference run's 1K cells, exactly."""
    out = tmp_path / "default"
    result = run_cli(
        "run",
        "needle",
        "--ctx",
        "1k",
        "--needles",
        "1",
        "--queries",
        "1",
        "--depths",
        "0,25,50,75,100",
        "--samples",
        "20",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {r["model"] for r in records} == {"diff", "base"} and len(records) == 200
    reference = {
        (r["model"], r["sample_id"]): r["output"]
        for r in map(json.loads, (REFERENCE_RUN / "samples.jsonl").read_text().splitlines())
    }
    for record in records:
        assert reference[(record["model"], record["sample_id"])] == record["output"]
    accuracy = {m: sum(r["score"] for r in records if r["model"] == m) / 100 for m in ("diff", "base")}
    assert min(accuracy.values()) >= 0.9  # the pair's target: both models retrieve a single needle at 1K
    card = (BUILTIN_MODELS / "MODEL_CARD.md").read_text()
    for model, value in accuracy.items():
        assert f"toy-{model} | {value:.2f}" in card  # the model card reports what the weights do


def test_corpus_documents_are_exact_length_and_weight_only_predictable_tokens():
    tokenizer = PreTrainedTokenizerFast.from_pretrained(BUILTIN_MODELS / "toy-base")
    needles = DocumentMaker(tokenizer, answer_weight=3.0, copy_share=0.0)
    for index in range(20):
        doc = needles.make(0, index, 256)
        assert len(doc.ids) == len(doc.weights) == 256
        text = tokenizer.decode(doc.ids)
        haystack = text.split("\n\n")[1]
        assert "The special magic number for" in haystack and "mentioned in the provided text" in text
        # answer digits (weight 3) repeat a fact's digits, which are random and carry no loss
        first_answer = tokenizer.decode([t for t, w in zip(doc.ids, doc.weights, strict=True) if w == 3.0][:7])
        assert first_answer.isdigit() and f"is: {first_answer}." in haystack

    copies = DocumentMaker(tokenizer, copy_share=1.0)
    for index in range(20):
        doc = copies.make(0, index, 128)
        assert len(doc.ids) == len(doc.weights) == 128
        span = doc.weights.index(1.0) - 1  # BOS and the first span carry no loss: they are random
        assert span >= 8 and all(doc.ids[i] == doc.ids[i - span] for i in range(span + 1, 128))
        assert set(doc.weights[span + 1 :]) == {1.0}


@pytest.mark.slow
def test_builtin_names_work_anywhere(tmp_path):
    inspect = run_cli("models", "inspect", "toy-diff")
    assert inspect.returncode == 0 and "DiffLlamaForCausalLM" in inspect.stdout and "λ_init" in inspect.stdout
    result = run_cli(
        "run",
        "needle",
        "-m",
        "toy-base",
        "--ctx",
        "1k",
        "--depths",
        "50",
        "--samples",
        "1",
        "--out",
        str(tmp_path / "named"),
    )
    assert result.returncode == 0, result.stderr


def _tiny(tmp_path: Path, name: str, **overrides) -> TrainConfig:
    config = TrainConfig(
        kind="diff",
        out=str(tmp_path / name),
        work=str(tmp_path / f"{name}.work"),
        steps=4,
        hidden=32,
        layers=2,
        heads=2,
        head_dim=16,
        ffn=64,
        vocab_size=600,
        lengths=[160],
        stage_max_fraction=[1.0],
        eval_every=1,
        eval_samples=1,
        checkpoint_minutes=0.0,
        warmup=1,
    )
    return replace(config, **overrides)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["diff", "diff2"])
def test_training_is_deterministic_and_resumes(tmp_path, kind):
    straight = _tiny(tmp_path, "straight", kind=kind)
    train(straight, log=lambda line: None)

    interrupted = _tiny(tmp_path, "interrupted", kind=kind)

    def stop_at_step_3(line: str) -> None:
        if line.startswith("step 3 "):
            raise KeyboardInterrupt  # a kill after step 3's update, before its checkpoint

    with pytest.raises(KeyboardInterrupt):
        train(interrupted, log=stop_at_step_3)
    messages = []
    train(interrupted, log=messages.append)
    assert any(m.startswith("resumed at step 2") for m in messages)
    first = load_file(Path(straight.out) / "model.safetensors")
    second = load_file(Path(interrupted.out) / "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.slow
def test_ci_smoke_runs_on_the_default_pair(tmp_path):
    out = tmp_path / "smoke"
    result = run_cli("run", "suite", "ci-smoke", "--out", str(out))
    assert result.returncode == 0, result.stderr
    runs = {
        json.loads((out / t / "run.json").read_text())["config"]["task"]
        for t in ("needle", "attention", "icl", "hallucination")
    }
    assert runs == {"needle", "attention", "icl", "hallucination"}
    models = {json.loads(line)["model"] for line in (out / "needle" / "samples.jsonl").read_text().splitlines()}
    assert models == {"diff", "base"}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "options",
    [["--steps", "0"], ["--steps", "-3"], ["--tokens-per-step", "0"], ["--lr", "0"], ["--lr", "nan"]],
)
def test_toy_train_refuses_counts_that_are_not_positive(tmp_path, options):
    out = tmp_path / "model"
    result = run_cli_in_process("toy", "train", "--kind", "diff", "--out", str(out), *options)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert options[0] in result.stderr and not out.exists() and not (tmp_path / "model.work").exists()


def test_toy_train_refuses_a_non_empty_out_without_overwrite(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = run_cli_in_process("toy", "train", "--kind", "base", "--out", str(out))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "is not empty" in result.stderr and "--overwrite" in result.stderr
    assert _snapshot(out) == {"notes.txt": b"mine"} and not (tmp_path / "model.work").exists()


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_toy_train_never_replaces_a_model_it_did_not_start(tmp_path, overwrite):
    """The shipped toy-base has no run marker: `toy train --out` over a copy of it leaves every byte as it was."""
    out = tmp_path / "toy-base"
    shutil.copytree(BUILTIN_MODELS / "toy-base", out)
    before = _snapshot(out)
    result = run_cli_in_process("toy", "train", "--kind", "base", "--out", str(out), *overwrite)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "did not start" in result.stderr and "even with --overwrite" in result.stderr
    assert _snapshot(out) == before and not (tmp_path / "toy-base.work").exists()


@pytest.mark.slow
def test_toy_train_resumes_its_own_folder_and_refuses_another_runs(tmp_path):
    config = _tiny(tmp_path, "model", steps=2)
    train(config, log=lambda line: None)
    out, work = Path(config.out), Path(config.work)
    assert json.loads((out / RUN_MARKER).read_text()) == asdict(config)
    trained = _snapshot(out), _snapshot(work)
    messages = []
    train(config, log=messages.append)  # the same run again: resumes its finished checkpoint, the same model
    assert any(m.startswith("resumed at step 2") for m in messages)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "training_log.csv"):
        assert (out / name).read_bytes() == trained[0][name]
    assert _snapshot(work) == trained[1]
    trained = _snapshot(out), _snapshot(work)
    longer = replace(config, steps=3)
    with pytest.raises(InputError, match=r"other settings \(steps 2 → 3\).*even with --overwrite"):
        train(longer, log=lambda line: None, overwrite=True)
    with pytest.raises(InputError, match=r"--work .* holds a checkpoint of other settings \(.*steps 2 → 3\)"):
        train(replace(longer, out=str(tmp_path / "fresh")), log=lambda line: None, overwrite=True)
    assert (_snapshot(out), _snapshot(work)) == trained and not (tmp_path / "fresh").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    exported = run_cli_in_process("toy", "export", "--work", str(work), "--out", str(other))
    assert exported.returncode == 2 and "is not empty" in exported.stderr and _snapshot(other) == {"config.json": b"{}"}


@pytest.mark.slow
def test_toy_train_overwrite_writes_into_a_folder_without_a_model(tmp_path):
    """--overwrite lets a run start in a non-empty folder; a tokenizer file left there is not taken as this run's."""
    config = _tiny(tmp_path, "model", steps=1)
    out = Path(config.out)
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(InputError, match="is not empty"):
        train(config, log=lambda line: None)
    train(config, log=lambda line: None, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()
    assert len(PreTrainedTokenizerFast.from_pretrained(out)) == config.vocab_size
