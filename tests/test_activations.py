"""Outliers, quantized attention logits and lm-eval zero-shot on local task YAMLs (paper Table 5, Figure 8, Table 1)."""

import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from conftest import pair_options, run_cli
from diffeval.models.activations import (
    RunningStats,
    histogram_median,
    quantize_absmax,
    quantized_attention,
    quantized_logits,
    relative_median_error,
)
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.tasks.internals import outliers
from diffeval.tasks.internals.outliers import OutliersOptions

pytest.importorskip("lm_eval", reason="lm-eval is an optional extra: pip install 'diffeval[lmeval]'")


@pytest.mark.parametrize("granularity", ["tensor", "head", "row"])
@pytest.mark.parametrize("bits", [8, 6, 4])
def test_quantization_moves_each_logit_at_most_half_a_step(bits, granularity):
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 16, 16) * 30
    valid = torch.ones(1, 1, 16, 16, dtype=torch.bool).tril()
    quantized = quantize_absmax(logits, bits, granularity, valid)
    levels = 2 ** (bits - 1) - 1
    dims = {"tensor": (1, 2, 3), "head": (2, 3), "row": (3,)}[granularity]
    step = logits.abs().masked_fill(~valid, 0).amax(dim=dims, keepdim=True) / levels
    inside = valid.expand_as(logits)
    assert ((quantized - logits).abs() <= step / 2 + 1e-4)[inside].all()
    for row in quantized.reshape(-1, 16):
        assert row.unique().numel() <= 2**bits
    assert torch.equal(quantize_absmax(logits, 16, granularity), logits)


def test_registered_function_applies_the_causal_mask_when_given_none():
    torch.manual_seed(0)
    query, key, value = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    module = SimpleNamespace(layer_idx=0)
    _, weights = quantized_attention(module, query, key, value, None, scaling=8**-0.5)
    assert torch.all(weights.triu(diagonal=1) == 0) and torch.allclose(weights.sum(-1), torch.ones(1, 2, 6))


@pytest.mark.parametrize("name", ["diff", "base_a"])
def test_16_bits_matches_eager_and_low_bits_stay_causal(tiny_models, name):
    eager = AutoModelForCausalLM.from_pretrained(tiny_models[name], attn_implementation="eager").eval()
    model = AutoModelForCausalLM.from_pretrained(tiny_models[name], attn_implementation="sdpa").eval()
    ids = torch.randint(3, 300, (1, 40))
    with torch.no_grad():
        reference = eager(ids).logits
        with quantized_logits(model, 16):
            assert torch.allclose(model(ids).logits, reference, atol=1e-5)
        with quantized_logits(model, 4, "row"):
            low = model(ids).logits
            changed = ids.clone()
            changed[0, 30:] = 5
            assert torch.allclose(model(changed).logits[0, :30], low[0, :30], atol=1e-6)  # the future is masked
    assert model.config._attn_implementation == "sdpa"  # restored


