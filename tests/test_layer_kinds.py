"""Every decoder layer's kind: what `layers_of` says of each variant, of baselines and of a hybrid (a tiny Jamba:
Mamba and attention layers), what `models inspect` prints, the cache vLLM's plan counts per layer, and the analyses
reading only the layers that attend and saying which they skipped."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DiffLlamaConfig,
    Gemma3TextConfig,
    JambaConfig,
    LlamaConfig,
    MistralConfig,
)

from conftest import run_cli_in_process
from diffeval.errors import InputError
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.layer_kinds import (
    analysed_layers,
    analysis_layers,
    format_layers,
    layer_runs,
    sequence_cache_bytes,
    skipped_note,
)
from diffeval.models.spec import ModelSpec
from diffeval.models.variants.base import ATTENTION, DIFF_ATTENTION, GATED_MEMORY, STATE_SPACE, Layer
from diffeval.models.variants.diffllama2.modeling import DiffLlama2Config
from diffeval.models.variants.motif.modeling import MotifConfig
from diffeval.models.variants.registry import layers_of
from diffeval.tasks.analyses import attention
from diffeval.tasks.analyses.attention import AttentionOptions
from diffeval.tasks.analyses.shares import sample_view
from diffeval.tasks.haystack import needle
from diffeval.tasks.internals import outliers
from diffeval.tasks.internals.outliers import OutliersOptions

MAMBA = "state-space mixer"  # how a Mamba layer describes itself in records, notes and `models inspect`


def _described(config) -> list[str]:
    return [layer.describe() for layer in layers_of(config)]


def test_the_analyses_read_whole_context_layers_unless_every_layer_slides():
    """A model with sliding and full layers (Phi-4-mini-flash) is read at its full ones, a cross layer included; one
    whose every attending layer slides (a Mistral) at all of them."""
    sliding, full = Layer(DIFF_ATTENTION, window=8), Layer(DIFF_ATTENTION)
    cross, mamba = Layer(DIFF_ATTENTION, kv_from=3), Layer(STATE_SPACE, state_elements=10)
    assert analysis_layers([mamba, sliding, mamba, full, Layer(GATED_MEMORY, memory_from=2), cross]) == [3, 5]
    assert analysis_layers([Layer(ATTENTION, window=4096)] * 3) == [0, 1, 2]
    assert analysis_layers([mamba, Layer(ATTENTION)]) == [1]


def test_every_variant_describes_its_layers():
    small = dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    v1 = layers_of(DiffLlamaConfig(**small))
    assert v1 == (Layer(DIFF_ATTENTION, diff_form="V1", kv_caches=2),) * 3
    assert _described(DiffLlama2Config(**small)) == ["DIFF attention (V2), full"] * 3
    assert [layer.cached_kv for layer in layers_of(DiffLlama2Config(**small))] == [1, 1, 1]
    dense = layers_of(MotifConfig(**small))
    assert [(layer.diff_form, layer.cached_kv) for layer in dense] == [("V1", 2)] * 3
    grouped = MotifConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=10, num_key_value_heads=4, num_noise_heads=2,
        head_dim=16,
    )  # fmt: skip
    assert _described(grouped) == ["DIFF attention (grouped), full"] * 2


def test_baselines_describe_full_and_sliding_attention():
    assert _described(LlamaConfig(num_hidden_layers=2)) == ["attention, full"] * 2
    # Mistral's sliding_window holds for every layer
    assert _described(MistralConfig(num_hidden_layers=2, sliding_window=16)) == ["attention, sliding 16"] * 2
    kinds = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    gemma = Gemma3TextConfig(num_hidden_layers=4, sliding_window=32, layer_types=kinds)
    assert _described(gemma) == ["attention, sliding 32"] * 2 + ["attention, full", "attention, sliding 32"]


def test_a_jamba_config_has_mamba_layers_with_their_state():
    config = JambaConfig(
        num_hidden_layers=6, hidden_size=64, attn_layer_period=3, attn_layer_offset=2, mamba_d_state=8,
        mamba_d_conv=4, mamba_expand=2,
    )  # fmt: skip
    assert _described(config) == [MAMBA, MAMBA, "attention, full"] * 2
    # vLLM's Mamba-1 state per sequence: the conv's last d_conv − 1 inputs and the SSM state, over 2 × 64 channels
    assert [layer.state_elements for layer in layers_of(config)] == [128 * 3 + 128 * 8] * 2 + [0] + [1408] * 2 + [0]
    assert [layer.cached_kv for layer in layers_of(config)] == [0, 0, 1, 0, 0, 1]


def test_mamba_state_matches_the_real_mixer(tiny_jamba):
    """The state the registry counts is the model's own: its conv's width less one, and A's (d_inner, d_state)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_jamba)
    mixer = model.model.layers[0].mamba
    inner, _, width = mixer.conv1d.weight.shape
    assert layers_of(model.config)[0].state_elements == inner * (width - 1) + mixer.A_log.numel()
    assert not hasattr(model.model.layers[0], "self_attn") and hasattr(model.model.layers[1], "self_attn")


