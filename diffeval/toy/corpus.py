"""Training documents for the toy DIFF / baseline pair: filler text with key→value facts and questions on them.

A document reads exactly like a needle prompt (instruction, haystack with "The special magic number for PLACE
is: NNNNNNN." facts, question, answer prefix) followed by its answer and further question/answer rounds about
the same facts, so one document trains several retrievals. Places come from TRAIN_PLACES and a syllable
generator, never from the evaluation's `data.cities.CITIES`; a document is a pure function of (seed, index, length).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from diffeval.data.cities import CITIES
from diffeval.data.haystack import NOISE_SENTENCES
from diffeval.tasks.haystack.needle import INSTRUCTION, answer_prefix, needle_sentence, question

# Real towns, regions and islands; none of them is an evaluation city (asserted below).
TRAIN_PLACES = (
    "Albany",
    "Albuquerque",
    "Anchorage",
    "Annapolis",
    "Atlanta",
    "Austin",
    "Baltimore",
    "Baton Rouge",
    "Billings",
    "Birmingham",
    "Boise",
    "Boston",
    "Buffalo",
    "Burlington",
    "Charleston",
    "Charlotte",
    "Cheyenne",
    "Cincinnati",
    "Cleveland",
    "Columbus",
    "Dallas",
    "Denver",
    "Des Moines",
    "Detroit",
    "El Paso",
    "Fargo",
    "Fresno",
    "Hartford",
    "Honolulu",
    "Houston",
    "Indianapolis",
    "Jackson",
    "Juneau",
    "Kansas City",
    "Knoxville",
    "Las Vegas",
    "Lexington",
    "Little Rock",
    "Los Angeles",
    "Louisville",
    "Madison",
    "Memphis",
    "Miami",
    "Milwaukee",
    "Minneapolis",
    "Mobile",
    "Montgomery",
    "Nashville",
    "New Orleans",
    "Newark",
    "Norfolk",
    "Oakland",
    "Omaha",
    "Orlando",
    "Philadelphia",
    "Phoenix",
    "Pittsburgh",
    "Portland",
    "Providence",
    "Raleigh",
    "Reno",
    "Richmond",
    "Sacramento",
    "Salem",
    "San Diego",
    "San Jose",
    "Savannah",
    "Seattle",
    "Spokane",
    "Tacoma",
    "Tampa",
    "Topeka",
    "Tucson",
    "Tulsa",
    "Wichita",
    "Calgary",
    "Edmonton",
    "Halifax",
    "Montreal",
    "Ottawa",
    "Quebec",
    "Regina",
    "Saskatoon",
    "Vancouver",
    "Victoria",
    "Winnipeg",
    "Whitehorse",
    "Yellowknife",
    "Acapulco",
    "Cancun",
    "Guadalajara",
    "Monterrey",
    "Oaxaca",
    "Puebla",
    "Tijuana",
    "Merida",
    "Havana",
    "Kingston",
    "Nassau",
    "San Juan",
    "Santo Domingo",
    "Panama City",
    "San Jose de Costa Rica",
    "Managua",
    "Tegucigalpa",
    "San Salvador",
    "Guatemala City",
    "Belize",
    "Caracas",
    "Maracaibo",
    "Medellin",
    "Cali",
    "Cartagena",
    "Quito",
    "Guayaquil",
    "Cusco",
    "Arequipa",
    "La Paz",
    "Sucre",
    "Asuncion",
    "Montevideo",
    "Buenos Aires",
    "Cordoba",
    "Rosario",
    "Mendoza",
    "Valparaiso",
    "Concepcion",
    "Sao Paulo",
    "Rio de Janeiro",
    "Brasilia",
    "Salvador",
    "Recife",
    "Fortaleza",
    "Manaus",
    "Belem",
    "Curitiba",
    "Porto Alegre",
    "Paramaribo",
    "Georgetown",
    "Cayenne",
    "Granada",
    "Malaga",
    "Bilbao",
    "Zaragoza",
    "Murcia",
    "Alicante",
    "Toledo",
    "Salamanca",
    "Coimbra",
    "Braga",
    "Faro",
    "Nantes",
    "Lille",
    "Toulouse",
    "Nice",
    "Strasbourg",
    "Rennes",
    "Grenoble",
    "Dijon",
    "Montpellier",
    "Ghent",
    "Bruges",
    "Liege",
    "Namur",
    "Eindhoven",
    "Groningen",
    "Leiden",
    "Maastricht",
    "Luxembourg",
    "Dresden",
    "Leipzig",
    "Stuttgart",
    "Hanover",
    "Bremen",
    "Dortmund",
    "Essen",
    "Nuremberg",
    "Heidelberg",
    "Freiburg",
    "Innsbruck",
    "Graz",
    "Linz",
    "Bern",
    "Lausanne",
    "Lucerne",
    "Lugano",
    "Bologna",
    "Genoa",
    "Verona",
    "Padua",
    "Bari",
    "Catania",
    "Pisa",
    "Siena",
    "Trieste",
    "Cagliari",
    "Valletta",
    "Nicosia",
    "Patras",
    "Heraklion",
    "Plovdiv",
    "Varna",
    "Cluj",
    "Timisoara",
    "Iasi",
    "Novi Sad",
    "Nis",
    "Split",
    "Rijeka",
    "Sarajevo",
    "Mostar",
    "Podgorica",
    "Skopje",
    "Tirana",
    "Bratislava",
    "Kosice",
    "Debrecen",
    "Szeged",
    "Ostrava",
    "Plzen",
    "Poznan",
    "Wroclaw",
    "Lodz",
    "Lublin",
    "Szczecin",
    "Kaunas",
    "Klaipeda",
    "Tartu",
    "Turku",
    "Tampere",
    "Oulu",
    "Uppsala",
    "Malmo",
    "Umea",
    "Trondheim",
    "Stavanger",
    "Tromso",
    "Odense",
    "Aalborg",
    "Galway",
    "Limerick",
    "Belfast",
    "Cardiff",
    "Swansea",
    "Aberdeen",
    "Dundee",
    "Inverness",
    "Leeds",
    "Sheffield",
    "Newcastle",
    "Nottingham",
    "Leicester",
    "Oxford",
    "Cambridge",
    "Brighton",
    "Plymouth",
    "York",
    "Bath",
    "Akureyri",
    "Kyiv",
    "Lviv",
    "Odesa",
    "Kharkiv",
    "Minsk",
    "Chisinau",
    "Tbilisi",
    "Yerevan",
    "Baku",
    "Izmir",
    "Antalya",
    "Bursa",
    "Konya",
    "Trabzon",
    "Beirut",
    "Damascus",
    "Amman",
    "Jerusalem",
    "Haifa",
    "Baghdad",
    "Basra",
    "Tehran",
    "Isfahan",
    "Shiraz",
    "Tabriz",
    "Riyadh",
    "Jeddah",
    "Doha",
    "Dubai",
    "Abu Dhabi",
    "Muscat",
    "Kuwait City",
    "Manama",
    "Sanaa",
    "Aden",
    "Kabul",
    "Herat",
    "Tashkent",
    "Samarkand",
    "Bukhara",
    "Almaty",
    "Astana",
    "Bishkek",
    "Dushanbe",
    "Ashgabat",
    "Ulaanbaatar",
    "Islamabad",
    "Peshawar",
    "Quetta",
    "Multan",
    "Jaipur",
    "Agra",
    "Lucknow",
    "Pune",
    "Hyderabad",
    "Bangalore",
    "Ahmedabad",
    "Surat",
    "Kochi",
    "Madurai",
    "Patna",
    "Bhopal",
    "Indore",
    "Nagpur",
    "Chittagong",
    "Sylhet",
    "Pokhara",
    "Thimphu",
    "Kandy",
    "Galle",
    "Male",
    "Yangon",
    "Mandalay",
    "Chiang Mai",
    "Phuket",
    "Vientiane",
    "Phnom Penh",
    "Siem Reap",
    "Da Nang",
    "Hue",
    "Saigon",
    "Kuala Lumpur",
    "Penang",
    "Malacca",
    "Singapore",
    "Surabaya",
    "Bandung",
    "Yogyakarta",
    "Medan",
    "Denpasar",
    "Makassar",
    "Cebu",
    "Davao",
    "Taipei",
    "Kaohsiung",
    "Taichung",
    "Hong Kong",
    "Macau",
    "Guangzhou",
    "Shenzhen",
    "Chengdu",
    "Chongqing",
    "Wuhan",
    "Nanjing",
    "Hangzhou",
    "Suzhou",
    "Xian",
    "Tianjin",
    "Harbin",
    "Dalian",
    "Qingdao",
    "Kunming",
    "Lhasa",
    "Urumqi",
    "Incheon",
    "Daegu",
    "Gwangju",
    "Pyongyang",
    "Sapporo",
    "Sendai",
    "Nagoya",
    "Kobe",
    "Hiroshima",
    "Fukuoka",
    "Nagasaki",
    "Okinawa",
    "Vladivostok",
    "Novosibirsk",
    "Yekaterinburg",
    "Kazan",
    "Samara",
    "Omsk",
    "Irkutsk",
    "Murmansk",
    "Perth",
    "Adelaide",
    "Brisbane",
    "Darwin",
    "Hobart",
    "Canberra",
    "Cairns",
    "Wellington",
    "Christchurch",
    "Dunedin",
    "Suva",
    "Apia",
    "Noumea",
    "Port Moresby",
    "Rabat",
    "Marrakesh",
    "Fez",
    "Tangier",
    "Algiers",
    "Oran",
    "Tripoli",
    "Benghazi",
    "Khartoum",
    "Luxor",
    "Aswan",
    "Dakar",
    "Bamako",
    "Niamey",
    "Ouagadougou",
    "Abidjan",
    "Monrovia",
    "Freetown",
    "Conakry",
    "Lome",
    "Cotonou",
    "Abuja",
    "Kano",
    "Ibadan",
    "Douala",
    "Yaounde",
    "Libreville",
    "Kinshasa",
    "Brazzaville",
    "Luanda",
    "Lusaka",
    "Harare",
    "Bulawayo",
    "Maputo",
    "Gaborone",
    "Windhoek",
    "Pretoria",
    "Bloemfontein",
    "Port Elizabeth",
    "Maseru",
    "Mbabane",
    "Antananarivo",
    "Port Louis",
    "Mombasa",
    "Kisumu",
    "Arusha",
    "Dodoma",
    "Dar es Salaam",
    "Zanzibar",
    "Kigali",
    "Bujumbura",
    "Mogadishu",
    "Djibouti",
    "Asmara",
    "Juba",
    "Lilongwe",
    "Blantyre",
)
assert not set(TRAIN_PLACES) & set(CITIES), "training places must be disjoint from the evaluation cities"
assert len(set(TRAIN_PLACES)) == len(TRAIN_PLACES) >= 300

# Held out from training documents: the in-training needle check asks about places the model never saw.
VALIDATION_PLACES = TRAIN_PLACES[::10]
_TRAINING_PLACES = tuple(p for i, p in enumerate(TRAIN_PLACES) if i % 10)

_ONSETS = (
    "b",
    "br",
    "c",
    "ch",
    "d",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "st",
    "t",
    "tr",
    "v",
    "w",
    "z",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ("", "", "n", "r", "s", "l", "m", "th", "nd", "rg")

# Essay-like filler: procedurally built sentences of common words (a stand-in for Paul Graham essays).
_SUBJECTS = (
    "the founder",
    "a good startup",
    "most people",
    "the investor",
    "every programmer",
    "a small team",
    "the company",
    "our users",
    "a new idea",
    "the market",
    "the best writers",
    "a determined person",
    "the software",
    "this essay",
    "the problem",
    "a big company",
    "young founders",
    "the city",
)
_VERBS = (
    "builds",
    "needs",
    "finds",
    "changes",
    "ignores",
    "explains",
    "learns",
    "makes",
    "wants",
    "understands",
    "discovers",
    "avoids",
    "measures",
    "questions",
    "creates",
    "sells",
    "remembers",
    "writes",
)
_OBJECTS = (
    "something people want",
    "the hardest problems",
    "a simple product",
    "more money",
    "good ideas",
    "the right question",
    "a new language",
    "their own work",
    "the whole picture",
    "a better way",
    "many small details",
    "the next step",
    "what matters most",
    "real users",
    "a lot of time",
)
_TAILS = (
    "",
    "",
    " in the long run",
    " without noticing",
    " almost by accident",
    " every single day",
    " when nobody is watching",
    " because it is fun",
    " faster than expected",
    " for a few years",
)
_OPENERS = (
    "",
    "",
    "",
    "In practice, ",
    "Surprisingly, ",
    "Of course, ",
    "At first, ",
    "For example, ",
    "In the end, ",
    "Usually, ",
    "Perhaps ",
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
        sentences, used = [], 0
        for sentence in filler_sentences(rng, kind):
            cost = len(self.encode(" " + sentence))
            if used + cost > room:
                return sentences
            sentences.append(sentence)
            used += cost
        return sentences
