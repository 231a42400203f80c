"""The run's progress bars: each model's bar times that model from its own start, not from the run's."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from diffeval import runner
from diffeval.tasks import build_config


def test_each_models_bar_starts_when_that_model_does(tiny_models, tmp_path, monkeypatch):
    made = []
    progress_of = runner._progress

    def kept(console):
        made.append(progress_of(console))
        return made[-1]

    monkeypatch.setattr(runner, "_progress", kept)
    flags = {
        "models": [f"first={tiny_models['diff']}", f"second={tiny_models['base_a']}"],
        "ctx": "1k",
        "depths": "50",
        "samples": 2,
        "device": "cpu",
        "out": str(tmp_path / "run"),
    }
    runner.run(build_config("needle", {}, flags), Console(file=io.StringIO(), force_terminal=True))
    [progress] = made
    first, second = progress.tasks
    assert (first.description, second.description) == ("first", "second")
    assert first.finished and second.finished and first.completed == second.completed == 2
    # the second model's clock starts after the first model's last sample, so its elapsed time and ETA are its own
    # (before, every bar started with the run, and the second model's time included the first model's)
    assert second.start_time >= first.start_time + first.finished_time


def test_eta_shows_from_the_first_finished_sample():
    """One sample of ten done after 0.5 s: the ETA is the mean time per sample × the nine left, about 4.5 s (rich's
    own estimate shows `-:--:--` until a second update lands in its speed window)."""
    console = Console(file=io.StringIO(), width=200)
    progress = runner._progress(console)
    bar = progress.add_task("model", total=10, rate="")
    time.sleep(0.5)
    progress.update(bar, advance=1)
    console.print(progress.get_renderable())
    hours, minutes, seconds = map(int, re.search(r"ETA (\d+):(\d\d):(\d\d)", console.file.getvalue()).groups())
    assert 4 <= 3600 * hours + 60 * minutes + seconds <= 6
