"""A wrong input a user meets before any work is answered before torch or transformers is imported: a path that does
not exist, an engine that is not installed, a GGUF file without the gguf package, a context beyond the model's
positions (read from config.json or the GGUF header). Checked by what the process had imported, not by a stopwatch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from conftest import run_probed

pytestmark = pytest.mark.slow  # each case is a fresh interpreter


def _answer(tmp_path: Path, *args: str, pythonpath: Path | None = None) -> tuple[int, str, list[str]]:
    """The exit code, the one stderr line and the heavy libraries imported."""
    result, heavy = run_probed(tmp_path, *args, pythonpath=pythonpath)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return result.returncode, lines[0], heavy


def test_a_missing_path_is_answered_before_torch(tmp_path):
    code, said, heavy = _answer(tmp_path, "run", "needle", "-m", f"x={tmp_path / 'nowhere'}", "--ctx", "1k")
    assert code == 2 and "does not exist" in said
    assert heavy == []


def test_the_probe_sees_torch_when_it_is_imported(tmp_path):
    """The check itself: a command that gets as far as the check stage is seen importing torch."""
    code, said, heavy = _answer(tmp_path, "run", "needle", "-m", f"x={tmp_path}", "--ctx", "1k")  # no config.json
    assert code == 2 and "has no config.json" in said and heavy == []
    result, heavy = run_probed(
        tmp_path, "run", "needle", "--ctx", "1k", "--samples", "1", "--depths", "50", "--dry-run"
    )
    assert result.returncode == 0, result.stderr
    assert {"torch", "transformers"} <= set(heavy)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_an_engine_not_installed_is_answered_before_torch(tmp_path):
    code, said, heavy = _answer(tmp_path, "run", "needle", "--backend", "vllm", "--ctx", "1k")
    assert code == 2 and "needs vllm, which is not installed" in said and "pip install" in said
    assert heavy == []


def test_a_context_beyond_the_configs_positions_is_answered_before_torch(tmp_path):
    code, said, heavy = _answer(tmp_path, "run", "needle", "--ctx", "128k")  # the built-in pair holds 64K positions
    assert code == 2 and "exceeds diff's max_position_embeddings 65536" in said
    assert heavy == []


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from real_checkpoints import smollm2

    found = smollm2()
    if isinstance(found, str):
        pytest.skip(f"SmolLM2 GGUF unavailable: {found}")
    return found


def test_a_context_beyond_the_gguf_headers_positions_is_answered_before_torch(smollm2, tmp_path):
    code, said, heavy = _answer(tmp_path, "run", "needle", "-m", f"s={smollm2}", "--ctx", "16k")
    assert code == 2 and "exceeds s's max_position_embeddings 8192" in said
    assert heavy == ["numpy"]  # the gguf package reads the header with numpy


def test_a_gguf_file_without_the_gguf_package_is_answered_before_torch(smollm2, tmp_path):
    blocked = tmp_path / "blocked"
    (blocked / "gguf").mkdir(parents=True)  # a gguf package that cannot be imported, as when it is not installed
    (blocked / "gguf" / "__init__.py").write_text("raise ImportError('No module named gguf')\n")
    code, said, heavy = _answer(tmp_path, "run", "needle", "-m", f"s={smollm2}", "--ctx", "1k", pythonpath=blocked)
    assert code == 2 and "needs the gguf package: pip install 'diffeval[gguf]'" in said
    assert heavy == []
