"""A small POS-free rule set that perturbs free-form captions (COCO-format data), as ARO does.

Yuksekgonul et al. (2023, the ARO benchmark) perturb captions with a part-of-speech tagger:
attributes swapped between two objects (VG-Attribution), the two sides of a relation swapped
(VG-Relation), words shuffled (COCO-/Flickr30k-Order).  Without a tagger the same three
perturbations are read off closed word lists, which is enough for caption language (short noun
phrases around a verb or preposition) and is exactly reproducible:

- ``attribute_swaps``: an *attribute* is a word of ``ATTRIBUTES`` (colours, sizes, materials,
  ages) directly before a *head* (a word that is neither an attribute nor a function word); two
  attribute-head pairs with different attributes and different heads swap their attributes:
  "a white dog chasing a brown cat" -> "a brown dog chasing a white cat".
- ``relation_swaps``: a *relation* is a phrase of ``RELATIONS`` (spatial prepositions and
  common caption verbs); its left side is the noun phrase that ends right before it (after an
  optional "is"/"are") and starts at a determiner, its right side the noun phrase that starts
  at a determiner right after it and runs up to the next function word; both at most
  ``MAX_PHRASE`` words.  The sides swap: "a man riding a horse on the beach" -> "a horse riding
  a man on the beach" and "a man riding the beach on a horse".
- ``content_words``: words that are not function words (``FUNCTION_WORDS``): the stand-in for
  ARO's nouns and adjectives in the shuffle probe.

A caption with no match gives no perturbation; the probes count how many items they could perturb.
"""

from __future__ import annotations

from collections.abc import Sequence

Tokens = tuple[str, ...]

COLOURS = ("white", "black", "red", "blue", "green", "yellow", "brown", "orange", "pink", "purple", "gray",
           "grey", "silver", "golden", "tan")
SIZES = ("large", "small", "big", "little", "tall", "short", "long", "tiny", "huge")
MATERIALS = ("wooden", "metal", "glass", "plastic", "stone", "brick", "leather")
AGES = ("old", "young", "new")
ATTRIBUTES = frozenset(COLOURS + SIZES + MATERIALS + AGES)

DETERMINERS = frozenset(("a", "an", "the", "two", "three", "four", "several", "some", "many", "his", "her",
                         "their", "its"))
AUXILIARIES = frozenset(("is", "are"))
#: spatial prepositions and frequent caption verbs (multi-word phrases first)
RELATIONS: tuple[Tokens, ...] = tuple(tuple(r.split()) for r in (
    "on top of", "in front of", "next to", "on", "in", "under", "above", "below", "behind", "beside", "near",
    "inside", "with", "holding", "riding", "eating", "carrying", "wearing", "chasing", "watching", "pulling",
    "pushing", "feeding", "hitting", "throwing", "catching", "looking at", "sitting on", "standing on",
    "lying on", "standing next to", "sitting next to"))
RELATION_WORDS = frozenset(w for r in RELATIONS for w in r)
FUNCTION_WORDS = frozenset(DETERMINERS | AUXILIARIES | RELATION_WORDS | {
    "and", "or", "of", "to", "at", "by", "for", "from", "into", "onto", "over", "up", "down", "out", "off",
    "while", "as", "that", "which", "who", "there", "it", "they", "he", "she", "this", "these", "those",
    "be", "being", "has", "have", "with", "some", "then", "first", "after", "before", "finally", "afterwards",
    "right", "left", "other", "each", "one", "s", "'s"})
MAX_PHRASE = 4  # words of a relation side, determiner included


def swap_spans(tokens: Sequence[str], a: tuple[int, int], b: tuple[int, int]) -> Tokens:
    """``tokens`` with the half-open spans ``a`` and ``b`` (``a`` before ``b``, not overlapping) swapped."""
    (a0, a1), (b0, b1) = a, b
    if not a1 <= b0:
        raise ValueError(f"spans {a} and {b} overlap or are out of order")
    t = list(tokens)
    return tuple(t[:a0] + t[b0:b1] + t[a1:b0] + t[a0:a1] + t[b1:])


def attribute_swaps(tokens: Sequence[str]) -> list[Tokens]:
    """Every caption made by swapping the attributes of two attribute-head pairs (see the module)."""
    pairs = [k for k in range(len(tokens) - 1)
             if tokens[k] in ATTRIBUTES and tokens[k + 1] not in ATTRIBUTES | FUNCTION_WORDS]
    out = []
    for x, i in enumerate(pairs):
        for j in pairs[x + 1:]:
            if tokens[i] != tokens[j] and tokens[i + 1] != tokens[j + 1]:
                t = list(tokens)
                t[i], t[j] = t[j], t[i]
                out.append(tuple(t))
    return out


def _relation_at(tokens: Sequence[str], k: int) -> int:
    """Length of the longest relation phrase starting at ``k`` (0: none)."""
    best = 0
    for r in RELATIONS:
        if len(r) > best and tuple(tokens[k: k + len(r)]) == r:
            best = len(r)
    return best


def _left_phrase(tokens: Sequence[str], end: int) -> tuple[int, int] | None:
    """The noun phrase ending at ``end`` (exclusive; an "is"/"are" before ``end`` is skipped)."""
    if end > 0 and tokens[end - 1] in AUXILIARIES:
        end -= 1
    for start in range(end - 2, max(end - MAX_PHRASE, 0) - 1, -1):
        if tokens[start] in DETERMINERS:
            inner = tokens[start + 1: end]
            return (start, end) if inner and not any(w in FUNCTION_WORDS for w in inner) else None
    return None


def _right_phrase(tokens: Sequence[str], start: int) -> tuple[int, int] | None:
    """The noun phrase starting at a determiner at ``start`` and running to the next function word."""
    if start >= len(tokens) or tokens[start] not in DETERMINERS:
        return None
    end = start + 1
    while end < len(tokens) and end - start < MAX_PHRASE and tokens[end] not in FUNCTION_WORDS:
        end += 1
    return (start, end) if end > start + 1 else None


def relation_swaps(tokens: Sequence[str]) -> list[Tokens]:
    """Every caption made by swapping the two sides of one relation (see the module)."""
    out, k = [], 0
    while k < len(tokens):
        n = _relation_at(tokens, k)
        if not n:
            k += 1
            continue
        left, right = _left_phrase(tokens, k), _right_phrase(tokens, k + n)
        if left and right and tuple(tokens[left[0]: left[1]]) != tuple(tokens[right[0]: right[1]]):
            out.append(swap_spans(tokens, left, right))
        k += n
    return out


def content_words(tokens: Sequence[str]) -> list[int]:
    """Positions of the words that are not function words."""
    return [k for k, w in enumerate(tokens) if w not in FUNCTION_WORDS]