def test_outlier_statistics_match_brute_force(tiny_models):
    backend = HFBackend(load_model(ModelSpec("diff", str(tiny_models["diff"])), "cpu"))
    config = SimpleNamespace(options=OutliersOptions(ctx=[96], tokens=192), seed=0)
    samples = outliers.make_samples(config.options, 0)
    records = [r.to_dict() for r in outliers.evaluate(samples, backend, config)]
    assert len(records) == 2 and all(r["prompt_tokens"] == 96 for r in records)
    # brute force: the post-RoPE queries and keys of every layer, full T×T causal logits, sorted
    captured = {}

    def keep(module, query, key, value, attention_mask, **kwargs):
        captured.setdefault(module.layer_idx, (query[0].clone(), key[0].clone(), kwargs["scaling"]))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("test_keep", keep)
    AttentionMaskInterface.register("test_keep", sdpa_mask)
    stream = outliers._token_stream(backend, "noise", 0, 192)
    all_logits, all_hidden = [], []
    backend.model.set_attn_implementation("test_keep")
    for sample in samples:
        captured.clear()
        body = stream[sample.index * 96 : (sample.index + 1) * 96 - 1]
        with torch.no_grad():
            out = backend.model.get_decoder()(input_ids=torch.tensor([[0] + body]), output_hidden_states=True)
        for query, key, scaling in captured.values():
            key = key.repeat_interleave(query.shape[0] // key.shape[0], dim=0)
            logits = query @ key.transpose(1, 2) * scaling
            all_logits.append(logits[:, torch.ones(96, 96, dtype=torch.bool).tril()].abs().flatten())
        all_hidden.extend(h.abs().flatten() for h in out.hidden_states[1:])
    backend.model.set_attn_implementation("sdpa")
    frame = pd.DataFrame.from_records(records)
    table = outliers.tables(frame, outliers.OutliersOptions())["table5"]
    for label, values in (("attention logits", torch.cat(all_logits)), ("hidden states", torch.cat(all_hidden))):
        ordered = values.sort(descending=True).values
        for k in outliers.RANKS:
            assert table.loc[("diff", label), f"top-{k}"] == pytest.approx(float(ordered[k - 1]), abs=1e-4)
        median = float(values.median())
        assert table.loc[("diff", label), "median"] == pytest.approx(median, rel=relative_median_error() + 1e-3)


def test_running_stats_memory_does_not_grow():
    stats = RunningStats()
    for _ in range(20):
        stats.add(torch.randn(10_000))
    assert stats.top.numel() == 100 and stats.hist.numel() == 10_000 and stats.count == 200_000
    assert histogram_median(stats.hist) == pytest.approx(0.6745, rel=0.02)  # median |N(0,1)|


@pytest.mark.slow
def test_quantize_and_zeroshot_through_lm_eval(tiny_models, lm_tasks, tmp_path):
    models = ["-m", f"diff={tiny_models['diff']}", "-m", f"base={tiny_models['base']}"]
    quant = run_cli(
        "run",
        "quantize",
        *models,
        "--tasks",
        "hellaswag_local",
        "--bits",
        "16,4",
        "--include-path",
        str(lm_tasks),
        "--ctx",
        "512",
        "--out",
        str(tmp_path / "q"),
    )
    assert quant.returncode == 0, quant.stderr
    records = [json.loads(line) for line in (tmp_path / "q" / "samples.jsonl").read_text().splitlines()]
    assert sorted((r["model"], r["bits"]) for r in records) == [("base", 4), ("base", 16), ("diff", 4), ("diff", 16)]
    assert all(0 <= r["acc"] <= 1 and 0 <= r["acc_norm"] <= 1 for r in records)
    assert (tmp_path / "q" / "quantize_accuracy_vs_bits.png").is_file()
    assert "Figure 8" in (tmp_path / "q" / "table.md").read_text()
    zero = run_cli(
        "run",
        "zeroshot",
        *models,
        "--tasks",
        "hellaswag_local,arc_local",
        "--include-path",
        str(lm_tasks),
        "--ctx",
        "512",
        "--out",
        str(tmp_path / "z"),
    )
    assert zero.returncode == 0, zero.stderr
    table = (tmp_path / "z" / "table.md").read_text()
    assert "Table 1 layout" in table and "hellaswag_local" in table and "average" in table
    zero_records = {
        (r["model"], r["lm_task"]): r
        for r in map(json.loads, (tmp_path / "z" / "samples.jsonl").read_text().splitlines())
    }
    for r in records:  # 16-bit quantization is the unquantized model: the same accuracy as plain zero-shot
        if r["bits"] == 16:
            assert r["acc_norm"] == pytest.approx(zero_records[(r["model"], "hellaswag_local")]["metrics"]["acc_norm"])
    bad = run_cli("run", "zeroshot", *models, "--tasks", "no_such_task", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "lm-eval has no task" in bad.stderr


@pytest.mark.slow
def test_outliers_cli(tiny_models, tmp_path):
    out = tmp_path / "o"
    result = run_cli(
        "run",
        "outliers",
        *pair_options(tiny_models),
        "--tokens",
        "2k",
        "--ctx",
        "1k",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "Table 5 layout" in (out / "table.md").read_text()
    assert run_cli("report", str(out), "--paper").returncode == 0
    assert "paper: DIFF-3B" in (out / "table.md").read_text()
