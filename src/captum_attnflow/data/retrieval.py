"""A seeded generator of retrieval prompts: short facts (the sources), then a question one of them answers.

Each source states one attribute of one person, its value right after the person,
``Alice: tennis (favourite sport).``; the question asks for one of them, ``What is Alice's
favourite sport?``, and the answer (one to three words) is copied from the one source that
states it, the gold source. The other sources are distractors that share words with the question:

* the same person with another attribute (``Alice: sushi (favourite food).``),
* the same attribute of another person (``Bob: golf (favourite sport).``),
* another person and another attribute (``Carol: Lima (home city).``).

The value follows its person because that is what a small model learns to look up on a CPU: with
``Alice's favourite sport is tennis.`` (the person five words before the value) no training run
of docs/retrieval-model.md bound values to their persons.

Within a prompt no two sources state the same attribute of the same person, and no two state
the same value of an attribute, so only the gold source answers the question and only it holds
the answer's words: which source the answer came from is known. The prompt is a
:class:`captum.attr.TextTemplateInput` whose values are the sources, one a line, followed by
``Question: ...`` and ``Answer:``; the bundled retrieval model
(:func:`~captum_attnflow.load_retrieval_model`) continues it with the answer.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

if TYPE_CHECKING:
    from captum.attr import TextTemplateInput

MAX_SOURCES = 64
"""The most sources a prompt holds (the range the bundled retrieval model was trained on ends here)."""

NAMES: tuple[str, ...] = (
    "Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack", "Karen", "Liam",
    "Maria", "Noah", "Olivia", "Peter", "Quinn", "Rachel", "Sam", "Tara", "Umar", "Vera", "Walter", "Xena",
    "Yusuf", "Zoe", "Anna", "Ben", "Chloe", "Daniel", "Ella", "Felix", "Gina", "Hugo", "Isla", "James",
    "Kate", "Leo", "Mia", "Nina", "Oscar", "Paula", "Ravi", "Sofia", "Tom", "Ursula", "Victor", "Wendy",
    "Yara", "Zach", "Amir", "Bella", "Carlos", "Diana", "Ethan", "Fiona", "George", "Hannah", "Ivan",
    "Julia", "Kevin", "Lucy", "Mark", "Nora",
)

# Each attribute (two words, so every source has the same shape) and its values; no word is in two
# values, so a value's first word decides the rest of it and no source holds another's answer.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "favourite colour": (
        "red", "green", "blue", "yellow", "purple", "orange", "pink", "black", "white", "grey", "violet",
        "indigo", "turquoise", "crimson", "beige", "maroon", "navy", "teal", "olive", "silver", "gold",
        "amber", "lilac", "scarlet", "cyan", "magenta", "ivory", "lavender", "coral", "bronze",
    ),
    "favourite food": (
        "pizza", "pasta", "sushi", "curry", "tacos", "noodles", "salad", "soup", "steak", "burgers",
        "dumplings", "risotto", "paella", "lasagne", "pancakes", "waffles", "omelettes", "kebabs",
        "falafel", "ramen", "goulash", "couscous", "hummus", "burritos", "gnocchi", "porridge",
        "ice cream", "apple pie", "fish and chips", "roast chicken",
    ),
    "favourite sport": (
        "tennis", "football", "rugby", "golf", "cricket", "hockey", "baseball", "volleyball",
        "basketball", "badminton", "squash", "handball", "netball", "softball", "lacrosse", "curling",
        "bowling", "cycling", "rowing", "sailing", "skiing", "surfing", "swimming", "boxing", "fencing",
        "judo", "karate", "archery", "water polo", "rock climbing",
    ),
    "favourite animal": (
        "dog", "cat", "parrot", "hamster", "rabbit", "turtle", "goldfish", "pony", "ferret", "lizard",
        "canary", "snake", "tortoise", "gerbil", "mouse", "horse", "donkey", "duck", "frog", "owl",
        "fox", "wolf", "bear", "tiger", "lion", "zebra", "giraffe", "penguin", "dolphin", "koala",
    ),
    "favourite drink": (
        "tea", "coffee", "lemonade", "milk", "cocoa", "cider", "beer", "wine", "whisky", "gin", "rum",
        "vodka", "brandy", "sherry", "sake", "kombucha", "smoothies", "milkshakes", "espresso",
        "cappuccino", "latte", "mocha", "chai", "soda", "lager", "mead", "champagne", "prosecco",
        "hot chocolate", "mint julep",
    ),
    "favourite instrument": (
        "violin", "piano", "guitar", "cello", "flute", "drums", "trumpet", "harp", "clarinet",
        "saxophone", "trombone", "oboe", "banjo", "ukulele", "accordion", "harmonica", "bassoon", "tuba",
        "viola", "mandolin", "sitar", "xylophone", "organ", "bagpipes", "recorder", "lute", "marimba",
        "tambourine", "synthesizer", "double bass",
    ),
    "native language": (
        "French", "German", "Spanish", "Italian", "Dutch", "Polish", "Swedish", "Greek", "Turkish",
        "Russian", "Japanese", "Korean", "Hindi", "Arabic", "Hebrew", "Finnish", "Danish", "Czech",
        "Welsh", "Irish", "Portuguese", "Hungarian", "Thai", "Swahili", "Mandarin", "Norwegian",
        "Icelandic", "Persian", "Romanian", "Catalan",
    ),
    "home city": (
        "Paris", "London", "Rome", "Berlin", "Madrid", "Vienna", "Prague", "Lisbon", "Dublin", "Oslo",
        "Stockholm", "Helsinki", "Warsaw", "Athens", "Cairo", "Tokyo", "Seoul", "Lima", "Bogota",
        "Toronto", "Chicago", "Boston", "Sydney", "Melbourne", "Nairobi", "Istanbul", "Munich",
        "New York", "Hong Kong", "Buenos Aires",
    ),
    "family name": (
        "Smith", "Jones", "Taylor", "Wilson", "Davies", "Evans", "Thomas", "Johnson", "Roberts",
        "Walker", "Wright", "Robinson", "Thompson", "Hughes", "Edwards", "Hall", "Wood", "Harris",
        "Lewis", "Jackson", "Clarke", "Turner", "Hill", "Cooper", "Morris", "Ward", "Baker", "Palmer",
        "Fisher", "Mason",
    ),
}

QUESTION = "What is {name}'s {attribute}?"
SOURCE = "{name}: {value} ({attribute})."
# The template's own text: the sources one a line, then the question and the cue the answer follows.
TEMPLATE_TAIL = "Question: {question}\nAnswer:"
SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")


@dataclass(frozen=True)
class RetrievalExample:
    """One retrieval prompt: the sources, the question, its answer and the source that holds it.

    Attributes:
        sources: the facts, one string each (``"Alice: tennis (favourite sport)."``).
        question: ``"What is Alice's favourite sport?"``.
        answer: the value the gold source states, one to three words (``"tennis"``).
        gold: the index in ``sources`` of the one source that answers the question.
        template: the prompt's template, a ``{}`` a source, one a line, then
            ``Question: <question>`` and ``Answer:`` (property).
        prompt: a fresh :class:`captum.attr.TextTemplateInput` of ``template`` with the sources
            as its values (property).
        text: the prompt written out, what a model reads (property).

    Example::

        >>> example = RetrievalExample(("Bob: Lima (home city).", "Alice: Oslo (home city)."),
        ...                            "What is Alice's home city?", "Oslo", 1)
        >>> print(example.text)
        Bob: Lima (home city).
        Alice: Oslo (home city).
        Question: What is Alice's home city?
        Answer:
        >>> example.prompt.values == list(example.sources)
        True
    """

    sources: tuple[str, ...]
    question: str
    answer: str
    gold: int

    @property
    def template(self) -> str:
        """The template: ``{}`` per source, one a line, then the question and ``Answer:``."""
        return "{}\n" * len(self.sources) + TEMPLATE_TAIL.format(question=self.question)

    @property
    def prompt(self) -> TextTemplateInput:
        """The prompt as Captum's template input, the sources its values (ablating one removes its line's words)."""
        from captum.attr import TextTemplateInput  # Captum loads when a prompt is built, not with the data

        return TextTemplateInput(self.template, values=list(self.sources))

    @property
    def text(self) -> str:
        """The prompt written out."""
        return self.template.format(*self.sources)


def retrieval_examples(count: int, sources: int | tuple[int, int] = (4, MAX_SOURCES), seed: int = 0) -> list[RetrievalExample]:
    """``count`` retrieval prompts with ``sources`` facts each, deterministically for a ``seed``.

    Each prompt draws its number of sources (uniformly in ``sources`` when it is a range), a
    person and an attribute for the question, and then its distractors: the same person with
    1 to 8 other attributes, the same attribute of 1 to 29 other persons (with 2 distractors or
    more, at least one of each; a single one is either), and the rest other persons with other
    attributes, every (person, attribute) pair and every value at most once, shuffled; the gold
    source is anywhere.

    Args:
        count: how many examples, >= 0.
        sources: the number of sources of every prompt, or an inclusive range ``(low, high)``;
            1 to :data:`MAX_SOURCES` (64). The bundled model was trained and measured on 4 to 64.
        seed: seed of the generator.

    Returns:
        a list of :class:`RetrievalExample`.

    Raises:
        ValueError: a negative ``count``, or ``sources`` outside 1 to 64 or a range whose low
            end is above its high end.
        TypeError: ``sources`` neither an int nor a pair of ints.

    Example::

        >>> example = retrieval_examples(1, sources=4, seed=3)[0]
        >>> print(example.text)
        Felix: synthesizer (favourite instrument).
        Quinn: orange (favourite colour).
        Quinn: Warsaw (home city).
        Quinn: mandolin (favourite instrument).
        Question: What is Quinn's favourite instrument?
        Answer:
        >>> example.answer, example.gold
        ('mandolin', 3)
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}.")
    low, high = _source_range(sources)
    rng = random.Random(seed)
    return [_example(rng, rng.randint(low, high)) for _ in range(count)]


