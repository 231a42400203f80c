"""A given document in a prompt template, through a model's chat template, fitted into a token budget by cutting the
document's middle (as LongBench truncates), never the template nor the chat template's turns."""

from __future__ import annotations

from typing import Protocol

from diffeval.longctx.fitting import fit_document
from diffeval.models.backend import Backend


class PromptTemplate(Protocol):
    """A prompt template: `template` formatted with {context} and {input}, its last line the answer prefix that the
    output continues ("Summary:", "Answer:"); and the tokens the answer may take."""

    @property
    def template(self) -> str: ...

    @property
    def max_new_tokens(self) -> int: ...


class GivenDocument(Protocol):
    """The text a prompt is about, and the question asked of it (empty when none)."""

    @property
    def context(self) -> str: ...

    @property
    def question(self) -> str: ...


def answer_prefix(spec: PromptTemplate) -> str:
    """The last line of the template ("Summary:", "Answer:"), which the output continues."""
    return spec.template.rsplit("\n", 1)[1]


def prompt_text(spec: PromptTemplate, context: str, question: str, backend: Backend, chat_template: bool) -> str:
    """The template around the document and question. With the chat template, the template up to its answer prefix
    (the document and the question) is the user turn and the answer prefix opens the assistant's reply."""
    text = spec.template.format(context=context, input=question)
    if not chat_template:
        return text
    prefix = answer_prefix(spec)
    return backend.render_prompt(text[: -len(prefix)], prefix, True)


def fit_prompt(
    spec: PromptTemplate, doc: GivenDocument, backend: Backend, budget: int, chat_template: bool = False
) -> tuple[list[int], int]:
    """The prompt's token ids within `budget`, cutting the middle of the document (never the template, nor the chat
    template's turns); and how many tokens were cut."""
    ids, cut, _ = fit_prompt_text(spec, doc, backend, budget, chat_template)
    return ids, cut


def fit_prompt_text(
    spec: PromptTemplate,
    doc: GivenDocument,
    backend: Backend,
    budget: int,
    chat_template: bool = False,
    thinking: int = 0,
) -> tuple[list[int], int, str]:
    """`fit_prompt`, and the prompt's text (a thinking run moves its answer prefix after the thinking). thinking: the
    tokens the context reserves for a thinking phase beside the budget and the answer (named in the refusal's
    --ctx)."""
    beside = f"the answer's {spec.max_new_tokens}" + (f" and the thinking's {thinking}" if thinking else "")
    return fit_document(
        lambda context: prompt_text(spec, context, doc.question, backend, chat_template),
        doc.context,
        backend,
        budget,
        spec.max_new_tokens + thinking,
        beside,
    )
