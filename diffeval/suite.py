"""Suites: several tasks from one YAML preset, each into a subfolder of one suite folder.

suite: ci-smoke                 # name; the default folder is results/<name>
models: {diff: PATH, base: PATH}  # keys at the top apply to every task (models, seed, device, ...)
tasks:
  - task: needle                # then the task's own options, as in `diffeval run TASK --config`
    ctx: 1k
  - task: icl
    name: icl-trec              # subfolder name (default: the task)
    data_dir: package:fixtures  # `package:` paths point inside the installed diffeval package
  - task: mrcr
    on_builtin_models: {rendering: plain}  # replaces the task's values on a run of the built-in pair (no models)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from diffeval.config import RunConfig, load_yaml
from diffeval.errors import InputError
from diffeval.tasks import build_config

# a task entry's values for a run of the built-in pair (no models given), which the shipped preset's defaults do not
# suit: the toy models have no chat template, and an offline run no hub to read real data from
BUILTIN_KEY = "on_builtin_models"


def suite_configs(
    preset: str, out: str | None, flags: dict, say: Callable[[str], None] | None = None
) -> tuple[Path, list[RunConfig]]:
    """The suite's folder and its tasks' configs. On the built-in pair, an entry's `on_builtin_models` values replace
    its own, each change said in one line through `say` (run.json records the values the task ran with)."""
    data = load_yaml(preset)
    tasks = data.pop("tasks", None)
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, dict) and "task" in t for t in tasks):
        raise InputError(f"suite {preset!r} needs a `tasks:` list of mappings, each with a `task:` key")
    name = str(data.pop("suite", Path(preset).stem))
    folder = Path(out or data.pop("out", None) or Path("results") / name)
    data.pop("out", None)
    builtin = not flags.get("models") and not data.get("models")
    configs, names = [], []
    for entry in tasks:
        entry = {str(k).replace("-", "_"): v for k, v in entry.items()}
        task = entry.pop("task")
        on_builtin = entry.pop(BUILTIN_KEY, None) or {}
        if not isinstance(on_builtin, dict):
            raise InputError(f"suite {preset!r}: {task}'s `{BUILTIN_KEY}:` is a mapping of its options to values")
        for key, value in on_builtin.items() if builtin else ():
            key = str(key).replace("-", "_")
            if flags.get(key) is not None:  # the command line's value wins over the preset's, either one
                continue
            was = entry.get(key, data.get(key, "its default"))
            entry[key] = value
            if say is not None:
                say(f"{task}: on the built-in models, {key} {value} (instead of {was})")
        run_name = str(entry.pop("name", task))
        if run_name in names:
            raise InputError(f"suite {name}: two tasks run into {run_name!r}; give each a distinct `name:`")
        names.append(run_name)
        configs.append(build_config(task, {**data, **entry}, {**flags, "out": str(folder / run_name)}))
    return folder, configs