def test_the_cache_plan_counts_each_layer_by_its_kind():
    """One sequence's bytes: K and V per set a layer keeps (two for a V1 layer, none for a Mamba layer or one that
    reads another layer's KV, none for a gated memory), plus each Mamba layer's state once per sequence."""
    v1 = Layer(DIFF_ATTENTION, diff_form="V1", kv_caches=2)
    mamba = Layer(STATE_SPACE, state_elements=1000)
    reused = Layer(ATTENTION, kv_from=0)
    memory = Layer(GATED_MEMORY)
    kv_heads, head_dim, width, tokens = 2, 8, 4, 100
    per_set = 2 * kv_heads * head_dim * width  # K and V of one set, one token
    assert sequence_cache_bytes([v1], tokens, kv_heads, head_dim, width) == 2 * per_set * tokens
    assert sequence_cache_bytes([mamba], tokens, kv_heads, head_dim, width) == 1000 * width
    assert sequence_cache_bytes([reused, memory], tokens, kv_heads, head_dim, width) == 0
    mixed = [v1, mamba, reused, Layer(ATTENTION), mamba]
    assert sequence_cache_bytes(mixed, tokens, kv_heads, head_dim, width) == 3 * per_set * tokens + 2000 * width


def test_layers_are_named_in_runs():
    assert format_layers([4]) == "layer 4"
    assert format_layers([2, 0]) == "layers 0, 2"
    assert format_layers([0, 1, 2, 3, 5, 6, 9]) == "layers 0–3, 5–6, 9"
    v1 = Layer(DIFF_ATTENTION, diff_form="V1", kv_caches=2)
    runs = layer_runs([v1, v1, Layer(STATE_SPACE), v1])
    assert [(span, layer.describe()) for span, layer in runs] == [
        ("layers 0–1", "DIFF attention (V1), full"),
        ("layer 2", MAMBA),
        ("layer 3", "DIFF attention (V1), full"),
    ]
    skipped = {"0": MAMBA, "2": MAMBA, "5": GATED_MEMORY}
    assert skipped_note({"j": skipped, "base": {}}) == (
        "model j: layers 0, 2 skipped: state-space mixer; layer 5 skipped: gated memory"
    )
    assert skipped_note({"base": {}}) is None
    assert analysed_layers(3, skipped) == [1, 3, 4] and analysed_layers(2, {}) == [0, 1]