def _source_range(sources: int | tuple[int, int]) -> tuple[int, int]:
    """``sources`` as an inclusive range, checked against 1..MAX_SOURCES."""
    if isinstance(sources, int) and not isinstance(sources, bool):
        low = high = sources
    elif (
        isinstance(sources, (tuple, list))
        and len(sources) == 2
        and all(isinstance(end, int) and not isinstance(end, bool) for end in sources)
    ):
        low, high = sources
    else:
        raise TypeError(f"sources must be an int or a pair of ints (low, high), got {sources!r}.")
    if not 1 <= low <= high <= MAX_SOURCES:
        raise ValueError(
            f"sources must lie in 1..{MAX_SOURCES} with low <= high, got {sources!r}; "
            f"a prompt holds at most {MAX_SOURCES} facts."
        )
    return low, high


def _example(rng: random.Random, count: int) -> RetrievalExample:
    """One prompt of ``count`` sources drawn from ``rng``."""
    attributes = list(ATTRIBUTES)
    name, attribute = rng.choice(NAMES), rng.choice(attributes)
    others = [n for n in NAMES if n != name]
    other_attributes = [a for a in attributes if a != attribute]
    distractors = count - 1
    if distractors < 2:  # one distractor shares the person or the attribute
        same_name = rng.randint(0, distractors)
    else:  # at least one of each
        same_name = rng.randint(1, min(len(other_attributes), distractors - 1))
    room = distractors - same_name  # for the same attribute of others and the unrelated sources
    same_attribute = rng.randint(min(1, room), min(room, len(ATTRIBUTES[attribute]) - 1))
    pairs = [(name, attribute)]
    pairs += [(name, a) for a in rng.sample(other_attributes, same_name)]
    pairs += [(n, attribute) for n in rng.sample(others, same_attribute)]
    values = {a: rng.sample(ATTRIBUTES[a], len(ATTRIBUTES[a])) for a in attributes}
    facts = [(n, a, values[a].pop()) for n, a in pairs]
    taken = set(pairs)
    while len(facts) < count:  # 8 attributes of 63 others leave room: the loop ends
        n, a = rng.choice(others), rng.choice(other_attributes)
        if (n, a) not in taken and values[a]:
            taken.add((n, a))
            facts.append((n, a, values[a].pop()))
    order = list(range(count))
    rng.shuffle(order)
    sources = tuple(SOURCE.format(name=facts[i][0], attribute=facts[i][1], value=facts[i][2]) for i in order)
    return RetrievalExample(sources, QUESTION.format(name=name, attribute=attribute), facts[0][2], order.index(0))


