"""FolderLock with real processes: a live holder refuses, a killed one is taken over, other hosts need --break-lock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from diffeval.errors import InputError
from diffeval.lock import LOCK_FILE, FolderLock

REPO = Path(__file__).resolve().parents[1]

HOLDER = """
import sys, time
from diffeval.lock import FolderLock
FolderLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def _start_holder(folder: Path) -> subprocess.Popen:
    """A child process that takes the lock and sleeps; returns once it says it holds the lock."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
    )
    try:
        line = child.stdout.readline()
        assert line.strip() == "locked", f"holder did not lock (exit code {child.poll()})"
    except BaseException:
        _stop(child)
        raise
    return child


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(timeout=30)
    child.stdout.close()


def _note(folder: Path) -> dict:
    return json.loads((folder / LOCK_FILE).read_text())


@pytest.mark.slow
def test_live_holder_in_another_process_refuses(tmp_path):
    folder = tmp_path / "run"
    child = _start_holder(folder)
    try:
        with pytest.raises(InputError) as err:
            FolderLock(folder).acquire()
        message = str(err.value)
        assert f"pid {child.pid}" in message
        assert f"host {socket.gethostname()}" in message
        assert "--out" in message and "\n" not in message
        with pytest.raises(InputError):  # break_lock cannot override a live holder on this host
            FolderLock(folder, break_lock=True).acquire()
    finally:
        _stop(child)


@pytest.mark.slow
def test_killed_holder_is_taken_over(tmp_path):
    folder = tmp_path / "run"
    child = _start_holder(folder)
    try:
        os.kill(child.pid, signal.SIGKILL)
    finally:
        _stop(child)
    assert _note(folder)["pid"] == child.pid  # kill -9 left its note behind, but the kernel dropped the flock
    with FolderLock(folder) as lock:
        assert lock.taken_over_from["pid"] == child.pid
        assert _note(folder)["pid"] == os.getpid()


def test_other_host_needs_break_lock(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    started = (datetime.now(timezone.utc) - timedelta(hours=2)).isoformat(timespec="seconds")
    note = {"pid": 99, "host": "some-other-host", "started": started}
    (folder / LOCK_FILE).write_text(json.dumps(note))
    with pytest.raises(InputError) as err:
        FolderLock(folder).acquire()
    message = str(err.value)
    assert "pid 99 on host some-other-host" in message
    assert "(2.0 h ago)" in message and "--break-lock" in message
    assert _note(folder) == note  # a refusal leaves the other host's note alone
    with FolderLock(folder, break_lock=True) as lock:
        assert lock.taken_over_from == note
        assert _note(folder)["host"] == socket.gethostname()


def test_release_empties_the_file_and_garbage_is_taken_over(tmp_path):
    folder = tmp_path / "new" / "run"
    lock = FolderLock(folder)
    lock.acquire()  # creates the folder
    assert lock.taken_over_from is None
    assert _note(folder)["pid"] == os.getpid()
    with pytest.raises(InputError, match=f"pid {os.getpid()}"):  # a second open file in this process is refused too
        FolderLock(folder).acquire()
    lock.release()
    lock.release()  # idempotent
    assert (folder / LOCK_FILE).exists() and (folder / LOCK_FILE).read_text() == ""
    with FolderLock(folder) as again:
        assert again.taken_over_from is None
    assert (folder / LOCK_FILE).read_text() == ""

    (folder / LOCK_FILE).write_text("not json {")
    with FolderLock(folder) as lock:
        assert lock.taken_over_from == {"unreadable": "not json {"}
        assert _note(folder)["pid"] == os.getpid()
