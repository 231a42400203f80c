from pathlib import Path

import pytest

from diffeval.data.haystack import haystack_sentences
from diffeval.errors import InputError
from diffeval.longctx import lengths, scoring
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.tasks.haystack import needle, needle_report, recipe, tables
from diffeval.tasks.haystack.needle_options import NeedleOptions
from diffeval.tasks.haystack.recipe import STOP

# every test here touches transformers' internals: .ci/run runs them again at the low end of its range
pytestmark = pytest.mark.transformers_floor


@pytest.fixture(scope="module")
def backends(tiny_models):
    return {name: HFBackend(load_model(ModelSpec(name, str(tiny_models[name])), "cpu")) for name in ("diff", "base")}


def test_samples_are_pure_and_unique():
    a = needle.make_sample(0, 4096, 50, 6, 2, 3)
    assert a == needle.make_sample(0, 4096, 50, 6, 2, 3)
    assert a != needle.make_sample(1, 4096, 50, 6, 2, 3)
    assert len(set(a.extra["cities"])) == 6 and len(set(a.extra["numbers"])) == 6
    assert all(len(n) == 7 and n.isdigit() for n in a.extra["numbers"])
    assert [i.depth for i in a.inserts][0] == 50 and a.expected == a.extra["numbers"][:2]
    options = NeedleOptions(ctx=[1024, 2048], needles=[1, 2], queries=[1, 2], depths=[0, 100], samples=3)
    samples = needle.TASK.running.make_samples(options, seed=0)
    assert len(samples) == 2 * 2 * 2 * 3 and len({s.sample_id for s in samples}) == len(samples)
    assert len(needle.TASK.running.make_samples(options, seed=0, limit=1)) == 8


@pytest.mark.parametrize("ctx", [1024, 2048, 4096])
@pytest.mark.parametrize("depth", [0, 25, 50, 75, 100])
def test_prompt_fills_budget_and_places_needle_at_depth(backends, ctx, depth):
    sample = needle.make_sample(0, ctx, depth, 4, 2, 0)
    for backend in backends.values():
        prompt = needle.build_prompt(sample, backend, ctx - 32, chat_template=False)
        assert 0.99 * ctx <= len(prompt.ids) + 32 <= ctx
        assert abs(prompt.depth_actual - depth) <= 2.0
        tokenizer = backend.tokenizer
        for (start, end), number in zip(prompt.spans["numbers"], sample.extra["numbers"]):
            assert tokenizer.decode(prompt.ids[start:end]).strip() == number
        for (start, end), city in zip(prompt.spans["needles"], sample.extra["cities"]):
            assert city in tokenizer.decode(prompt.ids[start:end])
        h_start, h_end = prompt.spans["haystack"]
        first = prompt.spans["needles"][0][0]
        assert h_start <= first < h_end


def test_same_content_across_tokenizers(backends):
    sample = needle.make_sample(0, 2048, 50, 6, 2, 0)
    prompts = {n: needle.build_prompt(sample, b, 2048 - 32, False) for n, b in backends.items()}
    texts = {n: backends[n].tokenizer.decode(p.ids, skip_special_tokens=True) for n, p in prompts.items()}
    assert backends["diff"].tokenizer.get_vocab() != backends["base"].tokenizer.get_vocab()
    for text in texts.values():
        needles = zip(sample.extra["cities"], sample.extra["numbers"])
        assert all(needle.needle_sentence(c, n) in text for c, n in needles)
        assert text.startswith(needle.INSTRUCTION)
        assert text.endswith(needle.answer_prefix(sample.extra["cities"][:2]))

    # both models cut the same stream: the shorter haystack is a prefix of the longer (needles removed)
    def stream(text):
        for c, n in zip(sample.extra["cities"], sample.extra["numbers"]):
            text = text.replace(needle.needle_sentence(c, n) + " ", "")
        return text.split("\n\n")[1].split()

    short, long = sorted((stream(t) for t in texts.values()), key=len)
    assert long[: len(short)] == short
    # same needle order in both prompts (relative depths do not depend on the tokenizer)
    orders = [sorted(range(6), key=lambda i: t.index(sample.extra["numbers"][i])) for t in texts.values()]
    assert orders[0] == orders[1]


