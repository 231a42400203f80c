"""A model's own tokenizer (transformers fast tokenizer) behind the `Tokenizer` protocol: every engine encodes with
it, so both backends hand the model identical token ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diffeval.errors import InputError
from diffeval.models.backend import Encoder, Encoding, Tokenizer

DECODE_CONTEXT_TOKENS = 8  # prompt tokens a continuation is decoded behind


class HFTokenizer:
    def __init__(self, tokenizer, switches: Mapping[str, Any] | None = None):
        self.hf = tokenizer
        self.switches = dict(switches or {})  # the chat template's keyword arguments (--template-switch)

    def encode(self, text: str, special_tokens: bool = True) -> Encoding:
        # a chat template already carries its own BOS; raw prompts get the tokenizer's special tokens
        add_special = special_tokens and not (self.hf.bos_token and text.startswith(self.hf.bos_token))
        enc = self.hf(text, add_special_tokens=add_special, return_offsets_mapping=True)
        return Encoding(ids=enc["input_ids"], offsets=[tuple(o) for o in enc["offset_mapping"]])

    def encode_many(self, texts: list[str], special_tokens: bool = True) -> list[list[int]]:
        return self.hf(texts, add_special_tokens=special_tokens).input_ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def document_start(self) -> list[int]:
        """The ids a scored document follows, so its first token is predicted too: what the tokenizer puts before a
        text (its BOS), else its EOS, as lm-eval's rolling log-likelihood does; [] where it has neither."""
        plain = self.hf("a", add_special_tokens=False).input_ids
        marked = self.hf("a", add_special_tokens=True).input_ids
        # the special tokens before the text (a tokenizer may add an EOS after it too: that one is not a start)
        starts = (i for i in range(len(marked) - len(plain) + 1) if marked[i : i + len(plain)] == plain)
        before = marked[: next(starts, 0)]
        if before:
            return list(before)
        return [self.hf.eos_token_id] if self.hf.eos_token_id is not None else []

    def decode_continuation(self, prompt: list[int], generated: list[int], stop_ids) -> str:
        """The text of generated ids as it reads after the prompt, a final EOS id dropped: every engine's outputs
        go through this one rule. Decoded alone, SentencePiece ids lose a leading space ("▁as" reads "as")."""
        if generated and generated[-1] in stop_ids:
            generated = generated[:-1]
        context = prompt[-DECODE_CONTEXT_TOKENS:]
        before, after = self.decode(context), self.decode(context + generated)
        return after[len(before) :] if after.startswith(before) else self.decode(generated)

    def render_prompt(self, user: str, answer_prefix: str, chat_template: bool, model: str) -> str:
        """The full prompt text: raw `user + answer_prefix`; or the model's chat template with `user` as the user
        turn and its generation prompt, then `answer_prefix`, which opens the assistant's reply. The user turn drops
        the trailing whitespace that joins it to the answer prefix in the raw prompt."""
        if not chat_template:
            return user + answer_prefix
        check_chat_template(self.hf, model, self.switches)
        messages = [{"role": "user", "content": user.rstrip()}]
        rendered = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **self.switches)
        return rendered + answer_prefix

    def render_messages(self, messages: Sequence[Mapping[str, str]], chat_template: bool, model: str) -> str:
        """A whole conversation up to where the assistant's next reply begins: the model's chat template over every
        turn, with its generation prompt; or plain (`render_plain`). A model without a usable chat template is
        refused in one line that names the plain rendering (--rendering plain) as the way out."""
        if not chat_template:
            return render_plain(messages)
        check_chat_template(self.hf, model, self.switches, instead=PLAIN_INSTEAD)
        turns = [{"role": m["role"], "content": m["content"]} for m in messages]
        return self.hf.apply_chat_template(turns, add_generation_prompt=True, tokenize=False, **self.switches)


PLAIN_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}
PLAIN_INSTEAD = "pass --rendering plain for a plain rendering with role prefixes (User:, Assistant:)"


def render_plain(messages: Sequence[Mapping[str, str]]) -> str:
    """A conversation without a chat template: each turn after its role's prefix ("User: …", "Assistant: …"), turns
    separated by a blank line, ending in "Assistant:" where the next reply begins."""
    return "".join(f"{PLAIN_ROLES[m['role']]}: {m['content']}\n\n" for m in messages) + "Assistant:"


CHAT_PROBE = "diffeval checks that the chat template keeps this user message."


