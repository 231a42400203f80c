"""One writer per run folder: an flock on <folder>/run.lock, plus a JSON note saying who holds it."""

from __future__ import annotations

import fcntl
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path

from diffeval.errors import InputError

LOCK_FILE = "run.lock"


def _age(started: str) -> str:
    """'3.2 h ago' style age of an ISO-8601 time, or '' when it cannot be read."""
    try:
        then = datetime.fromisoformat(started)
    except (TypeError, ValueError):
        return ""
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    seconds = max(0.0, (datetime.now(timezone.utc) - then).total_seconds())
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


class FolderLock:
    """Exclusive lock on a run folder while a process writes into it.

    The kernel drops an flock when its process dies (even on kill -9), so on one host a stale note left by a
    dead holder is simply taken over. flock does not reach across hosts on shared filesystems, so a note from
    another host is only overridden with break_lock=True.
    """

    def __init__(self, folder: str | Path, break_lock: bool = False):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.break_lock = break_lock
        self.taken_over_from: dict | None = None  # the previous holder's note when acquire() replaced one
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, creating the folder if needed; raise InputError when someone else holds it."""
        if self._fd is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InputError(self._in_use_message(_read_note(fd))) from None
            note = _read_note(fd)
            self._check_other_host(fd, note)
            self.taken_over_from = note or None
            mine = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            # Overwrite in place: the file is never unlinked, so every process always locks the same inode.
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)  # closing also drops the flock if we got it
            raise
        self._fd = fd

    def release(self) -> None:
        """Empty the note (empty means free), unlock and close. Safe to call twice."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # truncate before unlocking, so nobody sees our note after we let go
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _in_use_message(self, note: dict) -> str:
        if "pid" not in note:  # the holder is between taking the flock and writing its note
            return f"{self.folder} is in use by another process: wait for that run to finish, or use another --out"
        since = f" (since {note['started']})" if note.get("started") else ""
        return (
            f"{self.folder} is in use by pid {note['pid']} on host {note.get('host', '?')}{since}: "
            "wait for that run to finish, or use another --out"
        )

    def _check_other_host(self, fd: int, note: dict) -> None:
        """A note from another host may belong to a live run that our flock cannot see: refuse unless told."""
        host = note.get("host")
        if not host or host == socket.gethostname() or self.break_lock:
            return
        started = str(note.get("started", "?"))
        age = _age(started)
        fcntl.flock(fd, fcntl.LOCK_UN)
        raise InputError(
            f"{self.folder} is locked by pid {note.get('pid', '?')} on host {host} since {started}"
            f"{f' ({age})' if age else ''}: if that run is gone, rerun with --break-lock"
        )


def _read_note(fd: int) -> dict:
    """The holder's note; {} when empty (free), {'unreadable': text} when it is not a JSON object."""
    text = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
    if not text:
        return {}
    try:
        note = json.loads(text)
    except ValueError:
        note = None
    return note if isinstance(note, dict) else {"unreadable": text[:200]}
