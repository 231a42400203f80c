"""Motif-2.6B (DIFF attention in adjacent head pairs + PolyNorm) on hf, what only Motif has: checkpoints in Motif's own
layout, written from the published sources (tests/motif_reference.py, no code shared with diffeval) around a real
tokenizer (Mistral-7B-v0.1's); comparisons with that reference that must fail (a wrong head pairing, a wrong GDA
grouping); the parity fixture's layout against the published one; the variant everywhere (inspect, attention
analysis, the attention-logit instruments); the config and weights refusals; ICL through the CLI.

Its logits against the independent reference, greedy decoding through its KV cache and its parity with vLLM are the
parity suites' (tests/test_parity.py, tests/test_vllm.py), on its record's fixture shapes, as for every variant."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import changed_checkpoint, run_cli, run_cli_in_process
from diffeval.models import diff
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.models.variants.motif.fixture import SHAPES as FIXTURE_SHAPES
from diffeval.models.variants.motif.record import MOTIF
from motif_reference import POLYNORM_CASE, reference_logits, write_tiny_motif

# name → the checkpoint's shape: MHA tied with Motif's own model-type spelling, GQA untied with the lower-case one
SHAPES = {
    "mha": dict(heads=4, kv_heads=4, tied=True, model_type="Motif", seed=1),
    "gqa": dict(heads=8, kv_heads=2, hidden=128, tied=False, model_type="motif", seed=2),
    # grouped differential attention (Motif-2-12.7B's layout): R = 4 signal heads per noise head, one KV pair per
    # group; N not a multiple of N_kv (as 40 over 16 heads)
    "gda": dict(heads=10, kv_heads=4, noise_heads=2, tied=False, seed=3),
}


@pytest.fixture(scope="module")
def motif_models(tmp_path_factory) -> dict[str, Path]:
    from real_checkpoints import mistral_tokenizer

    tokenizer = mistral_tokenizer()
    if isinstance(tokenizer, str):
        pytest.skip(f"the Mistral tokenizer is unavailable: {tokenizer}")
    root = tmp_path_factory.mktemp("motif")
    return {name: write_tiny_motif(root / name, tokenizer, **shape) for name, shape in SHAPES.items()}


def _ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 32000, (2, length), generator=torch.Generator().manual_seed(seed))


def test_polynorm_matches_the_published_case():
    case = POLYNORM_CASE
    got = diff.poly_norm(torch.tensor(case["input"]), torch.tensor(case["weight"]), torch.tensor([case["bias"]]))
    torch.testing.assert_close(got, torch.tensor(case["expected"]), atol=1e-5, rtol=0)


@pytest.mark.transformers_floor
@pytest.mark.parametrize("shape", MOTIF.fixture_shapes)
def test_the_parity_fixture_saves_motifs_published_layout(variant_checkpoint, tiny_models, tmp_path, shape):
    """The parity suites' Motif checkpoints come from diffeval's own classes (the record's fixture): they hold the
    tensors, with their names and shapes, and the config keys of a checkpoint written from the published sources in
    the same shape, so the suites' reference comparison is one on Motif's published layout. transformers 5 writes
    `rope_theta` inside `rope_parameters` and `torch_dtype` as `dtype`."""
    sizes = FIXTURE_SHAPES[shape]
    published = write_tiny_motif(
        tmp_path / "published", tiny_models["tok_a"], heads=sizes["heads"], kv_heads=sizes["kv_heads"],
        head_dim=sizes["head_dim"], hidden=sizes["hidden"], ffn=128, max_positions=8192,
        tied=sizes.get("tie_word_embeddings", True),
        noise_heads=sizes.get("num_noise_heads"), k_ratio=sizes.get("k_ratio"),
    )  # fmt: skip
    ours = variant_checkpoint(f"motif-{shape}")

    def tensors(folder: Path) -> dict[str, tuple[int, ...]]:
        return {name: tuple(tensor.shape) for name, tensor in load_file(folder / "model.safetensors").items()}

    assert tensors(ours) == tensors(published)
    config, reference = (json.loads((folder / "config.json").read_text()) for folder in (ours, published))
    assert config["rope_parameters"]["rope_theta"] == reference.pop("rope_theta")
    assert config["dtype"] == reference.pop("torch_dtype")
    reference.pop("initializer_range")  # how the random weights were drawn
    assert {key: config[key] for key in reference if key in config} == reference


def test_a_wrong_head_pairing_fails_the_comparison(motif_models, monkeypatch):
    """The comparison can tell pairings apart: DiffLlama's halves (head i with i + N/2) instead of adjacent heads."""
    import diffeval.models.variants.motif.modeling as motif

    def halves(query, key, value, noise_heads=None):
        groups = query.shape[1] // key.shape[1]
        pairs = torch.cat(value.chunk(2, dim=1), dim=-1)
        return query, key.repeat_interleave(groups, 1), torch.cat([pairs, pairs], 1).repeat_interleave(groups, 1)

    monkeypatch.setattr(motif, "motif_maps", halves)
    loaded = load_model(ModelSpec("m", str(motif_models["gqa"])), "cpu")
    ids = _ids(16)
    with torch.inference_mode():
        ours = loaded.model(input_ids=ids).logits.double()
    assert (ours - reference_logits(motif_models["gqa"], ids)).abs().max().item() > 1e-2


@pytest.mark.parametrize(
    "wrong",
    [
        pytest.param(dict(noise_repeat="tile"), id="noise-tiled-over-the-signal-heads"),
        pytest.param("flipped", id="noise-head-first-in-each-group"),
    ],
)
def test_a_wrong_repeat_or_grouping_fails_the_comparison(motif_models, monkeypatch, wrong):
    """GDA's noise output meets the signal heads of its own group (interleaved, not tiled), and the noise head is the
    last of each group: the comparison tells either mistake apart."""
    import diffeval.models.variants.motif.modeling as motif

    folder, ids = motif_models["gda"], _ids(16)
    if wrong == "flipped":
        right = motif.motif_maps
        monkeypatch.setattr(motif, "motif_maps", lambda q, k, v, noise: right(q.flip(1), k, v, noise))
        reference = reference_logits(folder, ids)
    else:
        reference = reference_logits(folder, ids, **wrong)
    loaded = load_model(ModelSpec("m", str(folder)), "cpu")
    with torch.inference_mode():
        ours = loaded.model(input_ids=ids).logits.double()
    assert (ours - reference).abs().max().item() > 1e-2


def test_lambda_init_follows_motif_and_inspect_shows_the_variant(motif_models):
    loaded = load_model(ModelSpec("m", str(motif_models["mha"])), "cpu")
    rows = loaded.info.lambdas
    assert [round(row["lambda_init"], 6) for row in rows] == [round(0.8 - 0.6 * 2.718281828459045**0.3, 6), 0.2]
    attention = loaded.model.model.layers[1].self_attn.requires_grad_(False)
    first = torch.exp((attention.lambda_q1 * attention.lambda_k1).sum())
    expected = first - torch.exp((attention.lambda_q2 * attention.lambda_k2).sum()) + 0.2
    assert rows[1]["lambda"] == pytest.approx(float(expected), abs=1e-6)
    result = run_cli_in_process("models", "inspect", str(motif_models["mha"]))
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    assert "DIFF V1 (Motif)" in shown and "adjacent heads (2i, 2i + 1)" in shown and "λ_init" in shown
    result = run_cli_in_process("models", "inspect", str(motif_models["gda"]))
    shown = " ".join(result.stdout.split())
    assert result.returncode == 0 and "2 groups of 4 signal heads and 1 noise head" in shown, shown


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["gqa", "gda"])
def test_attention_analysis_splits_motif_maps(motif_models, tmp_path, shape):
    """A1 and A2 are map 1 (even query heads) and map 2 (odd), each a softmax (rows sum to 1); A1 − λ·A2 sums to
    1 − λ of the layer."""
    import numpy as np

    from diffeval.tasks.analyses.shares import SEGMENTS, per_map_shares

    backend = HFBackend(load_model(ModelSpec("m", str(motif_models[shape])), "cpu"))
    ids = backend.encode("The grass is green. The sky is blue. The sun is yellow. Here we go.").ids
    rows, segments = [len(ids) - 3, len(ids) - 1], [i % len(SEGMENTS) for i in range(len(ids))]
    shares, lambdas = backend.attention_rows(ids, rows, segments, len(SEGMENTS))
    config = backend.model.config
    # map 1: one row per signal head; map 2: its group's noise head, repeated over the group (2 × S heads in all)
    assert lambdas is None and shares.shape == (config.num_hidden_layers, 2 * config.signal_heads, 2, len(SEGMENTS))
    maps = per_map_shares(shares, backend.info, None)
    lam = np.array([row["lambda"] for row in backend.info.lambdas])
    np.testing.assert_allclose(maps["A1"]["row_sum"], 1.0, atol=1e-5)
    np.testing.assert_allclose(maps["diff"]["row_sum"], 1 - lam, atol=1e-5)
    result = run_cli("run", "attention", "-m", f"motif={motif_models[shape]}", "--ctx", "512", "--depths", "50",
                     "--samples", "1", "--out", str(tmp_path / "attention"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    [record] = [json.loads(line) for line in (tmp_path / "attention" / "samples.jsonl").read_text().splitlines()]
    assert record["is_diff"] and set(record["shares"]) == {"A1", "A2", "diff"}


@pytest.mark.parametrize("shape", ["mha", "gda"])
def test_attention_logit_instruments_run_on_motif(motif_models, shape):
    """Quantized logits (Figure 8) and logit statistics (Table 5) on Motif and GDA: 16 bits gives the model's own
    logits, 4 bits changes them, and the statistics see every query head the attention call gets (2S: GDA's noise
    heads once per signal head they serve)."""
    from diffeval.models.activations import logit_statistics, quantized_logits

    loaded = load_model(ModelSpec("m", str(motif_models[shape])), "cpu")
    model, ids = loaded.model, _ids(24)[:1]
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
    heads = 2 * model.config.signal_heads
    assert sorted(stats) == [0, 1] and all(s.count == heads * 24 * 25 // 2 for s in stats.values())


def _refusal(folder: Path, out: Path) -> str:
    result = run_cli_in_process("run", "needle", "-m", f"motif={folder}", "--ctx", "512", "--depths", "50",
                                "--samples", "1", "--out", str(out))  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"num_attention_heads": 3, "num_key_value_heads": 2}, "num_attention_heads must be even, got 3"),
        ({"num_key_value_heads": 1}, "num_key_value_heads must be even, got 1"),
        ({"num_noise_heads": 3}, "num_noise_heads 3 does not divide the 1 signal heads"),
        ({"num_noise_heads": 1}, "num_noise_heads 1 is not a multiple of the 2 key/value pairs"),
        ({"num_noise_heads": 2, "k_ratio": 2}, "k_ratio 2 is not supported"),
        ({"num_attention_heads": 2, "num_key_value_heads": 2}, "(model [64, 64])"),
        ({"kv_lora_rank": 512, "num_experts": 64}, "not supported yet: Motif-3"),
        ({"hidden_act": "silu"}, "Motif's MLP is PolyNorm"),
    ],
)
def test_configs_diffeval_cannot_run_exactly_are_one_line(motif_models, tmp_path, change, expected):
    folder = changed_checkpoint(motif_models["mha"], tmp_path / "changed", config=change)
    line = _refusal(folder, tmp_path / "run")
    assert expected in line and "model motif" in line


