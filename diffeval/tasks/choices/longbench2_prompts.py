"""LongBench v2's prompts (the official 0-shot prompt, lm-eval's longbench2 prompt), each fitted to a model's budget by
cutting the document's middle, and the official answer extraction."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from diffeval.data import longbench2 as data
from diffeval.longctx.fitting import fit_document
from diffeval.tasks import thinking
from diffeval.tasks.base import RunContext
from diffeval.tasks.choices.longbench2_options import LongBench2Options

# LongBench v2's prompts/0shot.txt, its $DOC$, $Q$ and $C_A$ … $C_D$ as format fields
OFFICIAL = (
    "Please read the following text and answer the question below.\n\n<text>\n{context}\n</text>\n\n"
    "What is the correct answer to this question: {question}\nChoices:\n(A) {a}\n(B) {b}\n(C) {c}\n(D) {d}\n\n"
    'Format your response as follows: "The correct answer is (insert answer here)".'
)
# lm-eval's longbench2 doc_to_text (lm_eval/tasks/longbench2/_longbench_common_yaml): the context and choices as
# they are, the question stripped
LMEVAL = (
    "Please read the following text and answer the question below.\n\n<text>\n{context}\n</text>\n\n"
    "What is the correct answer to this question: {question}\nChoices:\n(A) {a}\n(B) {b}\n(C) {c}\n(D) {d}"
    "\n\n"
)
MAX_NEW_TOKENS = 128  # pred.py's max_new_tokens without chain of thought
CHOICE_TOKENS = 4  # what a prompt leaves for a scored letter (1–2 tokens; a merge across the seam can take more)
MIN_PROMPT_TOKENS = 96  # the least prompt a length must hold: the template, a short question and its choices


def extract_answer(response: str) -> str | None:
    """The letter of "The correct answer is (X)", else of "The correct answer is X", asterisks (markdown bold)
    removed first; None where neither is found. LongBench's pred.py `extract_answer`, on the stripped output."""
    response = response.strip().replace("*", "")
    for pattern in (r"The correct answer is \(([A-D])\)", r"The correct answer is ([A-D])"):
        found = re.search(pattern, response)
        if found:
            return found.group(1)
    return None


@dataclass(frozen=True)
class Form:
    """How a mode and prompt build a sample's prompt: the user turn around a document, the answer prefix that
    opens the reply, and the continuations scored after it (none when generating)."""

    user: Callable[[data.Question, str], str]
    answer_prefix: str
    letters: tuple[str, ...]


def form(options: LongBench2Options) -> Form:
    if options.prompt == "lm-eval":

        def user(q, doc):
            return LMEVAL.format(
                context=doc, question=q.question.strip(), a=q.choices[0], b=q.choices[1], c=q.choices[2], d=q.choices[3]
            )

        return Form(user, "Answer:", tuple(" " + letter for letter in data.LETTERS))

    def official(q, doc):
        a, b, c, d = (choice.strip() for choice in q.choices)
        return OFFICIAL.format(context=doc.strip(), question=q.question.strip(), a=a, b=b, c=c, d=d)

    if options.mode == "choices":  # the asked format's opening: the reply's letter is what is scored
        return Form(lambda q, doc: official(q, doc) + "\n\n", "The correct answer is (", data.LETTERS)
    return Form(official, "", ())


def fit(
    question: data.Question, renderer, ctx: int, context: RunContext[LongBench2Options]
) -> tuple[list[int], int, str]:
    """The prompt's ids within its budget (ctx less the answer's and the thinking's tokens), the document tokens cut
    from its middle, and its text. `renderer`: a backend, or a model's `PromptTokenizer`."""
    shape, reserved = form(context.options), reserved_tokens(context)
    chat = context.chat_template
    # with the chat template, the raw prompt's trailing blank line is the template's turn break
    user = (lambda doc: shape.user(question, doc).rstrip("\n")) if chat else (lambda doc: shape.user(question, doc))
    thought = f" and the thinking's {thinking.reserve(context)}" if thinking.reserve(context) else ""
    beside = f"the letter's {CHOICE_TOKENS}" if shape.letters else f"the answer's {MAX_NEW_TOKENS}{thought}"
    return fit_document(
        lambda doc: renderer.render_prompt(user(doc), shape.answer_prefix, chat),
        question.context,
        renderer,
        ctx - reserved,
        reserved,
        beside,
    )


def reserved_tokens(context: RunContext[LongBench2Options]) -> int:
    return CHOICE_TOKENS if context.options.mode == "choices" else MAX_NEW_TOKENS + thinking.reserve(context)