def ask(example: RetrievalExample, index: int) -> RetrievalExample:
    """The same sources with the question that source ``index`` answers (it becomes the gold one).

    Every source answers one question (its person's attribute), and no other source answers
    it, so any source can be asked about.

    Raises:
        ValueError: ``index`` outside the sources, or a source not of the generator's form
            ``<name>: <value> (<attribute>).``.

    Example::

        >>> example = RetrievalExample(("Bob: Lima (home city).", "Alice: water polo (favourite sport)."),
        ...                            "What is Bob's home city?", "Lima", 0)
        >>> asked = ask(example, 1)
        >>> asked.question, asked.answer, asked.gold
        ("What is Alice's favourite sport?", 'water polo', 1)
    """
    if not 0 <= index < len(example.sources):
        raise ValueError(f"index {index} is outside the example's {len(example.sources)} sources.")
    source = example.sources[index]
    parsed = re.fullmatch(r"(\w+): (.+) \((.+)\)\.", source)
    name, value, attribute = parsed.groups() if parsed else (None, None, None)
    if attribute not in ATTRIBUTES or value not in ATTRIBUTES[attribute]:
        raise ValueError(f"source {source!r} is not of the form \"<name>: <value> (<attribute>).\" that ask reads.")
    return RetrievalExample(example.sources, QUESTION.format(name=name, attribute=attribute), value, index)


