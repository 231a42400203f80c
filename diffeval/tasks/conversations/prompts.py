"""A given document in a prompt template, through a model's chat template, fitted into a token budget by cutting the
document's middle (as LongBench truncates), never the template nor the chat template's turns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from diffeval.errors import InputError
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


def fit_document(
    render: Callable[[str], str], document: str, backend: Backend, budget: int, reserved: int, beside: str
) -> tuple[list[int], int, str]:
    """The token ids of `render(document)` within `budget`, the document tokens cut from its middle (its first and
    last halves kept, as LongBench truncates) and the prompt's text. `reserved`: the tokens the context holds beside
    the budget (the answer's, the thinking's), named in the refusal (`beside` says what they are) of a prompt that
    does not fit even without any document."""
    text = render(document)
    ids = backend.encode(text).ids
    if len(ids) <= budget:
        return ids, 0, text
    context = backend.encode(document, special_tokens=False).ids
    cut = len(ids) - budget
    while True:  # decoding and re-encoding the two halves can shift a few tokens: cut until it fits
        keep = max(len(context) - cut, 0)
        head = backend.decode(context[: keep // 2])
        tail = backend.decode(context[len(context) - (keep - keep // 2) :]) if keep else ""
        text = render(head + tail)
        ids = backend.encode(text).ids
        if len(ids) <= budget:
            return ids, len(context) - keep, text
        if keep == 0:  # the template and question alone exceed the budget: no cut of the document helps
            raise InputError(
                f"--ctx {budget + reserved}: the prompt without any document takes {len(ids)} tokens, more than the "
                f"{budget} left beside {beside}: use a longer --ctx"
            )
        cut += len(ids) - budget