def test_essay_haystack_from_folder_and_json(tmp_path, backends):
    essays = tmp_path / "essays"
    essays.mkdir()
    for i in range(3):
        (essays / f"e{i}.txt").write_text(" ".join(f"Essay {i} sentence {j} says a thing." for j in range(300)))
    json_file = tmp_path / "essays.json"
    json_file.write_text('{"text": "' + " ".join(f"Json sentence {j} is here." for j in range(400)) + '"}')
    for source in (f"essays:{essays}", f"essays:{json_file}"):
        sample = needle.make_sample(0, 1024, 50, 1, 1, 0, source)
        prompt = needle.build_prompt(sample, backends["diff"], 1024 - 32, False)
        assert 0.99 * 1024 <= len(prompt.ids) + 32 <= 1024
        assert abs(prompt.depth_actual - 50) <= 3.0
    # a stream depends only on the seed, and wraps around a corpus shorter than the context
    short = haystack_sentences(f"essays:{essays}", 7, 10)
    long = haystack_sentences(f"essays:{essays}", 7, 50_000)
    assert long[: len(short)] == short and sum(s.count(" ") + 1 for s in long) >= 50_000


@pytest.mark.parametrize(
    ("source", "message"),
    [("essays:/does/not/exist", "does not exist"), ("mystery", "bad --haystack"), ("essays:", "bad --haystack")],
)
def test_bad_haystack(source, message):
    with pytest.raises(InputError, match=message):
        haystack_sentences(source, 0, 100)


@pytest.mark.integration
def test_paul_graham_essays_haystack(backends):
    folder = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "haystack" / "PaulGrahamEssays"
    if not folder.is_dir():
        pytest.skip(f"{folder} absent: the shared datasets are only on CI and dev machines")
    sample = needle.make_sample(0, 4096, 25, 2, 1, 0, f"essays:{folder}")
    prompt = needle.build_prompt(sample, backends["base"], 4096 - 32, False)
    assert 0.99 * 4096 <= len(prompt.ids) + 32 <= 4096
    assert abs(prompt.depth_actual - 25) <= 3.0


# output, expected numbers, score under the default rule, score under RULER's string_match_all
SCORING_TABLE = [
    ("1234567.", ["1234567"], 1.0, 1.0),
    ("The numbers are 1234567 and 7654321", ["7654321", "1234567"], 1.0, 1.0),
    ("1234567", ["1234567", "7654321"], 0.5, 0.5),
    ("1,234,567", ["1234567"], 1.0, 0.0),  # digit groups: the same number to a reader, not a substring
    ("1 234 567", ["1234567"], 1.0, 0.0),
    ("1.234.567.", ["1234567"], 1.0, 0.0),
    ("1'234'567", ["1234567"], 1.0, 0.0),
    ("1,234 567", ["1234567"], 0.0, 0.0),  # two kinds of separator: not one number
    ("12345678", ["1234567"], 0.0, 1.0),  # inside a longer number: a substring, but not the number
    ("0.1234567", ["1234567"], 0.0, 1.0),
    ("1234567.5", ["1234567"], 0.0, 1.0),
    ("1,234,5678", ["1234567"], 0.0, 0.0),
    ("Lisbon: 1234567, Paris: 7654321", ["1234567"], 1.0, 1.0),
    ("", ["1234567"], 0.0, 0.0),
]


@pytest.mark.parametrize(("output", "expected", "default", "ruler"), SCORING_TABLE)
def test_each_scoring_rule_on_a_table_of_outputs(output, expected, default, ruler):
    assert scoring.score(output, expected) == (default, default == 1.0)
    assert scoring.score(output, expected, "ruler") == (ruler, ruler == 1.0)


def test_rescoring_adds_unqueried_numbers_and_precision():
    import pandas as pd

    frame = pd.DataFrame({
        "output": ["1234567", "1234567, 7654321", "1,234,567 and 42", "nothing"],
        "expected": [["1234567"]] * 4,
        "numbers": [["1234567", "7654321"]] * 4,
    })  # fmt: skip
    scored = needle_report.rescore(frame, "default")
    assert list(scored["score"]) == [1.0, 1.0, 1.0, 0.0]
    assert list(scored["unqueried_numbers"]) == [False, True, False, False]  # 42 belongs to no needle
    assert list(scored["precision"][:3]) == [1.0, 0.5, 0.5] and pd.isna(scored["precision"][3])


