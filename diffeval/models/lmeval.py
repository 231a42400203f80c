"""lm-evaluation-harness on a model diffeval has loaded (its HF wrapper takes the model object as is: `loaded` is a
backend's `torch_module()`)."""

from __future__ import annotations

import functools
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
        if len(self.ctx) != 1:  # lm-eval takes one max_length per call
            raise InputError(f"--ctx {','.join(map(str, self.ctx))}: give one length, lm-eval's max_length, e.g. 2048")
        if self.include_path:
            check_task_yamls(self.include_path)
        if self.lm_batch_size < 1:
            raise InputError(f"--lm-batch-size {self.lm_batch_size}: give at least 1, e.g. 8")


def check_task_yamls(include_path: str) -> None:
    """--include-path is a folder whose task YAMLs are UTF-8 YAML: lm-eval skips a file it cannot read without a word,
    and then reports its task as unknown."""
    import yaml

    folder = Path(include_path).expanduser()
    if not folder.is_dir():
        raise InputError(f"--include-path {include_path} is not a folder of lm-eval task YAMLs")
    files = sorted(p for p in folder.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise InputError(f"--include-path {include_path} holds no .yaml file: give the folder of your task YAMLs")

    class TagsKept(yaml.SafeLoader):  # lm-eval's YAMLs carry tags such as !function: parsed, not run
        pass

    TagsKept.add_multi_constructor("!", lambda loader, suffix, node: None)
    for path in files:
        try:
            yaml.load(path.read_bytes().decode("utf-8"), Loader=TagsKept)
        except UnicodeDecodeError as exc:
            raise InputError(
                f"--include-path: {path} is not UTF-8 text (byte {exc.start:,}): save it as UTF-8"
            ) from None
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            line = f" (line {where.line + 1})" if where else ""
            raise InputError(
                f"--include-path: {path} is not valid YAML{line}: fix it, or move it out of the folder"
            ) from None


def task_manager(tasks: list[str], include_path: str | None = None):
    """lm-eval's task index, once every name in `tasks` is known to it."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise InputError("this task runs lm-eval: pip install 'diffeval[lmeval]'") from None
    manager = _index(TaskManager, include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise InputError(f"lm-eval has no task(s) {unknown}: check the names, or --include-path for custom YAMLs")
    return manager


@functools.lru_cache(maxsize=4)
def _index(manager_class, include_path: str | None):
    """lm-eval's task index, built once per process (it reads some 15,000 YAML files, seconds each time): the check
    stage and every model and bit width of a run look their tasks up in it."""
    return manager_class(include_path=include_path) if include_path else manager_class()


def evaluate_tasks(
    loaded, tasks: list[str], limit: int | None, max_length: int, batch_size: int, include_path: str | None = None
) -> dict[str, dict[str, float]]:
    """Zero-shot lm-eval results per task: {task: {"acc": …, "acc_norm": …, …}} (the `none` filter)."""
    manager = task_manager(tasks, include_path)
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    model = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=batch_size, max_length=max_length)
    try:
        output = simple_evaluate(
            model=model, tasks=tasks, num_fewshot=0, limit=limit, task_manager=manager, log_samples=False,
            verbosity="ERROR",
        )  # fmt: skip
    except (ConnectionError, FileNotFoundError) as exc:  # datasets' words for data offline, absent or misnamed
        reason = " ".join(str(exc).split())[:200]
        raise InputError(f"lm-eval cannot load the data of --tasks {','.join(tasks)} ({reason}): run once online to "
                         "cache it, or fix the data files its YAML names") from None  # fmt: skip
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