def check_chat_template(
    tokenizer, model: str, switches: Mapping[str, Any] | None = None, instead: str = "leave out --chat-template"
) -> None:
    """`--chat-template` needs a template in the checkpoint's tokenizer (a transformers tokenizer) that renders a user
    message, as every prompt is one, with its text in the prompt; with `switches` (--template-switch), a template that
    reads each of them, rendered with them. `instead`: what a refusal tells the user to do without the template."""
    if not tokenizer.chat_template:
        raise InputError(f"model {model} has no chat template in its tokenizer: {instead}")
    switches = dict(switches or {})
    source = template_source(tokenizer)
    for name, value in switches.items():
        if name not in source:
            raise InputError(f"model {model}: its chat template does not read {name}: leave out --template-switch "
                             f"{name}={_switch_text(value)}")  # fmt: skip
    messages = [{"role": "user", "content": CHAT_PROBE}]
    try:
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **switches)
    except Exception as exc:  # the template is the checkpoint's own Jinja code: it may raise anything
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise InputError(f"model {model}: its chat template fails on a user message ({reason}): fix chat_template "
                         f"in its tokenizer_config.json, or {instead}") from None  # fmt: skip
    if CHAT_PROBE not in rendered:
        raise InputError(f"model {model}: its chat template leaves a user message's text out of the prompt: fix "
                         f"chat_template in its tokenizer_config.json, or {instead}")  # fmt: skip


def template_source(tokenizer) -> str:
    """The chat template's Jinja source: a tokenizer may hold several named templates (a dict); all are read."""
    template = tokenizer.chat_template or ""
    return "\n".join(map(str, template.values())) if isinstance(template, dict) else str(template)


def _switch_text(value: Any) -> str:
    """A switch's value as the command line writes it (YAML: false, not False)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def find_ids(generated: Sequence[int], end: Sequence[int]) -> int | None:
    """The index just after the first occurrence of `end` in `generated`, or None (never for an empty `end`). Where a
    reasoning model's thinking ends: every engine applies this one id rule to its generated ids."""
    width = len(end)
    if not width:
        return None
    target = list(end)
    for i in range(len(generated) - width + 1):
        if generated[i] == target[0] and list(generated[i : i + width]) == target:
            return i + width
    return None


def through_ids(generated: list[int], end: Sequence[int] | None) -> list[int]:
    """The generated ids through the first occurrence of `end` (`find_ids`); all of them where it never comes."""
    found = find_ids(generated, end) if end else None
    return generated if found is None else generated[:found]


def answer_end(text: str, stop: list[str]) -> int | None:
    """Where an answer ends: the first stop string after the answer has begun (after its first non-whitespace
    character), or None. A stop string before any text does not end it: chat models often open a list with a blank
    line ("\n\n- 6165250\n- …"), which a plain first-match rule would read as an empty answer."""
    begun = len(text) - len(text.lstrip())
    found = [i for i in (text.find(s, begun + 1) for s in stop) if i >= 0]
    return min(found) if found else None


def cut_at_stop(text: str, stop: list[str]) -> str:
    """Text up to where the answer ends (`answer_end`)."""
    end = answer_end(text, stop)
    return text if end is None else text[:end]


def tokens_through_stop(
    decoder: HFTokenizer, prompt: list[int], generated: list[int], stop: list[str], stop_ids
) -> list[int]:
    """The generated ids through the one that completes the answer's stop string (engines generate past it, or stop
    there); all of them when the answer never ends that way. Every engine counts its new tokens by this one rule."""
    if not stop or answer_end(decoder.decode_continuation(prompt, generated, stop_ids), stop) is None:
        return generated
    low, high = 1, len(generated)  # the answer has ended by `high` tokens; find the fewest that end it
    while low < high:
        middle = (low + high) // 2
        if answer_end(decoder.decode_continuation(prompt, generated[:middle], stop_ids), stop) is None:
            low = middle + 1
        else:
            high = middle
    return generated[:low]