@pytest.mark.slow
def test_token_limit_follows_the_answer_in_the_models_tokens(real_models):
    """Mistral's tokenizer spends a token per digit: two 7-digit answers need more than 32 new tokens; the prompt
    budget shrinks by as much, so prompt + limit still fill 99-100 % of the context."""
    from types import SimpleNamespace

    from diffeval.models.tokenizer import HFTokenizer, PromptTokenizer

    tokenizer = PromptTokenizer(HFTokenizer(load_tokenizer_for(real_models["base-mistral"])), "mistral")
    config = SimpleNamespace(max_new_tokens=None, options=NeedleOptions(), chat_template=False)
    one, four = needle.make_sample(0, 2048, 50, 4, 1, 0), needle.make_sample(0, 2048, 50, 4, 4, 0)
    answer = len(tokenizer.encode(" " + ", ".join(four.expected), special_tokens=False).ids)
    assert needle.token_limit(one, tokenizer, config) == 32
    margin = needle.ANSWER_MARGIN_PER_QUERY
    assert needle.token_limit(four, tokenizer, config) == answer + 4 * margin > 32 + answer
    prompt = recipe.fitted_prompt(needle.RECIPE, four, tokenizer, config)
    assert 0.99 * 2048 <= len(prompt.ids) + needle.token_limit(four, tokenizer, config) <= 2048
    config.max_new_tokens = 20  # --max-new-tokens wins
    assert needle.token_limit(four, tokenizer, config) == 20


def load_tokenizer_for(path):
    from diffeval.models.checkpoints.loading import load_tokenizer

    return load_tokenizer(ModelSpec("m", str(path)))


def test_generation_stops_at_the_first_blank_line_after_the_answer_begins():
    from diffeval.models.tokenizer import cut_at_stop

    assert cut_at_stop(" 1234567.\n\nNext question", STOP) == " 1234567."
    # a real chat model (SmolLM2-135M-Instruct) opens its list of numbers with a blank line
    assert cut_at_stop("\n\n- 6165250\n- 5464442\n\nThat is all.", STOP) == "\n\n- 6165250\n- 5464442"
    assert cut_at_stop(" \n\n", STOP) == " \n\n" and cut_at_stop("", STOP) == ""


def test_both_engines_count_new_tokens_through_the_one_that_ends_the_answer(tiny_models):
    """The token count by the rule, whatever the engine generated past the stop: the fewest tokens whose text ends
    the answer."""
    from diffeval.models.tokenizer import HFTokenizer, cut_at_stop, tokens_through_stop

    decoder = HFTokenizer(load_tokenizer_for(tiny_models["diff"]))
    prompt = decoder.encode("The number is:").ids
    generated = decoder.encode("\n\n 1234567.\n\nNext question and more", special_tokens=False).ids
    kept = tokens_through_stop(decoder, prompt, generated, STOP, set())
    text = decoder.decode_continuation(prompt, kept, set())
    assert cut_at_stop(text, STOP) == "\n\n 1234567." and text.endswith("\n\n") and len(kept) < len(generated)
    shorter = decoder.decode_continuation(prompt, kept[:-1], set())
    assert cut_at_stop(shorter, STOP) == shorter  # one token fewer, and the answer has not ended
    assert tokens_through_stop(decoder, prompt, generated[:3], STOP, set()) == generated[:3]


def test_chat_template_prompt_fits_budget(tiny_models):
    backend = HFBackend(load_model(ModelSpec("diff", str(tiny_models["diff"])), "cpu"))
    backend.tokenizer.chat_template = (
        "<s>{% for m in messages %}[USER] {{ m['content'] }} [/USER]{% endfor %}"
        "{% if add_generation_prompt %} [ASSISTANT] {% endif %}"
    )
    sample = needle.make_sample(0, 1024, 50, 2, 1, 0)
    prompt = needle.build_prompt(sample, backend, 1024 - 32, chat_template=True)
    text = backend.tokenizer.decode(prompt.ids)
    assert text.startswith("<s>[USER] " + needle.INSTRUCTION) and text.count("<s>") == 1
    assert text.endswith("[/USER] [ASSISTANT] " + needle.answer_prefix(sample.extra["cities"][:1]))
    assert 0.99 * 1024 <= len(prompt.ids) + 32 <= 1024
    start, end = prompt.spans["numbers"][0]
    assert backend.tokenizer.decode(prompt.ids[start:end]).strip() == sample.extra["numbers"][0]


