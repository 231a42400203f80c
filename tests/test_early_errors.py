"""A wrong input a user meets before any work is answered before torch or transformers is imported: a path that does
not exist, an engine that is not installed, a GGUF file without the gguf package, a context beyond the model's
positions (read from config.json or the GGUF header). Checked by what the process imported (`python -X importtime`),
not by a stopwatch."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each case is a fresh interpreter

HEAVY = {"torch", "transformers"}


def _answer(*args: str, pythonpath: Path | None = None) -> tuple[int, str, set[str]]:
    """The exit code, the last stderr line and the top-level modules the command line imported."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "diffeval", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    imported, said = set(), []
    for line in result.stderr.splitlines():
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[-1].strip().split(".")[0])
        elif line.strip():
            said.append(line)
    return result.returncode, said[-1] if said else "", imported


def test_a_missing_path_is_answered_before_torch(tmp_path):
    code, said, imported = _answer("run", "needle", "-m", f"x={tmp_path / 'nowhere'}", "--ctx", "1k")
    assert code == 2 and "does not exist" in said
    assert not imported & HEAVY


def test_the_scan_sees_torch_when_it_is_imported():
    """The check itself: a command that loads a model is seen importing torch."""
    code, _, imported = _answer("models", "inspect", "toy-base")
    assert code == 0 and HEAVY <= imported


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_an_engine_not_installed_is_answered_before_torch():
    code, said, imported = _answer("run", "needle", "--backend", "vllm", "--ctx", "1k")
    assert code == 2 and "needs vllm, which is not installed" in said and "pip install" in said
    assert not imported & HEAVY


def test_a_context_beyond_the_configs_positions_is_answered_before_torch():
    code, said, imported = _answer("run", "needle", "--ctx", "128k")  # the built-in pair holds 64K positions
    assert code == 2 and "exceeds diff's max_position_embeddings 65536" in said
    assert not imported & HEAVY


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from real_checkpoints import smollm2

    found = smollm2()
    if isinstance(found, str):
        pytest.skip(f"SmolLM2 GGUF unavailable: {found}")
    return found


def test_a_context_beyond_the_gguf_headers_positions_is_answered_before_torch(smollm2):
    code, said, imported = _answer("run", "needle", "-m", f"s={smollm2}", "--ctx", "16k")
    assert code == 2 and "exceeds s's max_position_embeddings 8192" in said
    assert not imported & HEAVY


def test_a_gguf_file_without_the_gguf_package_is_answered_before_torch(smollm2, tmp_path):
    blocked = tmp_path / "blocked"
    (blocked / "gguf").mkdir(parents=True)  # a gguf package that cannot be imported, as when it is not installed
    (blocked / "gguf" / "__init__.py").write_text("raise ImportError('No module named gguf')\n")
    code, said, imported = _answer("run", "needle", "-m", f"s={smollm2}", "--ctx", "1k", pythonpath=blocked)
    assert code == 2 and "needs the gguf package: pip install 'diffeval[gguf]'" in said
    assert not imported & HEAVY
