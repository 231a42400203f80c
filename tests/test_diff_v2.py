"""Differential Transformer V2 in transformers form (models/variants/diffllama2/modeling.py) on real tiny models, built
here: what only V2 has. Its logits against the independent reference, greedy decoding through its KV cache and its
parity with vLLM are the parity suites' (tests/test_parity.py, tests/test_vllm.py), which run on every variant.

The attention test compares `DiffLlama2Attention` (eager and sdpa) with the paper's V2 module written out
independently (tests/diff_references.py, with transformers' rotate-half rotary) on a right-padded batch and head sizes
vLLM does not take. The checkpoint tests save a tiny V2 and take it through diffeval's loader, the weights check,
registration, the attention analysis, `models inspect` and the attention-logit instruments.
"""

import json
import subprocess
import sys

import pytest
import torch

from conftest import changed_checkpoint, run_cli, run_cli_in_process
from diff_references import multihead_flashdiffv2, rope_rotate_half
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.diff import v2_combine, v2_lambda
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.models.tiny import build_tiny_model
from diffeval.models.variants.diffllama2.modeling import DiffLlama2Attention, DiffLlama2Config, DiffLlama2ForCausalLM

FP32 = {"atol": 1e-5, "rtol": 1e-5}


def _attention(heads: int, kv_heads: int, head_dim: int, impl: str) -> DiffLlama2Attention:
    config = DiffLlama2Config(
        hidden_size=64,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=64,
    )
    config._attn_implementation = impl
    attention = DiffLlama2Attention(config, layer_idx=0).eval()
    with torch.no_grad():  # λ spread over (0, 1) rather than all near 1/2
        attention.lambda_proj.weight.copy_(0.5 * torch.randn_like(attention.lambda_proj.weight))
    return attention


@pytest.mark.transformers_floor
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 16), (4, 1, 8), (4, 4, 16)])
def test_v2_attention_is_the_formula(impl, heads, kv_heads, head_dim):
    torch.manual_seed(100 * heads + 10 * kv_heads + head_dim)
    attention = _attention(heads, kv_heads, head_dim, impl)
    batch, length = 2, 9
    x = torch.randn(batch, length, 64)
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cos, sin = LlamaRotaryEmbedding(attention.config)(x, torch.arange(length).expand(batch, length))
    # causal, plus right padding of the last 3 keys in batch row 1 (every query row keeps a key)
    allowed = torch.ones(batch, length, length, dtype=torch.bool).tril()
    allowed[1, :, length - 3 :] = False
    additive = torch.zeros(batch, 1, length, length).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    theta = attention.config.rope_parameters["rope_theta"]
    with torch.no_grad():
        actual, _ = attention(x, (cos, sin), attention_mask=additive)
        expected = multihead_flashdiffv2(
            attention.state_dict(), "", x, 0, theta, rope=rope_rotate_half, allowed=allowed
        )
    assert attention.q_proj.weight.shape == (2 * heads * head_dim, 64)
    assert attention.lambda_proj.weight.shape == (heads, 64)
    torch.testing.assert_close(actual, expected, **FP32)


@pytest.mark.transformers_floor
def test_v2_combine_pairs_adjacent_heads():
    out = torch.arange(6.0).view(1, 1, 6, 1).expand(1, 1, 6, 2)  # query head j's output is j
    lam = torch.tensor([[[0.5, 0.25, 1.0]]])
    assert v2_combine(out, lam)[0, 0, :, 0].tolist() == [0 - 0.5 * 1, 2 - 0.25 * 3, 4 - 1.0 * 5]
    x, weight = torch.randn(2, 3, 8), torch.randn(3, 8)
    torch.testing.assert_close(v2_lambda(x, weight), 1 / (1 + torch.exp(-(x @ weight.T))), **FP32)


@pytest.fixture(scope="module")
def v2_checkpoint(tiny_models, tmp_path_factory):
    path = tmp_path_factory.mktemp("v2") / "diff2"
    build_tiny_model("diff2", tiny_models["tok_a"], path, seed=5, heads=4, kv_heads=2)
    return path


