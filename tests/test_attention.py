"""Attention-to-answer analysis: exact against eager output_attentions, DIFF map algebra, CLI end to end."""

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from conftest import pair_options, run_cli
from diffeval.errors import InputError
from diffeval.models.capture import capturing
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.diff import split_differential
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.tasks.analyses import attention
from diffeval.tasks.analyses.attention import AttentionOptions
from diffeval.tasks.haystack import needle
from diffeval.tasks.haystack.samples import HaystackPrompt


def _config(**options):
    return SimpleNamespace(options=AttentionOptions(**options), max_new_tokens=32, chat_template=False)


def _brute_force_shares(path, ids, rows, segments, lambdas):
    """Every share from the full eager T×T maps, the way one would do it without diffeval."""
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    with torch.no_grad():
        maps = model(torch.tensor([ids]), output_attentions=True).attentions
    seg = torch.tensor(segments)
    out = {}
    for layer, layer_maps in enumerate(maps):
        rows_maps = layer_maps[0][:, rows]  # (H, R, T)
        per_segment = torch.stack([rows_maps[..., seg == s].sum(-1) for s in range(len(attention.SEGMENTS))], -1)
        if lambdas is None:
            named = {"softmax": per_segment}
        else:
            half = per_segment.shape[0] // 2
            named = {
                "A1": per_segment[:half],
                "A2": per_segment[half:],
                "diff": per_segment[:half] - lambdas[layer] * per_segment[half:],
            }
        for name, values in named.items():
            means = values.mean(dim=(0, 1))
            for i, segment in enumerate(attention.SEGMENTS):
                out.setdefault(name, {}).setdefault(segment, []).append(float(means[i]))
            out[name].setdefault("row_sum", []).append(float(means.sum()))
    return out


@pytest.mark.transformers_floor
@pytest.mark.parametrize("model_name", ["diff", "base_a"])
@pytest.mark.parametrize(
    ("rows", "span", "ctx"),
    [pytest.param("last", "answer", 2048, marks=pytest.mark.slow), ("answer", "needle", 1024)],  # 2048: seconds each
)
def test_shares_match_eager_attention_maps(tiny_models, model_name, rows, span, ctx):
    backend = HFBackend(load_model(ModelSpec(model_name, str(tiny_models[model_name])), "cpu"))
    sample = needle.make_sample(0, ctx, 50, 4, 2, 0)
    [record] = [r.to_dict() for r in attention.evaluate([sample], backend, _config(rows=rows, span=span))]
    prompt = needle.build_prompt(sample, backend, ctx - 32, False)
    ids = list(prompt.ids)
    if rows == "answer":
        ids += backend.encode(" " + ", ".join(sample.expected), special_tokens=False).ids
        assert len(record["rows"]) > 10  # two 7-digit numbers, one digit per token
    assert record["rows"][0] == len(prompt.ids) - 1
    segments = attention.segment_ids(prompt, len(ids), len(sample.expected), span)
    lambdas = [row["lambda"] for row in backend.info.lambdas] if backend.info.is_diff else None
    expected = _brute_force_shares(tiny_models[model_name], ids, record["rows"], segments, lambdas)
    assert set(expected) == set(record["shares"])
    for name, per_segment in expected.items():
        for segment, values in per_segment.items():
            assert record["shares"][name][segment] == pytest.approx(values, abs=1e-5), (name, segment)


@pytest.mark.transformers_floor
def test_differential_rows_sum_to_one_minus_lambda(tiny_models):
    backend = HFBackend(load_model(ModelSpec("diff", str(tiny_models["diff"])), "cpu"))
    sample = needle.make_sample(0, 1024, 0, 1, 1, 0)
    [record] = [r.to_dict() for r in attention.evaluate([sample], backend, _config())]
    lambdas = [row["lambda"] for row in backend.info.lambdas]
    assert record["shares"]["diff"]["row_sum"] == pytest.approx([1 - lam for lam in lambdas], abs=1e-5)
    assert record["shares"]["A1"]["row_sum"] == pytest.approx([1.0, 1.0], abs=1e-5)
    assert record["answer_share"] == pytest.approx(sum(record["shares"]["diff"]["answer"]) / 2)
    assert record["answer_share_normalized"] == pytest.approx(
        record["answer_share"] / (sum(record["shares"]["diff"]["row_sum"]) / 2)
    )


@pytest.mark.transformers_floor
def test_split_differential_pairs_head_i_with_head_i_plus_half():
    shares = torch.arange(8.0).reshape(4, 2)
    maps = split_differential(shares, 0.5)
    assert torch.equal(maps["A1"], shares[:2]) and torch.equal(maps["A2"], shares[2:])
    assert torch.equal(maps["diff"], shares[:2] - 0.5 * shares[2:])


@pytest.mark.transformers_floor
def test_needle_span_widens_the_answer():
    prompt = HaystackPrompt(
        ids=list(range(40)),
        text="",
        offsets=[],
        haystack_words=0,
        spans={"needles": [[10, 20], [25, 30]], "numbers": [[15, 19], [26, 29]], "haystack": [5, 35]},
    )
    by_number = attention.segment_ids(prompt, 40, 1, "answer")
    by_needle = attention.segment_ids(prompt, 40, 1, "needle")
    names = attention.SEGMENTS
    assert [names[i] for i in by_number[14:20]] == ["needles", "answer", "answer", "answer", "answer", "needles"]
    assert all(names[i] == "answer" for i in by_needle[10:20])
    assert names[by_number[0]] == "sink" and names[by_number[5]] == "noise" and names[by_number[37]] == "scaffold"


@pytest.mark.transformers_floor
def test_unsupported_architecture_is_named(tmp_path):
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50))
    supported = "diffllama, diffllama2, Motif, motif, phi4flash, llama, mistral, qwen2, jamba"
    with pytest.raises(InputError, match=f"supports {supported} models, not 'gpt2'"):
        with capturing(model, [0], [0], 1):
            pass


@pytest.mark.slow
def test_attention_cli_writes_table3_and_plots(tiny_models, tmp_path):
    out = tmp_path / "attn"
    result = run_cli(
        "run",
        "attention",
        *pair_options(tiny_models),
        "--ctx",
        "1k",
        "--depths",
        "0,100",
        "--samples",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    table = (out / "table.md").read_text()
    assert "Table 3 layout" in table and "answer 0%" in table and "noise 100%" in table and "(raw shares)" in table
    assert "shares / row sum" in table
    assert (out / "attention_by_depth.png").stat().st_size > 0 and (out / "attention_per_layer.png").is_file()
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {r["model"] for r in records} == {"diff", "base"} and len(records) == 8
    assert set(records[0]["shares"]) == {"A1", "A2", "diff"}
    bad = run_cli("run", "attention", "-m", f"diff={tiny_models['diff']}", "--rows", "middle", "--out", str(out))
    assert bad.returncode == 2 and "bad --rows" in bad.stderr
