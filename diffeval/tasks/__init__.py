"""Task families by name: the one place a task is registered.

Tasks from other packages register through the `diffeval.tasks` entry-point group: each entry point names a `Task`
object, e.g. `[project.entry-points."diffeval.tasks"] mytask = "mypackage.mytask:TASK"`.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from diffeval.config import RunConfig
from diffeval.tasks.analyses import attention, distractor_attention
from diffeval.tasks.base import Task, configure, registry
from diffeval.tasks.choices import icl, longbench2
from diffeval.tasks.conversations import hallucination, mrcr
from diffeval.tasks.generated import graphwalks
from diffeval.tasks.haystack import cwe, mk_niah, mv_niah, needle, nolima, vt
from diffeval.tasks.internals import outliers, quantize, zeroshot
from diffeval.tasks.loss import nll


def _plugins() -> list[Task]:
    return [point.load() for point in entry_points(group="diffeval.tasks")]


TASKS = registry(
    needle.TASK,
    attention.TASK,
    icl.TASK,
    hallucination.TASK,
    mrcr.TASK,
    nll.TASK,
    mk_niah.TASK,
    mv_niah.TASK,
    vt.TASK,
    cwe.TASK,
    nolima.TASK,
    distractor_attention.TASK,
    outliers.TASK,
    quantize.TASK,
    zeroshot.TASK,
    longbench2.TASK,
    graphwalks.TASK,
    *_plugins(),
)


def build_config(task: str, yaml_values: dict[str, Any], flags: dict[str, Any]) -> RunConfig:
    """Merge preset values and command-line flags (flags win) into a validated RunConfig."""
    return configure(TASKS, task, yaml_values, flags)
