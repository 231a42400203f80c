"""OpenAI-MRCR's conversations (multi-round coreference): built here from real text, or read from OpenAI's data.

Built conversations follow the published structure (the `openai/mrcr` dataset card): the user asks "write a {format}
about {topic}" turn after turn, from a few formats and topics; 2, 4 or 8 of those requests are the same (the
needles) among look-alikes (the same format about another topic, another format about the same topic); each reply
is a passage of real text (the packaged book, essays:PATH or hf:DATASET, as the haystack tasks read them), never
text from a model, and no needle reply appears twice. The last user turn asks, in OpenAI's words, for the i-th
needle's reply with a random string prepended.

A conversation is a pure function of the sample: the needle replies and where the needles sit (fractions of the
filler turns, seeded), and an endless seeded stream of filler turns that each model takes from until its budget is
full (`tasks/conversations/turns.py`).

OpenAI's rows (`prompt`: a JSON list of messages, `answer`, `random_string_to_prepend`, `n_needles`,
`desired_msg_index`, `total_messages`, `n_chars`, `date_added`) come from the hub (`openai/mrcr`) or a local parquet
or JSONL file in that schema.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from diffeval.data import read_utf8
from diffeval.data.haystack import haystack_sentences, split_sentences
from diffeval.errors import InputError

# the formats and topics of the requests (OpenAI's card names poems, stories and tapirs; these are of that kind)
FORMATS = ("poem", "short story", "riddle", "essay", "blog post", "social media post", "letter", "speech")
TOPICS = ("tapirs", "lighthouses", "frogs", "glaciers", "bicycles", "owls", "volcanoes", "libraries", "penguins",
          "harbours", "comets", "orchards")  # fmt: skip
FORMATS_PER_CONVERSATION = 4  # the formats one conversation draws its requests from, the needle's among them
TOPICS_PER_CONVERSATION = 4
PASSAGE_WORDS = (15, 40)  # a reply's length in words: whole sentences up to a seeded target in this range
RANDOM_STRING_LENGTH = 10  # OpenAI's strings are 10 letters and digits ("aYooSG8CQg")
HUB_ID = "openai/mrcr"
FILE_NAMES = ("mrcr.parquet", "mrcr.jsonl")  # what a --data-dir folder holds, read in this order
COLUMNS = {"prompt": str, "answer": str, "random_string_to_prepend": str, "n_needles": int, "desired_msg_index": int,
           "total_messages": int, "n_chars": int}  # fmt: skip  # date_added is read when present


def request(fmt: str, topic: str) -> str:
    """A user turn: "write a poem about tapirs" (OpenAI's lower-case form, "an" before a vowel)."""
    return f"write {'an' if fmt[0] in 'aeiou' else 'a'} {fmt} about {topic}"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, …, 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def question(random_string: str, index: int, fmt: str, topic: str) -> str:
    """The last user turn, in OpenAI-MRCR's published words."""
    return (f"Prepend {random_string} to the {ordinal(index)} (1 indexed) {fmt} about {topic}. Do not include any "
            "other text in your response.")  # fmt: skip


@dataclass(frozen=True)
class Conversation:
    """A built conversation's content, before any model cuts it: the needle request, its replies (one per needle, in
    order), where each needle sits (a fraction of the filler turns before it), the asked index (1-based), the random
    string, and the seeded stream its filler turns come from."""

    key: str  # seeds the filler stream
    source: str  # where replies come from: book | essays:PATH | hf:DATASET[:SPLIT[:FIELD]]
    formats: tuple[str, ...]
    topics: tuple[str, ...]
    needle_format: str
    needle_topic: str
    needle_replies: tuple[str, ...]
    positions: tuple[float, ...]  # sorted, in [0, 1]
    index: int  # the asked needle, 1..len(needle_replies)
    random_string: str

    @property
    def expected(self) -> str:
        """OpenAI's `answer`: the random string, then the asked needle's reply."""
        return self.random_string + self.needle_replies[self.index - 1]

    @property
    def final_question(self) -> str:
        return question(self.random_string, self.index, self.needle_format, self.needle_topic)

    @cached_property
    def fillers(self) -> FillerStream:
        return FillerStream(self)

    def messages(self, fillers: int, last_words: int | None = None) -> tuple[list[dict[str, str]], list[int]]:
        """The conversation with `fillers` filler turns, the last one's reply cut to (or continued through the
        source to) `last_words` words (None: its passage whole), and its final question; and the message index of
        each needle's reply, in order."""
        before = [round(p * fillers) for p in self.positions]  # filler turns before each needle (sorted)
        turn = request(self.needle_format, self.needle_topic)
        messages: list[dict[str, str]] = []
        needles: list[int] = []
        for i in range(fillers + 1):
            for k in (k for k, at in enumerate(before) if at == i):
                messages += [
                    {"role": "user", "content": turn},
                    {"role": "assistant", "content": self.needle_replies[k]},
                ]
                needles.append(len(messages) - 1)
            if i < fillers:
                ask, reply = self.fillers.turn(i, last_words if i == fillers - 1 else None)
                messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": reply}]
        return messages + [{"role": "user", "content": self.final_question}], needles


class FillerStream:
    """A conversation's filler turns, endless and seeded: each a request that is not the needle's, and a passage of
    the source that no needle reply shares a sentence with. Turn i's reply read on past its passage continues
    through the source (the last turn a model takes may be cut or continued to fill its budget)."""

    def __init__(self, conversation: Conversation):
        self.conversation = conversation
        needle = (conversation.needle_format, conversation.needle_topic)
        self.requests = [(f, t) for f in conversation.formats for t in conversation.topics if (f, t) != needle]
        self.excluded = {s for reply in conversation.needle_replies for s in split_sentences(reply)}
        self.sentences: list[str] = []
        self.starts: list[int] = [0]  # sentence index where each passage starts

    def _grow(self, sentences: int) -> None:
        words = max(2000, 2 * sum(s.count(" ") + 1 for s in self.sentences))
        while len(self.sentences) < sentences:
            stream = haystack_sentences(self.conversation.source, _seed(self.conversation.key, "fillers"), words)
            self.sentences = [s for s in stream if s not in self.excluded]
            words *= 2

    def _passage_end(self, i: int) -> int:
        while len(self.starts) <= i + 1:
            start, target = self.starts[-1], _passage_words(self.conversation.key, len(self.starts) - 1)
            end, words = start, 0
            while words < target:
                self._grow(end + 1)
                words += self.sentences[end].count(" ") + 1
                end += 1
            self.starts.append(end)
        return self.starts[i + 1]

    def turn(self, i: int, words: int | None = None) -> tuple[str, str]:
        """Filler turn i: (request, reply); the reply cut or continued to `words` words when given."""
        rng = random.Random(_seed(self.conversation.key, f"request:{i}"))
        ask = request(*rng.choice(self.requests))
        end = self._passage_end(i)
        if words is None:
            return ask, " ".join(self.sentences[self.starts[i] : end])
        taken: list[str] = []
        at = self.starts[i]
        while len(taken) < words:
            self._grow(at + 1)
            taken += self.sentences[at].split()
            at += 1
        return ask, " ".join(taken[:words])


def _seed(key: str, part: str) -> int:
    return random.Random(f"mrcr:{key}:{part}").getrandbits(32)


def _passage_words(key: str, i: int) -> int:
    return random.Random(f"mrcr:{key}:passage:{i}").randint(*PASSAGE_WORDS)


def build(key: str, source: str, n_needles: int, index: int | None) -> Conversation:
    """A conversation's content from its key (seed, length and cell): the formats and topics it draws from, the
    needle request, `n_needles` distinct replies of real text, where the needles sit (uniform fractions of the
    filler turns, sorted), the asked index (`index`, or seeded) and a random string."""
    rng = random.Random(f"mrcr:{key}")
    formats = tuple(rng.sample(FORMATS, FORMATS_PER_CONVERSATION))
    topics = tuple(rng.sample(TOPICS, TOPICS_PER_CONVERSATION))
    sentences = haystack_sentences(source, _seed(key, "needles"), 400 * n_needles)
    replies, at = [], 0
    for k in range(n_needles):
        target, words, start = _passage_words(key, -1 - k), 0, at
        while words < target:
            words += sentences[at].count(" ") + 1
            at += 1
        replies.append(" ".join(sentences[start:at]))
    alphabet = string.ascii_letters + string.digits
    return Conversation(
        key=key,
        source=source,
        formats=formats,
        topics=topics,
        needle_format=rng.choice(formats),
        needle_topic=rng.choice(topics),
        needle_replies=tuple(replies),
        positions=tuple(sorted(rng.random() for _ in range(n_needles))),
        index=index if index is not None else rng.randint(1, n_needles),
        random_string="".join(rng.choice(alphabet) for _ in range(RANDOM_STRING_LENGTH)),
    )


# ---- OpenAI's rows ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One row of OpenAI's MRCR data: its messages (the last is the question), `answer` (the random string and the
    asked reply), the string, and the row's own counts."""

    id: str  # the row's number in its file (or split), from 0
    messages: tuple[dict[str, str], ...]
    answer: str
    random_string_to_prepend: str
    n_needles: int
    desired_msg_index: int  # the asked reply's index in `messages`
    n_chars: int
    date_added: str

    @property
    def needle_messages(self) -> list[int]:
        """The message index of each reply to the asked request (the needles), in order."""
        asked = self.messages[self.desired_msg_index - 1]["content"]
        return [i for i in range(1, len(self.messages) - 1) if self.messages[i]["role"] == "assistant"
                and self.messages[i - 1]["content"] == asked]  # fmt: skip

    @property
    def index(self) -> int:
        """The asked needle, 1-based."""
        return self.needle_messages.index(self.desired_msg_index) + 1