@pytest.mark.parametrize("tensor", ["model.layers.1.mlp.act_fn.weight", "model.layers.0.self_attn.lambda_k2"])
def test_weights_without_polynorm_or_lambda_tensors_are_refused(motif_models, tmp_path, tensor):
    folder = changed_checkpoint(motif_models["mha"], tmp_path / "missing", tensors=lambda weights: weights.pop(tensor))
    line = _refusal(folder, tmp_path / "run")
    assert f"do not match MotifForCausalLM (missing {tensor})" in line


@pytest.mark.slow
def test_icl_runs_on_motif_through_the_cli(motif_models, tmp_path):
    """Choice scoring on a Motif checkpoint around the real Mistral tokenizer (the needle through the command line is
    the parity suite's, on both engines)."""
    from conftest import SHARED_DATASETS

    data_dir = SHARED_DATASETS if (SHARED_DATASETS / "trec").is_dir() else "package:fixtures"
    result = run_cli("run", "icl", "-m", f"motif={motif_models['gqa']}", "--ctx", "1k", "--dataset", "trec",
                     "--shots", "4", "--orders", "random:1", "--test-size", "4", "--data-dir", str(data_dir),
                     "--out", str(tmp_path / "icl"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len((tmp_path / "icl" / "samples.jsonl").read_text().splitlines()) == 4


@pytest.mark.skipif(
    not os.environ.get("DIFFEVAL_MOTIF_MODELING"),
    reason="set DIFFEVAL_MOTIF_MODELING to a Motif modeling_motif.py (the hub's, not reachable here) to compare it",
)
def test_a_supplied_modeling_motif_agrees_with_diffeval(motif_models, tmp_path):
    """`--trust-remote-code` runs a checkpoint's own modeling file: given one, its logits equal diffeval's class's."""
    folder = changed_checkpoint(motif_models["mha"], tmp_path / "remote")
    shutil.copy(os.environ["DIFFEVAL_MOTIF_MODELING"], folder / "modeling_motif.py")
    data = json.loads((folder / "config.json").read_text())
    data["auto_map"] = {"AutoModelForCausalLM": "modeling_motif.MotifForCausalLM"}
    (folder / "config.json").write_text(json.dumps(data))
    ours = load_model(ModelSpec("m", str(motif_models["mha"])), "cpu").model
    theirs = load_model(ModelSpec("m", str(folder)), "cpu", trust_remote_code=True).model
    ids = _ids(32)
    with torch.inference_mode():
        torch.testing.assert_close(theirs(input_ids=ids).logits, ours(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
