"""lm-evaluation-harness on a model diffeval has loaded (its HF wrapper takes the model object as is)."""

from __future__ import annotations

from diffeval.errors import InputError


def evaluate_tasks(
    backend, tasks: list[str], limit: int | None, max_length: int, batch_size: int, include_path: str | None = None
) -> dict[str, dict[str, float]]:
    """Zero-shot lm-eval results per task: {task: {"acc": …, "acc_norm": …, …}} (the `none` filter)."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise InputError("this task runs lm-eval: pip install 'diffeval[lmeval]'") from None
    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise InputError(f"lm-eval has no task(s) {unknown}: check the names, or --include-path for custom YAMLs")
    model = HFLM(pretrained=backend.model, tokenizer=backend.tokenizer, batch_size=batch_size, max_length=max_length)
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
