"""Scripted reasoning models for the thinking-budget tests (models.tiny.build_scripted_model): tiny Llamas whose greedy
output follows a fixed script, on tokenizer A with a chat template that has <think>/</think> markers
(models.tiny.THINK_TEMPLATE).

Greedy output is a walk from the prompt's last token. Phase 1 (thinking) starts at the generation prompt's last token,
<|assistant|>; phase 2 (the answer) at the last token of "\\n\\n" + answer prefix, ":" for every prefix that ends in one
(needle's, hallucination's). The scripts:
- answers: thinks "<think>\\n the</think>", then answers the number;
- wrong: thinks "<think> NUMBER</think>" (the number only in the thinking), then answers " the";
- loops: "<think>\\n\\n\\n…", never closed;
- judge_yes (a reasoning judge): thinks "<think>\n</think>", then " yes" after "Verdict:";
  "loops" serves as a judge whose thinking never closes;
- plain: tokenizer A without marker tokens (run with --think-markers "<think>,</think>", ids of several tokens each):
  thinks "\\n the</think>" (no start marker), then answers the number.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerFast

from diffeval.models.thinking import SEPARATOR
from diffeval.models.tiny import build_scripted_model, thinking_tokenizer

EOS = 1  # tiny_config's eos_token_id


def script_ids(tokenizer: PreTrainedTokenizerFast, number: str, prefix_end: str = ":") -> dict[str, list[int]]:
    """The ids the scripts are made of: the generation prompt's last token, the markers (as the tokenizer encodes
    them), a newline, a word, the answer's first token (after SEPARATOR + a prefix ending in `prefix_end`) and the
    number's tokens (" " then one per digit)."""

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    return {
        "assistant": [tokenizer.convert_tokens_to_ids("<|assistant|>")],
        "start": ids("<think>"),
        "end": ids("</think>"),
        "newline": ids("\n"),
        "word": ids(" the"),
        "answer_start": ids(SEPARATOR + "Answer" + prefix_end)[-1:],
        "number": ids(" " + number),
    }


def scripted_models(root: Path, tok_a: Path, number: str = "1234567", prefix_end: str = ":") -> dict[str, Path]:
    """The tokenizers ("tok", "tok_plain") and the models "answers", "wrong", "loops", "judge_yes" and "plain" in
    `root`. `number`
    needs distinct digits (each digit token has one successor)."""
    tok = thinking_tokenizer(tok_a, root / "tok")
    plain = thinking_tokenizer(tok_a, root / "tok_plain", marker_tokens=False)
    i = script_ids(tok, number, prefix_end)
    a, s, e, nl, w, p, n = (i[k] for k in ("assistant", "start", "end", "newline", "word", "answer_start", "number"))
    yes = tok(" yes", add_special_tokens=False).input_ids
    scripts = {
        "answers": (root / "tok", [a + s + nl + w + e, p + n + [EOS]]),
        "wrong": (root / "tok", [a + s + n + e, p + w + [EOS]]),
        "loops": (root / "tok", [a + s + nl + nl]),
        "judge_yes": (root / "tok", [a + s + nl + e, p + yes]),
    }
    j = script_ids(plain, number, prefix_end)
    scripts["plain"] = (root / "tok_plain", [j["assistant"] + j["newline"] + j["word"] + j["end"], j["answer_start"]
                                              + j["number"] + [EOS]])  # fmt: skip
    paths = {"tok": root / "tok", "tok_plain": root / "tok_plain"}
    for name, (tokenizer_dir, walks) in scripts.items():
        paths[name] = build_scripted_model(tokenizer_dir, root / name, walks)
    return paths
