"""Suites: several tasks from one YAML preset, each into a subfolder of one suite folder.

suite: ci-smoke                 # name; the default folder is results/<name>
models: {diff: PATH, base: PATH}  # keys at the top apply to every task (models, seed, device, ...)
tasks:
  - task: needle                # then the task's own options, as in `diffeval run TASK --config`
    ctx: 1k
  - task: icl
    name: icl-trec              # subfolder name (default: the task)
    data_dir: package:fixtures  # `package:` paths point inside the installed diffeval package
"""

from __future__ import annotations

from pathlib import Path

from diffeval.config import RunConfig, load_yaml
from diffeval.errors import InputError
from diffeval.tasks import build_config


def suite_configs(preset: str, out: str | None, flags: dict) -> tuple[Path, list[RunConfig]]:
    data = load_yaml(preset)
    tasks = data.pop("tasks", None)
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, dict) and "task" in t for t in tasks):
        raise InputError(f"suite {preset!r} needs a `tasks:` list of mappings, each with a `task:` key")
    name = str(data.pop("suite", Path(preset).stem))
    folder = Path(out or data.pop("out", None) or Path("results") / name)
    data.pop("out", None)
    configs, names = [], []
    for entry in tasks:
        entry = {str(k).replace("-", "_"): v for k, v in entry.items()}
        task = entry.pop("task")
        run_name = str(entry.pop("name", task))
        if run_name in names:
            raise InputError(f"suite {name}: two tasks run into {run_name!r}; give each a distinct `name:`")
        names.append(run_name)
        configs.append(build_config(task, {**data, **entry}, {**flags, "out": str(folder / run_name)}))
    return folder, configs