@pytest.mark.transformers_floor
def test_v2_checkpoint_loads_as_diff_v2(v2_checkpoint):
    loaded = load_model(ModelSpec("v2", str(v2_checkpoint)), "cpu")
    model, info = loaded.model, loaded.info
    assert isinstance(model, DiffLlama2ForCausalLM)
    assert info.is_diff and info.diff_variant == "v2" and info.architecture == "DiffLlama2ForCausalLM"
    assert (info.heads, info.kv_heads, info.head_dim) == (4, 2, 16)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (2 * 4 * 16, 64)


def _refusal(folder, out) -> str:
    result = run_cli_in_process("run", "needle", "-m", f"v2={folder}", "--ctx", "512", "--depths", "50",
                                "--samples", "1", "--out", str(out))  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert not out.exists()
    return lines[0]


@pytest.mark.transformers_floor
def test_weights_check_refuses_v2_weights_without_lambda_proj_or_config(v2_checkpoint, tmp_path):
    lam = "model.layers.1.self_attn.lambda_proj.weight"
    no_lambda = changed_checkpoint(v2_checkpoint, tmp_path / "no-lambda", tensors=lambda t: t.pop(lam))
    line = _refusal(no_lambda, tmp_path / "run")
    assert f"model v2: the weights in {no_lambda} do not match DiffLlama2ForCausalLM (missing {lam})" in line
    assert "without its λ projections (lambda_proj" in line

    as_llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    llama_config = changed_checkpoint(v2_checkpoint, tmp_path / "llama-config", config=as_llama)
    line = _refusal(llama_config, tmp_path / "run")
    assert "unexpected model.layers.0.self_attn.lambda_proj.weight" in line
    assert "misshapen model.layers.0.self_attn.q_proj.weight [128, 64] (model [64, 64])" in line
    assert 'Differential Transformer V2 weights (lambda_proj): give them a V2 config (model_type "diffllama2"' in line