def vocabulary() -> list[str]:
    """Every word a retrieval prompt or answer holds, as the tokenizer splits them, in a fixed order.

    Example::

        >>> words = vocabulary()
        >>> words[:4], "tennis" in words, len(words) == len(set(words))
        (['Question', 'Answer', 'What', 'is'], True, True)
    """
    words = ["Question", "Answer", "What", "is", "'s", "?", ":", ".", "(", ")"]
    words += [word for attribute in ATTRIBUTES for word in attribute.split()]
    words += NAMES
    words += [word for values in ATTRIBUTES.values() for value in values for word in value.split()]
    return list(dict.fromkeys(words))


def build_retrieval_tokenizer() -> PreTrainedTokenizerFast:
    """The retrieval model's word-level fast tokenizer: a word, ``'s`` or a punctuation mark a token.

    Ids 0-3 are ``<pad>``, ``<unk>``, ``<s>`` (beginning of sequence, prepended to every
    sequence) and ``</s>`` (end of sequence, which follows an answer); :func:`vocabulary`
    follows. Case is kept (``Paris``, ``French``); whitespace and newlines make no token, so a
    source ablated to the empty string leaves the other tokens as they were. Offsets
    (``return_offsets_mapping=True``) are character spans of the text, ``(0, 0)`` for ``<s>``;
    padding goes on the left, as batched generation wants.

    Returns:
        PreTrainedTokenizerFast

    Example::

        >>> tokenizer = build_retrieval_tokenizer()
        >>> encoded = tokenizer("Alice: New York (home city).", return_offsets_mapping=True)
        >>> tokenizer.convert_ids_to_tokens(encoded["input_ids"])
        ['<s>', 'Alice', ':', 'New', 'York', '(', 'home', 'city', ')', '.']
        >>> encoded["offset_mapping"][:3]
        [(0, 0), (0, 5), (5, 6)]
    """
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *vocabulary()])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"'s|\w+|[^\w\s]"), behavior="removed", invert=True)
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )
