"""`diffeval view`'s local server: the page's static files and its JSON, from the standard library's HTTP server.

    GET /                                   the page (static/index.html)
    GET /static/FILE                        its script and style sheet
    GET /api/runs                           every run's summary (tables, counts); a folder still being written is read
                                            again when its samples.jsonl has changed
    GET /api/runs/N/index                   run N's compact sample index
    GET /api/runs/N/samples/ID[?full=1]     one sample on every model; full=1: whole prompts, however long

It binds to 127.0.0.1 unless told otherwise, and never reaches the internet: the page loads nothing from outside.
"""

from __future__ import annotations

import json
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from diffeval.errors import InputError
from diffeval.view.data import RunView, dropped_notes_of, open_run, sample_detail, sample_index, summary

STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css"}
STATIC_FILES = ("viewer.js", "viewer.css")  # besides index.html: the only files the server hands out


def static_file(name: str) -> bytes:
    return (resources.files("diffeval.view") / "static" / name).read_bytes()


class Runs:
    """The run folders being viewed; each read again when its samples.jsonl changes (a run still writing)."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self._lock = threading.Lock()
        self._views: list[tuple[tuple, RunView]] = [(self._stamp(p), open_run(i, p)) for i, p in enumerate(paths)]

    @staticmethod
    def _stamp(path: Path) -> tuple:
        samples = path / "samples.jsonl"
        stat = samples.stat() if samples.is_file() else None
        return (stat.st_size, stat.st_mtime_ns) if stat else (0, 0)

    def view(self, number: int) -> RunView:
        if not 0 <= number < len(self.paths):
            raise KeyError(number)
        with self._lock:
            stamp, view = self._views[number]
            if self._stamp(self.paths[number]) != stamp:
                self._views[number] = (self._stamp(self.paths[number]), open_run(number, self.paths[number]))
            return self._views[number][1]

    def __len__(self) -> int:
        return len(self.paths)

    def dropped_notes(self) -> list[str]:
        """A line for each run with damaged lines or duplicate records skipped, as `report` prints it."""
        return [note for _, view in self._views if (note := dropped_notes_of(view))]


def make_server(runs: Runs, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A server over run folders already read (so bad input fails before it binds); port 0 takes a free port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            url = urlparse(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/") if p]
            try:
                if not parts:
                    self._send(static_file("index.html"), STATIC_TYPES[".html"])
                elif parts[0] == "static" and len(parts) == 2 and parts[1] in STATIC_FILES:
                    self._send(static_file(parts[1]), STATIC_TYPES[Path(parts[1]).suffix])
                elif parts == ["api", "runs"]:
                    self._json([summary(runs.view(i)) for i in range(len(runs))])
                elif parts[:2] == ["api", "runs"] and len(parts) == 4 and parts[3] == "index":
                    self._json(sample_index(runs.view(int(parts[2]))))
                elif parts[:2] == ["api", "runs"] and len(parts) == 5 and parts[3] == "samples":
                    full = parse_qs(url.query).get("full") == ["1"] or None
                    self._json(sample_detail(runs.view(int(parts[2])), parts[4], full))
                else:
                    self._error(HTTPStatus.NOT_FOUND, f"no such page: {url.path}")
            except (KeyError, IndexError, ValueError, FileNotFoundError):
                self._error(HTTPStatus.NOT_FOUND, f"no such page: {url.path}")
            except InputError as exc:  # a folder damaged while being viewed
                self._error(HTTPStatus.CONFLICT, str(exc))
            except Exception as exc:  # the page shows the message; the server goes on serving
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")

        def _json(self, payload) -> None:
            self._send(json.dumps(payload, ensure_ascii=False, allow_nan=False).encode(), "application/json")

        def _error(self, status: HTTPStatus, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _send(self, body: bytes, content_type: str) -> None:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args) -> None:  # noqa: A002 (the standard library's signature)
            pass  # the terminal shows the URL and errors, not every request

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    return Server((host, port), Handler)
