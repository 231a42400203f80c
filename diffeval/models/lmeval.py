"""lm-evaluation-harness on a model diffeval has loaded (its HF wrapper takes the model object as is: `loaded` is a
backend's `torch_module()`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diffeval.config import context_option, folder_files, option
from diffeval.errors import InputError


@dataclass(frozen=True)
class LmEvalOptions:
    """What every task run through lm-eval takes."""

    if TYPE_CHECKING:  # declared by each task, after its own options (its flag and help are the task's)
        lm_tasks: list[str]

    ctx: list[int] = context_option([2048], help="lm-eval's max_length [default: 2048]")
    include_path: str | None = option(
        None,
        help="folder of extra lm-eval task YAMLs (e.g. local data files)",
        reads=lambda o: folder_files(o.include_path),  # lm-eval reads the YAMLs below it and the files they name
    )
    lm_batch_size: int = option(8, help="lm-eval batch size [default: 8]")

    def validate(self) -> None:
        if not self.lm_tasks:
            raise InputError("--tasks is empty: name lm-eval tasks, e.g. hellaswag,arc_easy")
        if self.include_path and not Path(self.include_path).expanduser().is_dir():
            raise InputError(f"--include-path {self.include_path} is not a folder of lm-eval task YAMLs")
        if self.lm_batch_size < 1:
            raise InputError("--lm-batch-size must be at least 1")


def task_manager(tasks: list[str], include_path: str | None = None):
    """lm-eval's task index, once every name in `tasks` is known to it."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise InputError("this task runs lm-eval: pip install 'diffeval[lmeval]'") from None
    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise InputError(f"lm-eval has no task(s) {unknown}: check the names, or --include-path for custom YAMLs")
    return manager


def evaluate_tasks(
    loaded, tasks: list[str], limit: int | None, max_length: int, batch_size: int, include_path: str | None = None
) -> dict[str, dict[str, float]]:
    """Zero-shot lm-eval results per task: {task: {"acc": …, "acc_norm": …, …}} (the `none` filter)."""
    manager = task_manager(tasks, include_path)
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    model = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=batch_size, max_length=max_length)
    output = simple_evaluate(
        model=model, tasks=tasks, num_fewshot=0, limit=limit, task_manager=manager, log_samples=False, verbosity="ERROR"
    )
    results = {}
    for task in tasks:
        metrics = output["results"][task]
        results[task] = {
            key.split(",")[0]: float(value)
            for key, value in metrics.items()
            if "," in key and key.endswith(",none") and isinstance(value, (int, float))
        }
    return results


def headline_metric(metrics: dict[str, float]) -> tuple[str, float]:
    """acc_norm where the task reports it (ARC, HellaSwag, OpenBookQA, PIQA), else acc."""
    name = "acc_norm" if "acc_norm" in metrics else "acc"
    return name, metrics[name]
