"""Words for synthetic probes: RULER-style word keys ("adjective-noun"), UUIDs, numbers, and the key/value pair
stream a haystack of needles is made of.

RULER draws its words from `wonderwords`; diffeval ships its own short lists (written for this project) so the probes
run offline, and reads common-words lists from the vocabulary of the novel it ships (`books.SHIPPED`).
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Iterator
from functools import lru_cache

from diffeval.errors import InputError

ADJECTIVES = (
    "able", "amber", "ancient", "angry", "arctic", "autumn", "bitter", "black", "bold", "brave", "brief", "bright",
    "broken", "calm", "careful", "cheap", "clever", "cold", "cosmic", "crimson", "crooked", "curious", "damp",
    "dark", "deep", "distant", "dry", "dusty", "eager", "early", "electric", "empty", "faint", "fancy", "fierce",
    "flat", "foggy", "fragile", "free", "fresh", "frozen", "gentle", "giant", "gifted", "glad", "golden", "grand",
    "green", "grey", "hidden", "hollow", "honest", "humble", "hungry", "icy", "idle", "jolly", "keen", "kind",
    "late", "lazy", "little", "lively", "lonely", "loud", "lucky", "mellow", "merry", "misty", "modern", "muddy",
    "narrow", "noble", "odd", "old", "orange", "pale", "patient", "plain", "polite", "proud", "purple", "quick",
    "quiet", "rapid", "rare", "rough", "round", "royal", "rusty", "sacred", "salty", "scarlet", "secret", "shiny",
    "silent", "silver", "simple", "sleepy", "slow", "small", "smooth", "soft", "solid", "sour", "spare", "steady",
    "steep", "stormy", "strange", "sunny", "swift", "tall", "tame", "tender", "thick", "thin", "tidy", "tiny",
    "tired", "vast", "velvet", "violet", "warm", "wary", "wet", "white", "wicked", "wild", "windy", "wise",
    "wooden", "yellow", "young", "zealous",
)  # fmt: skip
NOUNS = (
    "anchor", "apple", "arrow", "badge", "basket", "beacon", "bell", "blanket", "boat", "bottle", "bridge",
    "bucket", "button", "cabin", "candle", "canyon", "carpet", "castle", "cave", "chair", "cherry", "circle",
    "cloud", "clover", "coat", "comet", "compass", "cookie", "copper", "cottage", "crane", "crystal", "cup",
    "desert", "diamond", "dragon", "drum", "eagle", "engine", "falcon", "feather", "fence", "field", "flame",
    "flute", "forest", "fountain", "garden", "gate", "glacier", "glove", "harbor", "hammer", "helmet", "hill",
    "island", "jacket", "jungle", "kettle", "key", "kite", "ladder", "lake", "lantern", "leaf", "lemon", "library",
    "lighthouse", "lion", "marble", "meadow", "mirror", "monkey", "moon", "mountain", "needle", "nest", "ocean",
    "orchard", "otter", "owl", "palace", "panther", "parrot", "pebble", "pencil", "piano", "pillow", "planet",
    "pocket", "pond", "puzzle", "rabbit", "river", "rocket", "saddle", "sail", "scarf", "shadow", "shell",
    "shovel", "signal", "spoon", "stone", "storm", "summit", "sunset", "table", "temple", "thunder", "tiger",
    "tower", "train", "trumpet", "tunnel", "umbrella", "valley", "violin", "wagon", "wallet", "whale", "window",
    "wolf", "zebra",
)  # fmt: skip
KEY_TYPES = ("words", "uuids")
VALUE_TYPES = ("numbers", "uuids")


def random_value(kind: str, rng: random.Random) -> str:
    """A RULER needle key or value: a 7-digit number, an "adjective-noun" word pair or a UUID."""
    if kind == "numbers":
        return str(rng.randint(1_000_000, 9_999_999))
    if kind == "words":
        return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown key or value type {kind!r}")


WORD_KEYS = len(ADJECTIVES) * len(NOUNS)  # distinct "adjective-noun" keys: a haystack of word-key needles ends there


def key_value_pairs(key_type: str, value_type: str, seed: int) -> Iterator[tuple[str, str]]:
    """A seeded stream of (key, value) pairs with distinct keys and distinct values: a sample takes its needles from
    the first `RESERVED_PAIRS`, a haystack of needles (`needle_sentences`) the rest, so no distractor shares a key or
    a value with a needle. Word keys run out after WORD_KEYS pairs (a refusal: about 160K tokens of needles)."""
    rng = random.Random(f"key-value-pairs|{key_type}|{value_type}|{seed}")
    keys: set[str] = set()
    values: set[str] = set()
    while True:
        if key_type == "words" and len(keys) >= WORD_KEYS * 0.9:  # the last keys would take ever longer to draw
            raise InputError(
                f"a haystack of word-key needles holds at most {int(WORD_KEYS * 0.9)} distinct keys: use a shorter "
                "--ctx, or UUID keys (mk-niah variant 3)"
            )
        key, value = random_value(key_type, rng), random_value(value_type, rng)
        if key in keys or value in values:
            continue
        keys.add(key)
        values.add(value)
        yield key, value


RESERVED_PAIRS = 64  # pairs at the head of a stream kept for a sample's own needles


def needle_sentence(key: str, value: str, value_type: str) -> str:
    """RULER's needle: "One of the special magic numbers for KEY is: VALUE."."""
    return f"One of the special magic {value_type} for {key} is: {value}."


def needle_sentences(key_type: str, value_type: str, seed: int, min_words: int) -> list[str]:
    """A haystack made of needles (RULER's `needle` haystack): the stream's pairs after the reserved ones."""
    pairs = key_value_pairs(key_type, value_type, seed)
    for _ in range(RESERVED_PAIRS):
        next(pairs)
    out: list[str] = []
    words = 0
    while words < min_words:
        sentence = needle_sentence(*next(pairs), value_type)
        out.append(sentence)
        words += sentence.count(" ") + 1
    return out


@lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """Distinct lowercase words of 4-12 letters in the shipped novel (Persuasion), in first-seen order, without any
    word that is part of another ("other" holds "the"), so a substring match of one never counts another: the pool
    common-words lists draw from (RULER draws from wonderwords' nouns, adjectives and verbs)."""
    from diffeval.data.books import SHIPPED

    text = (SHIPPED / "austen-persuasion.txt").read_text(encoding="utf-8")
    words = list(dict.fromkeys(re.findall(r"\b[a-z]{4,12}\b", text)))
    joined = "|" + "|".join(words) + "|"
    return tuple(w for w in words if joined.count(w) == 1)