def local_file(data_dir: str) -> Path:
    """The file a --data-dir names: itself, or the first of FILE_NAMES in the folder."""
    path = Path(data_dir).expanduser()
    if path.is_dir():
        found = [path / name for name in FILE_NAMES if (path / name).is_file()]
        if not found:
            raise InputError(f"--data-dir {data_dir} holds neither {' nor '.join(FILE_NAMES)}: give a folder with "
                             "one, or the file itself")  # fmt: skip
        return found[0]
    if not path.is_file():
        raise InputError(f"--data-dir {data_dir} does not exist: give OpenAI's MRCR rows as a parquet or JSONL file")
    return path


def load(data_dir: str | None, needles: list[int], count: int | None = None) -> list[Row]:
    """OpenAI's rows with one of `needles` needle counts, at most `count` of each, in file order: from a local file
    (`--data-dir`) or the hub."""
    raw = _read_local(local_file(data_dir)) if data_dir else _read_hub()
    rows, taken = [], dict.fromkeys(needles, 0)
    for number, item in enumerate(raw):
        needles_of = item.get("n_needles") if isinstance(item, dict) else None
        if needles_of in taken and count is not None and taken[needles_of] >= count:
            continue  # a row past the count is not parsed (the hub's prompts reach millions of characters)
        row = _row(item, number, data_dir or HUB_ID)
        if row.n_needles in taken:
            taken[row.n_needles] += 1
            rows.append(row)
    if not rows:
        raise InputError(f"{data_dir or HUB_ID} holds no row with {','.join(map(str, needles))} needles: choose "
                         "--needles among the data's n_needles")  # fmt: skip
    return rows


