"""The run's progress bars: each model's bar times that model from its own start, not from the run's."""

from __future__ import annotations

import io

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