@pytest.mark.transformers_floor
@pytest.mark.slow
def test_stock_transformers_refuses_v2_and_diffeval_registers_it_on_first_load(v2_checkpoint):
    script = f"""
import sys
import transformers
from transformers import CONFIG_MAPPING, AutoConfig
assert "diffllama2" not in CONFIG_MAPPING
try:
    AutoConfig.from_pretrained({str(v2_checkpoint)!r})
    raise SystemExit("stock transformers loaded a diffllama2 config")
except ValueError as exc:
    assert "diffllama2" in str(exc), exc
import diffeval.models.checkpoints.loading as loading
from diffeval.models.variants import registry
assert "diffllama2" not in CONFIG_MAPPING and "diffeval.models.variants.diffllama2.modeling" not in sys.modules
loading.load_config(loading.ModelSpec("v2", {str(v2_checkpoint)!r}))
registry.register()
assert "diffllama2" in CONFIG_MAPPING
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.transformers_floor
@pytest.mark.slow
def test_starting_the_cli_leaves_v2_unregistered():
    """Registration waits for the first model load: `import diffeval` imports no torch, and the CLI module does not
    import the V2 modeling code."""
    script = (
        "import sys, diffeval; print('torch' in sys.modules); import diffeval.cli; "
        "print('diffeval.models.variants.diffllama2.modeling' in sys.modules, "
        "'transformers.models.llama.modeling_llama' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "False"], result.stdout


@pytest.mark.slow
def test_attention_analysis_decomposes_v2_maps_with_the_per_token_lambda(v2_checkpoint, tmp_path):
    """Table 3 on V2: A1 and A2 are the adjacent query heads' softmax maps (rows sum to 1), λ at each row is
    sigmoid(W_λ x) of that row's attention input, and A1 − λ·A2 therefore sums to 1 − λ per row."""
    import numpy as np

    from diffeval.tasks.analyses.shares import SEGMENTS, per_map_shares

    backend = HFBackend(load_model(ModelSpec("v2", str(v2_checkpoint)), "cpu"))
    ids = backend.encode("The grass is green. The sky is blue. The sun is yellow. Here we go.").ids
    rows, segments = [len(ids) - 3, len(ids) - 1], [i % len(SEGMENTS) for i in range(len(ids))]
    shares, lambdas = backend.attention_rows(ids, rows, segments, len(SEGMENTS))
    config = backend.model.config
    assert shares.shape == (config.num_hidden_layers, 2 * config.num_attention_heads, 2, len(SEGMENTS))
    assert lambdas.shape == (config.num_hidden_layers, config.num_attention_heads, 2)
    np.testing.assert_allclose(shares.sum(-1), 1.0, atol=1e-5)
    with torch.inference_mode():  # layer 0's attention input: its input norm of the embeddings
        layer = backend.model.model.layers[0]
        x = layer.input_layernorm(backend.model.model.embed_tokens(torch.tensor([ids])))
        expected = v2_lambda(x[0, rows], layer.self_attn.lambda_proj.weight).T.numpy()
    np.testing.assert_allclose(lambdas[0], expected, atol=1e-6)
    maps = per_map_shares(shares, backend.info, lambdas)
    np.testing.assert_allclose(maps["diff"]["row_sum"], (1 - lambdas).mean(axis=(1, 2)), atol=1e-6)
    assert maps["A1"]["row_sum"] == pytest.approx([1.0] * config.num_hidden_layers, abs=1e-5)
    result = run_cli("run", "attention", "-m", f"v2={v2_checkpoint}", "--ctx", "512", "--depths", "50",
                     "--samples", "1", "--out", str(tmp_path / "attention"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    [record] = [json.loads(line) for line in (tmp_path / "attention" / "samples.jsonl").read_text().splitlines()]
    assert record["is_diff"] and set(record["shares"]) == {"A1", "A2", "diff"}


@pytest.mark.transformers_floor
def test_models_inspect_gives_v2_lambda_statistics_per_layer(v2_checkpoint):
    from diffeval.models.diff import v2_lambda, v2_layer_lambdas

    loaded = load_model(ModelSpec("v2", str(v2_checkpoint)), "cpu")
    ids = loaded.tokenizer("The grass is green. The sky is blue.", return_tensors="pt").input_ids
    rows = v2_layer_lambdas(loaded.model, ids)
    assert [row["layer"] for row in rows] == list(range(loaded.model.config.num_hidden_layers))
    with torch.inference_mode():  # layer 0's attention input is its input norm of the embeddings
        layer = loaded.model.model.layers[0]
        x = layer.input_layernorm(loaded.model.model.embed_tokens(ids))
        lam = v2_lambda(x, layer.self_attn.lambda_proj.weight)
    assert rows[0]["mean"] == pytest.approx(float(lam.mean()), abs=1e-6)
    assert rows[0]["std"] == pytest.approx(float(lam.std()), abs=1e-6) and 0 < rows[0]["min"] <= rows[0]["max"] < 1
    result = run_cli_in_process("models", "inspect", str(v2_checkpoint))
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())  # rich wraps titles to the terminal's width
    assert "yes (v2)" in shown and "λ = sigmoid(W_λ·x) per token and head" in shown


@pytest.mark.transformers_floor
def test_attention_logit_instruments_run_on_v2(v2_checkpoint):
    """Quantized logits (Figure 8) and logit statistics (Table 5) go through the attention interface V2 calls: 16 bits
    gives the model's own logits, 4 bits changes them, and the statistics see every layer's 2h query heads."""
    from diffeval.models.activations import logit_statistics, quantized_logits

    loaded = load_model(ModelSpec("v2", str(v2_checkpoint)), "cpu")
    model, ids = loaded.model, loaded.tokenizer("The grass is green. The sky is blue.", return_tensors="pt").input_ids
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
    assert sorted(stats) == list(range(model.config.num_hidden_layers))
    query_heads = 2 * model.config.num_attention_heads
    assert all(s.count == query_heads * ids.shape[1] * (ids.shape[1] + 1) // 2 for s in stats.values())