def test_chat_template_missing_is_input_error(backends):
    with pytest.raises(InputError, match="no chat template"):
        backends["base"].render_prompt("x", "y", chat_template=True)


def test_forward_groups_bound_the_padded_batch():
    from diffeval.models.engines.hf import forward_groups

    assert forward_groups([10, 12, 9], max_tokens=36) == [[0, 1, 2]]
    assert forward_groups([10, 12, 9], max_tokens=30) == [[0, 1], [2]]
    assert forward_groups([40, 30, 40, 12], max_tokens=32) == [[0], [1], [2], [3]]
    assert forward_groups([], max_tokens=16) == []


def test_a_batch_holds_at_most_max_batch_tokens_and_decodes_as_alone(backends, monkeypatch):
    """Prompts share a forward pass only while the padded batch fits MAX_BATCH_TOKENS, with the outputs each prompt
    gets alone; each Generation says how many prompts shared its forward pass."""
    backend = backends["base"]
    sample = needle.make_sample(0, 1024, 50, 1, 1, 0)
    ids = needle.build_prompt(sample, backend, 300, chat_template=False).ids
    prompts = [ids, ids[:-7], list(ids), ids[:-3]]
    alone = [backend.generate([p], 12, STOP)[0] for p in prompts]
    for max_tokens, batches in ((len(ids) - 1, [1, 1, 1, 1]), (2 * len(ids), [2, 2, 2, 2]), (4096, [4, 4, 4, 4])):
        monkeypatch.setattr(HFBackend, "MAX_BATCH_TOKENS", max_tokens)
        together = backend.generate(prompts, 12, STOP)
        assert [g.batch for g in together] == batches
        assert [(g.text, g.new_tokens) for g in together] == [(g.text, g.new_tokens) for g in alone]


def test_effective_length_follows_nolima():
    import numpy as np

    def scores(*fractions):  # ten samples per length: 1K, 2K, 4K, 8K
        return {1024 * 2**i: np.array([1.0] * round(10 * f) + [0.0] * (10 - round(10 * f))) for i, f in
                enumerate(fractions)}  # fmt: skip

    # base 1.0 at 1K; 2K keeps 0.9 >= 0.85, 4K drops to 0.8: effective 2K, though 8K is back at 0.9
    assert lengths.effective_length(scores(1.0, 0.9, 0.8, 0.9), [1024]) == (2048, 1.0)
    assert lengths.effective_length(scores(0.7, 1.0, 1.0, 1.0), [1024, 2048]) == (0, 0.85)  # below the shortest
    assert lengths.effective_length(scores(0.4, 0.4, 0.4, 0.4), [1024]) == (None, 0.4)  # base below the floor
    assert lengths.effective_length(scores(1.0, 1.0, 1.0, 1.0), [1024]) == (8192, 1.0)


def test_effective_length_table_and_position_curves(tmp_path):
    import numpy as np
    import pandas as pd

    rows = [
        {"model": model, "sample_id": f"{ctx}-{i}", "ctx": ctx, "depth": (0, 50, 100)[i % 3], "score": float(ok)}
        for model, keep in (("diff", {1024: 10, 2048: 10, 4096: 9}), ("base", {1024: 10, 2048: 5, 4096: 2}))
        for ctx, hits in keep.items()
        for i, ok in enumerate(np.arange(10) < hits)
    ]
    frame = pd.DataFrame(rows)
    table = tables.effective_length_table(frame, [])
    assert table.loc["diff", "effective length"] == "4K" and table.loc["base", "effective length"] == "1K"
    assert table.loc["diff", "base lengths"] == "1K" and table.loc["diff", "threshold"] == 0.85
    assert table.loc["base", "interval low"] == "1K"
    longer = frame[frame["ctx"] > 1024]
    assert tables.effective_length_table(longer, []).loc["diff", "effective length"] == (
        "undefined: no records at the base lengths (up to 1K)"
    )
    # given base lengths are never replaced by others: a run that has not reached 1K yet says so
    assert tables.effective_length_table(longer, [1024]).loc["diff", "effective length"] == (
        "undefined: no records at the base lengths (1K)"
    )
    frame["length"] = frame["ctx"].map(lengths.format_ctx)
    path = lengths.position_curves(frame, ["diff", "base"], ["1K", "2K", "4K"], tmp_path / "curves.png", "depth (%)")
    assert path.name == "curves.png" and path.stat().st_size > 1000
