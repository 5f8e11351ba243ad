"""A seeded generator of English-like subject-verb number agreement examples (paper, section 2).

The input is a sentence up to its verb, e.g. ``the key to the cabinets`` (label: singular).
The paper uses the Linzen et al. (2016) dataset, which cannot be downloaded here, so this
generator builds the same kind of input from a small grammar:

* the subject noun phrase: an ambiguous determiner (``the``, ``my``, ...), optional
  adjective, the subject noun;
* an optional modifier after the subject: prepositional phrases (``to the cabinets``,
  nested up to twice), an object relative clause whose verb agrees with its own subject
  (``that the man near the cabinet likes``) or a subject relative clause whose verb agrees
  with the head noun (``that opens the cabinets``), optionally after a prepositional phrase;
* an optional prefix before the subject: an adverb (``here``), a fronted prepositional
  phrase (``near the cabinets ,``) or a complement clause whose verb agrees with its own
  subject (``the men think that``), so the subject is not always the first noun.

Every noun other than the subject whose number differs from the subject's is an agreement
attractor. The number of attractors is drawn uniformly from ``0..max_attractors``; the other
nouns take the subject's number. Train and held-out examples are disjoint by construction:
a sentence belongs to the held-out split iff the CRC32 of its text is divisible by
:data:`HELD_OUT_MODULUS`.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Sequence

SINGULAR, PLURAL = 0, 1

NOUNS: tuple[tuple[str, str], ...] = (
    ("key", "keys"), ("cabinet", "cabinets"), ("dog", "dogs"), ("man", "men"), ("woman", "women"),
    ("child", "children"), ("mouse", "mice"), ("person", "people"), ("teacher", "teachers"),
    ("author", "authors"), ("book", "books"), ("table", "tables"), ("friend", "friends"),
    ("student", "students"), ("painting", "paintings"), ("car", "cars"), ("house", "houses"),
    ("girl", "girls"), ("boy", "boys"), ("doctor", "doctors"), ("farmer", "farmers"),
    ("letter", "letters"), ("picture", "pictures"), ("bird", "birds"), ("tree", "trees"),
    ("garden", "gardens"), ("city", "cities"), ("box", "boxes"), ("lawyer", "lawyers"),
    ("report", "reports"), ("article", "articles"), ("system", "systems"),
)
# Verbs of relative clauses (agreeing with their own subject): (singular, plural).
VERBS: tuple[tuple[str, str], ...] = (
    ("likes", "like"), ("sees", "see"), ("admires", "admire"), ("hates", "hate"),
    ("follows", "follow"), ("visits", "visit"), ("remembers", "remember"), ("opens", "open"),
)
# Verbs that take a complement clause: "the men think that ...".
SAY_VERBS: tuple[tuple[str, str], ...] = (
    ("says", "say"), ("thinks", "think"), ("believes", "believe"), ("knows", "know"),
)
ADJECTIVES: tuple[str, ...] = (
    "old", "new", "small", "large", "red", "famous", "young", "happy", "quiet", "strange",
)
PREPOSITIONS: tuple[str, ...] = (
    "to", "near", "behind", "from", "with", "on", "under", "beside", "of", "for", "about",
)
# Determiners that do not reveal number: the only ones a subject gets, so the noun decides.
AMBIGUOUS_DETERMINERS: tuple[str, ...] = ("the", "my", "your", "our", "their", "his", "her", "no")
NUMBER_DETERMINERS: tuple[tuple[str, ...], tuple[str, ...]] = (
    ("a", "this", "that", "each", "every", "another"),
    ("these", "those", "many", "several", "two", "few"),
)
ADVERBS: tuple[tuple[str, ...], ...] = (
    ("here",), ("today",), ("perhaps",), ("then",), ("of", "course", ","), ("in", "fact", ","),
)
COMPLEMENTIZER = "that"

HELD_OUT_MODULUS = 10


@dataclass(frozen=True)
class AgreementExample:
    """One input sentence up to its verb, with the verb's number and the ground-truth positions.

    Attributes:
        words: the sentence up to the verb, no special tokens. In the tokenized input
            ``[CLS] + words`` the token position of ``words[i]`` is ``i + 1``.
        label: the verb's number, 0 singular, 1 plural.
        subject_index: index in ``words`` of the verb's subject (a noun).
        attractor_indices: indices in ``words`` of the nouns whose number differs from the
            subject's (agreement attractors), increasing.
        sentence: the words joined by spaces (property).
        num_attractors: ``len(attractor_indices)`` (property).

    Example::

        >>> example = AgreementExample(["the", "keys", "to", "the", "cabinet"], PLURAL, 1, (4,))
        >>> example.sentence, example.num_attractors
        ('the keys to the cabinet', 1)
    """

    words: list[str]
    label: int
    subject_index: int
    attractor_indices: tuple[int, ...]

    @property
    def sentence(self) -> str:
        """The words joined by spaces."""
        return " ".join(self.words)

    @property
    def num_attractors(self) -> int:
        """How many attractors (nouns of the other number between subject and verb) the sentence has."""
        return len(self.attractor_indices)


def generate_examples(
    num_examples: int,
    seed: int = 0,
    max_attractors: int = 3,
    split: str = "train",
    attractor_weights: Sequence[float] | None = None,
    max_words: int | None = None,
) -> list[AgreementExample]:
    """Generate ``num_examples`` agreement examples, deterministically for a given ``seed``.

    Labels are balanced in expectation and the number of attractors is uniform over
    ``0..max_attractors``. ``split="train"`` and ``split="test"`` never share a sentence
    (see the module docstring); the bundled model was trained on ``split="train", seed=0``
    and is evaluated on ``split="test"``. The last two arguments shift the distribution
    towards natural text (the paper's inputs are sentences up to the verb, median about 7
    words, most of them without attractors; :data:`SHORT_SENTENCES` holds such settings);
    left at None they change nothing: the same seed gives the same examples as without them.

    Args:
        num_examples: how many examples, >= 0.
        seed: seed of the generator.
        max_attractors: largest number of attractors, 0 to 3.
        split: ``"train"`` or ``"test"``.
        attractor_weights: relative frequencies of 0, 1, ... attractors (one weight per
            count, ``max_attractors + 1`` of them) instead of the uniform draw.
        max_words: draw again any sentence longer than this many words.

    Returns:
        a list of :class:`AgreementExample`.

    Example:
        >>> example = generate_examples(1, seed=3)[0]
        >>> example.words[example.subject_index] in {n for pair in NOUNS for n in pair}
        True
    """
    return [example for example, _ in _generate(num_examples, seed, max_attractors, split, attractor_weights, max_words)]


def accuracy_by_attractors(correct: Sequence[bool], examples: Sequence[AgreementExample]) -> dict[str, float | int]:
    """Accuracy overall, on the examples with attractors and per number of attractors.

    Args:
        correct: one bool per example, whether the model got its verb's number right.
        examples: the examples, in the same order.

    Returns:
        dict: ``n``, ``accuracy``, ``n_with_attractors`` and ``accuracy_with_attractors`` (when
        some have attractors), and ``n_<k>_attractors``, ``accuracy_<k>_attractors`` for each k.

    Example::

        >>> examples = generate_examples(4, seed=1)
        >>> report = accuracy_by_attractors([True, False, True, True], examples)
        >>> report["n"], report["accuracy"]
        (4, 0.75)
    """
    counts = [example.num_attractors for example in examples]
    results: dict[str, float | int] = {"n": len(examples), "accuracy": sum(correct) / len(correct)}
    with_attractors = [c for c, k in zip(correct, counts) if k > 0]
    if with_attractors:
        results["n_with_attractors"] = len(with_attractors)
        results["accuracy_with_attractors"] = sum(with_attractors) / len(with_attractors)
    for k in sorted(set(counts)):
        group = [c for c, count in zip(correct, counts) if count == k]
        results[f"n_{k}_attractors"] = len(group)
        results[f"accuracy_{k}_attractors"] = sum(group) / len(group)
    return results


def is_held_out(words: list[str]) -> bool:
    """Whether a sentence belongs to the held-out (``"test"``) split: the CRC32 of its text
    (words joined by spaces) is divisible by :data:`HELD_OUT_MODULUS`.

    Args:
        words: the sentence as a list of words, as in :attr:`AgreementExample.words`.

    Returns:
        bool: True for the ``"test"`` split, False for ``"train"``.

    Example::

        >>> is_held_out(["the", "keys", "to", "the", "cabinet"])
        False
        >>> all(is_held_out(example.words) for example in generate_examples(5, split="test"))
        True
    """
    return zlib.crc32(" ".join(words).encode()) % HELD_OUT_MODULUS == 0


def vocabulary() -> list[str]:
    """Every word the generator can produce, in a fixed order (the tokenizer's word ids follow it).

    Returns:
        list[str]: distinct words, nouns and verbs first (singular, plural), then adjectives,
        prepositions, determiners, adverbs, ``"that"`` and ``","``.

    Example::

        >>> words = vocabulary()
        >>> words[:4], len(words) == len(set(words))
        (['key', 'keys', 'cabinet', 'cabinets'], True)
    """
    words = [w for pair in NOUNS + VERBS + SAY_VERBS for w in pair]
    words += [*ADJECTIVES, *PREPOSITIONS, *AMBIGUOUS_DETERMINERS, *NUMBER_DETERMINERS[0], *NUMBER_DETERMINERS[1]]
    words += [w for adverb in ADVERBS for w in adverb] + [COMPLEMENTIZER, ","]
    return list(dict.fromkeys(words))


class _Chunk:
    """Marks where a chunk (``"NP"``, ``"PP"``, ...) starts among the parts; ``"O"`` starts words outside any chunk."""

    def __init__(self, label: str):
        self.label = label


class _Noun:
    """A noun slot whose number is decided after the sentence's shape is known."""

    def __init__(self, is_subject: bool = False):
        self.is_subject = is_subject
        self.number = SINGULAR


def _generate(
    num_examples: int,
    seed: int,
    max_attractors: int,
    split: str,
    attractor_weights: Sequence[float] | None = None,
    max_words: int | None = None,
) -> list[tuple[AgreementExample, tuple[str, ...]]]:
    """The examples of :func:`generate_examples`, each with its BIO chunk tags, one per word."""
    if not isinstance(num_examples, int) or num_examples < 0:
        raise ValueError(f"num_examples must be a non-negative int, got {num_examples!r}.")
    if max_attractors not in (0, 1, 2, 3):
        raise ValueError(f"max_attractors must be 0, 1, 2 or 3, got {max_attractors!r}.")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    if attractor_weights is not None and (
        len(attractor_weights) != max_attractors + 1 or min(attractor_weights) < 0 or sum(attractor_weights) <= 0
    ):
        raise ValueError(
            f"attractor_weights must give {max_attractors + 1} non-negative weights (for 0..{max_attractors} "
            f"attractors) that are not all 0, got {attractor_weights!r}."
        )
    if max_words is not None and (isinstance(max_words, bool) or not isinstance(max_words, int) or max_words < 2):
        raise ValueError(f"max_words must be an int >= 2 (the shortest sentences have 2 words), got {max_words!r}.")
    rng = random.Random(seed)
    examples = []
    while len(examples) < num_examples:
        if attractor_weights is None:
            count = rng.randint(0, max_attractors)
        else:
            count = rng.choices(range(max_attractors + 1), weights=attractor_weights)[0]
        example, tags = _tagged_example(rng, count)
        if max_words is not None and len(example.words) > max_words:
            continue
        if is_held_out(example.words) == (split == "test"):
            examples.append((example, tags))
    return examples


def _tagged_example(rng: random.Random, num_attractors: int) -> tuple[AgreementExample, tuple[str, ...]]:
    # Rejection sampling: draw shapes until one has enough non-subject nouns for the attractors.
    while True:
        parts = _sentence_shape(rng)
        others = [p for p in parts if isinstance(p, _Noun) and not p.is_subject]
        if len(others) >= num_attractors:
            break
    label = rng.randint(0, 1)
    attractors = set(rng.sample(range(len(others)), num_attractors))
    for i, noun in enumerate(others):
        noun.number = 1 - label if i in attractors else label
    subject = next(p for p in parts if isinstance(p, _Noun) and p.is_subject)
    subject.number = label

    words: list[str] = []
    tags: list[str] = []
    chunk, chunk_start = "O", True
    subject_index, attractor_indices = -1, []
    nouns = {}
    for part in parts:
        if isinstance(part, _Chunk):
            chunk, chunk_start = part.label, True
            continue
        if chunk == "O":
            tags.append("O")
        else:
            tags.append(("B-" if chunk_start else "I-") + chunk)
            chunk_start = False
        if isinstance(part, _Noun):
            nouns[id(part)] = rng.randrange(len(NOUNS))
            if part.is_subject:
                subject_index = len(words)
            elif part.number != label:
                attractor_indices.append(len(words))
            words.append(NOUNS[nouns[id(part)]][part.number])
        elif isinstance(part, tuple):
            kind, noun = part
            if kind == "det":
                words.append(_determiner(rng, noun))
            else:
                words.append(rng.choice(VERBS if kind == "verb" else SAY_VERBS)[noun.number])
        else:
            words.append(part)
    return AgreementExample(words, label, subject_index, tuple(attractor_indices)), tuple(tags)


def _determiner(rng: random.Random, noun: _Noun) -> str:
    if noun.is_subject or rng.random() < 0.5:
        return rng.choice(AMBIGUOUS_DETERMINERS)
    return rng.choice(NUMBER_DETERMINERS[noun.number])


def _noun_phrase(rng: random.Random, noun: _Noun) -> list:
    adjective = [rng.choice(ADJECTIVES)] if rng.random() < 0.3 else []
    return [_Chunk("NP"), ("det", noun), *adjective, noun]


def _prepositional_phrase(rng: random.Random, depth: int) -> list:
    phrase = [_Chunk("PP"), rng.choice(PREPOSITIONS), *_noun_phrase(rng, _Noun())]
    if depth > 1 and rng.random() < 0.4:
        phrase += _prepositional_phrase(rng, depth - 1)
    return phrase


def _relative_clause(rng: random.Random, head: _Noun) -> list:
    if rng.random() < 0.5:
        inner = _Noun()
        pp = _prepositional_phrase(rng, 1) if rng.random() < 0.4 else []
        return [_Chunk("SBAR"), COMPLEMENTIZER, *_noun_phrase(rng, inner), *pp, _Chunk("VP"), ("verb", inner)]
    return [_Chunk("SBAR"), COMPLEMENTIZER, _Chunk("VP"), ("verb", head), *_noun_phrase(rng, _Noun())]


def _sentence_shape(rng: random.Random) -> list:
    """Words (str), nouns (:class:`_Noun`), number-dependent slots (``(kind, noun)``) and chunk starts (:class:`_Chunk`)."""
    subject = _Noun(is_subject=True)
    roll = rng.random()
    if roll < 0.45:
        prefix = []
    elif roll < 0.6:
        adverb = rng.choice(ADVERBS)
        # "of course ," and "in fact ,": the comma is outside the adverb phrase.
        prefix = [_Chunk("ADVP"), *adverb[:2], _Chunk("O"), *adverb[2:]]
    elif roll < 0.8:
        prefix = [*_prepositional_phrase(rng, 1), _Chunk("O"), ","]
    else:
        speaker = _Noun()
        prefix = [*_noun_phrase(rng, speaker), _Chunk("VP"), ("say", speaker), _Chunk("SBAR"), COMPLEMENTIZER]
    roll = rng.random()
    if roll < 0.15:
        modifier = []
    elif roll < 0.6:
        modifier = _prepositional_phrase(rng, 3)
    elif roll < 0.85:
        modifier = _relative_clause(rng, subject)
    else:
        modifier = [*_prepositional_phrase(rng, 1), *_relative_clause(rng, subject)]
    return [*prefix, *_noun_phrase(rng, subject), *modifier]


# generate_examples settings for inputs shaped like the paper's (sentences up to the verb from
# Linzen et al. 2016): median 7 words, about 5 in 6 without an attractor.
SHORT_SENTENCES: dict = {"attractor_weights": (0.8, 0.15, 0.04, 0.01), "max_words": 10}
