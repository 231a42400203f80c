"""OpenAI-MRCR (multi-round coreference): reproduce the reply to the i-th of several identical requests in a long
conversation, with a random string prepended (docs/tasks/mrcr.md).

Recipe:
1. samples: per length and needle count, `samples` conversations (data/mrcr.py: 2, 4 or 8 identical requests among
   look-alikes, replies of real text, the asked index and random string seeded); or OpenAI's rows (`--source
   openai`), each run at the shortest --ctx that holds it for every model (`prepare`), or counted as too long.
2. prompt: every turn through the model's chat template (`Backend.render_messages`), or plain with role prefixes
   when asked (`--rendering plain`). Each model takes filler turns from the conversation's stream until its budget
   (ctx − answer budget − thinking) is full, token-exact (`turns.fit_turns`).
3. backend: greedy generation of the answer budget: the expected answer's tokens and a margin (`answer_budget`).
4. score, as OpenAI grades: 0 unless the output starts with the random string; else difflib's SequenceMatcher ratio
   of the output and the expected reply, the string removed from both (`grade`).
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, replace

from diffeval.data import mrcr as data
from diffeval.errors import InputError
from diffeval.records import Record, sample_id
from diffeval.tasks import thinking
from diffeval.tasks.base import ContextBudget, Listing, Reporting, RunContext, Running, Scoring, Task, Viewing
from diffeval.tasks.conversations import turns
from diffeval.tasks.conversations.mrcr_options import MrcrOptions
from diffeval.tasks.conversations.mrcr_report import FLOOR, RECORD_SCHEMA, TITLES, TOO_LONG, sample_view, tables

ANSWER_MARGIN = 16  # tokens beyond the expected answer's own, and a tenth of them: a reply may re-tokenize longer


def grade(response: str, answer: str, random_string: str) -> float:
    """OpenAI-MRCR's grade: 0 unless the response starts with the random string; otherwise the SequenceMatcher ratio
    of response and answer, each without the string."""
    if not response.startswith(random_string):
        return 0.0
    return difflib.SequenceMatcher(
        None, response.removeprefix(random_string), answer.removeprefix(random_string)
    ).ratio()


def score(output: str, answer: str, random_string: str) -> float:
    """A model's output graded as a chat API returns a reply: without the leading whitespace a plain rendering's
    reply begins with ("Assistant: …")."""
    return grade(output.lstrip(), answer, random_string)


COPY_RATIO = 0.5  # an output this close (SequenceMatcher ratio) to a reply of the conversation reproduces it


def copied(output: str, random_string: str, messages: list[dict], asked: int, needles: list[int]) -> dict:
    """Which reply the output reproduces, a diagnostic beside the grade: the asked one, a look-alike needle's, another
    reply, or none (no reply within COPY_RATIO); and its ratio. The random string, where written, is not compared."""
    text = output.lstrip().removeprefix(random_string)
    index, ratio = turns.closest_reply(text, messages)
    kind = "asked" if index == asked else "look-alike" if index in needles else "other"
    return {"copied": kind if ratio >= COPY_RATIO else "none", "copied_ratio": round(ratio, 4)}


@dataclass(frozen=True)
class MrcrSample:
    sample_id: str
    ctx: int
    n_needles: int
    conversation: data.Conversation | None = None  # a generated one
    row: data.Row | None = None  # or OpenAI's
    fits: bool = True  # False: an OpenAI row that fits no --ctx for some model


def answer_budget(encoder, expected: str) -> int:
    """Tokens a model may generate: the expected answer's, the margin and a tenth (a model must reproduce it)."""
    tokens = len(encoder.encode(expected, special_tokens=False).ids)
    return tokens + ANSWER_MARGIN + tokens // 10


def _generated(options: MrcrOptions, seed: int, count: int) -> list[MrcrSample]:
    return [MrcrSample(sample_id(key), ctx, n, data.build(key, options.replies, n, options.index))
            for ctx in options.ctx for n in options.needles for i in range(count)
            for key in [f"mrcr|{seed}|{ctx}|{n}|{i}"]]  # fmt: skip


def make_samples(options: MrcrOptions, seed: int, limit: int | None = None, prepared=None) -> list[MrcrSample]:
    count = min(options.samples, limit) if limit else options.samples
    if options.source == "generated":
        return _generated(options, seed, count)
    taken: dict[int, int] = {}  # rows per needle count: at most `count` of each
    samples = []
    for row, ctx in prepared:
        taken[row.n_needles] = taken.get(row.n_needles, 0) + 1
        if taken[row.n_needles] <= count:
            samples.append(MrcrSample(sample_id(f"mrcr|openai|{row.id}|{row.answer}"), ctx or max(options.ctx),
                                      row.n_needles, row=row, fits=ctx is not None))  # fmt: skip
    return samples


