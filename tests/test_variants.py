"""The DIFF-variant registry is the one place that knows variants: its records resolve, configs map to them, and no
module outside it names a variant's architecture or model type, or compares a variant's name."""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import fields
from pathlib import Path

import pytest

from diffeval.models import variants

PACKAGE = Path(__file__).resolve().parents[1] / "diffeval"
REGISTRY = PACKAGE / "models" / "variants.py"


def _exports(tree: ast.AST) -> set[int]:
    """ids of the string constants in `__all__` lists (a module's exported names, not variant checks)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            found |= {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return found


def variant_strings_outside_the_registry(root: Path) -> list[str]:
    names = {a for v in variants.VARIANTS for a in v.architectures} | set(variants.model_types())
    short = {v.name for v in variants.VARIANTS}
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == REGISTRY:
            continue
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
    assert variant.lambda_form in (variants.PER_LAYER, variants.PER_TOKEN)
    assert all(variants.by_name(name) for name in variant.paired_with)


def test_configs_map_to_their_variant(tiny_models):
    from transformers import AutoConfig

    from diffeval.models.diffllama2 import DiffLlama2Config
    from diffeval.models.motif import MotifConfig, MotifLowerConfig

    assert variants.variant_of(AutoConfig.from_pretrained(tiny_models["diff"])) is variants.DIFF_V1
    for config in (MotifConfig(architectures=None), MotifLowerConfig(architectures=None)):
        assert variants.variant_of(config) is variants.MOTIF  # by either spelling of the model type
    assert variants.variant_of(AutoConfig.from_pretrained(tiny_models["base"])) is None
    assert variants.variant_of(DiffLlama2Config(num_attention_heads=4, num_key_value_heads=2)) is variants.DIFF_V2
    assert variants.of_architecture("DiffLlamaForCausalLM") is variants.DIFF_V1
    assert variants.vllm_architectures() == {
        "DiffLlamaForCausalLM": "diffeval.models.vllm_diffllama:DiffLlamaForCausalLM",
        "DiffLlama2ForCausalLM": "diffeval.models.vllm_diffllama2:DiffLlama2ForCausalLM",
        "MotifForCausalLM": "diffeval.models.vllm_motif:MotifForCausalLM",
    }
