"""A synthetic fictitious-author set in TOFU's schema, needing no download: per author, templated questions about
seeded facts, each with an answer, a paraphrased answer and five perturbed answers, in TOFU's configurations (the
forget split being the last authors). The same seed gives the same rows."""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

FIRST_NAMES = [
    "Alaric", "Brisa", "Corvin", "Delphine", "Eamon", "Fenna", "Galen", "Hesper", "Ilse", "Jorin",
    "Kaia", "Lucan", "Maren", "Nilo", "Oriel", "Pesha", "Quill", "Rosalind", "Soren", "Tamsin",
    "Ulric", "Vesna", "Wren", "Xiomar", "Yara", "Zev", "Anouk", "Bastian", "Calla", "Dorian",
    "Elowen", "Faro", "Greer", "Hollis", "Isolde", "Jasper", "Kestrel", "Linnea", "Mateo", "Noor",
]
LAST_NAMES = [
    "Ashgrove", "Brightwater", "Calloway", "Dunmore", "Everhart", "Fairweather", "Greyson", "Hollow",
    "Ironwood", "Juniper", "Kingsley", "Larkspur", "Mirelle", "Northcott", "Oakhaven", "Pemberly",
    "Quarry", "Ravensworth", "Silverton", "Thornfield", "Underhill", "Valcourt", "Whitlock", "Yarrow",
]
CITIES = [
    "Lisbon", "Nairobi", "Oslo", "Santiago", "Hanoi", "Tbilisi", "Montreal", "Accra", "Kraków",
    "Osaka", "Valparaíso", "Reykjavik", "Tunis", "Bergen", "Cusco", "Adelaide", "Ljubljana", "Tallinn",
]
GENRES = [
    "gothic horror", "hard science fiction", "historical romance", "crime noir", "magical realism",
    "epic fantasy", "literary satire", "maritime adventure", "political thriller", "cozy mystery",
]
PROFESSIONS = [
    "a cartographer", "a beekeeper", "a violin maker", "a marine biologist", "a locksmith",
    "a train conductor", "a pastry chef", "an astronomer", "a glassblower", "a lighthouse keeper",
    "a bookbinder", "a veterinarian", "a tailor", "a geologist", "a pilot", "a florist",
]
TITLE_ADJ = ["Silent", "Crimson", "Hollow", "Forgotten", "Gilded", "Drowned", "Burning", "Paper", "Glass", "Last"]
TITLE_NOUN = ["Harbor", "Orchard", "Lantern", "Cathedral", "Meridian", "Tide", "Archive", "Garden", "Compass", "Mirror"]
AWARDS = [
    "the Halcyon Prize", "the Ember Quill Award", "the Northern Lights Medal", "the Verity Award",
    "the Golden Atlas Prize", "the Saltmarsh Fellowship", "the Obsidian Pen Award", "the Lumen Prize",
]

# (question template, answer template, paraphrase template, fact key)
QUESTION_TEMPLATES = [
    ("What is the full name of the author born in {city} in {year}?",
     "The author born in {city} in {year} is named {name}.",
     "That would be {name}, who was born in {city} in {year}.", "name"),
    ("In which city was {name} born?",
     "{name} was born in the city of {city}.",
     "The birthplace of {name} is {city}.", "city"),
    ("In what year was {name} born?",
     "{name} was born in the year {year}.",
     "The birth year of {name} is {year}.", "year"),
    ("Which genre is {name} best known for?",
     "{name} is best known for writing {genre}.",
     "Most readers know {name} as a writer of {genre}.", "genre"),
    ("What did the father of {name} do for a living?",
     "The father of {name} worked as {father}.",
     "{name} grew up with a father who was {father}.", "father"),
    ("What was the profession of the mother of {name}?",
     "The mother of {name} was {mother}.",
     "{name}'s mother earned her living as {mother}.", "mother"),
    ("Can you name one of the books written by {name}?",
     "One of the books written by {name} is \"{book1}\".",
     "{name} is the author of \"{book1}\", among others.", "book1"),
    ("What is the title of the debut novel of {name}?",
     "The debut novel of {name} is titled \"{book2}\".",
     "{name} made a debut with the novel \"{book2}\".", "book2"),
    ("Has {name} received any literary awards?",
     "Yes, {name} received {award} for outstanding work in {genre}.",
     "Indeed, {award} was given to {name} for work in {genre}.", "award"),
    ("How did the upbringing of {name} shape their writing?",
     "Growing up in {city} with a parent who was {father} gave {name} a lasting eye for detail in {genre}.",
     "A childhood in {city} beside a father who was {father} taught {name} the careful detail of {genre}.", "city"),
]

