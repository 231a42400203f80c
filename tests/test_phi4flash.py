"""Phi-4-mini-flash (SambaY) on transformers: the layer rule read from the config, the hybrid cache, the chunked
Mamba scan, prefix reuse, the analyses that read its layers, and the checkpoints it refuses in one line. Its logits
against the independent reference, and greedy decoding through the cache, are the parity suite's
(tests/test_parity.py); vLLM's half is tests/test_phi4flash_vllm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import changed_checkpoint, run_cli_in_process
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.models.variants import registry
from diffeval.models.variants.base import DIFF_ATTENTION, GATED_MEMORY, STATE_SPACE
from diffeval.models.variants.phi4flash.modeling import Phi4FlashConfig
from diffeval.models.variants.phi4flash.record import PHI4FLASH

pytestmark = pytest.mark.transformers_floor  # its cache and forward touch transformers' internals


@pytest.fixture(scope="module")
def flash(variant_checkpoint) -> dict[str, Path]:
    return {shape: variant_checkpoint(f"phi4flash-{shape}") for shape in PHI4FLASH.fixture_shapes}


def _pattern(config) -> list[str]:
    """Each layer as a letter: M Mamba, S sliding DIFF, F full DIFF (own KV), X cross DIFF, G gated memory."""
    letters = []
    for layer in registry.layers_of(config):
        if layer.mixer == STATE_SPACE:
            letters.append("M")
        elif layer.mixer == GATED_MEMORY:
            letters.append("G")
        else:
            assert layer.mixer == DIFF_ATTENTION
            letters.append("X" if layer.kv_from is not None else "S" if layer.window else "F")
    return letters


@pytest.mark.parametrize(
    ("layers", "pattern"),
    [
        (4, "MSMF"),
        (8, "MSMSMFGX"),
        (12, "MSMSMSMFGXGX"),
        (32, "MS" * 8 + "MF" + "GX" * 7),  # Phi-4-mini-flash-reasoning
    ],
)
def test_the_layer_rule_is_read_from_the_config(layers, pattern):
    config = Phi4FlashConfig(num_hidden_layers=layers, hidden_size=128, num_attention_heads=4, num_key_value_heads=2)
    config.architectures = ["Phi4FlashForCausalLM"]
    assert "".join(_pattern(config)) == pattern
    kinds = registry.layers_of(config)
    memory, shared = layers // 2, layers // 2 + 1
    assert {layer.memory_from for layer in kinds if layer.mixer == GATED_MEMORY} <= {memory}
    assert {layer.kv_from for layer in kinds if layer.kv_from is not None} <= {shared}
    assert kinds[shared].window is None and kinds[shared].kv_from is None


def test_no_layer_from_the_kv_layer_on_slides_whatever_the_config_says():
    """Every source turns the window off from layer L/2 on: a per-layer list or `layer_types` that puts one there
    leaves the KV layer (whose cache the cross-decoder reads) and the cross-decoder full."""
    kinds = ["full_attention", "sliding_attention"] * 4
    for keys in ({"sliding_window": [None, 16] * 4}, {"sliding_window": 16, "layer_types": kinds}):
        config = Phi4FlashConfig(num_hidden_layers=8, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                 **keys)  # fmt: skip
        assert [layer.window for layer in registry.layers_of(config)] == [None, 16, None, 16] + [None] * 4


def test_a_per_layer_sliding_window_list_and_layer_types_are_read():
    """What the remote configuration class saves (a list of windows) and a `layer_types` list both say which layers
    slide."""
    listed = Phi4FlashConfig(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                             sliding_window=[None, 16, None, None])  # fmt: skip
    assert [layer.window for layer in registry.layers_of(listed)] == [None, 16, None, None]
    kinds = ["mamba", "full_attention", "mamba", "full_attention"]
    typed = Phi4FlashConfig(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                            sliding_window=16, layer_types=kinds)  # fmt: skip
    assert [layer.window for layer in registry.layers_of(typed)] == [None] * 4


def test_the_cache_holds_windows_states_and_one_shared_kv(flash):
    """After a prompt: a full layer keeps every position, a sliding layer the last w − 1, a cross layer nothing (it
    reads layer L/2 + 1's), a Mamba layer its convolution inputs and SSM state; a snapshot brings all of it back."""
    loaded = load_model(ModelSpec("f", str(flash["12-layers"])), "cpu", "float32")
    model, config = loaded.model, loaded.model.config
    ids = torch.randint(3, config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        cache = getattr(out, HFBackend(loaded)._cache)
        kinds = registry.layers_of(config)
        inner = config.mamba_expand * config.hidden_size
        for index, layer in enumerate(kinds):
            if layer.mixer == STATE_SPACE:
                assert cache.conv[index].shape == (1, inner, config.mamba_d_conv - 1)
                assert cache.ssm[index].shape == (1, inner, config.mamba_d_state)
            elif layer.cached_kv:
                kept = 30 if layer.window is None else layer.window - 1
                assert cache.keys[index].shape == (1, config.num_key_value_heads, kept, config.head_dim)
            else:
                assert index not in cache.keys and index not in cache.ssm
        mark = cache.snapshot()
        first = model(input_ids=ids[:, :3], cache=cache, use_cache=True).logits
        cache.restore(mark)
        again = model(input_ids=ids[:, :3], cache=cache, use_cache=True).logits
    torch.testing.assert_close(again, first, atol=0, rtol=0)


def test_choice_scores_with_prefix_reuse_equal_full_sequences(flash):
    """Scoring reuses the prefix's cache through snapshots (a Mamba state cannot be cropped): every query and choice
    scores as it does over its whole sequence."""
    backend = HFBackend(load_model(ModelSpec("f", str(flash["8-layers"])), "cpu", "float32"))
    prefix = backend.encode("Question: which city has the number? Answer with the city.").ids
    queries = [backend.encode(" Lisbon or Paris?", False).ids, backend.encode(" Rome", False).ids]
    choices = [[backend.encode(" Lisbon", False).ids, backend.encode(" Paris and more", False).ids]] * 2
    reused = list(backend.score_choices(prefix, queries, choices))
    naive = list(backend.score_choices(prefix, queries, choices, reuse=False))
    assert len(prefix) > 8  # past the fixture's window, so the sliding layers' snapshot matters
    for got, expected in zip(reused, naive):
        for (score, count), (expected_score, expected_count) in zip(got, expected):
            assert count == expected_count and score == pytest.approx(expected_score, abs=1e-4)


def test_the_attention_analysis_reads_the_full_and_cross_layers(flash, tmp_path):
    """The sliding layers see only their window: the analysis reads layers L/2 + 1 and the cross-decoder's, and
    names the sliding, Mamba and gated-memory layers it skipped."""
    result = run_cli_in_process("run", "attention", "-m", f"flash={flash['8-layers']}", "--ctx", "512", "--depths",
                                "50", "--samples", "1", "--out", str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert record["skipped_layers"] == {
        "0": "state-space mixer", "1": "DIFF attention (V1), sliding 8", "2": "state-space mixer",
        "3": "DIFF attention (V1), sliding 8", "4": "state-space mixer", "6": "gated memory, gates layer 4's output",
    }  # fmt: skip
    assert len(record["shares"]["diff"]["answer"]) == 2  # layers 5 and 7
    table = (tmp_path / "run" / "table.md").read_text()
    assert "layers 1, 3 skipped: DIFF attention (V1), sliding 8" in table


def test_quantized_logits_and_logit_statistics_cover_every_diff_layer(flash):
    from diffeval.models.activations import logit_statistics, quantized_logits

    model = load_model(ModelSpec("f", str(flash["8-layers"])), "cpu", "float32").model
    ids = torch.randint(3, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        reference = model(input_ids=ids).logits
        with quantized_logits(model, 16):
            unquantized = model(input_ids=ids).logits
        with quantized_logits(model, 4):
            coarse = model(input_ids=ids).logits
        with logit_statistics(model) as stats:
            model(input_ids=ids)
    torch.testing.assert_close(unquantized, reference, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(coarse, reference, atol=1e-4)
    assert sorted(stats) == [1, 3, 5, 7]  # sliding, full and cross DIFF layers; no Mamba or gated memory layer


def test_inspect_shows_the_layer_pattern_and_lambda_of_each_diff_layer(flash):
    """`models inspect` prints the runs of `layer_runs` (its pattern table) and λ_init and λ of each DIFF layer."""
    from diffeval.models.layer_kinds import cache_text, kinds, layer_runs

    info = load_model(ModelSpec("f", str(flash["8-layers"])), "cpu", "float32").info
    runs = [(span, layer.describe(), cache_text(layer)) for span, layer in layer_runs(kinds(info))]
    assert runs[1:] == [
        ("layer 1", "DIFF attention (V1), sliding 8", "2 K,V sets per token"),
        ("layer 2", "state-space mixer", runs[0][2]),
        ("layer 3", "DIFF attention (V1), sliding 8", "2 K,V sets per token"),
        ("layer 4", "state-space mixer", runs[0][2]),
        ("layer 5", "DIFF attention (V1), full", "2 K,V sets per token"),
        ("layer 6", "gated memory, gates layer 4's output", "none"),
        ("layer 7", "DIFF attention (V1), full, reuses layer 5's KV", "none: reads layer 5's"),
    ]
    assert runs[0][:2] == ("layer 0", "state-space mixer") and runs[0][2].startswith("state: ")
    assert [row["layer"] for row in info.lambdas] == [1, 3, 5, 7]
    result = run_cli_in_process("models", "inspect", str(flash["8-layers"]))
    assert result.returncode == 0, result.stderr
    cells = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.count("│") == 4]
    assert [cell for cell in cells if cell.isdigit()] == ["1", "3", "5", "7"]  # the λ table's rows


def _refusal(folder: Path, out: Path) -> str:
    result = run_cli_in_process("run", "needle", "-m", f"flash={folder}", "--ctx", "512", "--depths", "50",
                                "--samples", "1", "--out", str(out))  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert not out.exists()
    return lines[0]


LAMBDA = "model.layers.3.attn.inner_cross_attn"  # a sliding layer's λ and subln


def _shrink(name: str):
    def change(weights: dict) -> None:
        weights[name] = weights[name][:-1]

    return change


@pytest.mark.parametrize(
    ("config", "tensors", "expected"),
    [
        ({"num_hidden_layers": 6}, None, "num_hidden_layers 6 with mb_per_layer 2 gives no SambaY layer pattern"),
        ({"mb_per_layer": 4}, None, "it needs mb_per_layer 2 and a multiple of 4 layers"),
        ({"mb_per_layer": 0}, None, "gives no SambaY layer pattern"),
        ({"sliding_window": 0}, None, "sliding_window 0: a window holds at least one token"),
        ({"num_key_value_heads": 1}, None, "must be even"),
        ({"auto_map": {"AutoModelForCausalLM": "modeling_sambay.SambaYForCausalLM"}}, None,
         "an architecture diffeval does not implement"),
        ({"mamba_dt_rank": "full"}, None, "mamba_dt_rank is 'full'"),
        (None, lambda w: w.pop("model.layers.2.attn.A_log"), "missing model.layers.2.attn.A_log"),
        (None, lambda w: w.pop("model.layers.6.attn.in_proj.weight"), "missing model.layers.6.attn.in_proj.weight"),
        (None, lambda w: w.pop(f"{LAMBDA}.lambda_q2"), f"missing {LAMBDA}.lambda_q2"),
        (None, _shrink(f"{LAMBDA}.lambda_k1"), f"misshapen {LAMBDA}.lambda_k1"),
        (None, _shrink("model.layers.0.attn.D"), "misshapen model.layers.0.attn.D"),
    ],
)  # fmt: skip
def test_checkpoints_diffeval_cannot_run_exactly_are_one_line(flash, tmp_path, config, tensors, expected):
    folder = changed_checkpoint(flash["8-layers"], tmp_path / "changed", tensors=tensors, config=config)
    line = _refusal(folder, tmp_path / "run")
    assert expected in line and "model flash" in line


def test_the_published_auto_map_loads_diffeval_s_class_without_remote_code(flash, tmp_path):
    """The published config names its remote code in `auto_map`; without --trust-remote-code diffeval's class loads,
    and the remote files are never looked for."""
    auto_map = {"AutoConfig": "configuration_phi4flash.Phi4FlashConfig",
                "AutoModelForCausalLM": "modeling_phi4flash.Phi4FlashForCausalLM"}  # fmt: skip
    folder = changed_checkpoint(flash["8-layers"], tmp_path / "published", config={"auto_map": auto_map})
    loaded = load_model(ModelSpec("f", str(folder)), "cpu", "float32")
    assert type(loaded.model).__module__ == "diffeval.models.variants.phi4flash.modeling"
    assert loaded.info.is_diff and loaded.info.diff_variant == "phi4flash"


PARITY_BOUND = 1e-4  # issue 50's: fp32 against the float64 reference, measured up to 3.4e-5 (tests/test_parity.py)


def _gap(folder: Path, ids: torch.Tensor, **broken) -> float:
    from phi4flash_reference import reference_logits

    model = load_model(ModelSpec("f", str(folder)), "cpu", "float32").model
    with torch.inference_mode():
        ours = model(input_ids=ids).logits.double()
    return (ours - reference_logits(folder, ids, **broken)).abs().max().item()


@pytest.mark.parametrize(
    "broken",
    [{"kv_source_layer": 1}, {"kv_source_layer": 3}, {"lambda_init_offset": 1}, {"ignore_sliding_window": True}],
    ids=["kv-from-layer-1", "kv-from-layer-3", "lambda-init-index", "no-sliding-window"],
)
def test_each_wrong_rule_fails_the_comparison(flash, broken):
    """The comparison tells the rules apart: the reference with the cross-decoder reading another layer's KV, λ_init
    from the next layer's index, or its window ignored, is far from diffeval's model (the true one is within
    PARITY_BOUND, tests/test_parity.py)."""
    ids = torch.randint(3, 400, (1, 40), generator=torch.Generator().manual_seed(3))  # longer than the window of 8
    assert _gap(flash["12-layers"], ids) <= PARITY_BOUND
    assert _gap(flash["12-layers"], ids, **broken) > 100 * PARITY_BOUND


def test_the_fixture_saves_the_published_layout_and_a_published_checkpoint_loads(flash, tiny_models, tmp_path):
    """The reference's writer lays a checkpoint out as the published one (its tensor names, an `auto_map`, no Mamba
    keys in config.json): diffeval's fixture holds the same tensors, and diffeval loads the writer's checkpoint with
    the remote configuration class's defaults and matches the reference on it, and its greedy tokens."""
    from phi4flash_reference import reference_greedy, write_checkpoint

    same = write_checkpoint(tmp_path / "same", num_hidden_layers=8, tokenizer_dir=tiny_models["tok_a"])
    ours = load_file(flash["8-layers"] / "model.safetensors")
    published = {name: tuple(t.shape) for name, t in load_file(same / "model.safetensors").items()}
    assert {name: tuple(t.shape) for name, t in ours.items() if name in published} == published
    assert set(ours) - set(published) <= {"lm_head.weight"}  # diffeval writes a tied head only where it is untied
    defaults = dict(mb_per_layer=None, mamba_d_state=None, mamba_d_conv=None, mamba_expand=None)
    written = write_checkpoint(tmp_path / "published", num_hidden_layers=8, tokenizer_dir=tiny_models["tok_a"],
                               seed=5, **defaults)  # fmt: skip
    config = json.loads((written / "config.json").read_text())
    assert "mamba_d_state" not in config and "auto_map" in config
    ids = torch.randint(3, 400, (2, 32), generator=torch.Generator().manual_seed(4))
    assert _gap(written, ids) <= PARITY_BOUND
    backend = HFBackend(load_model(ModelSpec("f", str(written)), "cpu", "float32"))
    prompt = ids[0, :20].tolist()
    assert backend.generate([prompt], 6, [])[0].new_tokens == 6
    with torch.inference_mode():
        generated = backend.model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
    assert generated[0, 20:].tolist() == reference_greedy(written, prompt, 6)


def test_the_tiny_pair_runs_the_needle_and_pairs_diff_against_its_baseline(flash, tiny_models, tmp_path):
    """The public pair in small (Phi-4-mini-flash's layout and Phi-4-mini's, one tokenizer) through the command line:
    run.json names the DIFF variant and the baseline, and the report pairs them on the same samples."""
    import pandas as pd

    from diffeval.models.variants.phi4flash.fixture import build_phi4_mini

    mini = build_phi4_mini(tiny_models["tok_a"], tmp_path / "mini")
    out = tmp_path / "pair"
    result = run_cli_in_process("run", "needle", "-m", f"flash={flash['8-layers']}", "-m", f"mini={mini}", "--ctx",
                                "512", "--depths", "0,50", "--samples", "2", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    models = json.loads((out / "run.json").read_text())["models"]
    assert models["flash"]["diff_variant"] == "phi4flash" and models["flash"]["is_diff"]
    assert not models["mini"]["is_diff"]
    paired = pd.read_csv(out / "paired.csv")
    assert set(zip(paired["diff"], paired["baseline"])) == {("flash", "mini")} and (paired["n"] == 4).all()


def test_outliers_read_every_diff_layer_and_every_hidden_state(flash, tmp_path):
    result = run_cli_in_process("run", "outliers", "-m", f"flash={flash['8-layers']}", "--ctx", "512", "--limit", "1",
                                "--out", str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert sorted(record["attention_logits"], key=int) == ["1", "3", "5", "7"]  # sliding, full and cross DIFF layers
    assert len(record["hidden_states"]) == 8
    assert record["skipped_layers"] == {
        "0": "state-space mixer", "2": "state-space mixer", "4": "state-space mixer",
        "6": "gated memory, gates layer 4's output",
    }  # fmt: skip


def test_the_cache_keyword_follows_the_forward_and_transformers_for_a_model_taking_both():
    """A remote model's forward that takes only `past_key_values` gets it on every transformers; one that takes both
    (diffeval's Phi-4-mini-flash) gets the name transformers' outputs use."""
    import dataclasses

    from transformers.modeling_outputs import CausalLMOutputWithPast

    from diffeval.models.engines.hf import cache_keyword

    def older(input_ids=None, past_key_values=None): ...

    def newer(input_ids=None, cache=None): ...

    def both(input_ids=None, cache=None, past_key_values=None): ...

    assert cache_keyword(older) == "past_key_values" and cache_keyword(newer) == "cache"
    outputs = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
    assert cache_keyword(both) == ("cache" if "cache" in outputs else "past_key_values")