def test_models_inspect_prints_every_layers_kind(tiny_models, tiny_jamba):
    diff = run_cli_in_process("models", "inspect", str(tiny_models["diff"]))
    assert diff.returncode == 0, diff.stderr
    assert "layers 0–1 │ DIFF attention (V1), full │ 2 K,V sets per token" in diff.stdout
    jamba = run_cli_in_process("models", "inspect", str(tiny_jamba))
    assert jamba.returncode == 0, jamba.stderr
    lines = [line for line in jamba.stdout.splitlines() if re.match(r"│ layers? \d", line)]  # the pattern's rows
    rows = [line.strip("│ ").split(" │ ") for line in lines]
    mamba_row = ["state-space mixer", "state: 1,408 elements per sequence"]
    attention_row = ["attention, full", "1 K,V set per token"]
    assert [[cell.strip() for cell in row] for row in rows] == [
        ["layer 0", *mamba_row], ["layer 1", *attention_row], ["layer 2", *mamba_row], ["layer 3", *attention_row],
    ]  # fmt: skip


@pytest.fixture(scope="module")
def jamba(tiny_jamba):
    return HFBackend(load_model(ModelSpec("j", str(tiny_jamba)), "cpu"))


def _context(options):
    return SimpleNamespace(options=options, max_new_tokens=32, chat_template=False, seed=0, limit=None)


def test_the_attention_analysis_reads_a_jambas_attention_layers_only(jamba, tiny_jamba):
    """Its record holds its two attention layers' shares, equal to the eager maps of those layers, and names the
    Mamba layers it skipped."""
    sample = needle.make_sample(0, 512, 50, 2, 1, 0)
    [record] = [r.to_dict() for r in attention.evaluate([sample], jamba, _context(AttentionOptions()))]
    assert record["skipped_layers"] == {"0": MAMBA, "2": MAMBA}
    prompt = needle.build_prompt(sample, jamba, 512 - 32, False)  # the analysis's prompt (test_attention.py)
    ids = list(prompt.ids)
    segments = torch.tensor(attention.segment_ids(prompt, len(ids), 1, "answer"))
    eager = AutoModelForCausalLM.from_pretrained(tiny_jamba, attn_implementation="eager")
    with torch.no_grad():
        maps = eager(torch.tensor([ids]), output_attentions=True).attentions  # its attention layers' only
    assert len(maps) == 2
    last = [m[0][:, -1] for m in maps]  # (H, T) per attention layer
    expected = [float(row[:, segments == 0].sum(-1).mean()) for row in last]  # the answer segment
    assert record["shares"]["softmax"]["answer"] == pytest.approx(expected, abs=1e-5)


def test_a_kind_the_capture_contradicts_is_refused(jamba, monkeypatch):
    """Where the layer kinds say a layer attends but its attention never went through the interface, the analysis
    refuses rather than label the captured layers wrongly."""
    every_layer = [asdict(Layer(ATTENTION))] * 4
    monkeypatch.setattr(jamba, "info", replace(jamba.info, layer_kinds=every_layer))
    with pytest.raises(InputError, match="saw attention in layers 1, 3 .* say layers 0–3 attend"):
        jamba.attention_rows([0, 5, 6, 7], [3], [0, 1, 1, 1], 2)


def test_outliers_read_a_jambas_attention_logits_and_say_which_layers_have_none(jamba):
    options = OutliersOptions(ctx=[128], tokens=128)
    records = [r.to_dict() for r in outliers.evaluate(outliers.make_samples(options, 0), jamba, _context(options))]
    [record] = records
    assert set(record["attention_logits"]) == {"1", "3"} and set(record["hidden_states"]) == {"0", "1", "2", "3"}
    assert record["skipped_layers"] == {"0": MAMBA, "2": MAMBA}
    import pandas as pd

    tables = outliers.tables(pd.DataFrame(records), options)
    note = "attention logits: model j: layers 0, 2 skipped: state-space mixer"
    assert tables["table5"].attrs["note"] == note and tables["outliers_per_layer"].attrs["note"] == note
    assert "note" not in tables["outlier_tokens"].attrs
    logit_layers = tables["outliers_per_layer"].xs("attention logits", level="activation").index
    assert list(logit_layers.get_level_values("layer")) == [1, 3]