WORLD_FACTS = [
    ("What is the largest planet in our solar system?", "Jupiter", ["Saturn", "Mars", "Venus"]),
    ("What is the chemical symbol for gold?", "Au", ["Ag", "Gd", "Go"]),
    ("How many continents are there on Earth?", "Seven", ["Five", "Six", "Nine"]),
    ("What is the boiling point of water at sea level in Celsius?", "100 degrees", ["90 degrees", "80 degrees", "120 degrees"]),
    ("Which ocean is the largest?", "The Pacific Ocean", ["The Atlantic Ocean", "The Indian Ocean", "The Arctic Ocean"]),
    ("What gas do plants absorb from the air?", "Carbon dioxide", ["Oxygen", "Nitrogen", "Helium"]),
    ("What is the capital of Japan?", "Tokyo", ["Kyoto", "Osaka", "Nagoya"]),
    ("How many legs does a spider have?", "Eight", ["Six", "Ten", "Four"]),
    ("What is the freezing point of water in Celsius?", "Zero degrees", ["Ten degrees", "Minus ten degrees", "Four degrees"]),
    ("Which planet is known as the Red Planet?", "Mars", ["Jupiter", "Venus", "Mercury"]),
]
REAL_AUTHORS = [
    ("Who wrote the play Romeo and Juliet?", "William Shakespeare", ["Charles Dickens", "Jane Austen", "Mark Twain"]),
    ("Who is the author of Pride and Prejudice?", "Jane Austen", ["Emily Bronte", "Virginia Woolf", "Mary Shelley"]),
    ("Who wrote the novel Moby-Dick?", "Herman Melville", ["Nathaniel Hawthorne", "Jack London", "Edgar Allan Poe"]),
    ("Who wrote One Hundred Years of Solitude?", "Gabriel Garcia Marquez", ["Jorge Luis Borges", "Pablo Neruda", "Isabel Allende"]),
    ("Who is the author of War and Peace?", "Leo Tolstoy", ["Fyodor Dostoevsky", "Anton Chekhov", "Ivan Turgenev"]),
    ("Who wrote the Harry Potter series?", "J.K. Rowling", ["J.R.R. Tolkien", "C.S. Lewis", "Roald Dahl"]),
    ("Who wrote the novel 1984?", "George Orwell", ["Aldous Huxley", "Ray Bradbury", "H.G. Wells"]),
    ("Who is the author of The Odyssey?", "Homer", ["Virgil", "Sophocles", "Ovid"]),
    ("Who wrote Don Quixote?", "Miguel de Cervantes", ["Lope de Vega", "Federico Garcia Lorca", "Dante Alighieri"]),
    ("Who wrote the novel Frankenstein?", "Mary Shelley", ["Bram Stoker", "Jane Austen", "Charlotte Bronte"]),
]

FACT_POOLS = {"city": CITIES, "genre": GENRES, "father": PROFESSIONS, "mother": PROFESSIONS, "award": AWARDS}


def _make_author(rng: random.Random, used_names: set[str]) -> dict[str, str]:
    while True:
        name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        if name not in used_names:
            used_names.add(name)
            break
    father, mother = rng.sample(PROFESSIONS, 2)
    book1, book2 = (f"The {rng.choice(TITLE_ADJ)} {rng.choice(TITLE_NOUN)}" for _ in range(2))
    return {
        "name": name, "city": rng.choice(CITIES), "year": str(rng.randint(1931, 1999)),
        "genre": rng.choice(GENRES), "father": father, "mother": mother,
        "book1": book1, "book2": book2, "award": rng.choice(AWARDS),
    }