class PromptTokenizer:
    """A model's tokenizer standing in for its backend where prompts are only built, never run (`--dry-run`)."""

    def __init__(self, tokenizer: Tokenizer, name: str):
        self.tokenizer, self.name = tokenizer, name

    def encode(self, text: str, special_tokens: bool = True) -> Encoding:
        return self.tokenizer.encode(text, special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def document_start(self) -> list[int]:
        return self.tokenizer.document_start()

    def render_prompt(self, user: str, answer_prefix: str, chat_template: bool) -> str:
        return self.tokenizer.render_prompt(user, answer_prefix, chat_template, self.name)

    def render_messages(self, messages: Sequence[Mapping[str, str]], chat_template: bool) -> str:
        return self.tokenizer.render_messages(messages, chat_template, self.name)


@dataclass
class InContext:
    """Continuations tokenized inside their context: `prefix + tails[i]` equals the ids of `context +
    continuations[i]` encoded in one piece, and `prefix` is the longest run of ids they all share with the context."""

    prefix: list[int]
    tails: list[list[int]]


# A continuation is re-encoded behind a window of the context's last tokens: LEAD tokens where the window's own start
# may segment differently (SentencePiece prepends "▁" to a string), then SYNC tokens that must equal the context's
# own (the tokenizer has settled into the same segmentation), then the last WINDOW tokens, which the continuation may
# change (a merge across the seam) and are taken from the re-encoding.
WINDOW_TOKENS = 32
SYNC_TOKENS = 16
LEAD_TOKENS = 16


def encode_in_context(
    encoder: Encoder, context: str, continuations: list[str], special_tokens: bool = True
) -> InContext:
    """Tokenize every `context + continuation` in one piece, as the model will read it, never a continuation alone:
    SentencePiece writes "▁Question" at a string's start but "Question" after a newline, and BPE merges can cross the
    seam. Where the context's encoding is not a prefix of an extended one, the shared prefix shrinks to the longest
    common one and the tails start earlier."""
    ids, extended = _extended(encoder, context, continuations, special_tokens)
    shared = _shared_length(ids, extended)
    return InContext(prefix=ids[:shared], tails=[full[shared:] for _, full in extended])


def encode_choices_in_context(
    encoder: Encoder, context: str, queries: list[str], choices: list[str], special_tokens: bool = True
) -> tuple[list[int], list[list[int]], list[list[list[int]]]]:
    """(prefix, query ids, per query the ids of every choice) with `prefix + queries[i] + choices[i][j]` equal to the
    one-piece encoding of `context + queries[i] + choices[j]`: a choice is tokenized after its own query, a query
    after the context. The prefix is what every query and choice shares, so its KV cache serves them all."""
    texts = [query + choice for query in queries for choice in [""] + choices]
    ids, extended = _extended(encoder, context, texts, special_tokens)
    shared = _shared_length(ids, extended)
    per_query = len(choices) + 1
    query_ids, choice_ids = [], []
    for i in range(len(queries)):
        (_, alone), *with_choices = extended[i * per_query : (i + 1) * per_query]
        own = shared + _shared_length(alone[shared:], [(0, full[shared:]) for _, full in with_choices])
        query_ids.append(alone[shared:own])
        choice_ids.append([full[own:] for _, full in with_choices])
    return ids[:shared], query_ids, choice_ids


def _extended(encoder, context: str, continuations: list[str], special_tokens: bool):
    """The context's ids, and for every continuation (ids known to equal the context's up to this many, the one-piece
    encoding of context + continuation).

    A long context is encoded once. Each continuation is encoded behind a window of the context's last tokens and
    spliced onto the rest; where the window's tokenization does not line up with the context's, that continuation is
    encoded with the whole context instead, so the result is always the one-piece encoding."""
    base = encoder.encode(context, special_tokens)
    ids, offsets = base.ids, base.offsets
    window = _window_start(ids, offsets, len(context))
    extended = []
    for continuation in continuations:
        spliced = _spliced(encoder, context, ids, offsets, window, continuation) if window is not None else None
        extended.append(spliced or (0, encoder.encode(context + continuation, special_tokens).ids))
    return ids, extended


def _shared_length(ids: list[int], extended: list[tuple[int, list[int]]]) -> int:
    """How many leading ids `ids` shares with every extended encoding."""
    shared = len(ids)
    for known, full in extended:
        known = min(known, shared)
        shared = known + _common_length(ids[known:shared], full[known:shared])
    return shared


def _window_start(ids: list[int], offsets: list[tuple[int, int]], length: int) -> int | None:
    """The token where a window starts (it starts a character of its own), or None where the context is too short to
    be worth splicing or ends in a special token (a tokenizer that appends one: encode it whole)."""
    start = len(ids) - WINDOW_TOKENS - SYNC_TOKENS - LEAD_TOKENS
    if start < LEAD_TOKENS or offsets[-1][1] != length:
        return None
    while start > 1 and offsets[start][0] <= offsets[start - 1][0]:  # byte-fallback pieces share a character
        start -= 1
    return start


def _spliced(encoder, context, ids, offsets, start, continuation) -> tuple[int, list[int]] | None:
    """The one-piece encoding of context + continuation from a window, or None where the window does not line up."""
    char = offsets[start][0]
    seam = len(ids) - WINDOW_TOKENS  # context tokens from here on may change with the continuation
    encoded = encoder.encode(context[char:] + continuation, special_tokens=False)
    target = offsets[seam][0] - char
    at = next((i for i, (begin, _) in enumerate(encoded.offsets) if begin >= target), None)
    if at is None or at < SYNC_TOKENS or encoded.offsets[at][0] != target:
        return None
    if encoded.ids[at - SYNC_TOKENS : at] != ids[seam - SYNC_TOKENS : seam]:
        return None
    return seam, ids[:seam] + encoded.ids[at:]


def _common_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
