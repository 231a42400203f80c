"""Training documents for the toy DIFF / baseline pair: filler text with key→value facts and questions on them.

A document reads exactly like a needle prompt (instruction, haystack with "The special magic number for PLACE
is: NNNNNNN." facts, question, answer prefix) followed by its answer and further question/answer rounds about
the same facts, so one document trains several retrievals. Places come from TRAIN_PLACES and a syllable
generator, never from the evaluation's `data.cities.CITIES`; a document is a pure function of (seed, index, length).
The places and the words of made-up names and essay sentences are data files in `toy/data/`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources

from diffeval.data.cities import CITIES
from diffeval.data.haystack import NOISE_SENTENCES
from diffeval.tasks.haystack.needle import INSTRUCTION, answer_prefix, needle_sentence, question

_DATA = resources.files("diffeval.toy") / "data"

# Real towns, regions and islands, one per line; none of them is an evaluation city (asserted below).
TRAIN_PLACES = tuple(_DATA.joinpath("train_places.txt").read_text(encoding="utf-8").splitlines())
assert not set(TRAIN_PLACES) & set(CITIES), "training places must be disjoint from the evaluation cities"
assert len(set(TRAIN_PLACES)) == len(TRAIN_PLACES) >= 300

# Held out from training documents: the in-training needle check asks about places the model never saw.
VALIDATION_PLACES = TRAIN_PLACES[::10]
_TRAINING_PLACES = tuple(p for i, p in enumerate(TRAIN_PLACES) if i % 10)

_WORDS = json.loads(_DATA.joinpath("words.json").read_text(encoding="utf-8"))
# Syllables of made-up place names: onset + vowel, one to three times, then a coda (the empty coda is listed twice).
_ONSETS, _VOWELS, _CODAS = (tuple(_WORDS["place_syllables"][part]) for part in ("onsets", "vowels", "codas"))
# Essay-like filler: procedurally built sentences of common words (a stand-in for Paul Graham essays). The empty
# opener and tail are listed several times: a plain sentence is the likeliest.
_OPENERS, _SUBJECTS, _VERBS, _OBJECTS, _TAILS = (
    tuple(_WORDS["essay"][part]) for part in ("openers", "subjects", "verbs", "objects", "tails")
)


def synthetic_place(rng: random.Random) -> str:
    """A pronounceable made-up place name (one or two words), for keys beyond the real-place list."""

    def word() -> str:
        syllables = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 3)))
        return (syllables + rng.choice(_CODAS)).capitalize()

    name = word() if rng.random() < 0.8 else f"{word()} {word()}"
    return name if name not in CITIES else synthetic_place(rng)


def essay_sentence(rng: random.Random) -> str:
    opener = rng.choice(_OPENERS)
    subject = rng.choice(_SUBJECTS)
    subject = subject if opener else subject.capitalize()
    sentence = f"{opener}{subject} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    return sentence + rng.choice(_TAILS) + rng.choice((".", ".", ".", "?", "!"))


# Filler kinds and their shares of documents. `cycle` repeats a few random essay sentences, like the noise
# haystack repeats its five: predicting the repeats needs copying from the context, so these documents train
# the induction (copy) heads that retrieval is built from much faster than rare facts alone.
FILLER_MIX = {"noise": 0.5, "cycle": 0.35, "essay": 0.15}


def filler_sentences(rng: random.Random, kind: str) -> Iterator[str]:
    """An endless filler stream of one FILLER_MIX kind."""
    if kind == "essay":
        while True:
            yield essay_sentence(rng)
    if kind == "noise":
        cycle = list(NOISE_SENTENCES)
    else:
        cycle = [essay_sentence(rng) for _ in range(rng.randint(2, 6))]
    i = rng.randrange(len(cycle))
    while True:
        yield cycle[i % len(cycle)]
        i += 1


def tokenizer_texts(count: int = 4000, seed: int = 0) -> Iterator[str]:
    """Tokenizer training text: corpus documents' text plus essay-like English."""
    rng = random.Random(f"tokenizer:{seed}")
    for _ in range(count):
        places = [rng.choice(TRAIN_PLACES) if rng.random() < 0.7 else synthetic_place(rng) for _ in range(4)]
        numbers = [str(rng.randint(1_000_000, 9_999_999)) for _ in places]
        facts = [needle_sentence(p, n) for p, n in zip(places, numbers, strict=True)]
        noise = " ".join(NOISE_SENTENCES)
        essay = " ".join(essay_sentence(rng) for _ in range(8))
        qa = " ".join(question(places[:r]) + " " + answer_prefix(places[:r]) for r in (1, 2))
        yield f"{INSTRUCTION}\n\n{noise} {facts[0]} {essay} {' '.join(facts[1:])}\n\n{qa}"


@dataclass
class Document:
    ids: list[int]
    weights: list[float]  # per-token loss weight of predicting this token


