"""What the tasks run through lm-eval share: the check stage and one lm-eval call on a loaded model, both read from
the task's `LmEvalOptions` (`models.lmeval`) and its `lm_tasks`."""

from __future__ import annotations

from typing import Protocol

from diffeval.models.lmeval import evaluate_tasks, task_manager
from diffeval.tasks.base import RunContext


class LmTaskOptions(Protocol):
    """An lm-eval task's options: `LmEvalOptions` and the task's own `--tasks`."""

    @property
    def ctx(self) -> list[int]: ...

    @property
    def include_path(self) -> str | None: ...

    @property
    def lm_batch_size(self) -> int: ...

    @property
    def lm_tasks(self) -> list[str]: ...


def check_lm_tasks(context: RunContext[LmTaskOptions]) -> None:
    """The check stage: lm-eval is installed and knows every --tasks name, before a model loads."""
    task_manager(context.options.lm_tasks, context.options.include_path)


def lm_eval_results(loaded, lm_tasks: list[str], options: LmTaskOptions, limit: int | None) -> dict[str, dict]:
    """Zero-shot lm-eval results per task on a backend's `torch_module()`: --ctx is lm-eval's max_length, --limit its
    documents per task."""
    return evaluate_tasks(loaded, lm_tasks, limit, options.ctx[0], options.lm_batch_size, options.include_path)