def _read_local(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            return pd.read_parquet(path).to_dict("records")
        except Exception as exc:  # pyarrow raises its own types for a file that is not parquet
            raise InputError(f"cannot read {path} as parquet ({type(exc).__name__}): give OpenAI's MRCR parquet "
                             "file") from None  # fmt: skip
    rows = []
    for number, line in enumerate(read_utf8(path, "MRCR data file").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise InputError(f"{path} line {number} is not JSON: give one MRCR row per line") from None
    return rows


def _read_hub() -> Iterable[dict]:
    """The hub's rows, read one at a time as `load` takes them: the whole split is gigabytes of prompts."""
    import datasets

    try:
        return datasets.load_dataset(HUB_ID, split="train")
    except Exception as exc:  # datasets raises many types for a missing or offline dataset
        raise InputError(f"cannot load {HUB_ID} ({type(exc).__name__}): check the network, or give --data-dir with "
                         "a local parquet or JSONL file in its schema") from None  # fmt: skip


def _row(item, number: int, source: str) -> Row:
    where = f"{source} row {number}"
    if not isinstance(item, dict):
        raise InputError(f"{where} is not an object: give OpenAI's MRCR rows (prompt, answer, ...)")
    missing = [c for c in COLUMNS if c not in item]
    if missing:
        raise InputError(f"{where} lacks {', '.join(missing)}: not OpenAI's MRCR schema ({', '.join(COLUMNS)})")
    wrong = [c for c, kind in COLUMNS.items() if not isinstance(item[c], kind) or isinstance(item[c], bool)]
    if wrong:
        raise InputError(f"{where}: {', '.join(wrong)} of the wrong type: not OpenAI's MRCR schema")
    try:
        messages = json.loads(item["prompt"])
    except json.JSONDecodeError:
        raise InputError(f"{where}: its prompt is not a JSON list of messages") from None
    good = isinstance(messages, list) and all(isinstance(m, dict) and m.get("role") in ("user", "assistant", "system")
                                              and isinstance(m.get("content"), str) for m in messages)  # fmt: skip
    index = int(item["desired_msg_index"])
    if not good or not messages or messages[-1]["role"] != "user":
        raise InputError(f"{where}: its prompt must be a JSON list of role/content messages ending in a user turn")
    if not 0 < index < len(messages) - 1 or messages[index]["role"] != "assistant":
        raise InputError(f"{where}: desired_msg_index {index} is not an assistant message of its prompt")
    rs = item["random_string_to_prepend"]
    if not item["answer"].startswith(rs):
        raise InputError(f"{where}: its answer does not start with its random_string_to_prepend")
    return Row(str(number), tuple(messages), item["answer"], rs, int(item["n_needles"]), index,
               int(item["n_chars"]), str(item.get("date_added", "")))  # fmt: skip
