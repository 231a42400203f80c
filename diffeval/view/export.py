"""`diffeval view --export DIR`: the same page as static files that open from disk, with no server.

A page opened from disk may not fetch files, but it may load scripts: every payload the server would answer is
written as a script that hands it to the page (`diffevalData(PATH, PAYLOAD)`), under the path the page asks the
server for. Sample views are written one file per sample and loaded when a sample is opened, so a large run's page
opens as fast as a small one's. Prompts over `haystack.view.VIEW_FULL_TOKENS` tokens are exported elided;
`diffeval view` on the folder shows them whole.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from diffeval.errors import InputError
from diffeval.view.data import dropped_notes_of, open_run, sample_detail, sample_index, summary
from diffeval.view.server import STATIC_FILES, static_file

MARKER = ".diffeval-view"  # marks a folder this command wrote, which a later export may replace
SAFE_ID = re.compile(r"[0-9A-Za-z_-]{1,128}")  # sample ids become file names


def check_target(target: Path) -> None:
    """Refuse a folder that holds anything but an earlier export: nothing else is ever overwritten."""
    if target.exists() and (not target.is_dir() or (any(target.iterdir()) and not (target / MARKER).is_file())):
        raise InputError(
            f"--export {target} exists and is not an earlier `diffeval view` export: give a new or empty folder"
        )


def export(paths: list[Path], target: Path, console: Console) -> Path:
    """Write the viewer over `paths` into `target`; returns the page to open."""
    check_target(target)
    views = [open_run(i, p) for i, p in enumerate(paths)]  # bad input fails before anything is written
    for note in filter(None, map(dropped_notes_of, views)):
        console.print(note, soft_wrap=True, markup=False, highlight=False)
    indexes = [sample_index(v) for v in views]
    for view, index in zip(views, indexes):
        unsafe = [s for s in index["samples"] if not SAFE_ID.fullmatch(s)]
        if unsafe:
            raise InputError(
                f"{view.folder.samples_path} holds sample id {unsafe[0]!r}, which is no file name: "
                "diffeval writes hex ids; view this folder with `diffeval view` instead"
            )
    try:
        return _write_all(views, indexes, target, console)
    except OSError as exc:
        raise InputError(
            f"cannot write --export {target}: {exc.strerror or exc}: give a folder you can write"
        ) from None


def _write_all(views: list, indexes: list[dict], target: Path, console: Console) -> Path:
    if (target / "data").is_dir():
        shutil.rmtree(target / "data")
    (target / "static").mkdir(parents=True, exist_ok=True)
    (target / MARKER).write_text("written by `diffeval view --export`; a later export replaces this folder\n")
    page = static_file("index.html").decode().replace('content="server"', 'content="static"', 1)
    (target / "index.html").write_text(page, encoding="utf-8")
    for name in STATIC_FILES:
        (target / "static" / name).write_bytes(static_file(name))
    _write(target, "runs", [summary(v) for v in views])
    progress = Progress(
        TextColumn("{task.description}", markup=False),  # a folder name: no markup
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )
    with progress:
        for view, index in zip(views, indexes):
            _write(target, f"runs/{view.number}/index", index)
            bar = progress.add_task(f"{view.folder.path.name}: samples", total=len(index["samples"]))
            for sample in index["samples"]:
                _write(target, f"runs/{view.number}/samples/{sample}", sample_detail(view, sample))
                progress.advance(bar)
    return target / "index.html"


def _write(target: Path, path: str, payload) -> None:
    file = target / "data" / f"{path}.js"
    file.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(payload, ensure_ascii=False, allow_nan=False)
    file.write_text(f"diffevalData({json.dumps(path)}, {data});\n", encoding="utf-8")
