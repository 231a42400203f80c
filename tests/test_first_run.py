"""A new user's first commands: typos get "did you mean", a hub id with no hub fails at once, a resumed run says so."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import constants

from conftest import run_cli_in_process
from diffeval.models.checkpoints import loading
from diffeval.models.lambda_probe import PROBE_TOKENS
from diffeval.models.tiny import build_tiny_model


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (["run", "needle", "-m", "diff=toy-dif", "--ctx", "1k"], "did you mean toy-diff?"),
        (["run", "needle", "-m", "Toy-Diff2", "--ctx", "1k"], "did you mean toy-diff2?"),
        (["models", "inspect", "toy-bas"], "did you mean toy-base?"),
        (["run", "needle", "--config", "needle-4k-tabel2"], "did you mean needle-4k-table2?"),
        (["run", "suite", "ci-smok"], "did you mean ci-smoke?"),
    ],
)
def test_near_miss_names_get_did_you_mean_at_once(args, suggestion):
    started = time.perf_counter()
    message = _one_line(run_cli_in_process(*args))
    assert suggestion in message and time.perf_counter() - started < 1


def test_near_miss_task_in_a_suite_gets_did_you_mean(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text("tasks:\n  - task: needel\n")
    assert "did you mean needle?" in _one_line(run_cli_in_process("run", "suite", str(suite), "--dry-run"))


def test_a_folder_named_like_a_builtin_is_not_a_typo(tiny_models, tmp_path, monkeypatch):
    shutil.copytree(tiny_models["base"], tmp_path / "toy-dif")
    monkeypatch.chdir(tmp_path)
    result = run_cli_in_process("run", "needle", "-m", "toy-dif", "--ctx", "1k", "--depths", "50", "--dry-run")
    assert result.returncode == 0, result.stderr


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens on it once the socket closes


@pytest.fixture
def unreachable_hub(monkeypatch):
    """This process without HF_HUB_OFFLINE, its hub a closed local port (as with no network, but refused at once)."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    loading._hub_unavailable.cache_clear()
    yield constants.ENDPOINT
    loading._hub_unavailable.cache_clear()


def test_hub_id_offline_fails_in_one_line_at_once():
    loading._hub_unavailable.cache_clear()
    started = time.perf_counter()
    message = _one_line(run_cli_in_process("run", "needle", "-m", "diff=nobody/not-cached", "--ctx", "1k"))
    assert time.perf_counter() - started < 5
    assert "hub id 'nobody/not-cached' is not in the local cache and HF_HUB_OFFLINE is set" in message
    assert "give a local folder" in message


def test_hub_id_with_the_hub_unreachable_fails_in_one_line_without_retries(unreachable_hub):
    started = time.perf_counter()
    message = _one_line(run_cli_in_process("models", "inspect", "nobody/not-cached"))
    assert time.perf_counter() - started < 5  # huggingface_hub's own retries took ~25 s
    assert f"not in the local cache and the hub ({unreachable_hub}) is not reachable" in message


def _hub_environment(tmp_path: Path, **variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    return {**env, "HF_HUB_CACHE": str(tmp_path / "hub-cache"), "COLUMNS": "200", **variables}


def _cache(tiny_models, tmp_path: Path, repo: str) -> None:
    """The hub cache's own layout (refs/main → snapshots/COMMIT/files), as `hf download` leaves it."""
    commit = "0" * 40
    folder = tmp_path / "hub-cache" / f"models--{repo.replace('/', '--')}"
    shutil.copytree(tiny_models["diff"], folder / "snapshots" / commit)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)


@pytest.mark.slow
@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "unreachable"])
def test_the_real_process_without_a_hub(tiny_models, tmp_path, offline):
    """Set by the environment in a fresh process: a hub id not in the cache is one line, with no retry storm; one in
    the cache loads from it."""
    variables = (
        {"HF_HUB_OFFLINE": "1"}
        if offline == "HF_HUB_OFFLINE"
        else {"HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"}
    )
    env = _hub_environment(tmp_path, **variables)
    _cache(tiny_models, tmp_path, "someone/tiny-diff")
    command = [sys.executable, "-m", "diffeval", "models", "inspect"]
    started = time.perf_counter()
    missing = subprocess.run([*command, "someone/absent"], capture_output=True, text=True, env=env, timeout=120)
    assert time.perf_counter() - started < 15 and "Retry" not in missing.stderr  # the retries alone took ~25 s
    assert "is not in the local cache" in _one_line(missing)
    cached = subprocess.run([*command, "someone/tiny-diff"], capture_output=True, text=True, env=env, timeout=120)
    assert cached.returncode == 0 and "DiffLlamaForCausalLM" in cached.stdout, cached.stderr
    assert "Retry" not in cached.stderr


@pytest.mark.slow
def test_a_resumed_run_says_how_many_samples_are_done(tiny_models, tmp_path):
    def run(samples: int) -> str:
        options = ["--ctx", "1k", "--depths", "50", "--samples", str(samples), "--out", str(tmp_path / "run")]
        result = run_cli_in_process("run", "needle", "-m", f"diff={tiny_models['diff']}", "--device", "cpu", *options)
        assert result.returncode == 0, result.stderr
        return result.stderr

    assert "resuming" not in run(1)
    assert "resuming: 1 of 2 samples already done" in run(2)
    assert "resuming: 2 of 2 samples already done" in run(2)


def test_a_v2_config_error_keeps_its_reason(tiny_models, tmp_path):
    """transformers' config validators put the reason on the line after their heading: the one line keeps both."""
    folder = tmp_path / "v2"
    build_tiny_model("diff2", tiny_models["tok_a"], folder, seed=5, heads=4, kv_heads=2)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 3}))
    result = run_cli_in_process("run", "needle", "-m", f"v2={folder}", "--ctx", "512", "--out", str(tmp_path / "run"))
    message = _one_line(result)
    assert "validate_architecture" in message
    assert "the 2 × 4 query heads of a DIFF V2 layer do not split evenly over 3 key/value heads" in message
    assert not (tmp_path / "run").exists()


def test_models_inspect_probes_v2_lambda_over_256_tokens():
    result = run_cli_in_process("models", "inspect", "toy-diff2")
    assert result.returncode == 0, result.stderr
    assert f"over a {PROBE_TOKENS}-token probe" in " ".join(result.stdout.split()) and PROBE_TOKENS == 256
