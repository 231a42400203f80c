"""Real tokenizers (Mistral's SentencePiece, Llama-3's byte-level BPE) around tiny random weights with a generation
config that asks for sampling: every task through the real CLI, prompts tokenized in context, diffeval's own greedy
decoding, and the weights checked before any work. Skipped, with the package named, where the tokenizers cannot be
had (see tests/real_checkpoints.py)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import run_cli, run_cli_in_process
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.models.tokenizer import HFTokenizer
from diffeval.tasks import build_config
from diffeval.tasks.analyses import attention
from diffeval.tasks.choices import icl
from diffeval.tasks.choices import icl_demonstrations as demos
from diffeval.tasks.haystack import needle, recipe

# slow: four checkpoints around the real tokenizers, loaded per module (about 25 s) and run
pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "diffeval" / "fixtures"
TOKENIZERS = ("mistral", "llama3")


def _models(real_models, *names) -> list[str]:
    return [arg for name in names for arg in ("-m", f"{name}={real_models[name]}")]


class Recording:
    """The real backend, with the ids of every scoring and attention call kept for inspection."""

    def __init__(self, backend):
        self.backend, self.scored, self.attended = backend, [], []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def score_choices(self, prefix, queries, choices, reuse=True):
        self.scored.append((prefix, queries, choices))
        return self.backend.score_choices(prefix, queries, choices, reuse)

    def attention_rows(self, ids, rows, segment_ids, n_segments):
        self.attended.append((ids, rows))
        return self.backend.attention_rows(ids, rows, segment_ids, n_segments)


@pytest.fixture(scope="module")
def backends(real_models):
    loaded = {name: HFBackend(load_model(ModelSpec(name, str(path)), "cpu")) for name, path in real_models.items()}
    yield loaded
    for backend in loaded.values():
        backend.close()


@pytest.mark.transformers_floor
@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_icl_scores_every_query_and_label_as_the_whole_prompt_tokenizes(backends, tokenizer):
    backend = Recording(backends[f"base-{tokenizer}"])
    config = build_config("icl", {}, {"models": ["a/b"], "data_dir": str(FIXTURES), "ctx": "2k", "test_size": 6,
                                      "shots": "8", "orders": ["random:2"]})  # fmt: skip
    data = demos.dataset("trec", str(FIXTURES))
    samples = icl.make_samples(config.options, config.seed)
    checked = 0
    for batch in icl.batches(samples, config):
        records = list(icl.evaluate(batch, backend, config))
        assert all(r.fields["status"] == "ok" for r in records)
        [(prefix, queries, choices)] = backend.scored[-1:]
        block = demos.demonstration_block(batch[0].run, str(FIXTURES), config.seed)
        for sample, query, options in zip(batch, queries, choices):
            text = block + demos.format_example("trec", data.test[sample.test_id].text, None)
            for label, choice in zip(data.labels, options):
                assert prefix + query + choice == backend.encode(text + " " + label).ids, (tokenizer, label)
                checked += 1
    assert checked == len(samples) * len(data.labels)


@pytest.mark.transformers_floor
@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_in_context_encoding_equals_the_one_piece_encoding_at_any_cut(backends, tokenizer, monkeypatch):
    """Long contexts cut anywhere (mid-word, after a newline, in a number), continuations that merge across the seam:
    the spliced window path gives the one-piece ids, and it is the path taken."""
    from conftest import NOISE_SENTENCES
    from diffeval.models import tokenizer as tokenization

    backend = backends[f"base-{tokenizer}"]
    spliced = []
    original = tokenization._spliced
    monkeypatch.setattr(tokenization, "_spliced", lambda *a: spliced.append(original(*a)) or spliced[-1])
    text = "\n".join(NOISE_SENTENCES * 20) + " 4,821,937 Question: où?\nType: 🙂 naïve\n\n"
    continuations = ["", " yes", "es", "\nQuestion: where?\nType:", " 1", ",937", "\n\n", "🙂", " ", "Type: LOC"]
    for cut in range(len(text) // 3, len(text), 37):
        found = tokenization.encode_in_context(backend, text[:cut], continuations)
        for continuation, tail in zip(continuations, found.tails):
            assert found.prefix + tail == backend.encode(text[:cut] + continuation).ids, (cut, continuation)
    assert spliced and sum(s is not None for s in spliced) >= 0.9 * len(spliced)


@pytest.mark.transformers_floor
@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_attention_answer_rows_and_judge_verdicts_are_tokenized_after_their_prompt(backends, tokenizer, tmp_path):
    backend = Recording(backends[f"diff-{tokenizer}"])
    config = build_config("attention", {}, {"models": ["a/b"], "ctx": "1k", "depths": "50", "samples": 1,
                                            "rows": "answer"})  # fmt: skip
    [sample] = attention.TASK.running.make_samples(config.options, config.seed, None, None)
    attention.evaluate([sample], backend, config)
    [(ids, rows)] = backend.attended
    prompt = recipe.fitted_prompt(needle.RECIPE, sample, backend, config)
    assert ids == backend.encode(prompt.text + " " + ", ".join(sample.expected)).ids
    assert rows[0] == len(prompt.ids) - 1 and rows[-1] == len(ids) - 2

    from diffeval.judges import HFJudge, JudgeItem, VerdictCache

    judge = HFJudge(VerdictCache(tmp_path), str(Path(backend.info.spec)), device="cpu")
    judge.backend = Recording(backend)
    item = JudgeItem("answer", "The cat sat on the mat.\n", "Where is the cat?", "On the mat.", "On the mat.")
    judge.judge([item])
    [(prefix, [query], [choices])] = judge.backend.scored
    for word, choice in zip((" yes", " no"), choices):
        assert prefix + query + choice == judge.backend.encode(item.prompt() + "\nVerdict:" + word).ids


def argmax_loop(backend, prompt: list[int], max_new_tokens: int, stop_ids: set[int]) -> tuple[list[int], list[float]]:
    """Greedy decoding by hand: the likeliest next token, appended, until an EOS id or the limit; and the top-2
    log-prob gap before each token (where a near-tie lets engines differ)."""
    from transformers import DynamicCache

    cache, ids, tokens, gaps = DynamicCache(), torch.tensor([prompt]), [], []
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = backend.model(input_ids=ids, **{backend._cache: cache}, use_cache=True).logits[0, -1]
            top = torch.log_softmax(logits.float(), dim=-1).topk(2)
            tokens.append(int(top.indices[0]))
            gaps.append(float(top.values[0] - top.values[1]))
            if tokens[-1] in stop_ids:
                break
            ids = torch.tensor([[tokens[-1]]])
    return tokens, gaps


def with_extra_eos(backend, source: Path, folder: Path) -> tuple[list[int], list[int]]:
    """A copy of the checkpoint whose generation config also lists, as EOS, the id the model generates third after a
    fixed prompt. Returns the prompt and the first two tokens it generates freely."""
    prompt = backend.encode("Once upon a time").ids
    free, _ = argmax_loop(backend, prompt, 8, set())
    assert free[2] not in free[:2]
    shutil.copytree(source, folder)
    generation = json.loads((folder / "generation_config.json").read_text())
    generation["eos_token_id"] = [*generation["eos_token_id"], free[2]]
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return prompt, free[:2]


@pytest.mark.transformers_floor
def test_hf_generation_is_a_plain_argmax_loop_whatever_the_generation_config_asks(backends, real_models):
    config = build_config("needle", {}, {"models": ["a/b"], "ctx": "1k", "depths": "0,50,100", "samples": 2})
    samples = needle.TASK.running.make_samples(config.options, config.seed)
    compared = 0
    for name, backend in backends.items():
        checkpoint = json.loads((real_models[name] / "generation_config.json").read_text())
        assert checkpoint["do_sample"] and checkpoint["repetition_penalty"] == 1.3  # what diffeval must not apply
        for sample in samples:
            prompt = needle.build_prompt(sample, backend, sample.ctx - 32, False)
            [generated] = backend.generate([prompt.ids], 32, [])
            tokens, _ = argmax_loop(backend, prompt.ids, 32, backend.stop_ids)
            text = HFTokenizer(backend.tokenizer).decode_continuation(prompt.ids, tokens, backend.stop_ids)
            assert generated.text == text and generated.new_tokens == len(tokens), name
            compared += 1
    assert compared == 4 * len(samples)


@pytest.mark.transformers_floor
def test_every_generation_config_eos_id_stops_hf(backends, real_models, tmp_path):
    """An EOS id only the generation config lists (Llama-3 lists several) ends generation as the tokenizer's does:
    the id the model would produce third is made an extra EOS, and generation stops there."""
    name = "base-llama3"
    backend = backends[name]
    folder = tmp_path / name
    prompt, first_two = with_extra_eos(backend, real_models[name], folder)
    stopped = HFBackend(load_model(ModelSpec(name, str(folder)), "cpu"))
    [out] = stopped.generate([prompt], 8, [])
    assert out.new_tokens == 3 and out.text == HFTokenizer(backend.tokenizer).decode_continuation(prompt, first_two, [])
    stopped.close()


TASK_RUNS = {
    "needle": ["--ctx", "1k", "--depths", "0,100", "--samples", "2"],
    "attention": ["--ctx", "1k", "--depths", "50", "--samples", "1", "--rows", "answer"],
    "icl": ["--ctx", "2k", "--shots", "4,16", "--orders", "random:2", "--test-size", "4", "--data-dir", str(FIXTURES)],
    "hallucination": [
        "--ctx",
        "1k",
        "--dataset",
        "xsum,hotpotqa",
        "--samples",
        "2",
        "--judge",
        "overlap",
        "--data-dir",
        str(FIXTURES),
    ],  # fmt: skip
    "outliers": ["--tokens", "1k", "--ctx", "512"],
}


@pytest.mark.parametrize("task", sorted(TASK_RUNS))
def test_every_task_runs_on_real_tokenizers_through_the_cli(real_models, task, tmp_path):
    out = tmp_path / task
    models = _models(real_models, "diff-mistral", "base-mistral", "diff-llama3", "base-llama3")
    result = run_cli("run", task, *models, *TASK_RUNS[task], "--out", str(out))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {r["model"] for r in records} == {"diff-mistral", "base-mistral", "diff-llama3", "base-llama3"}
    assert (out / "table.md").is_file()
    if task == "needle":  # every prompt fills its budget (ctx minus the generated tokens) to within 1 %
        assert all(0.99 * (r["ctx"] - 32) <= r["prompt_tokens"] <= r["ctx"] - 32 for r in records)
    if task == "icl":
        assert all(r["status"] == "ok" for r in records)


def test_lm_eval_tasks_run_on_real_tokenizers(real_models, lm_tasks, tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval is an optional extra: pip install 'diffeval[lmeval]'")
    models = _models(real_models, "diff-mistral", "base-llama3")
    common = ["--include-path", str(lm_tasks), "--ctx", "512"]
    quant = run_cli("run", "quantize", *models, "--tasks", "hellaswag_local", "--bits", "4", *common,
                    "--out", str(tmp_path / "q"))  # fmt: skip
    assert quant.returncode == 0, quant.stderr
    zero = run_cli("run", "zeroshot", *models, "--tasks", "arc_local", *common, "--out", str(tmp_path / "z"))
    assert zero.returncode == 0, zero.stderr


def _damaged(source: Path, folder: Path, change) -> Path:
    shutil.copytree(source, folder)
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_weights_that_do_not_match_the_architecture_are_refused_before_any_work(tiny_models, tmp_path):
    """The second model of the pair is damaged three ways; each run stops in one line before the first model runs,
    and the run folder an earlier run left is byte for byte as it was."""
    diff = tiny_models["diff"]
    lam = "model.layers.1.self_attn.lambda_k2"
    broken = {
        "missing": (lambda t: t.pop(lam), [f"missing {lam}", "without its λ tensors"]),
        "subln": (
            lambda t: t.update({"model.layers.0.self_attn.subln.weight": torch.ones(32)}),
            ["unexpected model.layers.0.self_attn.subln.weight", "microsoft/unilm"],
        ),  # fmt: skip
        "shape": (
            lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(64, 64)}),
            ["misshapen model.layers.0.mlp.up_proj.weight [64, 64] (model [128, 64])"],
        ),  # fmt: skip
    }
    out = tmp_path / "run"
    first = run_cli("run", "needle", "-m", f"a={diff}", "-m", f"b={diff}", "--ctx", "512", "--depths", "50",
                    "--samples", "1", "--out", str(out))  # fmt: skip
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for name, (change, expected) in broken.items():
        bad = _damaged(diff, tmp_path / name, change)
        result = run_cli_in_process("run", "needle", "-m", f"a={diff}", "-m", f"b={bad}", "--ctx", "512",
                                    "--depths", "50", "--samples", "2", "--out", str(out))  # fmt: skip
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert "model b: the weights in" in lines[0] and all(text in lines[0] for text in expected), lines[0]
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