def prepare(context: RunContext[MrcrOptions], tokenizers: dict) -> list[tuple[data.Row, int | None]] | None:
    """Before any work, with each model's tokenizer: a model without a chat template is refused (unless rendered
    plain); a generated conversation whose needles and question alone overflow a length is refused, naming the most
    needles that fit. OpenAI's rows: each with the shortest length that holds it for every model (None: none)."""
    options, reserved = context.options, thinking.reserve(context)
    chat = options.rendering == "chat"
    if options.source == "openai":
        found = []
        for row in data.load(options.data_dir, options.needles, options.samples):
            need = max(len(t.encode(t.render_messages(list(row.messages), chat, name)).ids)
                       + answer_budget(t, row.answer) for name, t in tokenizers.items())  # fmt: skip
            found.append((row, next((ctx for ctx in sorted(options.ctx) if need + reserved <= ctx), None)))
        return found
    for sample in _generated(options, context.seed, min(options.samples, context.limit or options.samples)):
        for name, tokenizer in tokenizers.items():
            _check_fits(sample, tokenizer, name, chat, reserved)
    return None


def _check_fits(sample: MrcrSample, tokenizer, name: str, chat: bool, reserved: int) -> None:
    conversation = sample.conversation
    assert conversation is not None
    answer = answer_budget(tokenizer, conversation.expected) + reserved

    def least(needles: int) -> int:
        fewer = replace(conversation, needle_replies=conversation.needle_replies[:needles],
                        positions=conversation.positions[:needles], index=min(conversation.index, needles))  # fmt: skip
        return len(tokenizer.encode(tokenizer.render_messages(fewer.messages(0)[0], chat, name)).ids) + answer

    if least(sample.n_needles) <= sample.ctx:
        return
    most = max((n for n in range(1, sample.n_needles) if least(n) <= sample.ctx), default=0)
    if most == 0:
        raise InputError(f"--ctx {sample.ctx} is below what one turn needs: model {name}'s shortest conversation (one "
                         f"needle and the question) and its answer take {least(1)} tokens: use at least --ctx "
                         f"{least(1)}")  # fmt: skip
    fit = "1 needle fits" if most == 1 else f"{most} needles fit"
    raise InputError(f"--needles {sample.n_needles} do not fit --ctx {sample.ctx} for model {name}: at most {fit} "
                     f"beside the answer: use --needles {most} or fewer, or a longer --ctx")  # fmt: skip


def evaluate(batch: list[MrcrSample], backend, context: RunContext[MrcrOptions]) -> list[Record]:
    """Each conversation fitted and rendered for this model, its answer generated within its own answer budget."""
    options, reserved = context.options, thinking.reserve(context)
    chat = options.rendering == "chat"
    records = []
    for sample in batch:
        start = time.perf_counter()
        conversation, row = sample.conversation, sample.row
        expected = conversation.expected if conversation else row.answer  # type: ignore[union-attr]
        budget = answer_budget(backend, expected)
        fields = _shared_fields(sample, options.rendering, budget)
        if not sample.fits:  # an OpenAI row longer than every --ctx for some model: counted, not generated
            records.append(Record("mrcr", backend.info.name, sample.sample_id, 0, 0, 0.0,
                                  {**fields, "output": "", "score": None, "outcome": TOO_LONG}))  # fmt: skip
            continue
        fitted, needles = conversation_prompt(sample, backend, chat, sample.ctx - budget - reserved)
        if conversation is not None:
            fields |= {"fillers": fitted.fillers, "last_words": fitted.last_words}
        asked = needles[fields["index"] - 1]
        stop = [] if chat else ["\nUser:"]  # a plain rendering's reply ends where the next turn would begin
        (out,) = thinking.generate(backend, context, [thinking.Ask(fitted.ids, fitted.text, "")], budget, stop)
        fields |= {
            "output": out.text,
            "score": score(out.text, expected, fields["random_string_to_prepend"]) if thinking.answered(out) else None,
            "distance_to_end": len(fitted.ids) - fitted.spans[asked][1],
            "distance_to_last_needle": turns.distance(fitted.spans, asked, [needles[-1]])[0],
            "prompt_budget": sample.ctx - budget - reserved,
            **copied(out.text, fields["random_string_to_prepend"], fitted.messages, asked, needles),
            **thinking.thinking_fields(out),
        }
        seconds = time.perf_counter() - start
        records.append(Record("mrcr", backend.info.name, sample.sample_id, len(fitted.ids),
                              thinking.generated_tokens(out), seconds, fields))  # fmt: skip
    return records