class DocumentMaker:
    """Builds token-exact documents of a given length with one tokenizer.

    The text is assembled from pieces that each start at a pre-tokenizer boundary (a space before a word, a
    newline, a digit), so the concatenated piece encodings equal the encoding of the whole text.
    """

    def __init__(self, tokenizer, answer_weight: float = 3.0, copy_share: float = 0.0):
        self.tokenizer = tokenizer
        self.answer_weight = answer_weight
        self.copy_share = copy_share
        self._cache: dict[str, list[int]] = {}
        self._digits = [self.encode(str(d))[0] for d in range(10)]
        self._plain_tokens = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]

    def encode(self, text: str) -> list[int]:
        if text not in self._cache:
            self._cache[text] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._cache[text]

    def make(self, seed: int, index: int, length: int) -> Document:
        rng = random.Random(f"toy-doc|seed={seed}|i={index}|L={length}")
        if rng.random() < self.copy_share:
            return self._copy_document(rng, length)
        # facts and question rounds grow with the length; several per document so each one trains retrieval.
        # The shortest documents hold one fact: plain copying, the circuit multi-fact retrieval builds on.
        n_facts = rng.randint(1, max(1, length // 96))
        places: list[str] = []
        while len(places) < n_facts:
            place = rng.choice(_TRAINING_PLACES) if rng.random() < 0.7 else synthetic_place(rng)
            if place not in places:
                places.append(place)
        numbers: list[str] = []
        while len(numbers) < n_facts:
            number = str(rng.randint(1_000_000, 9_999_999))
            if number not in numbers:
                numbers.append(number)

        header = [(INSTRUCTION, 1.0), ("\n\n", 1.0)]
        facts = [self._fact_pieces(place, number) for place, number in zip(places, numbers, strict=True)]
        answers = [
            piece
            for cities, asked in self._question_rounds(rng, places, numbers)
            for piece in self._answer_pieces(cities, asked)
        ]
        fixed = header + [p for fact in facts for p in fact] + answers
        room = length - 1 - sum(len(self.encode(text)) for text, _ in fixed) - len(facts)  # facts' spaces
        filler = self._filler(rng, max(room, 0))
        slots = sorted(rng.randint(0, len(filler)) for _ in facts)

        pieces = list(header)
        separator = ""  # the haystack's first piece follows the blank line directly, the others a space
        for i in range(len(filler) + 1):
            for slot, fact in zip(slots, facts, strict=True):
                if slot == i:
                    pieces += [(separator + fact[0][0], 1.0)] + fact[1:]
                    separator = " "
            if i < len(filler):
                pieces.append((separator + filler[i], 1.0))
                separator = " "
        pieces += answers

        ids, weights = [self.tokenizer.bos_token_id], [0.0]
        for text, weight in pieces:
            piece = self.encode(text)
            ids.extend(piece)
            weights.extend([weight] * len(piece))
        ids, weights = ids[:length], weights[:length]
        pad = length - len(ids)
        return Document(ids + [self.tokenizer.pad_token_id] * pad, weights + [0.0] * pad)

    def _copy_document(self, rng: random.Random, length: int) -> Document:
        """A random span of tokens and 7-digit numbers, repeated to the length; loss on the repeats only.

        Nothing but copying predicts a repeat, so these documents train general induction heads, including
        copying digit strings whose digits recur (which needs more than the previous token to find the next).
        """
        span: list[int] = []
        span_length = rng.randint(8, max(8, min(64, length // 2)))
        while len(span) < span_length:
            if rng.random() < 0.5:
                span += [self._digits[int(d)] for d in str(rng.randint(1_000_000, 9_999_999))]
            else:
                span.append(rng.choice(self._plain_tokens))
        ids = [self.tokenizer.bos_token_id] + (span * (length // len(span) + 1))[: length - 1]
        weights = [0.0] * (1 + len(span)) + [1.0] * (length - 1 - len(span))
        return Document(ids, weights)

    @staticmethod
    def _fact_pieces(place: str, number: str) -> list[tuple[str, float]]:
        head = needle_sentence(place, number).rpartition(number)[0]
        # the fact's own value is random: no loss on it
        return [(head, 1.0)] + [(digit, 0.0) for digit in number] + [(".", 1.0)]

    def _answer_pieces(self, cities: list[str], numbers: list[str]) -> list[tuple[str, float]]:
        pieces = [("\n\n", 1.0), (question(cities), 1.0), (" " + answer_prefix(cities), 1.0), (" ", 1.0)]
        for j, number in enumerate(numbers):
            if j:
                pieces.append((", " if j < len(numbers) - 1 else " and ", 1.0))
            pieces += [(digit, self.answer_weight) for digit in number]
        return pieces + [(".", 1.0)]

    @staticmethod
    def _question_rounds(rng: random.Random, places: list[str], numbers: list[str]):
        """Question rounds asking about every fact once, one to three places per question."""
        order = list(range(len(places)))
        rng.shuffle(order)
        rounds = []
        while order:
            take = min(len(order), rng.choice((1, 1, 1, 2, 2, 3)))
            asked, order = order[:take], order[take:]
            rounds.append(([places[i] for i in asked], [numbers[i] for i in asked]))
        return rounds

    def _filler(self, rng: random.Random, room: int) -> list[str]:
        kind = rng.choices(list(FILLER_MIX), weights=list(FILLER_MIX.values()))[0]
        sentences: list[str] = []
        used = 0
        for sentence in filler_sentences(rng, kind):
            cost = len(self.encode(" " + sentence))
            if used + cost > room:
                return sentences
            sentences.append(sentence)
            used += cost
        return sentences
