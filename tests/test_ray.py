"""Scale-out on a real local Ray instance, with the built-in pair on CPU: sharded runs write what one process writes,
a worker killed with -9 loses nothing, a killed driver resumes, a second driver is refused, bad input is one line.
Skipped when Ray is not installed."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli, run_cli_in_process

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'diffeval[ray]'")
psutil = pytest.importorskip("psutil", reason="psutil comes with Ray")
# one xdist group: with `--dist loadgroup` these run on one worker, so no two local Ray instances start at once (a
# driver's ray.init() joins the latest local cluster it finds)
pytestmark = pytest.mark.xdist_group("ray")

TABLES = ("table.md", "summary.csv", "table2.csv", "paired.csv", "depth_grid-diff.csv", "depth_grid-base.csv")


def _args(out: Path, *extra: str) -> list[str]:
    return ["run", "needle", "--ctx", "1k", "--depths", "0,50,100", "--samples", "4", "--out", str(out), *extra]


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "diffeval", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _wait_for(out: Path, count: int, process: subprocess.Popen) -> None:
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if (out / "samples.jsonl").exists() and len(_rows(out)) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {count} records (exit {process.poll()}): {process.stderr.read()[-2000:]}")


def _exactly_once(out: Path) -> int:
    keys = [(r["model"], r["sample_id"]) for r in _rows(out)]
    assert len(keys) == len(set(keys))
    return len(keys)


@pytest.mark.slow
def test_two_workers_write_what_one_process_writes(tmp_path):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    assert run_cli(*_args(single)).returncode == 0
    result = run_cli(*_args(sharded, "--ray", "--workers", "2"))
    assert result.returncode == 0, result.stderr
    strip = lambda row: {k: v for k, v in row.items() if k != "seconds"}  # noqa: E731
    assert [strip(r) for r in _rows(sharded)] == [strip(r) for r in _rows(single)]  # same records, same order
    for folder in (single, sharded):
        assert run_cli("report", str(folder), "--format", "md,csv").returncode == 0
    for name in TABLES:
        assert (sharded / name).read_bytes() == (single / name).read_bytes(), name


@pytest.fixture
def cluster(monkeypatch):
    """A Ray head on 127.0.0.1 that the CLI joins and the test inspects through Ray's API. Ray's token authentication
    is off for this throwaway cluster (a real cluster hands its token to clients through RAY_AUTH_TOKEN)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = ["ray", "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
             "--disable-usage-stats"]  # fmt: skip
    subprocess.run([str(Path(sys.executable).parent / start[0]), *start[1:]], check=True, capture_output=True)
    yield f"127.0.0.1:{port}"
    if ray.is_initialized():
        ray.shutdown()
    subprocess.run([str(Path(sys.executable).parent / "ray"), "stop", "--force"], capture_output=True)


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_nothing(cluster, tmp_path):
    out = tmp_path / "worker-killed"
    driver = _start(_args(out, "--ray", cluster, "--workers", "2"))
    try:
        _wait_for(out, 2, driver)
        ray.init(address=cluster, namespace="diffeval", logging_level="ERROR")
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("diff-")]
        victim = ray.get_actor(names[0], namespace="diffeval")
        os.kill(ray.get(victim.pid.remote()), signal.SIGKILL)
        assert driver.wait(timeout=300) == 0, driver.stderr.read()[-2000:]
    finally:
        driver.kill()
    assert _exactly_once(out) == 24


@pytest.mark.slow
def test_a_killed_driver_resumes_and_a_second_driver_is_refused(tmp_path):
    out = tmp_path / "driver-killed"
    args = _args(out, "--ray", "--workers", "2")
    driver = _start(args)
    agents: list[psutil.Process] = []  # none yet: a driver that failed before its records started no Ray instance
    try:
        _wait_for(out, 3, driver)
        second = run_cli_in_process(*args)
        assert second.returncode == 2 and f"in use by pid {driver.pid}" in second.stderr
        agents = psutil.Process(driver.pid).children(recursive=True)  # the local Ray instance the driver started
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    finally:
        driver.kill()
        for agent in agents:  # a dead driver's Ray agents survive SIGTERM: clean up the ones this test started
            try:
                agent.kill()
            except psutil.NoSuchProcess:
                pass
    before = _exactly_once(out)
    assert 3 <= before < 24
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    assert _exactly_once(out) == 24


def test_bad_ray_input_is_one_line(tmp_path, monkeypatch):
    out = tmp_path / "bad"
    cases = [
        (_args(out, "--workers", "2"), "--workers needs --ray"),
        (_args(out, "--ray", "127.0.0.1:1"), "cannot reach a Ray cluster at 127.0.0.1:1"),
        (_args(out, "--ray", "--workers", "0"), "--workers and --cpus-per-worker must be positive"),
    ]
    for args, message in cases:
        result = run_cli_in_process(*args)
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [result.stderr.strip()]
        assert message in result.stderr, result.stderr
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    result = run_cli_in_process(*_args(out, "--ray"))
    assert result.returncode == 2 and 'pip install "diffeval[ray]"' in result.stderr
    assert not out.exists()