def conversation_prompt(sample: MrcrSample, backend, chat: bool, budget: int) -> tuple[turns.Rendered, list[int]]:
    """The sample's conversation as this model reads it (a generated one fitted to `budget` prompt tokens), and the
    message index of each needle reply, in order."""
    if sample.conversation is not None:
        fitted = turns.fit_turns(backend, sample.conversation.messages, budget, chat)
        return fitted, sample.conversation.messages(fitted.fillers, fitted.last_words)[1]
    assert sample.row is not None
    return turns.render(backend, list(sample.row.messages), chat), sample.row.needle_messages


def _shared_fields(sample: MrcrSample, rendering: str, budget: int) -> dict:
    """What a record says of its sample before the model answers."""
    conversation, row = sample.conversation, sample.row
    if conversation is not None:
        own = {"source": "generated", "index": conversation.index, "format": conversation.needle_format,
               "topic": conversation.needle_topic, "expected": conversation.expected,
               "random_string_to_prepend": conversation.random_string, "key": conversation.key}  # fmt: skip
    else:
        assert row is not None
        own = {"source": "openai", "index": row.index, "row": row.id, "expected": row.answer,
               "random_string_to_prepend": row.random_string_to_prepend}  # fmt: skip
    return {"ctx": sample.ctx, "n_needles": sample.n_needles, "rendering": rendering, "answer_budget": budget, **own}


def sizing(samples: list[MrcrSample], tokenizer, context: RunContext[MrcrOptions]) -> tuple[int, int]:
    """For --dry-run: a built conversation fills its prompt budget (within 1 %), an OpenAI row is its rendering; each
    generates at most its answer budget (and the thinking budget)."""
    prompt = generated = 0
    chat, reserved = context.options.rendering == "chat", thinking.reserve(context)
    for sample in samples:
        expected = sample.conversation.expected if sample.conversation else sample.row.answer  # type: ignore[union-attr]
        budget = answer_budget(tokenizer, expected)
        if sample.row is not None:
            prompt += len(tokenizer.encode(tokenizer.render_messages(list(sample.row.messages), chat)).ids)
        else:
            prompt += sample.ctx - budget - reserved
        generated += budget + (thinking.budget(context) or 0)
    return prompt, generated


LEAST_PROMPT = 64  # tokens: the fewest a conversation (needle turns and the question) could take
LEAST_ANSWER = 24  # tokens: the random string and a few words; each sample's own budget is checked in `prepare`


def budget(context: RunContext[MrcrOptions]) -> ContextBudget:
    """A coarse check before any tokenizer is open; `prepare` checks each conversation with each model's own."""
    if context.chat_template and context.options.rendering == "plain":
        raise InputError("--chat-template and --rendering plain contradict each other: leave one out")
    return ContextBudget(context.lengths, LEAST_ANSWER, LEAST_PROMPT, thinking=thinking.reserve(context))


TASK = Task(
    name="mrcr",
    help="OpenAI-MRCR: reproduce the i-th of several identical requests' replies in a long conversation.",
    options=MrcrOptions,
    run_options=("chat_template", *thinking.RUN_OPTIONS),
    running=Running(make_samples=make_samples, evaluate=evaluate, budget=budget, prepare=prepare, sizing=sizing),
    reporting=Reporting(
        tables=tables,
        titles=TITLES,
        note=(
            "score = OpenAI-MRCR's grade: 0 unless the output starts with the random string, else difflib's "
            "SequenceMatcher ratio of the output and the expected reply, the string removed (leading whitespace of "
            f"the output dropped); a paired cell where both models' mean is at most {FLOOR} reads no difference"
        ),
        summary_keys=["model", "ctx", "n_needles"],
        pair_keys=["ctx", "n_needles"],
        metrics={"score": "score"},
        floor=FLOOR,
    ),
    viewing=Viewing(sample_view=sample_view, listing=Listing(answer="output", expected="expected", outcome=None)),
    scoring=Scoring(record_schema=RECORD_SCHEMA),
)