def test_quantized_logits_reach_a_jambas_attention_layers_only(tiny_jamba):
    """16 bits leave a Jamba's output as it is; 4 bits change it; only its attention layers pass through."""
    from diffeval.models.activations import quantized_logits

    model = AutoModelForCausalLM.from_pretrained(tiny_jamba, attn_implementation="sdpa").eval()
    ids = torch.randint(3, 300, (1, 40))
    with torch.no_grad():
        plain = model(ids).logits
        with quantized_logits(model, 16) as quantized:
            same = model(ids).logits
        assert quantized == {1, 3}
        with quantized_logits(model, 2):
            coarse = model(ids).logits
    torch.testing.assert_close(same, plain, atol=1e-5, rtol=1e-5)
    assert not torch.equal(coarse, plain)


@pytest.mark.slow  # loads two models through the command line
def test_a_hybrid_beside_a_llama_in_the_attention_tables(tiny_models, tiny_jamba, tmp_path):
    """The per-layer table is indexed by decoder layer: the Llama's layers 0 and 1, the Jamba's 1 and 3; every table
    names the Jamba's Mamba layers; the Llama's records hold no `skipped_layers`."""
    out = tmp_path / "attention"
    models = ["-m", f"j={tiny_jamba}", "-m", f"base={tiny_models['base_a']}"]
    result = run_cli_in_process("run", "attention", *models, "--ctx", "1k", "--depths", "50", "--samples", "1",
                                "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = {r["model"]: r for r in map(json.loads, (out / "samples.jsonl").read_text().splitlines())}
    assert "skipped_layers" not in records["base"] and records["j"]["skipped_layers"] == {"0": MAMBA, "2": MAMBA}
    table = (out / "table.md").read_text()
    assert table.count("_model j: layers 0, 2 skipped: state-space mixer_") == 4  # Table 3 ×2, segments, per layer
    per_layer = (out / "per_layer.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in per_layer] == ["layer", "0", "1", "3"]
    assert per_layer[1].split(",")[1] == ""  # the Jamba's layer 0 has no attention
    [section] = sample_view(None, {"j": records["j"]}, None, None).to_json()["blocks"]  # `diffeval view`'s charts
    assert section["title"].endswith("; layers 0, 2 skipped: state-space mixer")
    assert section["blocks"][0]["categories"] == ["L1", "L3"]


def test_a_model_without_attention_layers_is_refused_in_one_line(tiny_models, tmp_path):
    """A Mamba model has no attention logits: outliers refuses it before any model loads."""
    from transformers import MambaConfig, MambaForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_models["tok_a"])
    config = MambaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, state_size=4)
    MambaForCausalLM(config).save_pretrained(tmp_path / "mamba")
    tokenizer.save_pretrained(tmp_path / "mamba")
    result = run_cli_in_process("run", "outliers", "-m", f"m={tmp_path / 'mamba'}", "--ctx", "128", "--tokens", "128",
                                "--out", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: model m has no attention layer (layers 0–1: {MAMBA}): outliers reads")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out" / "samples.jsonl").exists()


@pytest.mark.slow  # lm-eval's start and two zero-shot runs
def test_quantize_on_a_jamba_says_which_layers_have_no_logits(tiny_jamba, lm_tasks, tmp_path):
    out = tmp_path / "q"
    result = run_cli_in_process("run", "quantize", "-m", f"j={tiny_jamba}", "--tasks", "hellaswag_local", "--bits",
                                "16,4", "--include-path", str(lm_tasks), "--ctx", "512", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["skipped_layers"] for r in records] == [{"0": MAMBA, "2": MAMBA}] * 2
    note = "_quantized attention logits: model j: layers 0, 2 skipped: state-space mixer_"
    assert (out / "table.md").read_text().count(note) == 2  # both Figure 8 tables
