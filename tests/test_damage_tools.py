"""The commands beside `run` fed damage, one table per command: `models convert` (a source that is missing, a file, of
another layout, with damaged weights or a config that is not UTF-8 JSON; a destination that exists, is the source or
inside it, or lies under a file), `toy train`, `toy export` and `toy plot` (counts, folders that are files or one
another, damaged checkpoints and loss logs), and the lm-eval tasks' own options (`run quantize`, `run zeroshot`).
Each row is refused in one line before anything is written: the folder the command runs in is byte-identical after
it, with no file or folder added (`assert_refused_in_place` with the whole folder kept).

A row is (arguments, setup, message): `setup(tmp_path)` writes the damaged input in the real format; the arguments
name paths under tmp_path as `{placeholders}` (`{tmp}` is tmp_path itself)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_bad_input import assert_refused_in_place

Setup = Callable[[Path], None] | None


def assert_refused_creating_nothing(tmp: Path, args: list[str], message: str) -> None:
    """One line, and `tmp` holds exactly the files and folders it held, byte for byte."""
    entries = set(tmp.rglob("*"))
    assert_refused_in_place(tmp, [a.format(tmp=tmp) for a in args], message, kept=(tmp,))
    assert set(tmp.rglob("*")) == entries, "a refused command created a file or folder"


def _write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))


def _files(files: dict[str, str | bytes]) -> Setup:
    def setup(tmp: Path) -> None:
        for name, content in files.items():
            _write(tmp / name, content)

    return setup


def _both(*setups: Setup) -> Setup:
    def setup(tmp: Path) -> None:
        for each in setups:
            each(tmp)

    return setup


# ---- models convert: {tmp}/src is a copy of a real paper-layout checkpoint (unilm-v1, diffattn) before setup runs


@pytest.fixture(scope="module")
def paper_source(tiny_models, tmp_path_factory) -> Path:
    from test_convert import paper_checkpoint

    root = tmp_path_factory.mktemp("paper")
    return paper_checkpoint(root / "src", tiny_models["tok_a"], "diffattn", heads=4, kv_heads=2, head_dim=8,
                            hidden=32, seed=5)  # fmt: skip


def _config(change: Callable[[dict], object]) -> Setup:
    def setup(tmp: Path) -> None:
        config = json.loads((tmp / "src" / "config.json").read_text())
        change(config)
        (tmp / "src" / "config.json").write_text(json.dumps(config))

    return setup


def _tensors(change: Callable[[dict], None]) -> Setup:
    def setup(tmp: Path) -> None:
        weights = tmp / "src" / "model.safetensors"
        tensors = load_file(weights)
        change(tensors)
        save_file(tensors, weights, metadata={"format": "pt"})

    return setup


def _truncated(tmp: Path) -> None:
    weights = tmp / "src" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


CONVERT = ["models", "convert", "--from", "unilm-v1:diffattn"]
MODELS_CONVERT = {
    "src_missing": ([*CONVERT, "{tmp}/nothing", "{tmp}/dst"], None, "does not exist"),
    "src_a_file": ([*CONVERT, "{tmp}/src/config.json", "{tmp}/dst"], None, "is a file: give the checkpoint folder"),
    "src_without_config": ([*CONVERT, "{tmp}/empty", "{tmp}/dst"], _files({"empty/notes.txt": "x"}),
                           "has no config.json"),
    "src_of_another_layout": (["models", "convert", "--from", "unilm-v2", "{tmp}/src", "{tmp}/dst"], None,
                              "are not in the unilm-v2 layout (missing model.layers.0.self_attn.lambda_proj.weight"),
    "from_unknown": (["models", "convert", "--from", "unilm-v3", "{tmp}/src", "{tmp}/dst"], None,
                     "--from 'unilm-v3' is not a layout diffeval converts"),
    "config_not_utf8": ([*CONVERT, "{tmp}/src", "{tmp}/dst"], _files({"src/config.json": b'{"a": "\xff"}'}),
                        "config.json is not UTF-8 text (byte 7)"),
    "config_not_json": ([*CONVERT, "{tmp}/src", "{tmp}/dst"], _files({"src/config.json": '{"hidden_size": '}),
                        "config.json is not valid JSON"),
    "config_a_list": ([*CONVERT, "{tmp}/src", "{tmp}/dst"], _files({"src/config.json": "[1, 2]"}),
                      "holds a JSON list, not a config"),
    "layers_true": ([*CONVERT, "{tmp}/src", "{tmp}/dst"], _config(lambda c: c.update(num_hidden_layers=True)),
                    "has no num_hidden_layers and hidden_size"),
    "layers_beyond_the_weights": ([*CONVERT, "{tmp}/src", "{tmp}/dst"],
                                  _config(lambda c: c.update(num_hidden_layers=3)),
                                  "missing model.layers.2.input_layernorm.weight"),
    "weights_truncated": ([*CONVERT, "{tmp}/src", "{tmp}/dst"], _truncated, "cannot read"),
    "weights_missing": ([*CONVERT, "{tmp}/src", "{tmp}/dst"], lambda tmp: (tmp / "src/model.safetensors").unlink(),
                        "has no model.safetensors"),
    "index_not_a_map": ([*CONVERT, "{tmp}/src", "{tmp}/dst"],
                        _files({"src/model.safetensors.index.json": '{"weight_map": ["model.safetensors"]}'}),
                        "is not a safetensors index"),
    "index_names_a_missing_shard": ([*CONVERT, "{tmp}/src", "{tmp}/dst"],
                                    _files({"src/model.safetensors.index.json":
                                            '{"weight_map": {"a": "b.safetensors"}}'}),
                                    "b.safetensors (No such file"),
    "lambda_a_scalar": ([*CONVERT, "{tmp}/src", "{tmp}/dst"],
                        _tensors(lambda t: t.update({"model.layers.0.self_attn.lambda_q1": torch.tensor(0.5)})),
                        "lambda_q1 has 0 dimensions, not 1"),
    "subln_misshapen": ([*CONVERT, "{tmp}/src", "{tmp}/dst"],
                        _tensors(lambda t: t.update({"model.layers.1.self_attn.subln.weight": torch.ones(8)})),
                        "subln.weight has shape [8], not [16]"),
    "dst_not_empty": ([*CONVERT, "{tmp}/src", "{tmp}/full"], _files({"full/keep.txt": "mine"}),
                      "exists and is not an empty folder"),
    "dst_a_file": ([*CONVERT, "{tmp}/src", "{tmp}/file"], _files({"file": "x"}), "exists and is not an empty folder"),
    "dst_is_src": ([*CONVERT, "{tmp}/src", "{tmp}/src"], None, "exists and is not an empty folder"),
    "dst_inside_src": ([*CONVERT, "{tmp}/src", "{tmp}/src/converted"], None, "is inside SRC"),
    "dst_under_a_file": ([*CONVERT, "{tmp}/src", "{tmp}/file/dst"], _files({"file": "x"}),
                         "cannot be made: {tmp}/file is a file"),
}  # fmt: skip


@pytest.mark.parametrize(("args", "setup", "message"), MODELS_CONVERT.values(), ids=list(MODELS_CONVERT))
def test_models_convert(paper_source, tmp_path, args, setup, message):
    shutil.copytree(paper_source, tmp_path / "src")
    if setup:
        setup(tmp_path)
    assert_refused_creating_nothing(tmp_path, args, message.format(tmp=tmp_path))


# ---- toy train, toy export, toy plot


def _checkpoint(state) -> Setup:
    """A work folder whose checkpoint.pt holds `state` (a real torch.save file)."""

    def setup(tmp: Path) -> None:
        (tmp / "work").mkdir()
        torch.save(state(tmp) if callable(state) else state, tmp / "work" / "checkpoint.pt")

    return setup


def _whole_checkpoint(tmp: Path, **config) -> dict:
    return {"config": {"kind": "diff", "out": str(tmp / "model"), "work": str(tmp / "work"), **config}, "model": {},
            "optimizer": {}, "step": 1, "stage": 0, "seconds": 0.0}  # fmt: skip


TRAIN = ["toy", "train", "--kind", "diff", "--out", "{tmp}/model"]
TOY_TRAIN = {
    "kind_unknown": (["toy", "train", "--kind", "cnn", "--out", "{tmp}/model"], None, "use diff, diff2 or base"),
    "steps_zero": ([*TRAIN, "--steps", "0"], None, "--steps 0: give a positive whole number"),
    "steps_negative": ([*TRAIN, "--steps", "-3"], None, "--steps -3: give a positive whole number"),
    "steps_arabic_digits": ([*TRAIN, "--steps", "٣"], None, "Invalid value for '--steps'"),
    "seed_superscript": ([*TRAIN, "--seed", "²"], None, "Invalid value for '--seed'"),
    "tokens_per_step_zero": ([*TRAIN, "--tokens-per-step", "0"], None, "--tokens-per-step 0: give a positive"),
    "tokens_per_step_below_a_document": ([*TRAIN, "--tokens-per-step", "100"], None,
                                         "--tokens-per-step 100: give a multiple of 1024"),
    "tokens_per_step_not_whole_documents": ([*TRAIN, "--tokens-per-step", "3000"], None,
                                            "--tokens-per-step 3000: give a multiple of 1024"),
    "lr_not_a_number": ([*TRAIN, "--lr", "nan"], None, "--lr nan: give a positive learning rate"),
    "out_a_file": ([*TRAIN[:-1], "{tmp}/file"], _files({"file": "x"}), "is a file: give a folder"),
    "out_under_a_file": ([*TRAIN[:-1], "{tmp}/file/model"], _files({"file": "x"}), "cannot be made"),
    "out_not_empty": (TRAIN, _files({"model/notes.txt": "mine"}), "is not empty"),
    "work_a_file": ([*TRAIN, "--work", "{tmp}/file"], _files({"file": "x"}), "--work {tmp}/file is a file"),
    "work_under_a_file": ([*TRAIN, "--work", "{tmp}/file/work"], _files({"file": "x"}),
                          "--work {tmp}/file/work cannot be made"),
    "work_not_empty": ([*TRAIN, "--work", "{tmp}/work"], _files({"work/notes.txt": "mine"}),
                       "--work {tmp}/work is not empty"),
    "work_is_out": ([*TRAIN, "--work", "{tmp}/model"], None, "is --out {tmp}/model or inside it"),
    "work_inside_out": ([*TRAIN, "--work", "{tmp}/model/work"], None, "is --out {tmp}/model or inside it"),
    "out_inside_work": ([*TRAIN[:-1], "{tmp}/work/model", "--work", "{tmp}/work"], None, "is inside --work"),
    "work_checkpoint_garbled": ([*TRAIN, "--work", "{tmp}/work"], _files({"work/checkpoint.pt": b"\x80garbled"}),
                                "is not a checkpoint `diffeval toy train` wrote"),
    "work_checkpoint_of_other_settings": ([*TRAIN, "--work", "{tmp}/work", "--overwrite"],
                                          _checkpoint(lambda tmp: _whole_checkpoint(tmp, steps=3)),
                                          "holds a checkpoint of other settings"),
}  # fmt: skip


def _truncated_checkpoint(tmp: Path) -> None:
    path = tmp / "work" / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


EXPORT = ["toy", "export", "--work", "{tmp}/work", "--out", "{tmp}/exported"]
TOY_EXPORT = {
    "work_missing": (EXPORT, None, "holds no checkpoint.pt"),
    "work_a_file": (EXPORT, _files({"work": "x"}), "holds no checkpoint.pt"),
    "checkpoint_garbled": (EXPORT, _files({"work/checkpoint.pt": b"\x80garbled"}), "is not a checkpoint"),
    "checkpoint_truncated": (EXPORT, _both(_checkpoint(_whole_checkpoint), _truncated_checkpoint),
                             "is not a checkpoint"),
    "checkpoint_a_list": (EXPORT, _checkpoint([1, 2]), "it lacks config, model, optimizer"),
    "checkpoint_without_settings": (EXPORT, _checkpoint({"model": {}}), "it lacks config, model, optimizer"),
    "checkpoint_of_a_newer_version": (EXPORT, _checkpoint(lambda tmp: _whole_checkpoint(tmp, warp_drive=True)),
                                      "holds settings this diffeval does not know"),
    "run_out_without_tokenizer": (EXPORT, _checkpoint(_whole_checkpoint), "--out {tmp}/model holds no tokenizer.json"),
    "out_a_file": ([*EXPORT[:-1], "{tmp}/file"], _both(_checkpoint(_whole_checkpoint), _files({"file": "x"})),
                   "--out {tmp}/file is a file"),
    "out_not_this_runs": (EXPORT, _both(_checkpoint(_whole_checkpoint), _files({"exported/config.json": "{}"})),
                          "is not empty and not this run's"),
}  # fmt: skip


LOG_HEADER = "step,length,loss,answer_loss,lr,seconds,val_accuracy\n"
GOOD_LOG = LOG_HEADER + "1,128,7.8,nan,0.00001,0.1,\n2,128,7.1,6.5,0.00002,0.2,0.000\n"
PLOT = ["toy", "plot", "a={tmp}/log.csv", "--out", "{tmp}/loss.png"]
TOY_PLOT = {
    "no_name": (["toy", "plot", "{tmp}/log.csv", "--out", "{tmp}/loss.png"], _files({"log.csv": GOOD_LOG}),
                "give NAME=LOSS_CSV"),
    "log_missing": (PLOT, None, "log.csv does not exist"),
    "log_a_folder": (["toy", "plot", "a={tmp}/logs", "--out", "{tmp}/loss.png"], _files({"logs/x": "x"}),
                     "is a folder"),
    "log_not_utf8": (PLOT, _files({"log.csv": LOG_HEADER.encode() + b"1,128,7.\xff,6.5,0,0,\n"}),
                     "(UnicodeDecodeError)"),
    "log_empty": (PLOT, _files({"log.csv": ""}), "cannot read loss log"),
    "log_header_only": (PLOT, _files({"log.csv": LOG_HEADER}), "has no rows"),
    "log_without_columns": (PLOT, _files({"log.csv": "step,loss\n1,2.0\n"}), "has no column length, answer_loss"),
    "log_ragged_rows": (PLOT, _files({"log.csv": LOG_HEADER + "1,128\n2,128,7,6,0,0,0,9,9,9\n"}), "(ParserError)"),
    "log_text_in_a_loss": (PLOT, _files({"log.csv": GOOD_LOG + "3,128,high,6.0,0,0,\n"}),
                           "line 4: loss 'high' is not a number of 0 or more"),
    "log_negative_loss": (PLOT, _files({"log.csv": GOOD_LOG + "3,128,7.0,-1.5,0,0,\n"}),
                          "line 4: answer_loss '-1.5' is not a number"),
    "name_twice": (["toy", "plot", "a={tmp}/log.csv", "a={tmp}/log.csv", "--out", "{tmp}/loss.png"],
                   _files({"log.csv": GOOD_LOG}), "NAME a is given twice"),
    "out_not_png": ([*PLOT[:-1], "{tmp}/loss.txt"], _files({"log.csv": GOOD_LOG}), "is not a PNG file name"),
    "out_a_folder": ([*PLOT[:-1], "{tmp}"], _files({"log.csv": GOOD_LOG}), "is not a PNG file name"),
    "out_under_a_file": ([*PLOT[:-1], "{tmp}/log.csv/loss.png"], _files({"log.csv": GOOD_LOG}),
                         "cannot be written: {tmp}/log.csv is a file"),
}  # fmt: skip


@pytest.mark.parametrize(("args", "setup", "message"), TOY_TRAIN.values(), ids=list(TOY_TRAIN))
def test_toy_train(tmp_path, args, setup, message):
    if setup:
        setup(tmp_path)
    assert_refused_creating_nothing(tmp_path, args, message.format(tmp=tmp_path))


@pytest.mark.parametrize(("args", "setup", "message"), TOY_EXPORT.values(), ids=list(TOY_EXPORT))
def test_toy_export(tmp_path, args, setup, message):
    if setup:
        setup(tmp_path)
    assert_refused_creating_nothing(tmp_path, args, message.format(tmp=tmp_path))


@pytest.mark.parametrize(("args", "setup", "message"), TOY_PLOT.values(), ids=list(TOY_PLOT))
def test_toy_plot(tmp_path, args, setup, message):
    if setup:
        setup(tmp_path)
    assert_refused_creating_nothing(tmp_path, args, message.format(tmp=tmp_path))


def test_toy_plot_draws_a_good_log_into_a_new_folder(tmp_path):
    """The log the table's rows damage plots, NaN answer losses and all; --out's folder is made."""
    from conftest import run_cli_in_process as run_cli

    _write(tmp_path / "log.csv", GOOD_LOG)
    result = run_cli("toy", "plot", f"a={tmp_path}/log.csv", "--out", str(tmp_path / "plots" / "loss.png"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "plots" / "loss.png").stat().st_size > 0


# ---- quantize and zeroshot: their own options, refused before lm-eval builds its task index (fast) or, for data
# lm-eval cannot load, once the model is loaded (slow: the index and a model)

TASK_YAML = "task: mine\ndataset_path: json\noutput_type: multiple_choice\n"
QUANTIZE_RUN = ["run", "quantize", "-m", "m=toy-base"]
QUANTIZE = {
    "bits_out_of_range_in_a_list": ([*QUANTIZE_RUN, "--bits", "16,8,1"], None, "--bits 1: use widths from 2 to 16"),
    "bits_above_16": ([*QUANTIZE_RUN, "--bits", "17"], None, "--bits 17: use widths from 2 to 16"),
    "bits_zero": ([*QUANTIZE_RUN, "--bits", "0"], None, "--bits 0: use widths from 2 to 16"),
    "bits_negative": ([*QUANTIZE_RUN, "--bits", "-4"], None, "--bits -4: use widths from 2 to 16"),
    "bits_twice": ([*QUANTIZE_RUN, "--bits", "8,8"], None, "--bits names 8 twice"),
    "bits_arabic_digits": ([*QUANTIZE_RUN, "--bits", "٨"], None, "bad --bits"),
    "tasks_twice": ([*QUANTIZE_RUN, "--tasks", "hellaswag,hellaswag"], None, "--tasks names 'hellaswag' twice"),
    "tasks_empty": ([*QUANTIZE_RUN, "--tasks", ""], None, "--tasks is empty"),
    "granularity_unknown": ([*QUANTIZE_RUN, "--granularity", "column"], None, "bad --granularity 'column'"),
    "two_lengths": ([*QUANTIZE_RUN, "--ctx", "1k,2k"], None, "--ctx 1024,2048: give one length"),
    "batch_size_zero": ([*QUANTIZE_RUN, "--lm-batch-size", "0"], None, "--lm-batch-size 0: give at least 1"),
    "batch_size_arabic_digits": ([*QUANTIZE_RUN, "--lm-batch-size", "٣"], None, "Invalid value for '--lm-batch-size'"),
    "include_path_a_file": ([*QUANTIZE_RUN, "--include-path", "{tmp}/mine.yaml"], _files({"mine.yaml": TASK_YAML}),
                            "is not a folder of lm-eval task YAMLs"),
    "include_path_yaml_not_utf8": ([*QUANTIZE_RUN, "--include-path", "{tmp}/yamls"],
                                   _files({"yamls/mine.yaml": b"task: caf\xe9\n"}), "mine.yaml is not UTF-8 text"),
}  # fmt: skip
ZEROSHOT_RUN = ["run", "zeroshot", "-m", "m=toy-base"]
ZEROSHOT = {
    "tasks_twice": ([*ZEROSHOT_RUN, "--tasks", "piqa,piqa"], None, "--tasks names 'piqa' twice"),
    "two_lengths": ([*ZEROSHOT_RUN, "--ctx", "1k,2k"], None, "--ctx 1024,2048: give one length"),
    "ctx_zero": ([*ZEROSHOT_RUN, "--ctx", "0"], None, "bad context length '0'"),
    "batch_size_negative": ([*ZEROSHOT_RUN, "--lm-batch-size", "-1"], None, "--lm-batch-size -1: give at least 1"),
    "granularity_of_quantize": ([*ZEROSHOT_RUN, "--granularity", "row"], None, "No such option: --granularity"),
    "include_path_missing": ([*ZEROSHOT_RUN, "--include-path", "{tmp}/none"], None, "is not a folder of lm-eval"),
    "include_path_without_yaml": ([*ZEROSHOT_RUN, "--include-path", "{tmp}/yamls"], _files({"yamls/a.txt": "x"}),
                                  "holds no .yaml file"),
    "include_path_yaml_not_utf8": ([*ZEROSHOT_RUN, "--include-path", "{tmp}/yamls"],
                                   _files({"yamls/sub/mine.yaml": b"task: caf\xe9\n"}), "mine.yaml is not UTF-8 text"),
    "include_path_yaml_broken": ([*ZEROSHOT_RUN, "--include-path", "{tmp}/yamls"],
                                 _files({"yamls/mine.yaml": "task: [mine\n"}), "mine.yaml is not valid YAML (line 2)"),
    "include_path_data_missing": pytest.param(
        [*ZEROSHOT_RUN, "--tasks", "diffeval_no_data", "--include-path", "{tmp}/yamls", "--ctx", "256", "--limit", "1"],
        _files({"yamls/no_data.yaml": "task: diffeval_no_data\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                "    test: /no/such/data.jsonl\ntest_split: test\noutput_type: multiple_choice\n"
                "doc_to_text: '{{question}}'\ndoc_to_target: 0\ndoc_to_choice: '{{choices}}'\nmetric_list:\n"
                "  - metric: acc\n    higher_is_better: true\n"}),
        "lm-eval cannot load the data of --tasks diffeval_no_data (Unable to find '/no/such/data.jsonl')",
        marks=pytest.mark.slow,  # lm-eval's task index and a model load: about 25 s
    ),
}  # fmt: skip


@pytest.mark.parametrize(("args", "setup", "message"), QUANTIZE.values(), ids=list(QUANTIZE))
def test_quantize(tmp_path, args, setup, message):
    if setup:
        setup(tmp_path)
    assert_refused_creating_nothing(tmp_path, [*args, "--out", "{tmp}/run"], message.format(tmp=tmp_path))


@pytest.mark.parametrize(("args", "setup", "message"), ZEROSHOT.values(), ids=list(ZEROSHOT))
def test_zeroshot(tmp_path, args, setup, message):
    if setup:
        setup(tmp_path)
    assert_refused_creating_nothing(tmp_path, [*args, "--out", "{tmp}/run"], message.format(tmp=tmp_path))
