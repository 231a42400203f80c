"""The package's imports point one way: a module imports only from its own layer or the layers below it."""

import ast
from pathlib import Path

import pytest

# the import layers, checked in the vLLM environment too (cheap: no test imports a model)
pytestmark = pytest.mark.transformers_floor

PACKAGE = Path(__file__).resolve().parents[1] / "diffeval"

# lowest first; a module belongs to the most specific prefix that names it
LAYERS = [
    ["diffeval.errors", "diffeval.machine", "diffeval.wording"],
    ["diffeval.records", "diffeval.paper", "diffeval.plotting", "diffeval.lock", "diffeval.intervals"],
    ["diffeval.config"],
    ["diffeval.data", "diffeval.results"],
    ["diffeval.models"],
    ["diffeval.judges"],
    ["diffeval.longctx"],
    ["diffeval.tasks"],
    ["diffeval.estimate", "diffeval.speed"],
    ["diffeval.runner", "diffeval.suite", "diffeval.toy", "diffeval.scale"],
    ["diffeval.report"],
    ["diffeval.view"],
    ["diffeval.cli", "diffeval.__main__"],
]


def layer_of(module: str) -> int | None:
    best = None
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (rank, len(prefix))
    return None if best is None else best[0]


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every diffeval import in a file, at any depth (imports inside functions count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from diffeval.tasks import needle` imports the submodule diffeval.tasks.needle
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] == "diffeval"]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_module_has_a_layer():
    unplaced = [module_name(p) for p in PACKAGE.rglob("*.py") if layer_of(module_name(p)) is None]
    assert module_name(PACKAGE / "__init__.py") == "diffeval"
    assert unplaced == ["diffeval"], unplaced  # the package root (version only) sits below everything


def test_no_import_points_up():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        source = module_name(path)
        rank = layer_of(source)
        for line, target in imports(path):
            target_rank = layer_of(target)
            if rank is not None and target_rank is not None and target_rank > rank:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} {source} imports {target} (up a layer)")
    assert not upward, "\n".join(upward)


def test_the_checker_sees_an_upward_import(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    from diffeval.tasks import needle\n")
    assert imports(sample) == [(2, "diffeval.tasks.needle")]
    assert layer_of("diffeval.tasks.needle") > layer_of("diffeval.config")