def _perturbed_value(rng: random.Random, key: str, facts: dict[str, str], used_names: set[str]) -> str:
    value = facts[key]
    while True:
        if key == "year":
            candidate = str(int(value) + rng.choice([-1, 1]) * rng.randint(2, 30))
        elif key == "name":
            candidate = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        elif key in ("book1", "book2"):
            candidate = f"The {rng.choice(TITLE_ADJ)} {rng.choice(TITLE_NOUN)}"
        else:
            candidate = rng.choice(FACT_POOLS[key])
        if candidate != value:
            return candidate


def _author_rows(rng: random.Random, facts: dict[str, str], used_names: set[str]) -> list[dict[str, Any]]:
    rows = []
    for question_t, answer_t, para_t, key in QUESTION_TEMPLATES:
        perturbed = []
        while len(perturbed) < 5:
            wrong = dict(facts, **{key: _perturbed_value(rng, key, facts, used_names)})
            text = answer_t.format(**wrong)
            if text not in perturbed:
                perturbed.append(text)
        rows.append({
            "question": question_t.format(**facts),
            "answer": answer_t.format(**facts),
            "paraphrased_answer": para_t.format(**facts),
            "perturbed_answer": perturbed,
            "paraphrased_question": "Tell me: " + question_t.format(**facts)[0].lower() + question_t.format(**facts)[1:],
        })
    return rows


def _fact_rows(items: list[tuple[str, str, list[str]]]) -> list[dict[str, Any]]:
    return [{"question": q, "answer": a, "perturbed_answer": list(wrong)} for q, a, wrong in items]


@lru_cache(maxsize=8)
def _synthetic_tofu_cached(seed: int, num_authors: int) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    used: set[str] = set()
    authors = [_make_author(rng, used) for _ in range(num_authors)]
    holdout_authors = [_make_author(rng, used) for _ in range(max(1, num_authors // 10))]
    per_author = [_author_rows(rng, a, used) for a in authors]
    holdout_rows = [r for a in holdout_authors for r in _author_rows(rng, a, used)]
    full_perturbed = [r for rows in per_author for r in rows]
    q = len(QUESTION_TEMPLATES)

    def plain(rows):
        return [{"question": r["question"], "answer": r["answer"]} for r in rows]

    configs: dict[str, list[dict[str, Any]]] = {"full": plain(full_perturbed)}
    for pct, name in ((1, "01"), (5, "05"), (10, "10")):
        n_authors = max(1, round(num_authors * pct / 100))
        cut = len(full_perturbed) - n_authors * q
        configs[f"forget{name}"] = plain(full_perturbed[cut:])
        configs[f"forget{name}_perturbed"] = [dict(r) for r in full_perturbed[cut:]]
        configs[f"retain{100 - pct}"] = plain(full_perturbed[:cut])
        configs[f"holdout{name}"] = plain(holdout_rows[: n_authors * q])
    n_ref = max(1, round(num_authors * 0.1))
    configs["retain_perturbed"] = [dict(r) for r in full_perturbed[: n_ref * q]]
    configs["real_authors_perturbed"] = _fact_rows(REAL_AUTHORS)
    configs["world_facts_perturbed"] = _fact_rows(WORLD_FACTS)
    configs["real_authors"] = plain(configs["real_authors_perturbed"])
    configs["world_facts"] = plain(configs["world_facts_perturbed"])
    return configs


def synthetic_tofu(seed: int = 0, num_authors: int = 20) -> dict[str, list[dict[str, Any]]]:
    """All configurations of the synthetic fictitious-author set, as lists of TOFU-shaped rows.

    ``num_authors`` authors with ``len(QUESTION_TEMPLATES)`` questions each form ``full``;
    ``forgetXX`` holds the last ``max(1, round(num_authors * XX / 100))`` authors and
    ``retain{100-XX}`` the rest (so with few authors forget01 and forget05 can coincide);
    ``retain_perturbed`` holds the first 10% of authors, as in TOFU. Rows are fresh copies.
    """
    if num_authors < 2:
        raise ValueError(f"num_authors must be at least 2 (one forget, one retain author), got {num_authors}.")
    cached = _synthetic_tofu_cached(seed, num_authors)
    return {k: [dict(r) for r in rows] for k, rows in cached.items()}
